"""The scale tier: cases big enough to take every threaded, chunked, tiled and zero-skipping
kernel path, judged without differentiating every element.

A fast-tier case has a few hundred elements, so a kernel's fast paths (engine.backends.cpu.
paths: chunks on the engine's threads from about a million elements, the zero-skipping
matmul, tiled copies, chunked sums, banded scatters) never run in it. A scale case (an op's
`OpDef.scale`, a Sample with tier "scale") has up to a few million elements, and its row
says which fast paths the engine under test took (`paths`). It is judged by:

1. the forward output and the VJP (the gradient of sum(output * weights) for every checked
   input), element by element, against a float64 reference computed by an independent
   path: torch autograd in float64 where the op has a torch equivalent, otherwise our own
   float64 graph run in the CPU backend's plain mode (one thread, no zero-skipping, no
   tiling, no chunks: engine.backends.cpu.paths.plain);
2. numerical directional derivatives of the float64 loss (our float64 graph in plain mode)
   along DIRECTIONS random directions, against backprop's projections on them: each costs
   four evaluations of the graph, whatever its size;
3. precision, for a float32 (float16, bfloat16) case of an op with a torch equivalent:
   gradcheck.precision's verdict, each result's error against the float64 reference
   (`err_vs_f64`) at most PRECISION_RATIO times that of torch computing in the case's
   dtype (`ref_err`) plus a floor of a few ulps (`ratio`: the worst, 8 the bar).
   The fixed float32 tolerance cannot see a sum accumulated in float32 over millions of
   elements (a relative error of 4e-4 against 1e-3); a good float32 implementation at the
   same size errs 10^4 times less;
4. determinism (two runs, the same bits) and thread counts: the engine under test at each
   of its `thread_counts` against its run at the first, bit for bit where the backend
   promises it (every kernel but the products: a case whose graph holds a matmul agrees
   within rounding, the dtype's tolerance). Ours: 1, 2, 3 and 7 chunks, then
   "numba-parallel", numba's parallel compilations of the prange kernels on all its
   threads (the code GRADVERIFY_PARALLEL=1 runs, off by default: a race between prange
   iterations, such as a scatter-add over repeated indices, exists only there);
5. every value finite, but for the output's constant infinities (gradcheck.reference.
   constant_cells: weight 0, the `constant` metric).

The scale tier runs on the CPU backend and in other engines on their CPU. Under numba's
CUDA simulator (NUMBA_ENABLE_CUDASIM=1) a kernel runs each GPU thread as a Python thread,
so a case of a million elements would take hours: scale cases there are `unsupported`
rows; on a real GPU they run like on the CPU.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu import paths
from gradcheck import precision
from gradcheck.backprop import (
    declined_inputs,
    engine_vjp,
    loss_weights,
    nonzero_problems,
    same_bits,
    zero_gradient,
)
from gradcheck.modes import project, random_directions, single_thread
from gradcheck.numeric import compare, directional_derivatives
from gradcheck.reference import (
    EngineReference,
    plain_vjp,
    settled,
    torch_available,
    torch_reference,
)
from gradcheck.verdict import power_metrics, vacuity
from reports import Result

DIRECTIONS = 3             # random directions of the numerical check


def thread_counts(adapter) -> tuple:
    """The thread settings the scale tier runs `adapter` at (its `thread_counts`: ours,
    gradcheck.adapters.engine_adapter.ENGINE_THREADS; none for an adapter without)."""
    return tuple(getattr(adapter, "thread_counts", ()))


class PlainReference(EngineReference):
    """The float64 reference (our float64 graph of the case) run in plain mode: no fast
    path of the CPU backend, so it shares no kernel path with the engine's fast ones."""

    def __init__(self, case, arrays):
        with paths.plain():
            super().__init__(case, arrays)

    def loss(self) -> float:
        with paths.plain():
            return super().loss()

    def output(self) -> np.ndarray:
        with paths.plain():
            return super().output()

    def holds(self, op: str) -> bool:
        """Whether the case's graph holds a node of op `op`."""
        return any(t.op == op for t in self._graph.nodes)


def _worst(name: str, c) -> str:
    return (f"{name}{list(c.worst_index or ())}: ref {c.worst_expected:.6g}, "
            f"got {c.worst_value:.6g}")


def _at(setting) -> str:
    return f"at {setting} threads" if isinstance(setting, int) else f"with {setting}"


def _thread_problem(runs, exact: bool, precision: str, checked) -> tuple[str, str | None]:
    """The `threads` metric and the problem (None) of runs {setting: (out, grads)} at each
    thread setting against the first."""
    counts = list(runs)
    out0, grads0 = runs[counts[0]]
    for n in counts[1:]:
        out, grads = runs[n]
        pairs = [("output", out0, out)] + [(f"grad {i}", grads0[i], grads[i]) for i in checked]
        for what, a, b in pairs:
            if exact and not same_bits(a, b):
                diff = int(np.count_nonzero(a != b))
                return (f"{n} vs {counts[0]} differ",
                        f"threads: {what} {_at(n)} differs from the run {_at(counts[0])} in "
                        f"{diff}/{a.size} elements (promised: the same bits)")
            if not exact:
                c = compare(b, a, precision)
                if not c.ok:
                    return (f"{n} vs {counts[0]} differ",
                            f"threads: {what} {_at(n)} is off vs the run {_at(counts[0])} "
                            f"({c.failures}/{c.checked}), worst {_worst(what, c)}")
    how = "same bits" if exact else "agree within rounding"
    return f"{','.join(map(str, counts))}: {how}", None


