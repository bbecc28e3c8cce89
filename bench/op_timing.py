"""One registry case timed on the engine and on torch, forward and forward + backward, in
one run (bench/bench_ops.py's measuring part).

The engine's side is a whole graph evaluation with its plan made beforehand, so executor
overhead counts: the forward graph of the case, and one graph of the forward and the
backward together, the backward built from the registry's backward rules (the op's own,
or those of the ops a composite is made of) for an upstream gradient fed as an input, as
Graph.build_backward builds it, without a loss on top (a weighted sum would add passes over
the output that torch's side does not make). torch's side is the op's `bench_torch` (else
its `torch` reference) on the same values: the forward under no_grad, and the forward with
torch.autograd.grad of the same upstream gradient. Gradients are made dense on both sides
where they are strided views (torch's sum backward returns a stride-0 expansion that writes
nothing; the engine's buffers are dense), and left as they are where they are dense (add's
gradient is the upstream gradient itself on both sides).

The timed calls take turns in rounds, engine and torch alternating (the order reversed in
every other round), each turn after a pause and one untimed call: torch's OpenMP workers
spin for a while after its calls and take the core that the engine's next chunk needs, and
after the pause this VM's idle cores take a moment to wake.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import math
import statistics
import time

import numpy as np

import engine
from engine.registry import OPS, get_op
from engine.tensor import as_dtype, is_float
from gradcheck.adapters.torch_adapter import as_torch, torch_view

# torch's OpenMP workers spin a while after its calls (bench/bench_half.py saw the next call
# 1-3 ms slower without a pause); 50 ms keeps 107 cases' pauses under a minute in all
PAUSE_S = 0.05
TURN_BUDGET_S = 1.0    # a turn stops timing after this long (at least one timed call)
WAKE_S = 0.05          # calls shorter than this get an untimed call after each pause

# What a figure is of its timed runs. This VM's noise only ever adds time (other tenants'
# memory traffic, a descheduled OpenMP worker): between two quiet full runs of bench_ops
# (docs/performance.md, 535042e and 8815adb) the median of 6 of an unchanged case moved by
# up to 8x on torch's side (log_softmax 7.8 -> 58.9 ms) and 2.3x on the engine's. The
# fastest run is the one the least disturbed, the best estimate of what the code costs on
# either side (the reasoning of Python's timeit, which reports the minimum); the same
# statistic on both sides, taken in the same alternating rounds, keeps the ratio fair.
STATISTICS = {"min": min, "median": statistics.median}


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


def reuse_freed_memory() -> bool:
    """glibc's malloc told to serve every block from its heap and to keep what is freed
    there (mallopt: no mmap'ed blocks, no trimming); whether it took (False where the C
    library has no mallopt).

    torch's CPU tensors come from malloc, and glibc serves a block of 32 MiB or more (an
    8M-element float32 output) with a fresh mmap, whose pages fault on first touch in every
    call: torch.relu of 2048 x 4096 float32 took 46 ms against 20 ms into a preallocated
    output, and 22.5 ms once mallopt kept the freed blocks (2 threads, this machine under
    load). The engine's plans allocate once. Timing glibc's page faults would flatter the
    engine by as much as an elementwise kernel costs; torch's performance guide
    recommends jemalloc or tcmalloc on the CPU, which reuse freed blocks, as this does."""
    mallopt = _libc("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))


def release_freed_memory() -> None:
    """The heap's free blocks given back to the system (glibc's malloc_trim), between two
    cases: kept from one case to the next they added up to a 5.9 GB peak over the full run
    (2.8 GB with glibc's defaults, 2.2 GB with this); the next case's untimed first calls
    fault them in."""
    trim = _libc("malloc_trim")
    if trim is not None:
        trim(0)


def _libc(name: str):
    """The C library's function `name`, or None where there is none (not glibc)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError, TypeError):
        return None


@dataclasses.dataclass
class Timing:
    """Median seconds of a case's calls: forward and forward + backward (None for an op
    without a gradient), the engine's and torch's; for a case judged against the engine's
    own float32 twin (bfloat16 matmul), that twin's too."""

    engine_fwd: float
    torch_fwd: float
    engine_fb: float | None = None
    torch_fb: float | None = None
    engine32_fwd: float | None = None
    engine32_fb: float | None = None


def differentiated(case) -> list[int]:
    """The indices of the case's inputs whose gradient forward + backward computes: the
    float ones marked grad, if the op has a gradient at all."""
    op = get_op(case.op)
    if not op.differentiable:
        return []
    return [i for i, spec in enumerate(case.inputs)
            if spec.grad and is_float(as_dtype(spec.dtype or case.dtype))]


def vjp_nodes(out, g, wrt) -> list:
    """The gradient nodes of `wrt` (leaves) for the upstream gradient `g` of `out`: the
    registry's backward rules applied in reverse order over the nodes that reach `out` from
    a leaf of `wrt` (Graph.build_backward's pass, seeded with g instead of a loss)."""
    nodes = engine.Graph([out]).nodes
    wanted = {t.id for t in wrt}
    needs: dict[int, bool] = {}
    for t in nodes:
        needs[t.id] = t.id in wanted if t.is_leaf else any(needs.get(s.id) for s in t.srcs)
    grads = {out.id: g}
    for node in reversed(nodes):
        gn = grads.get(node.id)
        if gn is None or node.is_leaf or not needs[node.id]:
            continue
        src_grads = OPS[node.op].backward(gn, node, *node.srcs, **node.params)
        for src, sg in zip(node.srcs, src_grads, strict=True):
            if sg is None or not needs.get(src.id):
                continue
            prev = grads.get(src.id)
            grads[src.id] = sg if prev is None else OPS["add"].build(prev, sg)
    missing = [t.name for t in wrt if t.id not in grads]
    if missing:
        raise ValueError(f"no gradient reaches {missing}")
    return [grads[t.id] if grads[t.id].contiguous else engine.ops.cont(grads[t.id])
            for t in wrt]


def upstream(shape, dtype) -> np.ndarray:
    """The upstream gradient both sides are handed: normal values, seeded."""
    return np.random.default_rng(1).normal(size=shape).astype(dtype)


def engine_graphs(case, arrays, g):
    """(forward graph, forward + backward graph or None, the gradient tensors of the
    differentiated inputs) of `case` on the engine, each graph evaluated once (its plan
    made)."""
    def leaves():
        out = []
        for spec, a in zip(case.inputs, case.leaf_arrays(arrays), strict=True):
            t = engine.input_tensor(a.shape, a.dtype, name=spec.name)
            t.set(a)
            out.append(t)
        return out
    fwd = engine.Graph([case.build(*leaves())], name=f"{case.op}.fwd")
    fwd.compute()
    diff = differentiated(case)
    if not diff:
        return fwd, None, []
    ins = leaves()
    out = case.build(*ins)
    seed = engine.input_tensor(out.shape, out.dtype, name="g")
    seed.set(g)
    grads = vjp_nodes(out, seed, [ins[i] for i in diff])
    both = engine.Graph([out, *grads], name=f"{case.op}.fwd_bwd")
    both.compute()
    return fwd, both, grads


def engine_calls(case, arrays, g):
    """(forward, forward + backward or None) graph evaluations of `case` on the engine."""
    fwd, both, _ = engine_graphs(case, arrays, g)
    return fwd.compute, (both.compute if both is not None else None)


def torch_function(op):
    """The torch function the bench times for `op` (an OpDef): bench_torch, else torch."""
    return op.bench_torch or op.torch


def torch_calls(case, arrays, g, results=None):
    """(forward, forward + backward or None) calls of the op's torch function
    (torch_function) on `arrays`, in the case's dtypes; each call puts its output, and the
    gradients, in `results` (a dict) where given (and nothing is kept otherwise: a kept
    output would change which freed blocks torch's next call can reuse)."""
    import torch
    fn, kwargs = torch_function(get_op(case.op)), case.kwargs
    leaves = [as_torch(spec.to_leaf(np.asarray(a))) for spec, a in
              zip(case.inputs, arrays, strict=True)]

    def views(ts):
        return [torch_view(spec, t) for spec, t in zip(case.inputs, ts, strict=True)]

    keep = results is not None
    results = {} if results is None else results

    def forward():
        with torch.no_grad():
            y = fn(*views(leaves), **kwargs)
        if keep:
            results["forward"] = y
    diff = differentiated(case)
    if not diff:
        return forward, None
    req = [t.clone().requires_grad_(True) if i in diff else t for i, t in enumerate(leaves)]
    wrt = [req[i] for i in diff]
    gt = as_torch(g)

    def forward_backward():
        y = fn(*views(req), **kwargs)
        grads = [t.contiguous() for t in torch.autograd.grad(y, wrt, gt.reshape(y.shape))]
        if keep:
            results["output"], results["grads"] = y, grads
    return forward, forward_backward


def time_rounds(calls, repeat: int, rounds: int, statistic: str = "min",
                pause: float = PAUSE_S, budget: float = TURN_BUDGET_S) -> list[float]:
    """Seconds of each zero-argument call of `calls` (the `statistic` of its timed runs:
    STATISTICS), after one untimed call of each
    (compiling, allocating, faulting pages in): `rounds` rounds in which the calls take
    turns, in order and reversed in every other round, each turn a pause, one untimed call
    for a call shorter than WAKE_S (whose first run after the pause would meet a sleeping
    core) and ceil(repeat / rounds) timed ones (fewer once a turn has taken `budget`
    seconds)."""
    first = []
    for call in calls:
        t0 = time.perf_counter()
        call()
        first.append(time.perf_counter() - t0)
    times: list[list[float]] = [[] for _ in calls]
    per_turn = max(1, math.ceil(repeat / rounds))
    for r in range(rounds):
        order = list(range(len(calls)))
        for i in (order if r % 2 == 0 else order[::-1]):
            time.sleep(pause)
            if first[i] < WAKE_S:
                calls[i]()
            start = time.perf_counter()
            for _ in range(per_turn):
                t0 = time.perf_counter()
                calls[i]()
                times[i].append(time.perf_counter() - t0)
                if time.perf_counter() - start > budget:
                    break
    return [STATISTICS[statistic](t) for t in times]


def time_case(case, repeat: int, rounds: int, engine_twin: str | None = None,
              statistic: str = "min", pause: float = PAUSE_S) -> Timing:
    """The Timing of `case`; with `engine_twin` (a dtype name) the engine's calls of the
    same case in that dtype are timed in the same rounds (bfloat16 matmul's target is the
    engine's own float32 product)."""
    arrays = case.generate_inputs()
    out_shape, out_dtype = output_of(case)
    g = upstream(out_shape, out_dtype)
    e_fwd, e_fb = engine_calls(case, arrays, g)
    t_fwd, t_fb = torch_calls(case, arrays, g)
    calls = [e_fwd, t_fwd] + ([e_fb, t_fb] if e_fb else [])
    if engine_twin:
        twin = case.promoted(engine_twin)
        twin_arrays = [a.astype(as_dtype(engine_twin)) if is_float(a.dtype) else a
                       for a in arrays]
        calls += [c for c in engine_calls(twin, twin_arrays, g.astype(as_dtype(engine_twin)))
                  if c is not None]
    seconds = time_rounds(calls, repeat, rounds, statistic, pause)
    timing = Timing(seconds[0], seconds[1])
    if e_fb:
        timing.engine_fb, timing.torch_fb = seconds[2], seconds[3]
    if engine_twin:
        timing.engine32_fwd = seconds[4 if e_fb else 2]
        timing.engine32_fb = seconds[5] if e_fb else None
    return timing


def output_of(case) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of the case's output (built on fresh leaves; nothing computed)."""
    leaves = [engine.input_tensor(spec.leaf_shape, as_dtype(spec.dtype or case.dtype))
              for spec in case.inputs]
    out = case.build(*leaves)
    return tuple(out.shape), out.dtype
