"""Sums on the CPU against torch, side by side in one run (a benchmark, not a test).

    python bench/bench_sum.py                 # both on the default threads
    python bench/bench_sum.py --threads 1     # both on one thread
    python bench/bench_sum.py --threads 1 --cpu   # CPU time: a loaded machine
    python bench/bench_sum.py --rounds 21 --shape 2048x1024

For float32 and float64 inputs of each shape (default (4096, 4096) and (2048, 1024)), the sum
over the last axis, over all axes and over the first: the median time of the engine and of
torch, forward (the op) and backward (the op's backward rule on a given output gradient,
which broadcasts it; torch's gradient, a stride-0 view, is made contiguous, as the engine's
buffers are), and the ratio of forward + backward (target <= 1.5, engine.backends.cpu.reduce).
The two are timed alternately, round after round (a few calls of one, a pause for torch's
spinning workers to sleep, a few of the other), so that a noisy spell on the shared machine
falls on both. On a loaded machine wall times mostly measure the others' load; `--cpu`
times the process's CPU time instead (time.process_time), a fair measure on one thread only
(on more, torch's OpenMP workers spin between calls and count, the engine's block). Also
prints each sum's error against the exact sum (math.fsum of the float64
values), the engine's and torch's, for random normal data (cancelling) and positive data.
The machine is shared and noisy: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np
import torch
from bench_cpu import engine_backward, engine_forward, same_threads
from tabulate import tabulate

from engine import ops
from engine.backends.cpu import threads as engine_threads

TARGET_RATIO = 1.5
PAUSE_S = 0.02             # torch's OpenMP workers spin for a while after a parallel call
AXES = {"last": -1, "all": None, "first": 0}


def timed(fn, calls: int, clock) -> float:
    """The fastest of `calls` timed calls of fn (within a round: the least disturbed)."""
    best = math.inf
    for _ in range(calls):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def bench(x: np.ndarray, axis, rounds: int, calls: int, clock) -> dict[str, float]:
    """Median over rounds of each side's time, forward and backward (seconds)."""
    def build(t):
        return ops.sum(t, axis)
    fwd, _ = engine_forward(build, [x])
    bwd = engine_backward(build, [x])
    tx = torch.from_numpy(x)
    req = tx.clone().requires_grad_(True)
    y = req.sum() if axis is None else req.sum(axis)
    g = torch.from_numpy(np.random.default_rng(1).normal(size=tuple(y.shape)).astype(x.dtype))

    def torch_fwd():
        with torch.no_grad():
            return tx.sum() if axis is None else tx.sum(axis)

    def torch_bwd():
        return [t.contiguous() for t in torch.autograd.grad(y, [req], g, retain_graph=True)]

    sides = {"engine fwd": fwd.compute, "torch fwd": torch_fwd,
             "engine bwd": bwd.compute, "torch bwd": torch_bwd}
    for fn in sides.values():           # compile, load the cache, fault pages in
        fn()
    times: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            time.sleep(PAUSE_S)
            times[name].append(timed(sides[name], calls, clock))
    return {k: statistics.median(v) for k, v in times.items()}


def errors(n: int, dtype, rng) -> list[list]:
    """Rows [data, dtype, engine error, torch error]: |sum - exact| / sum |x| over the rows
    of a (64, n) array, the worst row."""
    rows = []
    for name, x in (("normal", rng.normal(size=(64, n))),
                    ("positive", rng.uniform(0.5, 1.0, size=(64, n)))):
        x = x.astype(dtype)
        exact = np.array([math.fsum(r) for r in x.astype(np.float64)])
        scale = np.abs(x.astype(np.float64)).sum(-1)
        g, out = engine_forward(lambda t: ops.sum(t, -1), [x])
        ours = out.numpy().astype(np.float64)
        theirs = torch.from_numpy(x).sum(-1).numpy().astype(np.float64)
        rows.append([f"{name} (64, {n})", np.dtype(dtype).name,
                     f"{np.max(np.abs(ours - exact) / scale):.2e}",
                     f"{np.max(np.abs(theirs - exact) / scale):.2e}"])
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15, help="alternating rounds (median)")
    p.add_argument("--calls", type=int, default=3, help="calls per side and round (fastest)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for the engine and for torch alike (default: each's own)")
    p.add_argument("--cpu", action="store_true",
                   help="time CPU time (process_time), not wall time (see the doc)")
    p.add_argument("--shape", action="append", default=None,
                   help="a shape such as 4096x4096 (repeatable; default 4096x4096, 2048x1024)")
    p.add_argument("--dtype", action="append", choices=("f32", "f64"), default=None)
    p.add_argument("--axis", action="append", choices=tuple(AXES), default=None)
    args = p.parse_args(argv)
    same_threads(p, args.threads)
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shape or
              ("4096x4096", "2048x1024")]
    dtypes = [{"f32": np.float32, "f64": np.float64}[d] for d in args.dtype or ("f32", "f64")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; engine threads "
          f"{engine_threads.get_num_threads()}; median of {args.rounds} alternating rounds, "
          f"{'CPU' if args.cpu else 'wall'} time")
    clock = time.process_time if args.cpu else time.perf_counter
    rng = np.random.default_rng(0)
    table, ok = [], True
    for shape in shapes:
        for dtype in dtypes:
            x = rng.normal(size=shape).astype(dtype)
            for axis in args.axis or AXES:
                t = bench(x, AXES[axis], args.rounds, args.calls, clock)
                ratio = (t["engine fwd"] + t["engine bwd"]) / (t["torch fwd"] + t["torch bwd"])
                judged = axis in ("last", "all")
                ok = ok and (ratio <= TARGET_RATIO or not judged)
                table.append([f"sum {axis} {shape}", np.dtype(dtype).name,
                              *(f"{t[k] * 1e3:.3f}" for k in ("engine fwd", "torch fwd",
                                                               "engine bwd", "torch bwd")),
                              f"{t['engine fwd'] / t['torch fwd']:.2f}", f"{ratio:.2f}",
                              ("ok" if ratio <= TARGET_RATIO else "SLOWER THAN TARGET")
                              if judged else ""])
    print(tabulate(table, headers=["case", "dtype", "engine fwd ms", "torch fwd ms",
                                   "engine bwd ms", "torch bwd ms", "fwd ratio",
                                   "fwd+bwd ratio", f"target <= {TARGET_RATIO}"]))
    print()
    acc = [row for dtype in dtypes for n in (4096, 16384)
           for row in errors(n, dtype, np.random.default_rng(n))]
    print(tabulate(acc, headers=["row sums of", "dtype", "engine error", "torch error"]))
    print("(error: |sum - exact| / sum |x|, the worst of 64 rows)")
    print("all targets met" if ok else "SOME TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
