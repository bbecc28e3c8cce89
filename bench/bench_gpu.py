"""The engine's CUDA backend against torch CUDA on one GPU, side by side (a benchmark).

    python bench/bench_gpu.py                            # 4096^3 matmul, MNIST FC step
    python bench/bench_gpu.py --size 2048 --repeat 20 --json gpu.json --markdown gpu.md
    NUMBA_ENABLE_CUDASIM=1 python bench/bench_gpu.py --quick     # smoke test, no GPU

Two cases, each timed on the engine's cuda backend and in torch on the same device:

- matmul: a float32 n x n @ n x n product (default n = 4096), a one-node graph on the
  engine's backend (its tiled shared-memory kernel, no cuBLAS) against torch.matmul on CUDA
  tensors (cuBLAS, TF32 off: torch's default). GFLOP/s are 2 n^3 over the median time. The
  engine's product is compared with torch's (with numpy's where torch has no CUDA).
- MNIST FC step: one training step of the FC model (784-500-ReLU-10) as `mnist-train`
  takes it: a logical batch of 1000 made of two physical batches of 500 whose gradients
  accumulate, then AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, no weight decay). The engine
  runs mnist_target.run.make_trainer on `cuda`; torch runs mnist_target.torch_ref's model
  of the same weights. In both, each physical batch's images are copied from the host and
  its loss and correct count read back. GFLOP/s count the step's dense matmuls. Before the
  timing, one step of each from the same weights on the same batch: the first losses and
  the largest parameter difference afterwards are printed (a check, not a verdict); without
  warm-up runs that step is the first timed run.

Times are medians of --repeat runs after --warmup runs (compilation, caches), each run
closed by numba.cuda.synchronize() or torch.cuda.synchronize(). Images are random with
MNIST's density (19% non-zero, values k/256): the GPU kernels do not skip zeros, so the
values do not change the time. Exit status 2, with one line, where there is no CUDA device
(numba.cuda.is_available() false); under NUMBA_ENABLE_CUDASIM=1 only --quick runs (a 32 x 32
product, a batch of one image, no warm-up, one timed run: the step that is checked; the
simulator runs every CUDA thread as a Python thread, and its main thread polls them: the
script keeps to one CPU there, where the step took 24 s on this 2-core machine against 3-5
minutes spread over both cores, the GIL handed from core to core).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import time

import numpy as np

SCHEMA = "gradverify.bench_gpu/1"
MNIST_DENSITY = 0.19            # share of non-zero pixels in MNIST's training images
FULL = {"size": 4096, "logical": 1000, "physical": 500, "repeat": 10, "warmup": 3}
QUICK = {"size": 32, "logical": 1, "physical": 1, "repeat": 1, "warmup": 0}


@dataclasses.dataclass
class Row:
    """One case: median seconds of the engine and of torch (None: torch has no CUDA), the
    work in FLOPs, and a note (a correctness figure)."""

    case: str
    engine_s: float
    torch_s: float | None
    flops: float
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.torch_s is None else self.engine_s / self.torch_s


def timed(fn, sync) -> tuple[object, float]:
    """(fn(), the wall time of fn() followed by sync())."""
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def median_seconds(fn, sync, repeat: int, warmup: int, first: float | None = None) -> float:
    """The median wall time of fn() followed by sync(), over `repeat` runs after `warmup`.
    `first`: the time of a run already made; without warm-up it counts as the first of
    the `repeat` (--quick's one run is then the checked step itself: in the simulator a
    step takes tens of seconds)."""
    for _ in range(warmup):
        fn()
        sync()
    times = [first] if first is not None and warmup == 0 else []
    while len(times) < repeat:
        times.append(timed(fn, sync)[1])
    return statistics.median(times)


# --- the devices ----------------------------------------------------------------------------
def cuda_device() -> tuple[object | None, str]:
    """(numba.cuda, a description of the device), or (None, why there is none)."""
    try:
        import numba
        from numba import cuda
    except ImportError as exc:
        return None, f"numba.cuda cannot be imported ({exc}); pip install 'gradverify[cuda]'"
    if numba.config.ENABLE_CUDASIM:
        return cuda, "numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)"
    if not cuda.is_available():
        return None, "numba.cuda.is_available() is false"
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    major, minor = dev.compute_capability
    return cuda, f"{name} (compute capability {major}.{minor})"


def torch_cuda() -> tuple[object | None, str]:
    """(torch, a description) when torch sees a CUDA device, else (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} sees no CUDA device"
    torch.backends.cuda.matmul.allow_tf32 = False    # full float32, as the engine computes
    return torch, (f"torch {torch.__version__} (CUDA {torch.version.cuda}) on "
                   f"{torch.cuda.get_device_name(0)}, TF32 off")


