"""repeat: x tiled to a shape (ggml's REPEAT), and its dedicated backward repeat_back.

x's shape s is left-padded with 1s to len(shape); every side of `shape` must be a
multiple r of the side of s (r >= 1). Per axis, tile t of r and position k of s:

    repeat(x, shape)[t*s + k] = x[k]                      (torch: x.repeat(r))
    repeat_back(g, s)[k]      = sum over tiles t of g[t*s + k]

The gradient of repeat is repeat_back(g, x.shape): each element of x collects the gradient
of every copy of it. repeat_back is linear, and its own gradient is repeat. A dedicated op,
because the composition (reshape g to (r0, s0, r1, s1, ...), then sum the r axes) needs a
contiguous copy of a strided g and leaves sum with interleaved axes it cannot merge.
"""

from __future__ import annotations

import math

import numpy as np

from engine.backends.cpu.repeat import cpu_repeat, cpu_repeat_back
from engine.errors import DTypeError, ShapeError
from engine.params import Params, int_tuple, ints_param
from engine.registry import OpDef, VJPOf, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import BENCH_ELEMENTS, SIDE, SQUARE, bench_case, scale_case
from engine.strategies import draw_input, sample_strategy, shapes
from engine.tensor import is_float


def repeats(op: str, small, big) -> tuple[int, ...]:
    """The repeat counts tiling shape `small` (left-padded with 1s) into `big`, or a
    ShapeError naming the op and both shapes."""
    if len(small) > len(big):
        raise ShapeError(f"{op}: cannot tile shape {list(small)} into {list(big)}, which has "
                         "fewer axes")
    padded = (1,) * (len(big) - len(small)) + tuple(small)
    if any(n < 1 or m < n or m % n for n, m in zip(padded, big, strict=True)):
        raise ShapeError(f"{op}: every side of {list(big)} must be a positive multiple of "
                         f"the matching side of {list(small)} (left-padded with 1s to "
                         f"{list(padded)})")
    return tuple(m // n for n, m in zip(padded, big, strict=True))


def _check_float(op, t):
    if not is_float(t.dtype):
        raise DTypeError(f"{op}: needs a float input, got {t.dtype} of shape {list(t.shape)}")


def _repeat_infer(x, shape):
    _check_float("repeat", x)
    repeats("repeat", x.shape, shape)
    return tuple(shape), x.dtype


def repeat(x, shape):
    """x tiled to `shape` (each side a multiple of x's, x's shape left-padded with 1s)."""
    return make_node("repeat", (x,), shape=int_tuple("repeat", "shape", shape, None))


def _repeat_back_infer(g, shape):
    _check_float("repeat_back", g)
    repeats("repeat_back", shape, g.shape)
    return tuple(shape), g.dtype


def repeat_back(g, shape):
    """The sum of the tiles of g, each of `shape`: the gradient of repeat(x) for x of
    `shape`."""
    return make_node("repeat_back", (g,),
                     shape=int_tuple("repeat_back", "shape", shape, None))


def _torch_repeat(x, shape):
    return x.repeat(repeats("repeat", tuple(x.shape), shape))


def _torch_repeat_back(g, shape):
    r = repeats("repeat_back", shape, tuple(g.shape))
    padded = (1,) * (g.ndim - len(shape)) + tuple(shape)
    tiles = g.reshape([v for pair in zip(r, padded, strict=True) for v in pair])
    return tiles.sum(dim=tuple(range(0, 2 * g.ndim, 2))).reshape(shape)


# --- samples and registration ---------------------------------------------------------------
X = (2, 3, 4, 5)


def _times(shape, reps):
    """The tiled shape: `shape` left-padded with 1s to len(reps), times reps."""
    shape = (1,) * (len(reps) - len(shape)) + tuple(shape)
    return tuple(n * r for n, r in zip(shape, reps, strict=True))


# ggml: a 2-fold repeat along each axis in turn, none, and all at once; plus rank growth
REPEAT_CASES = [(X, r) for r in [(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1),
                                 (1, 1, 1, 2)]] + \
    [((1, 2, 3, 4), (2, 2, 2, 2)), ((7,), (3,)), ((3,), (2, 4)), ((3, 1), (2, 2, 5)),
     ((4, 1, 5), (1, 3, 2))]


@both_dtypes
def _repeat_samples(dtype):
    out = [Sample.make("repeat", [InputSpec("x", s)], dtype, shape=_times(s, r))
           for s, r in REPEAT_CASES]
    out += [Sample.make("repeat", [InputSpec("x", (3, 4, 5), permute=p)], dtype,
                        shape=_times((3, 4, 5), r))
            for p, r in [((2, 0, 1), (2, 1, 2)), ((1, 2, 0), (1, 1, 3))]]
    return out


@both_dtypes
def _repeat_back_samples(dtype):
    # ggml: dx of shape (2, 4, 6, 8) with each axis tiled twice in turn; g contiguous or a
    # strided view
    dx = (2, 3, 4, 2)
    out = [Sample.make("repeat_back", [InputSpec("g", _times(dx, r))], dtype, shape=dx)
           for r in [(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2)]]
    out += [Sample.make("repeat_back", [InputSpec("g", g, permute=p)], dtype, shape=s)
            for g, p, s in [((4, 6, 4), (2, 0, 1), (2, 3, 2)), ((6, 4, 2), (1, 2, 0), (2, 2)),
                            ((2, 3, 12), None, (3, 4))]]
    # g a stride-0 broadcast (the backward of a sum over those axes hands one)
    out += [Sample.make("repeat_back", [InputSpec("g", g, expand=e)], dtype, shape=s)
            for g, e, s in [((4, 6, 4), (1,), (2, 3, 2)), ((6, 4, 2), (0, 2), (3, 2, 1))]]
    return out


def _repeat_back_primals(g, shape):
    """repeat_back(g, shape) is repeat's VJP for x of `shape` tiled to g's shape (repeat is
    linear: any x, here zeros)."""
    return {"x": np.zeros(shape)}, g, {"shape": tuple(g.shape)}


@sample_strategy
def _repeat_strategy(draw, dtype):
    from hypothesis import strategies as st
    x_shape = draw(shapes(1, 4, 1, 4, max_size=60))
    extra = draw(st.integers(0, 4 - len(x_shape)))
    reps = tuple(draw(st.integers(1, 3)) for _ in range(len(x_shape) + extra))
    while math.prod(reps) * math.prod(x_shape) > 600:
        reps = tuple(max(1, r - 1) for r in reps)
    return Sample.make("repeat", [draw_input(draw, "x", x_shape)], dtype,
                       shape=_times(x_shape, reps))


@sample_strategy
def _repeat_back_strategy(draw, dtype):
    from hypothesis import strategies as st
    x_shape = draw(shapes(1, 4, 1, 4, max_size=60))
    reps = tuple(draw(st.integers(1, 3)) for _ in range(len(x_shape) +
                                                         draw(st.integers(0, 1))))
    while math.prod(reps) * math.prod(x_shape) > 300:
        reps = tuple(max(1, r - 1) for r in reps)
    g_shape = _times(x_shape, reps)
    return Sample.make("repeat_back", [draw_input(draw, "g", g_shape)], dtype,
                       shape=x_shape)


def _repeat_scale():
    """Scale cases: a column and a row repeated to SQUARE (repeat_back sums 1031 copies)."""
    return [scale_case("repeat", [InputSpec("x", (SIDE, 1))], shape=SQUARE),
            scale_case("repeat", [InputSpec("x", (1, SIDE))], shape=SQUARE)]


SHAPE = Params(dict(shape=ints_param(0)))
def _repeat_bench():
    """Bench case: a row tiled to BENCH_ELEMENTS (repeat_back sums 2048 copies)."""
    return [bench_case("repeat", [InputSpec("x", (1, BENCH_ELEMENTS[1]))],
                       shape=BENCH_ELEMENTS)]


register(OpDef("repeat", params=SHAPE, scale=_repeat_scale, bench=_repeat_bench,
               infer=_repeat_infer,
               backward=lambda g, out, x, shape: (repeat_back(g, x.shape),),
               kernels={"cpu": cpu_repeat, "cuda": "engine.backends.cuda.indexing:cuda_repeat"},
               build=repeat, torch=_torch_repeat,
               samples=_repeat_samples, strategy=_repeat_strategy,
               doc="x tiled to a shape (each side a multiple of x's); gradient: repeat_back"))
register(OpDef("repeat_back", params=SHAPE, kind="backward", infer=_repeat_back_infer,
               adds_up=True,
               backward=lambda g, out, gin, shape: (repeat(g, gin.shape),),
               kernels={"cpu": cpu_repeat_back,
                        "cuda": "engine.backends.cuda.indexing:cuda_repeat_back"},
               build=repeat_back, torch=_torch_repeat_back,
               samples=_repeat_back_samples, strategy=_repeat_back_strategy,
               vjp_of=VJPOf("repeat", _repeat_back_primals),
               doc="the sum of g's tiles of a shape: the gradient of repeat; its own "
                   "gradient is repeat"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.kernels import reads_as_contiguous  # noqa: E402
from engine.mutation.patches import prepare_replaced  # noqa: E402

mutation.register(
    Mutant("repeat_back_reads_gradient_as_contiguous", ("repeat",),
           "repeat_back reads its incoming gradient in memory order, ignoring its strides: "
           "only the cotangent=permuted case hands it a strided gradient",
           lambda: prepare_replaced("repeat_back", reads_as_contiguous),
           where=lambda case: case.cotangent == "permuted", cotangents=True,
           kind="permuted stride"),
)
