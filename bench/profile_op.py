"""Where a bench_ops case's forward + backward time goes: milliseconds per call, node by node.

    python bench/profile_op.py --op conv_2d                 # one thread, CPU time
    python bench/profile_op.py --op conv_transpose_2d --threads 2 --calls 10

Builds the graph that bench/op_timing.py times for the op's first bench case (or the one
whose string contains `--case`): the forward and the gradients of its differentiated
inputs for a fed upstream gradient, and times each node's calls by a call wrapper
(Graph.call_wrapper), largest first, then the whole call's. On one thread each node is
timed by `time.thread_time` (this thread's CPU time: the load of a shared machine costs
it little) with BLAS held to one thread too (an engine on one thread leaves BLAS's own
threads as they are: engine.backends.cpu.threads); on more, by `time.perf_counter`. A
profile, not a benchmark: bench_ops.py holds the ratios and targets.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import op_timing
from profile_mnist import node_timer
from tabulate import tabulate

from engine.backends.cpu.threads import get_num_threads, one_blas_thread, set_num_threads
from engine.registry import get_op


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", required=True, help="a registry op with bench cases")
    p.add_argument("--case", default="", help="a substring of the bench case to profile")
    p.add_argument("--threads", type=int, default=1, help="the engine's threads (default 1)")
    p.add_argument("--calls", type=int, default=5, help="timed calls (default 5)")
    args = p.parse_args(argv)
    if args.threads < 1 or args.calls < 1:
        p.error("--threads and --calls must be >= 1")
    cases = [c for c in get_op(args.op).bench() if args.case in str(c)]
    if not cases:
        p.error(f"{args.op} has no bench case containing {args.case!r}")
    case = cases[0]
    set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter

    arrays = case.generate_inputs()
    shape, dtype = op_timing.output_of(case)
    _, graph, _ = op_timing.engine_graphs(case, arrays, op_timing.upstream(shape, dtype))
    if graph is None:
        p.error(f"{case} has no gradient to profile")
    times: dict = {}
    graph.call_wrapper = node_timer(times, clock)
    graph.compute()                        # bound with the wrapper
    for entry in times.values():           # zeroed in place: the wrapped calls hold them
        entry[:] = [0.0, 0]
    with one_blas_thread() if args.threads == 1 else contextlib.nullcontext():
        t0 = clock()
        for _ in range(args.calls):
            graph.compute()
        whole = (clock() - t0) / args.calls * 1e3
    rows = [[op, name, "x".join(map(str, shape)) or "()", sec / args.calls * 1e3,
             f"{sec / args.calls * 1e3 / whole:.1%}"]
            for (_, op, name, shape), (sec, _) in sorted(times.items(), key=lambda kv: -kv[1][0])]
    print(f"{case}: forward + backward, {get_num_threads()} thread(s), {args.calls} calls, "
          f"{'CPU' if args.threads == 1 else 'wall'} time")
    print(tabulate(rows, headers=["op", "node", "shape", "ms/call", "of call"], floatfmt=".2f"))
    print(f"call {whole:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