# --- the cases ------------------------------------------------------------------------------
def bench_matmul(cuda, torch, n: int, repeat: int, warmup: int) -> Row:
    import engine
    from engine import ops

    rng = np.random.default_rng(0)
    a_host = rng.standard_normal((n, n), dtype=np.float32)
    b_host = rng.standard_normal((n, n), dtype=np.float32)
    a, b = engine.input_tensor((n, n), "f32", name="a"), engine.input_tensor((n, n), "f32",
                                                                            name="b")
    out = ops.matmul(a, b).set_output()
    graph = engine.Graph([out])
    a.set(a_host)
    b.set(b_host)
    engine_s = median_seconds(lambda: graph.compute("cuda"), cuda.synchronize, repeat, warmup)
    got = out.numpy()
    torch_s = None
    if torch is not None:
        ta, tb = torch.from_numpy(a_host).cuda(), torch.from_numpy(b_host).cuda()
        torch_s = median_seconds(lambda: torch.matmul(ta, tb), torch.cuda.synchronize,
                                 repeat, warmup)
        want, against = torch.matmul(ta, tb).cpu().numpy(), "torch"
    else:
        want, against = a_host @ b_host, "numpy"
    err = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
    return Row(f"matmul {n}x{n} @ {n}x{n} f32", engine_s, torch_s, 2.0 * n ** 3,
               f"max |engine - {against}| / max |{against}| = {err:.2e}")


