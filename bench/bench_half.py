"""float16 and bfloat16 CPU kernels against torch's in the same dtypes, in one run (a
benchmark, not a test).

    python bench/bench_half.py            # or: tox -e bench
    python bench/bench_half.py --repeat 30
    python bench/bench_half.py --threads 1     # both on one thread
    python bench/bench_half.py --statistic median
    python bench/bench_half.py --case matmul   # only the cases whose name contains it

For a 512x768 @ 768x512 matmul, a softmax over the rows of (1024, 1024) and a sum over the
rows of (2048, 1024), in float16 and bfloat16 (and float32 for scale), prints the time of
the engine and of torch computing in that dtype, forward and backward, and their ratio
(engine / torch; target <= 2), except bfloat16 matmul's: at most 1.25x the engine's own
float32 product of the same shape (issue 37's decision: no bfloat16 GEMM in numpy's
OpenBLAS, so the float32 BLAS is its floor; torch's, on AMX where the CPU has it, is
printed beside it for information). The engine's 16-bit kernels widen to float32, compute
there and round on store (engine.backends.cpu.half), as torch's CPU kernels do inside.
Timed as bench_ops times (bench/op_timing.py's time_rounds): each case's calls in all three
dtypes, engine and torch, take turns in rounds, each turn after a pause, and a figure is
the fastest of its timed runs (--statistic median for the median; op_timing.STATISTICS
says why), so the bfloat16 product and its float32 twin are timed in the same rounds.
Memory: the bytes of the engine's buffers for the forward graph (its plan's arena plus the
inputs), 16-bit against float32 (target 1/2).
The machine is shared and noisy: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import sys

import ml_dtypes
import numpy as np
import op_timing
import torch
from bench_cpu import engine_backward, engine_forward, same_threads
from tabulate import tabulate

from engine import ops
from engine.backends.cpu import threads as engine_threads
from engine.tensor import TORCH_DTYPE_NAMES

TARGET_RATIO = 2.0
TARGET_BF16_MATMUL = 1.25      # engine bfloat16 / engine float32, the same product
TARGET_MEMORY = 0.5
NUMPY = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}
DTYPES = ("f16", "bf16", "f32")
PHASES = ("forward", "backward")


def as_torch(a: np.ndarray) -> torch.Tensor:
    """A torch tensor of `a`'s values in its dtype (bfloat16 through its bit patterns)."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def cases(rng):
    """(name, engine build, torch function, float64 inputs)."""
    return [("matmul 512x768 @ 768x512", ops.matmul, torch.matmul,
             [rng.normal(size=(512, 768)), rng.normal(size=(768, 512))]),
            ("softmax rows (1024, 1024)", ops.softmax, lambda t: torch.softmax(t, -1),
             [rng.normal(size=(1024, 1024))]),
            ("sum over rows (2048, 1024)", lambda t: ops.sum(t, -1),
             lambda t: t.sum(-1), [rng.normal(size=(2048, 1024))])]


def forward_bytes(build, arrays) -> int:
    """The bytes of the engine's buffers for the forward graph: arena and inputs."""
    graph, _ = engine_forward(build, arrays)
    return graph.plan.arena_bytes + sum(a.nbytes for a in arrays)


def calls(build, torch_fn, arrays, dtype):
    """[engine forward, torch forward, engine backward, torch backward]: zero-argument calls
    of the case in `dtype`, each computing once when called (the engine's graphs planned)."""
    arrays = [a.astype(NUMPY[dtype]) for a in arrays]
    fwd, _ = engine_forward(build, arrays)
    bwd = engine_backward(build, arrays)
    tens = [as_torch(a) for a in arrays]

    def torch_forward():
        with torch.no_grad():
            torch_fn(*tens)
    req = [t.clone().requires_grad_(True) for t in tens]
    y = torch_fn(*req)
    g = torch.randn(tuple(y.shape), generator=torch.Generator().manual_seed(1)).to(y.dtype)

    # dense gradients, as the engine's buffers hold: torch's backward of a sum returns a
    # broadcast view (stride 0) and writes nothing, so it is timed made contiguous (a no-op
    # for the gradients that already are)
    def torch_backward():
        [t.contiguous() for t in torch.autograd.grad(y, req, g, retain_graph=True)]
    return [fwd.compute, torch_forward, bwd.compute, torch_backward]


