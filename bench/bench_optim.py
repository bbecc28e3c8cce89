"""Optimizer steps of the engine against torch.optim, side by side in one run (a benchmark).

    python bench/bench_optim.py                  # 10M float32 parameters
    python bench/bench_optim.py --size 1000000 --repeats 30 --threads 1

Times one `opt.step()` over `--size` float32 parameters, in two layouts: one single tensor,
and a small model's worth of tensors (`--layers` square weight matrices with their biases,
plus one 1-D tensor holding the remainder, so the total is exact). The engine's optimizer
(engine.optim) steps params whose gradients were set through `opt.grads[p].set(...)`;
torch.optim steps tensors holding the same values, in its `foreach` (multi-tensor) and
for-loop (single-tensor) implementations and, where torch has one, its fused kernel.

Target: AdamW(lr=1e-3, weight_decay=1e-2) no slower than torch's foreach AdamW
(engine / torch foreach <= 1). SGD with momentum and Adam with AMSGrad are for information.
Each figure is the median of `--repeats` steps after a warm-up; implementations run one after
another, each holding only its own copies and state (at 10M: peak about 0.5 GB beyond the
0.3 GB that importing torch takes).
GB/s is the traffic of one fused pass (every array read once, every state written once) over
the time, so it compares with the machine's memory bandwidth; foreach implementations make
several passes and move more than that. The machine is shared and noisy: read the ratios.
With numba's "omp" threading layer on a busy machine, every parallel launch may wait
milliseconds for a spinning or descheduled worker (torch's OpenMP alike); the threading layer
and OMP_WAIT_POLICY are printed to read the figures by (OMP_WAIT_POLICY=passive avoids it).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys

import numba
import numpy as np
import torch
from bench_cpu import median_time
from tabulate import tabulate

import engine
from engine.optim.optimizers import SGD, Adam, AdamW

TARGET_RATIO = 1.0
WARMUP_STEPS = 3
BYTES_F32 = 4

# name, engine class, torch class, keywords (shared), passes of float32 arrays per element
# in a fused step (reads of param, grad and states, writes of param and states), target?
OPTIMIZER_CASES = [
    ("AdamW", AdamW, torch.optim.AdamW, dict(lr=1e-3, weight_decay=1e-2), 4 + 3, True),
    ("SGD momentum=0.9", SGD, torch.optim.SGD, dict(lr=1e-2, momentum=0.9), 3 + 2, False),
    ("Adam amsgrad", Adam, torch.optim.Adam, dict(lr=1e-3, amsgrad=True), 5 + 4, False),
]


def layer_shapes(size: int, layers: int) -> list[tuple[int, ...]]:
    """`layers` pairs of a (d, d) weight and a (d,) bias, d the largest with
    layers * (d^2 + d) <= size, then one (r,) tensor for the remainder r (when r > 0)."""
    d = math.isqrt(size // layers)
    while layers * (d * d + d) > size:
        d -= 1
    shapes = [s for _ in range(layers) for s in ((d, d), (d,))]
    rest = size - layers * (d * d + d)
    return shapes + [(rest,)] if rest else shapes


def engine_step_time(cls, kwargs, params, grads, repeats) -> float:
    ps = []
    for i, a in enumerate(params):
        p = engine.param(a.shape, "f32", name=f"p{i}")
        p.set(a)
        ps.append(p)
    opt = cls(ps, **kwargs)
    for p, g in zip(ps, grads, strict=True):
        opt.grads[p].set(g)
    return median_time(opt.step, repeats, warmup=WARMUP_STEPS)


def torch_step_time(cls, kwargs, params, grads, repeats, **impl) -> float:
    ts = []
    for a, g in zip(params, grads, strict=True):
        t = torch.from_numpy(a.copy()).requires_grad_(True)
        t.grad = torch.from_numpy(g)   # read only by the step: shared with the engine's input
        ts.append(t)
    opt = cls(ts, **kwargs, **impl)
    return median_time(opt.step, repeats, warmup=WARMUP_STEPS)


def torch_has_fused(cls, kwargs) -> bool:
    t = torch.zeros(4, requires_grad=True)
    t.grad = torch.ones(4)
    try:
        cls([t], **kwargs, fused=True).step()
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def bench_optimizer(eng_cls, torch_cls, kwargs, params, grads, repeats):
    """Median step times {implementation: seconds} of one optimizer on one layout."""
    times = {"engine": engine_step_time(eng_cls, kwargs, params, grads, repeats)}
    gc.collect()
    impls = {"torch foreach": dict(foreach=True), "torch for-loop": dict(foreach=False)}
    if torch_has_fused(torch_cls, kwargs):
        impls["torch fused"] = dict(fused=True)
    for impl, options in impls.items():
        times[impl] = torch_step_time(torch_cls, kwargs, params, grads, repeats, **options)
        gc.collect()
    return times


def make_layout(shapes, rng):
    params = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    grads = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    return params, grads


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=10_000_000,
                   help="float32 parameters in all (default 10_000_000)")
    p.add_argument("--layers", type=int, default=4,
                   help="weight/bias pairs in the multi-tensor layout (default 4)")
    p.add_argument("--repeats", "--repeat", type=int, default=15,
                   help="timed steps per figure (median; default 15)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for numba and torch alike (default: each its own default)")
    args = p.parse_args(argv)
    if args.layers < 1 or args.repeats < 1:
        p.error(f"--layers and --repeats must be >= 1, got {args.layers} and {args.repeats}")
    if args.size < 2 * args.layers:
        p.error(f"--size must be at least 2 * --layers = {2 * args.layers}, got {args.size}")
    if args.threads is not None:
        if not 1 <= args.threads <= numba.config.NUMBA_NUM_THREADS:
            p.error(f"--threads must lie in [1, {numba.config.NUMBA_NUM_THREADS}] (numba's "
                    f"NUMBA_NUM_THREADS), got {args.threads}")
        numba.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}: {torch.get_num_threads()} threads; numba "
          f"{numba.__version__}: {numba.get_num_threads()} threads"
          f"{'' if args.threads else ' (both defaults)'}; median of {args.repeats} steps "
          f"after {WARMUP_STEPS} warm-up steps")

    rng = np.random.default_rng(0)
    shapes = layer_shapes(args.size, args.layers)
    layouts = [(f"1 tensor ({args.size:_})", [(args.size,)]),
               (f"{len(shapes)} tensors (d={shapes[0][0]})", shapes)]
    table = []
    worst = 0.0
    for opt_name, eng_cls, torch_cls, kwargs, passes, is_target in OPTIMIZER_CASES:
        for layout_name, layout_shapes in layouts:
            params, grads = make_layout(layout_shapes, rng)
            times = bench_optimizer(eng_cls, torch_cls, kwargs, params, grads,
                                    args.repeats)
            del params, grads
            gc.collect()
            reference = times["torch foreach"]
            ratio = times["engine"] / reference
            if is_target:
                worst = max(worst, ratio)
            verdict = ("ok" if ratio <= TARGET_RATIO else "SLOWER THAN TARGET") \
                if is_target else "(information)"
            for impl, seconds in times.items():
                gbs = passes * BYTES_F32 * args.size / seconds / 1e9
                table.append([opt_name, layout_name, impl, f"{seconds * 1e3:.2f}",
                              f"{gbs:.1f}", f"{seconds / reference:.2f}",
                              verdict if impl == "engine" else ""])
    print(tabulate(table, headers=["optimizer", "layout", "implementation", "ms/step",
                                   "GB/s (1 pass)", "/ torch foreach",
                                   f"engine target <= {TARGET_RATIO}"]))
    ok = worst <= TARGET_RATIO
    print(f"\nnumba threading layer {numba.threading_layer()}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    print(f"AdamW: worst engine / torch foreach = {worst:.2f}; "
          f"{'target met' if ok else 'TARGET MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