def mnist_batches(logical: int, physical: int, count: int = 3):
    """`count` logical batches, each a list of (images, one-hot labels, int labels) per
    physical batch: random images with MNIST's density."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        parts = []
        for _ in range(logical // physical):
            pixels = rng.integers(1, 256, (physical, 784)) * (rng.random((physical, 784))
                                                              < MNIST_DENSITY)
            labels = rng.integers(0, 10, physical)
            parts.append(((pixels / 256).astype(np.float32),
                          np.eye(10, dtype=np.float32)[labels], labels.astype(np.int64)))
        out.append(parts)
    return out


def engine_step(weights, logical: int, physical: int):
    """(step(parts), its trainer, its model): one engine training step on cuda."""
    from mnist_target.models import Model
    from mnist_target.run import TrainConfig, make_trainer

    model = Model("fc", weights)
    trainer = make_trainer(model, TrainConfig(batch_logical=logical, batch_physical=physical,
                                              backend="cuda"))

    def step(parts):
        return [trainer.eval_batch(x, onehot) for x, onehot, _ in parts]
    return step, trainer, model


def torch_step(torch, weights, logical: int, physical: int):
    """(step(parts), its net): the same step in torch on CUDA (mnist_target.torch_ref's
    accumulation: each physical batch's mean loss over k, one AdamW step)."""
    from mnist_target.torch_ref import torch_model

    net = torch_model("fc", weights).cuda()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    k = logical // physical

    def step(parts):
        opt.zero_grad(set_to_none=False)
        losses = []
        for x_host, _, y_host in parts:
            x, y = torch.from_numpy(x_host).cuda(), torch.from_numpy(y_host).cuda()
            logits = net(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            (loss / k if k > 1 else loss).backward()
            losses.append(loss.item())
            _ = int((logits.argmax(1) == y).sum())      # the engine's correct count
        opt.step()
        return losses
    return step, net


def step_flops(trainer) -> float:
    """2 M K N summed over the matmul nodes of the trainer's training graph, times the
    physical batches of a step."""
    per_batch = sum(2 * int(np.prod(t.shape)) * t.srcs[0].shape[-1]
                    for t in trainer.training.nodes if t.op == "matmul")
    return float(per_batch * trainer.opt_period)


def bench_mnist_step(cuda, torch, logical: int, physical: int, repeat: int,
                     warmup: int) -> Row:
    from mnist_target.models import Model

    weights = Model.new("fc", seed=0).weights()
    batches = mnist_batches(logical, physical)
    e_step, trainer, model = engine_step(weights, logical, physical)
    e_losses, e_first = timed(lambda: e_step(batches[0]), cuda.synchronize)
    note = f"first losses: engine {', '.join(f'{v:.6f}' for v in e_losses)}"
    torch_s = None
    if torch is not None:
        t_step, net = torch_step(torch, weights, logical, physical)
        t_losses, t_first = timed(lambda: t_step(batches[0]), torch.cuda.synchronize)
        names = {"fc1.weight": net[0].weight, "fc1.bias": net[0].bias,
                 "fc2.weight": net[2].weight, "fc2.bias": net[2].bias}
        got = model.weights()
        diff = max(float(np.max(np.abs(got[k] - v.detach().cpu().numpy())))
                   for k, v in names.items())
        note += (f"; torch {', '.join(f'{v:.6f}' for v in t_losses)}; params after one "
                 f"step: max |engine - torch| = {diff:.2e}")

    def run(step):
        order = itertools.cycle(batches)
        return lambda: step(next(order))
    engine_s = median_seconds(run(e_step), cuda.synchronize, repeat, warmup, e_first)
    if torch is not None:
        torch_s = median_seconds(run(t_step), torch.cuda.synchronize, repeat, warmup,
                                 t_first)
    return Row(f"MNIST FC step, batch {logical} ({logical // physical} x {physical}), AdamW",
               engine_s, torch_s, step_flops(trainer), note)


# --- rendering ------------------------------------------------------------------------------
HEADER = ("case", "engine ms", "torch ms", "engine/torch", "engine GFLOP/s", "torch GFLOP/s")


def table_rows(rows: list[Row]) -> list[tuple[str, ...]]:
    out = []
    for r in rows:
        absent = r.torch_s is None
        out.append((r.case, f"{r.engine_s * 1e3:.3f}",
                    "absent" if absent else f"{r.torch_s * 1e3:.3f}",
                    "n/a" if absent else f"{r.ratio:.2f}",
                    f"{r.flops / r.engine_s / 1e9:.1f}",
                    "n/a" if absent else f"{r.flops / r.torch_s / 1e9:.1f}"))
    return out


def markdown(rows: list[Row], meta: dict) -> str:
    lines = [f"engine: {meta['engine']}; torch: {meta['torch']}; median of "
             f"{meta['repeat']} runs after {meta['warmup']} warm-up runs", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(rows)]
    lines += [""] + [f"- {r.case}: {r.note}" for r in rows if r.note]
    return "\n".join(lines) + "\n"


def summary_line(rows: list[Row]) -> str:
    """One line: each case's engine GFLOP/s and engine/torch ratio."""
    parts = [f"{r.case}: engine {r.flops / r.engine_s / 1e9:.1f} GFLOP/s, "
             + ("torch absent" if r.torch_s is None else f"engine/torch {r.ratio:.2f}")
             for r in rows]
    return "bench_gpu: " + "; ".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, help=f"matmul size n (default {FULL['size']})")
    p.add_argument("--logical", type=int, help=f"MNIST logical batch ({FULL['logical']})")
    p.add_argument("--physical", type=int, help=f"MNIST physical batch ({FULL['physical']})")
    p.add_argument("--repeat", type=int, help=f"timed runs per figure ({FULL['repeat']})")
    p.add_argument("--warmup", type=int, help=f"untimed runs first ({FULL['warmup']})")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes, one run each (a smoke test; the only size the CUDA "
                        "simulator runs)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    args = p.parse_args(argv)
    sizes = dict(QUICK if args.quick else FULL)
    sizes.update({k: getattr(args, k) for k in sizes if getattr(args, k) is not None})
    if min(sizes[k] for k in ("size", "logical", "physical", "repeat")) < 1 \
            or sizes["warmup"] < 0:
        p.error("sizes, batches and --repeat must be at least 1, --warmup at least 0")
    if sizes["logical"] % sizes["physical"]:
        p.error(f"--physical {sizes['physical']} does not divide --logical "
                f"{sizes['logical']}")
    from engine.files import WriteError, first_unwritable, write_atomic
    problem = first_unwritable(args.markdown, args.json)   # before minutes of benchmarks
    if problem:
        print(f"bench_gpu: {problem}", file=sys.stderr)
        return 2

    cuda, device = cuda_device()
    if cuda is None:
        print(f"bench_gpu: no CUDA device found ({device}); run it on a machine with an "
              "NVIDIA GPU, or set NUMBA_ENABLE_CUDASIM=1 and pass --quick for a smoke test "
              "in numba's simulator", file=sys.stderr)
        return 2
    import numba
    if numba.config.ENABLE_CUDASIM and not args.quick:
        print("bench_gpu: under NUMBA_ENABLE_CUDASIM=1 only --quick runs (the simulator "
              "runs every CUDA thread in Python)", file=sys.stderr)
        return 2
    from engine.backends.cuda.launch import keep_to_one_cpu
    keep_to_one_cpu()       # under the simulator only: its threads run 5-10x faster on one CPU
    torch, torch_text = torch_cuda()
    meta = {"engine": f"cuda backend on {device}", "torch": torch_text, **sizes}
    print(f"engine: {meta['engine']}\ntorch: {torch_text}")

    rows = [bench_matmul(cuda, torch, sizes["size"], sizes["repeat"], sizes["warmup"]),
            bench_mnist_step(cuda, torch, sizes["logical"], sizes["physical"],
                             sizes["repeat"], sizes["warmup"])]
    text = markdown(rows, meta)
    print(text, end="")
    record = {"schema": SCHEMA, "meta": meta,
              "rows": [dict(dataclasses.asdict(r), ratio=r.ratio) for r in rows]}
    try:   # the one atomic writer of every tool (engine.files)
        if args.markdown:
            write_atomic(args.markdown, text)
        if args.json:
            write_atomic(args.json, json.dumps(record, indent=2) + "\n")
    except WriteError as exc:
        print(f"bench_gpu: {exc}", file=sys.stderr)
        return 2
    print(summary_line(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
