"""The activations' float32 vector kernels alone against torch's ATen kernels, in ns an element.

    python bench/bench_vector_kernels.py                        # every op, 128K and 8M
    python bench/bench_vector_kernels.py --op tanh --op sigmoid --sizes 131072
    python bench/bench_vector_kernels.py --form lean     # a candidate form of sigmoid, tanh
    python bench/bench_vector_kernels.py --op silu --form float64    # the float64 math

bench_ops.py times whole graphs at 8M elements, where memory, the executor and the
allocator share the figure with the arithmetic. This times the kernels themselves, to say
which of those a miss comes from: the engine's serial float32 vector kernel of each op
(engine.backends.cpu.elementwise's `vector:<op>` path, forward and gradient, with the
op's float32 math: vector_unary.FAST) against torch's out= kernel of the same pass
(`aten.<op>.out`, and `aten.<op>_backward.grad_input`, which for sigmoid and tanh takes
the saved output, as torch's autograd does), on one thread each (`torch.set_num_threads(1)`;
the engine's serial compilation), into preallocated outputs, on 64-byte aligned arrays of
values uniform in [-6, 6]. Each figure is the median CPU time (time.process_time) of
--repeat calls, engine and torch taking turns call by call. At 131072 elements (512 KB an
array) the arrays stay in the second-level cache and the arithmetic sets the time; at 8M
memory adds to it. A benchmark, not a test: no target, no exit status but for bad input.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from tabulate import tabulate

from engine import elementwise as table
from engine.backends.cpu import elementwise
from engine.backends.cpu.vector_unary import F32_CANDIDATES, FAST

aten = torch.ops.aten
FLOAT64 = "float64"     # --form: FAST's float64 math, for any op (what float32 math replaced)


# op -> (torch forward into y, torch gradient into out); x, y = f(x), g as the engine's
TORCH = {
    "sigmoid": (lambda x, y: aten.sigmoid.out(x, out=y),
                lambda g, x, y, o: aten.sigmoid_backward.grad_input(g, y, grad_input=o)),
    "tanh": (lambda x, y: aten.tanh.out(x, out=y),
             lambda g, x, y, o: aten.tanh_backward.grad_input(g, y, grad_input=o)),
    "silu": (lambda x, y: aten.silu.out(x, out=y),
             lambda g, x, y, o: aten.silu_backward.grad_input(g, x, grad_input=o)),
    "gelu": (lambda x, y: aten.gelu.out(x, approximate="tanh", out=y),
             lambda g, x, y, o: aten.gelu_backward.grad_input(g, x, approximate="tanh",
                                                              grad_input=o)),
    "gelu_erf": (lambda x, y: aten.gelu.out(x, out=y),
                 lambda g, x, y, o: aten.gelu_backward.grad_input(g, x, grad_input=o)),
    "softplus": (lambda x, y: aten.softplus.out(x, 1, 20, out=y),
                 lambda g, x, y, o: aten.softplus_backward.grad_input(g, x, 1, 20,
                                                                      grad_input=o)),
}


def aligned(n: int) -> np.ndarray:
    """n float32 starting on a 64-byte boundary (torch's allocator aligns its tensors so)."""
    raw = np.empty(4 * n + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start:start + 4 * n].view(np.float32)


def engine_kernels(name: str, form: str | None = None):
    """(forward(x, y), gradient(g, x, out)): op `name`'s serial float32 vector kernels, with
    vector_unary.F32_CANDIDATES' `form` of its float32 math where given, or FAST's float64
    math (form `float64`: the op's functions without forward32 and gradient32)."""
    row, fast = table.UNARY[name], FAST[name]
    label = name        # the kernels' cache names: a form's own (numba's disk cache keys a
    if form == FLOAT64:     # kernel by its name and its sources' files, the same for all)
        fast = fast._replace(forward32=None, gradient32=None)
        label = f"{name}_{form}"
    elif form is not None:
        fast = fast._replace(forward32=F32_CANDIDATES[(name, "forward")][form],
                             gradient32=F32_CANDIDATES[(name, "gradient")][form])
        label = f"{name}_{form}"
    forward = elementwise._vector_kernels(
        elementwise._vector_map, elementwise._vector_map_reach, label, fast.forward,
        fast.reach, elementwise.scalar(row.forward), fast.forward16, "forward",
        fast.forward32)[elementwise.F32].serial
    gradient = elementwise._vector_kernels(
        elementwise._vector_gradient_map, elementwise._vector_gradient_map_reach, label,
        fast.gradient, fast.reach, elementwise.scalar(row.gradient), fast.gradient16,
        "gradient", fast.gradient32)[elementwise.F32].serial
    params = row.kernel_args(name, {})
    return (lambda x, y: forward(x, y, params),
            lambda g, x, o: gradient(g, x, o, params))


def alternate(calls, repeat: int) -> list[float]:
    """The median CPU seconds of each call, the calls taking turns `repeat` times (after one
    untimed turn)."""
    for c in calls:
        c()
    times = [[] for _ in calls]
    for _ in range(repeat):
        for c, t in zip(calls, times, strict=True):
            t0 = time.process_time()
            c()
            t.append(time.process_time() - t0)
    return [float(np.median(t)) for t in times]


def measure(name: str, n: int, repeat: int, form: str | None = None) -> list:
    """[op, n, engine fwd, torch fwd, ratio, engine grad, torch grad, ratio] in ns/element."""
    forward, gradient = engine_kernels(name, form)
    torch_forward, torch_gradient = TORCH[name]
    rng = np.random.default_rng(0)
    x, y, g, o = aligned(n), aligned(n), aligned(n), aligned(n)
    x[:] = rng.uniform(-6.0, 6.0, n)
    g[:] = rng.uniform(-1.0, 1.0, n)
    ty, to = aligned(n), aligned(n)
    tx, tg, tyt, tot = (torch.from_numpy(a) for a in (x, g, ty, to))
    torch_forward(tx, tyt)
    ef, tf, eg, tgr = alternate([lambda: forward(x, y), lambda: torch_forward(tx, tyt),
                                 lambda: gradient(g, x, o),
                                 lambda: torch_gradient(tg, tx, tyt, tot)], repeat)
    ns = 1e9 / n
    return [name, n, ef * ns, tf * ns, ef / tf, eg * ns, tgr * ns, eg / tgr]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", action="append", choices=sorted(TORCH),
                   help="time this op (repeatable; default: all of them)")
    p.add_argument("--sizes", default="131072,8388608",
                   help="comma-separated element counts (default 131072,8388608)")
    p.add_argument("--repeat", type=int, default=9, help="timed calls per figure (median)")
    forms = sorted({f for forms in F32_CANDIDATES.values() for f in forms} | {FLOAT64})
    p.add_argument("--form", choices=forms,
                   help="sigmoid's and tanh's float32 math in this form of "
                        "vector_unary.F32_CANDIDATES instead of FAST's; float64: any op's "
                        "float64 math")
    args = p.parse_args(argv)
    if args.form not in (None, FLOAT64) and not set(args.op or []) <= {"sigmoid", "tanh"}:
        p.error("--form applies to sigmoid and tanh only (--op), but for float64")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes: comma-separated integers, got {args.sizes!r}")
    if args.repeat < 1 or any(s < 1 for s in sizes):
        p.error("--repeat and every size must be >= 1")
    torch.set_num_threads(1)
    rows = []
    candidates = args.form not in (None, FLOAT64)
    for name in args.op or (["sigmoid", "tanh"] if candidates else sorted(TORCH)):
        for n in sizes:
            rows.append(measure(name, n, args.repeat, args.form))
            print(f"{name} {n}: forward {rows[-1][4]:.2f}, gradient {rows[-1][7]:.2f}",
                  file=sys.stderr, flush=True)
    print(f"torch {torch.__version__}, one thread each; median CPU time of {args.repeat} "
          f"alternating calls; ns an element{f'; form {args.form}' if args.form else ''}")
    print(tabulate(rows, headers=["op", "elements", "engine fwd", "torch fwd", "fwd ratio",
                                  "engine grad", "torch grad", "grad ratio"],
                   floatfmt=".2f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
