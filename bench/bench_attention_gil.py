"""How much of attention's forward + backward holds the GIL: the part two threads cannot
overlap, measured in CPU time (which a loaded machine disturbs far less than wall time).

    python bench/bench_attention_gil.py            # 8 kv heads
    python bench/bench_attention_gil.py --kv-heads 2

On one thread (BLAS too), bench_attention.py's shape (causal, 8 query heads, 512 tokens,
head size 64, float32): the CPU time of a forward + backward graph evaluation, whole and
as its Python skeleton, the compiled and BLAS calls of attention's CPU kernels replaced by
no-ops (the kernels' Python between those calls, and the executor's, is what stays). Its
share s of the whole bounds two threads' gain at Amdahl's 1 / (s + (1 - s) / 2); the GIL's
hand-overs cost more on top. Run in a checkout from before attention's compiled tasks
(commit bf5bbd4), it replaces numpy's matmul and the row kernels of that loop instead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types

import numpy as np
import threadpoolctl
from bench_attention import attention_case
from bench_cpu import engine_backward, engine_forward

from engine.backends.cpu import attention as cpu_attention
from engine.backends.cpu import threads as engine_threads


def _cpu_ms(plans, runs, turns):
    """Median over `turns` of the CPU milliseconds per run of every plan in turn."""
    out = []
    for _ in range(turns):
        for _ in range(3):
            for p in plans:
                p.compute()
        t0 = time.process_time()
        for _ in range(runs):
            for p in plans:
                p.compute()
        out.append((time.process_time() - t0) / runs * 1e3)
    return statistics.median(out)


def _skeleton():
    """attention's CPU kernels with their compiled and BLAS calls made no-ops; a label."""
    def noop(*args, **kwargs):
        return None
    if hasattr(cpu_attention, "_fwd_task"):
        cpu_attention._fwd_task = cpu_attention._back_task = noop
        return "one compiled call per task"
    numpy = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np)
                                     if not k.startswith("__")})
    numpy.matmul = noop
    cpu_attention.np = numpy
    cpu_attention._fwd_rows = cpu_attention._back_rows = noop
    return "numpy's matmuls and row kernels"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kv-heads", type=int, default=8, choices=(1, 2, 4, 8))
    p.add_argument("--runs", type=int, default=60, help="runs per turn")
    p.add_argument("--turns", type=int, default=5, help="turns (median)")
    args = p.parse_args(argv)
    _, build, _, arrays = attention_case(np.random.default_rng(0), 8, args.kv_heads, 512, 64)
    engine_threads.set_num_threads(1)
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        plans = [engine_forward(build, arrays)[0], engine_backward(build, arrays)]
        whole = _cpu_ms(plans, args.runs, args.turns)
        label = _skeleton()
        skeleton = _cpu_ms(plans, args.runs, args.turns)
    s = skeleton / whole
    print(f"8/{args.kv_heads} heads ({label}): CPU ms per forward + backward on one thread: "
          f"whole {whole:.2f}, Python skeleton {skeleton:.3f} ({100 * s:.1f}%); two threads "
          f"gain at most {1 / (s + (1 - s) / 2):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
