"""Where an MNIST training step's time goes: milliseconds per batch, node by node.

    python bench/profile_mnist.py --arch fc                 # FC at batch 1000 (two of 500)
    python bench/profile_mnist.py --arch cnn --batches 20
    python bench/profile_mnist.py --arch fc --threads 2 --cpu  # CPU time: caller, workers
    PYTHONPATH=/path/to/other/checkout python bench/profile_mnist.py --arch fc --no-nodes

Trains `--batches` batches (after `--warmup` more) of real MNIST (mnist_target.data) with
bench/bench_mnist.py's engine trainer (AdamW, cross-entropy, physical batches of 500 whose
gradients accumulate) and batch order, and prints each node's milliseconds per batch (every
call of the trainer's plans timed one by one by a call wrapper installed on its graphs,
Graph.call_wrapper), largest first, then the whole step's.
With `--cpu`, each node's CPU time too, the calling thread's and the engine's worker
threads' (engine.backends.cpu.threads) apart: where a node keeps the caller busy while the
workers wait (a serial step before a split), and CPU time is what a loaded machine
disturbs least. Timing each call costs about a microsecond, so the nodes' sum is a little
above an untimed step; `--no-nodes` times whole steps only (and runs on a checkout whose
graphs take no call wrapper: two checkouts run alternately compare as well as this noisy
machine allows). A profile, not a benchmark: bench/bench_mnist.py holds the targets.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np
from bench_mnist import EPOCH_IMAGES, _batches, engine_trainer


def node_timer(times: dict, clock=time.perf_counter):
    """A call wrapper (Graph.call_wrapper) that times each call it wraps by `clock`: the
    call labelled (graph, op, node, shape) adds its seconds and one call to times[label] =
    [seconds, calls], an entry it holds from wrapping on (zero entries in place, do not
    clear the dict)."""
    def wrap(label, call):
        entry = times.setdefault(tuple(label), [0.0, 0])

        def timed():
            t0 = clock()
            call()
            entry[0] += clock() - t0
            entry[1] += 1
        return timed
    return wrap


def worker_clocks() -> list[int]:
    """CPU-time clock ids of the engine's worker threads now running (its pool's threads
    are named gradverify-cpu-N)."""
    return [time.pthread_getcpuclockid(t.ident) for t in threading.enumerate()
            if t.name.startswith("gradverify-cpu-")]


def cpu_node_timer(times: dict, workers: list):
    """A call wrapper as node_timer's that adds, per call labelled (graph, op, node,
    shape), to times[label] = [wall seconds, the calling thread's CPU seconds, the CPU
    seconds of the worker threads whose clock ids `workers` holds (read at each call: fill
    it once the pool has started), calls]."""
    def workers_cpu():
        return sum(time.clock_gettime(c) for c in workers)

    def wrap(label, call):
        entry = times.setdefault(tuple(label), [0.0, 0.0, 0.0, 0])

        def timed():
            t0, c0, k0 = time.perf_counter(), time.thread_time(), workers_cpu()
            call()
            entry[0] += time.perf_counter() - t0
            entry[1] += time.thread_time() - c0
            entry[2] += workers_cpu() - k0
            entry[3] += 1
        return timed
    return wrap


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=["fc", "cnn"], default="fc")
    p.add_argument("--batch", type=int, default=1000, help="logical batch (default 1000)")
    p.add_argument("--physical", type=int, default=500,
                   help="physical batch whose gradients accumulate (default 500)")
    p.add_argument("--batches", type=int, default=50, help="timed batches (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches first (default 5)")
    p.add_argument("--top", type=int, default=20, help="nodes listed (default 20)")
    p.add_argument("--threads", type=int, default=None,
                   help="the engine's threads (default: GRADVERIFY_THREADS or the cores)")
    p.add_argument("--no-nodes", action="store_true", help="time whole steps only")
    p.add_argument("--cpu", action="store_true",
                   help="CPU time per node too: the calling thread's and the workers'")
    args = p.parse_args(argv)
    physical = min(args.physical, args.batch)
    if args.batches < 1 or args.warmup < 0 or physical < 1 or args.batch % physical:
        p.error("--batches must be >= 1, --warmup >= 0, and --batch a multiple of "
                "--physical")

    from tabulate import tabulate

    from engine.backends.cpu.threads import get_num_threads, set_num_threads
    from mnist_target.data import load_mnist

    if args.threads is not None:
        if args.threads < 1:
            p.error("--threads must be >= 1")
        set_num_threads(args.threads)
    timing_nodes = not args.no_nodes
    data = load_mnist()
    train = engine_trainer(data.train_images, data.train_labels, args.arch, args.batch,
                           physical)
    node_times: dict = {}
    if timing_nodes:
        trainer = train.trainer
        graphs = [trainer.forward, trainer.training, trainer.optimizer.graph]
        if not all(hasattr(g, "call_wrapper") for g in graphs):
            p.error("this engine's graphs take no call_wrapper: use --no-nodes")
        workers: list = []
        timer = cpu_node_timer(node_times, workers) if args.cpu else node_timer(node_times)
        for g in graphs:
            g.call_wrapper = timer          # their plans time every call from now on
    plan = _batches(np.random.default_rng(0), EPOCH_IMAGES, args.batch,
                    args.warmup + args.batches)

    for idx in plan[:args.warmup]:
        train(idx)
    if timing_nodes:
        for entry in node_times.values():     # zeroed in place: the wrapped calls hold them
            entry[:] = [0.0] * (len(entry) - 1) + [0]
        workers[:] = worker_clocks()
    cpu = worker_clocks()
    t0, c0, k0 = time.perf_counter(), time.thread_time(), sum(map(time.clock_gettime, cpu))
    for idx in plan[args.warmup:]:
        train(idx)
    per_batch = 1e3 / args.batches
    step = (time.perf_counter() - t0) * per_batch
    step_cpu = ((time.thread_time() - c0) * per_batch,
                (sum(map(time.clock_gettime, cpu)) - k0) * per_batch)

    print(f"MNIST {args.arch.upper()} training, batch {args.batch} (physical {physical}), "
          f"{get_num_threads()} thread(s), {args.batches} batches after {args.warmup}")
    if timing_nodes:
        times = sorted(node_times.items(), key=lambda kv: -kv[1][0])
        nodes = sum(entry[0] for entry in node_times.values()) * per_batch
        rows = [[f"{graph}: {op}", name, "x".join(map(str, shape)) or "()",
                 entry[-1] / args.batches, entry[0] * per_batch]
                + [sec * per_batch for sec in entry[1:-1]]
                + [f"{entry[0] * per_batch / step:.1%}"]
                for (graph, op, name, shape), entry in times[:args.top]]
        cpu_headers = ["caller CPU", "workers CPU"] if args.cpu else []
        print(tabulate(rows, headers=["graph: op", "node", "shape", "calls/batch",
                                      "ms/batch", *cpu_headers, "of step"], floatfmt=".3f"))
        print(f"nodes {nodes:.3f} ms per batch ({len(times)} nodes; the rest is Python "
              "between them and the batch's data)")
    print(f"step {step:.3f} ms per batch"
          + (f"; CPU: caller {step_cpu[0]:.3f}, workers {step_cpu[1]:.3f}" if args.cpu
             else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
