"""Float32 graphs whose backward sums over a broadcast, on the engine against torch, side by
side in one run (a benchmark, not a test).

    python bench/bench_wide_gradients.py --threads 1
    python bench/bench_wide_gradients.py --threads 1 --rounds 5

Graph.build_backward makes the gradient of a float32 operand broadcast by a view (expand,
broadcast_to, repeat: engine/graph.py, F32_WIDENS) from float64 terms, rounded once: the
rule that makes the terms runs on float64 casts of its inputs, the sum adds float64 values
and its result is cast back. An op's own broadcasting (a bias added to a batch) was
widened too at first and cost a bias's gradient 0.41 -> 0.98 of torch's forward +
backward; it is not any more, and these graphs time that: a bias added to (or a scale
multiplied into) a (2048, 4096) batch under a weighted sum, and an MLP 784-128-10 with
biases on a batch of 256 under cross-entropy. bench/bench_ops.py does not see such costs,
since its backward applies the ops' rules itself (op_timing.vjp_nodes); this times whole
graphs, forward and backward, as training builds them. Each side's figure is the median
over rounds of the fastest of a few calls, engine and torch alternating, so that a noisy
spell on the shared machine falls on both; read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch
from bench_cpu import same_threads
from tabulate import tabulate

import engine
from engine import ops
from engine.backends.cpu import threads as engine_threads

PAUSE_S = 0.02             # torch's OpenMP workers spin for a while after a parallel call
BATCH = (2048, 4096)


def _arrays(rng, shapes):
    return [rng.normal(size=s).astype(np.float32) for s in shapes]


def broadcast_case(op: str, rng):
    """(engine graph, torch step) of sum(op(a, b) * w), a (2048, 4096), b (4096,), both
    params: b's gradient sums over the 2048 rows."""
    a, b, w = _arrays(rng, [BATCH, BATCH[1:], BATCH])
    ta, tb = (engine.param(x.shape, "f32", name=n) for x, n in ((a, "a"), (b, "b")))
    tw = engine.input_tensor(w.shape, "f32", name="w")
    for t, x in ((ta, a), (tb, b), (tw, w)):
        t.set(x)
    loss = ops.sum(ops.mul(getattr(ops, op)(ta, tb), tw)).set_loss()
    graph = engine.Graph([loss])
    graph.build_backward(loss)

    pa, pb = (torch.tensor(x, requires_grad=True) for x in (a, b))
    pw = torch.tensor(w)
    fn = {"add": torch.add, "mul": torch.mul}[op]

    def step():
        pa.grad = pb.grad = None
        (fn(pa, pb) * pw).sum().backward()
    return graph, step


def mlp_case(rng, batch: int = 256):
    """(engine graph, torch step) of cross_entropy(relu(x W1 + b1) W2 + b2, labels), the
    weights and biases params (784-128-10, as bench_mnist's FC net)."""
    x, w1, w2 = _arrays(rng, [(batch, 784), (784, 128), (128, 10)])
    w1 *= 0.05
    w2 *= 0.1
    labels = np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)]
    tx = engine.input_tensor(x.shape, "f32", name="x")
    tl = engine.input_tensor(labels.shape, "f32", name="labels")
    params = [engine.param(s, "f32", name=n) for s, n in
              (((784, 128), "W1"), ((128,), "b1"), ((128, 10), "W2"), ((10,), "b2"))]
    for t, v in zip([tx, tl, *params], [x, labels, w1, np.zeros(128, np.float32), w2,
                                        np.zeros(10, np.float32)], strict=True):
        t.set(v)
    W1, b1, W2, b2 = params
    h = ops.relu(ops.add(ops.matmul(tx, W1), b1))
    loss = ops.cross_entropy_loss(ops.add(ops.matmul(h, W2), b2), tl).set_loss()
    graph = engine.Graph([loss])
    graph.build_backward(loss)

    px, pl = torch.tensor(x), torch.tensor(labels)
    pw = [torch.tensor(v, requires_grad=True) for v in (w1, np.zeros(128, np.float32), w2,
                                                       np.zeros(10, np.float32))]

    def step():
        for p in pw:
            p.grad = None
        logits = torch.relu(px @ pw[0] + pw[1]) @ pw[2] + pw[3]
        torch.nn.functional.cross_entropy(logits, pl).backward()
    return graph, step


def timed(fn, calls: int) -> float:
    best = math.inf
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench(graph, step, rounds: int, calls: int) -> tuple[float, float]:
    """Median over rounds of the engine's and torch's forward + backward (seconds)."""
    graph.compute()
    step()
    times = {"engine": [], "torch": []}
    sides = {"engine": graph.compute, "torch": step}
    for r in range(rounds):
        for side in (("engine", "torch") if r % 2 == 0 else ("torch", "engine")):
            time.sleep(PAUSE_S)
            sides[side]()
            times[side].append(timed(sides[side], calls))
    return statistics.median(times["engine"]), statistics.median(times["torch"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--threads", type=int, default=None,
                   help="threads for the engine and for torch alike (default: each's own)")
    args = p.parse_args(argv)
    same_threads(p, args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; engine threads "
          f"{engine_threads.get_num_threads()}; median of {args.rounds} alternating rounds")
    rng = np.random.default_rng(0)
    rows = []
    for name, (graph, step) in {"add a (2048, 4096) + b (4096,)": broadcast_case("add", rng),
                                "mul a (2048, 4096) * b (4096,)": broadcast_case("mul", rng),
                                "MLP 784-128-10, batch 256": mlp_case(rng)}.items():
        e, t = bench(graph, step, args.rounds, args.calls)
        casts = sum(node.op == "cast" for node in graph.nodes)
        rows.append([name, f"{e * 1e3:.2f}", f"{t * 1e3:.2f}", f"{e / t:.2f}", casts])
    print(tabulate(rows, headers=["f32 forward + backward", "engine ms", "torch ms", "ratio",
                                  "casts"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