def check_scale_sample(case, adapter, labels: dict, use_torch: bool = True) -> Result:
    """Judge one scale case (see the module doc) in `adapter`'s engine; `labels`: the row's
    (gradcheck.check.case_labels). Raises for an engine error (check_sample makes it a
    row)."""
    name = str(case)
    labels = labels | {"tier": "scale", "mode": "fast"}
    if getattr(adapter, "backend", "cpu") == "cuda" and _simulated():
        return Result("gradcheck", name, "unsupported", message="scale cases are too big "
                      "for numba's CUDA simulator (see gradcheck.scale)", labels=labels)
    arrays = case.generate_inputs()
    f64 = PlainReference(case, arrays)
    differentiable = [i for i, leaf in enumerate(f64.leaves) if leaf is not None]
    declined = declined_inputs(adapter, case, differentiable)
    checked = [i for i in differentiable if i not in declined]
    weights = loss_weights(f64.output_shape, case.seed(),
                           getattr(case, "cotangent", "contiguous"), case.precision)
    weights, f64_out, constant = f64.weigh(weights)   # infinities: constant cells
    with paths.recording() as taken:    # the paths taken (the thread settings' added below)
        out, grads, differs = engine_vjp(adapter, case, arrays, weights, f64.output_shape)
    precision_dtype = case.precision
    problems = []
    ref = torch_reference(case, arrays, weights) if use_torch and torch_available() else None
    if ref is not None:
        ref_name, ref_out, ref_grads = "torch f64", ref.output, ref.grads
    else:
        ref_name = "plain f64"
        ref_out, ref_grads = plain_vjp(case, arrays, weights)
    forward = compare(settled(out, f64_out, constant), settled(ref_out, f64_out, constant),
                      precision_dtype)
    if not forward.ok:
        problems.append(f"forward: {forward.failures}/{forward.checked} off vs {ref_name}, "
                        f"worst {_worst('out', forward)}")
    worst_c, worst_name = None, ""
    power = {}
    for i in checked:
        c = compare(grads[i], ref_grads[i], precision_dtype)
        power[case.inputs[i].name] = c.power
        if worst_c is None or c.max_abs > worst_c.max_abs:
            worst_c, worst_name = c, case.inputs[i].name
        if not c.ok:
            problems.append(f"vjp: {case.inputs[i].name} {c.failures}/{c.checked} off vs "
                            f"{ref_name}, worst {_worst(case.inputs[i].name, c)}")
    directions = "none checked"
    if checked:
        dirs = random_directions(case, [case.inputs[i].shape for i in checked], DIRECTIONS)
        leaf_dirs = [[case.inputs[i].to_leaf(v) for i, v in zip(checked, d, strict=True)]
                     for d in dirs]
        with single_thread():
            num = directional_derivatives(f64.loss, [f64.leaves[i] for i in checked],
                                          leaf_dirs)
        bp = project([grads[i] for i in checked], dirs)
        c = compare(bp, num.value, precision_dtype, num.error, num.kink)
        directions = f"{c.checked - c.failures}/{c.checked} agree"
        if not c.ok:
            problems.append(f"directions: backprop off the numerical directional derivative "
                            f"along {c.failures}/{c.checked} directions, worst "
                            f"num {c.worst_expected:.6g}, bp {c.worst_value:.6g}")
    held = None
    if ref is not None and precision_dtype in precision.JUDGED:
        held = precision.check_case(case, arrays, weights, out, grads, checked, ref_out,
                                    ref_grads, use_torch)
        if held is not None and held.problem:
            problems.append(held.problem)
    if differs:
        problems.append("nondeterministic: two runs gave different bits")
    runs = {}
    for n in thread_counts(adapter):
        with paths.recording() as at_n:
            v = adapter.with_threads(n).vjp(case, [a.copy() for a in arrays], weights)
        taken.update(at_n)
        runs[n] = (np.asarray(v.output), [None if g is None else np.asarray(g)
                                          for g in v.grads])
    threads_metric = "not run"
    if len(runs) > 1:
        threads_metric, problem = _thread_problem(runs, not f64.holds("matmul"),
                                                  precision_dtype, checked)
        if problem:
            problems.append(problem)
    total = sum(int(np.size(grads[i])) for i in checked)
    metrics = {"checked": total, "checked_fraction": DIRECTIONS / total if total else 0.0,
               "reference": ref_name,
               "max_abs_err": worst_c.max_abs if worst_c else 0.0,
               "max_rel_err": worst_c.max_rel if worst_c else 0.0,
               "worst": _worst(worst_name, worst_c) if worst_c else "",
               "forward": "agree" if forward.ok else "off",
               "directions": directions, "threads": threads_metric,
               "paths": ", ".join(sorted(taken)) or "none"}
    if held is not None:
        metrics |= held.metrics()
    if constant is not None:
        metrics["constant"] = int(np.count_nonzero(constant))
    if declined:
        metrics["declined"] = "; ".join(f"{case.inputs[i].name}: {why}"
                                        for i, why in declined.items())
    zero = zero_gradient(case)
    problems += nonzero_problems(zero, case, checked, grads)
    if zero:                        # exactly 0 by definition: checked as such, above
        power = {}
        metrics["zero_by_definition"] = zero
    held_powers = held.powers if held is not None else {}
    for what, p in held_powers.items():
        if what in power:
            power[what] = min(power[what], p)
    metrics |= power_metrics(power, min(forward.power, held_powers.get("output", np.inf)))
    status = "fail" if problems else "pass"
    vacuous = vacuity(power, precision_dtype, getattr(case, "cotangent", "contiguous"))
    if not problems and vacuous:
        status, problems = "vacuous", [vacuous]
    return Result("gradcheck", name, status, metrics, "; ".join(problems), labels=labels)


def _simulated() -> bool:
    """Whether the CUDA backend runs under numba's simulator (asked of a cuda case only:
    the backend is loaded by then)."""
    from engine.backends.cuda.arrays import SIMULATED
    return SIMULATED

