"""float16 and bfloat16 CPU kernels against torch's in the same dtypes, in one run (a
benchmark, not a test).

    python bench/bench_half.py            # or: tox -e bench
    python bench/bench_half.py --repeat 30
    python bench/bench_half.py --threads 1     # both on one thread

For a 512x768 @ 768x512 matmul, a softmax over the rows of (1024, 1024) and a sum over the
rows of (2048, 1024), in float16 and bfloat16 (and float32 for scale), prints the median
time of the engine and of torch computing in that dtype, forward and backward, and their
ratio (engine / torch; target <= 2), except bfloat16 matmul's: at most 1.25x the engine's
own float32 product of the same shape (issue 37's decision: no bfloat16 GEMM in numpy's
OpenBLAS, so the float32 BLAS is its floor; torch's, on AMX where the CPU has it, is
printed beside it for information). The engine's 16-bit kernels widen to float32, compute
there and round on store (engine.backends.cpu.half), as torch's CPU kernels do inside.
Memory: the bytes of the engine's buffers for the forward graph (its plan's arena plus the
inputs), 16-bit against float32 (target 1/2).
The machine is shared and noisy: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import sys
import time

import ml_dtypes
import numpy as np
import torch
from bench_cpu import engine_backward, engine_forward, median_time, same_threads
from tabulate import tabulate

from engine import ops
from engine.backends.cpu import threads as engine_threads
from engine.tensor import TORCH_DTYPE_NAMES

PAUSE_S = 0.5              # torch's workers fall asleep (see bench)
TARGET_RATIO = 2.0
TARGET_BF16_MATMUL = 1.25      # engine bfloat16 / engine float32, the same product
TARGET_MEMORY = 0.5
NUMPY = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}


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


def bench(name, build, torch_fn, arrays, dtype, repeat):
    """Rows [case, dtype, pass, engine s, torch s] and the forward bytes."""
    arrays = [a.astype(NUMPY[dtype]) for a in arrays]
    fwd, _ = engine_forward(build, arrays)
    bwd = engine_backward(build, arrays)
    # the engine first, after a pause: torch's worker threads keep spinning for a while
    # after its calls (the bfloat16 product, timed right after torch's float16 ones, ran
    # 1-3 ms slower), and the engine's block, never spin
    time.sleep(PAUSE_S)
    e_fwd = median_time(fwd.compute, repeat)
    e_bwd = median_time(bwd.compute, repeat)
    tens = [as_torch(a) for a in arrays]
    with torch.no_grad():
        t_fwd = median_time(lambda: torch_fn(*tens), repeat)
    req = [t.clone().requires_grad_(True) for t in tens]
    y = torch_fn(*req)
    g = torch.randn(tuple(y.shape), generator=torch.Generator().manual_seed(1)).to(y.dtype)
    # dense gradients, as the engine's buffers hold: torch's backward of a sum returns
    # a broadcast view (stride 0) and writes nothing, so it is timed made contiguous
    # (a no-op for the gradients that already are)
    t_bwd = median_time(lambda: [t.contiguous() for t in torch.autograd.grad(
        y, req, g, retain_graph=True)], repeat)
    return ([[name, dtype, "forward", e_fwd, t_fwd], [name, dtype, "backward", e_bwd, t_bwd]],
            forward_bytes(build, arrays))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=15, help="timed runs per figure (median)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for the engine and for torch alike (default: each's own)")
    args = p.parse_args(argv)
    same_threads(p, args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; engine threads "
          f"{engine_threads.get_num_threads()}; median of {args.repeat} runs")
    rows, memory, ok = [], [], True
    for name, build, torch_fn, arrays in cases(np.random.default_rng(0)):
        sizes = {}
        for dtype in ("f16", "bf16", "f32"):
            r, sizes[dtype] = bench(name, build, torch_fn, arrays, dtype, args.repeat)
            rows += r
        for dtype in ("f16", "bf16"):
            share = sizes[dtype] / sizes["f32"]
            ok = ok and share <= TARGET_MEMORY
            memory.append([name, dtype, sizes[dtype], sizes["f32"], f"{share:.2f}"])
    table = []
    f32 = {(name, phase): e for name, dtype, phase, e, _ in rows if dtype == "f32"}
    for name, dtype, phase, e, t in rows:
        ratio = e / t
        if dtype == "f32":
            verdict = ""
        elif dtype == "bf16" and name.startswith("matmul"):
            twin = e / f32[name, phase]
            met = twin <= TARGET_BF16_MATMUL
            ok = ok and met
            verdict = (f"{'ok' if met else 'SLOWER THAN TARGET'} ({twin:.2f} x engine f32, "
                       f"<= {TARGET_BF16_MATMUL:g})")
        else:
            ok = ok and ratio <= TARGET_RATIO
            verdict = "ok" if ratio <= TARGET_RATIO else "SLOWER THAN TARGET"
        table.append([name, dtype, phase, f"{e * 1e3:.2f}", f"{t * 1e3:.2f}", f"{ratio:.2f}",
                      verdict])
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