def measure(build, torch_fn, arrays, repeat, rounds, statistic="min"):
    """{dtype: {phase: (engine s, torch s)}} for one case: the calls of every dtype (calls)
    timed in the same rounds, engine and torch taking turns (op_timing.time_rounds)."""
    every = [c for dtype in DTYPES for c in calls(build, torch_fn, arrays, dtype)]
    seconds = op_timing.time_rounds(every, repeat, rounds, statistic)
    return {dtype: {phase: (seconds[4 * i + 2 * j], seconds[4 * i + 2 * j + 1])
                    for j, phase in enumerate(PHASES)} for i, dtype in enumerate(DTYPES)}


def judge(name, dtype, phase, times):
    """(ratio, verdict, met) of a row of case `name` (times: measure's dict): engine / torch
    against TARGET_RATIO, or for bfloat16 matmul the engine against its own float32 product
    (TARGET_BF16_MATMUL); float32 rows are for scale (met)."""
    e, t = times[dtype][phase]
    if dtype == "f32":
        return e / t, "", True
    if dtype == "bf16" and name.startswith("matmul"):
        twin = e / times["f32"][phase][0]
        met = twin <= TARGET_BF16_MATMUL
        return e / t, (f"{'ok' if met else 'SLOWER THAN TARGET'} ({twin:.2f} x engine f32, "
                       f"<= {TARGET_BF16_MATMUL:g})"), met
    met = e / t <= TARGET_RATIO
    return e / t, "ok" if met else "SLOWER THAN TARGET", met


def parse(argv=None):
    p = argparse.ArgumentParser(prog="bench_half", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=15, help="timed runs per figure (default 15)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds the timed runs are cut into, engine and torch taking turns "
                        "(default 3)")
    p.add_argument("--statistic", choices=tuple(op_timing.STATISTICS), default="min",
                   help="what a figure is of its timed runs, the same on both sides: the "
                        "fastest (default: this machine's noise only adds time, see "
                        "op_timing.STATISTICS) or the median")
    p.add_argument("--case", action="append", metavar="TEXT",
                   help="only the cases whose name contains TEXT (repeatable; default all: "
                        "matmul, softmax, sum)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for the engine and for torch alike (default: each's own)")
    args = p.parse_args(argv)
    if args.repeat < 1 or args.rounds < 1:
        p.error("--repeat and --rounds must be at least 1")
    names = [c[0] for c in cases(np.random.default_rng(0))]
    for text in args.case or ():
        if not any(text in name for name in names):
            p.error(f"no case contains {text!r} (cases: {', '.join(names)})")
    same_threads(p, args.threads)
    return args


def main(argv=None) -> int:
    args = parse(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; engine threads "
          f"{engine_threads.get_num_threads()}; the {args.statistic} of {args.repeat} runs in "
          f"{args.rounds} rounds, engine and torch taking turns")
    table, memory, ok = [], [], True
    for name, build, torch_fn, arrays in cases(np.random.default_rng(0)):
        if args.case and not any(text in name for text in args.case):
            continue
        times = measure(build, torch_fn, arrays, args.repeat, args.rounds, args.statistic)
        for dtype in DTYPES:
            for phase in PHASES:
                ratio, verdict, met = judge(name, dtype, phase, times)
                ok = ok and met
                e, t = times[dtype][phase]
                table.append([name, dtype, phase, f"{e * 1e3:.2f}", f"{t * 1e3:.2f}",
                              f"{ratio:.2f}", verdict])
        sizes = {dtype: forward_bytes(build, [a.astype(NUMPY[dtype]) for a in arrays])
                 for dtype in DTYPES}
        for dtype in ("f16", "bf16"):
            share = sizes[dtype] / sizes["f32"]
            ok = ok and share <= TARGET_MEMORY
            memory.append([name, dtype, sizes[dtype], sizes["f32"], f"{share:.2f}"])
    print(tabulate(table, headers=["case", "dtype", "pass", "engine ms", "torch ms",
                                   "engine/torch", f"target <= {TARGET_RATIO:g} (16-bit; "
                                   "bf16 matmul: against engine f32)"]))
    print()
    print(tabulate(memory, headers=["case", "dtype", "bytes", "f32 bytes", "share"]))
    print(f"(memory target: a share <= {TARGET_MEMORY:g}; torch dtypes "
          f"{TORCH_DTYPE_NAMES['f16']}, {TORCH_DTYPE_NAMES['bf16']})")
    print("all targets met" if ok else "SOME TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
