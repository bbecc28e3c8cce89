"""Shape ops. reshape and permute are views (no copy); cont makes a contiguous copy;
broadcast_to materialises a numpy-style broadcast (its gradient is the broadcast reduction).

As in ggml, reshape needs a contiguous input: reshape a permuted view after `cont`.
"""

from __future__ import annotations

import math

import numpy as np

from engine.backends.cpu import elementwise as cpu
from engine.backends.cpu import threads
from engine.backends.cpu.block import broadcast_block
from engine.backends.cpu.patterns import as_patterns, native_half
from engine.errors import ParamError, ShapeError
from engine.ops.broadcast import broadcast_shapes, sum_to
from engine.params import Params, int_param, int_tuple, ints_param
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import BENCH_ELEMENTS, SQUARE, TRANSPOSED, bench_case, scale_case
from engine.strategies import (
    broadcast_source,
    draw_input,
    sample_strategy,
    shapes,
)

__all__ = ["cont_if_strided"]   # engine.ops exports it beside the ops


# --- reshape ---------------------------------------------------------------------------------
def _reshape_infer(x, shape):
    if not x.contiguous:
        raise ShapeError(f"reshape: input of shape {list(x.shape)} is a non-contiguous view "
                         "(from permute); apply cont() first")
    if math.prod(shape) != x.size:
        raise ShapeError(f"reshape: cannot reshape {list(x.shape)} ({x.size} elements) to "
                         f"{list(shape)}")
    return shape, x.dtype


def reshape(x, shape):
    """x with a new shape of the same size; one dimension may be -1."""
    shape = int_tuple("reshape", "shape",
                      shape if isinstance(shape, (tuple, list)) else (shape,), None, None)
    if shape.count(-1) > 1:
        raise ParamError(f"reshape: more than one -1 in {list(shape)}")
    if -1 in shape:
        rest = math.prod(d for d in shape if d != -1)
        if rest == 0 or x.size % rest:
            raise ShapeError(f"reshape: cannot reshape {list(x.shape)} to {list(shape)}")
        shape = tuple(x.size // rest if d == -1 else d for d in shape)
    return make_node("reshape", (x,), shape=shape)


def _reshape_backward(g, out, x, shape):
    return (reshape(contiguous_product(g), x.shape),)


def contiguous_product(g):
    """g made contiguous: cont_if_strided(g), except the transpose of a product, which
    is computed transposed instead (transposed_product). A reshape's backward needs its
    gradient contiguous; a matmul's backward hands the gradient of a transposed operand
    (conv_2d's `transpose(cols)`) as such a transpose, which cont would copy whole once
    more (conv_2d: N*OH*OW*C*KH*KW elements)."""
    if g.contiguous:
        return g
    return transposed_product(g) or cont(g)


def _is_swap(t) -> bool:
    """Whether t is a permute that swaps its last two axes (the matrix transpose)."""
    return (t.op == "permute"
            and t.params["axes"] == tuple(range(t.ndim - 2)) + (t.ndim - 1, t.ndim - 2))


def transposed_product(g):
    """For g the transpose of a (batched) matrix product, permute(a @ b) swapping the last
    two axes, the product b^T @ a^T: the same dot products written in g's layout, where
    copying the transposed view would be a pass of its own; None for any other g. A
    transposed operand is unwrapped (x^T^T is x). Meant for a gradient, whose product was
    built for this transpose alone: a product also read elsewhere would be computed
    twice."""
    if not _is_swap(g) or g.srcs[0].op != "matmul":
        return None
    a, b = g.srcs[0].srcs

    def t(x):
        return x.srcs[0] if _is_swap(x) else transpose(x)
    # by its registry name: engine.ops.matmul imports this module
    return make_node("matmul", (t(b), t(a)))


# --- permute / transpose ------------------------------------------------------------------------
def _permute_infer(x, axes):
    if sorted(axes) != list(range(x.ndim)):
        raise ShapeError(f"permute: axes {list(axes)} are not a permutation of the "
                         f"{x.ndim} axes of shape {list(x.shape)}")
    identity = tuple(axes) == tuple(range(x.ndim))
    return tuple(x.shape[a] for a in axes), x.dtype, identity and x.contiguous


def permute(x, axes):
    """numpy.transpose(x, axes): output axis i is input axis axes[i]. A strided view."""
    axes = int_tuple("permute", "axes", axes, None, None)
    return make_node("permute", (x,), axes=tuple(a + x.ndim if a < 0 else a for a in axes))


def _permute_backward(g, out, x, axes):
    return (permute(g, tuple(int(i) for i in np.argsort(axes))),)


def transpose(x, axis1=-2, axis2=-1):
    """Swap two axes (by default the last two, i.e. the matrix transpose). A view."""
    if x.ndim < 2:
        raise ShapeError(f"transpose: needs at least 2 axes, got shape {list(x.shape)}")
    for a in (axis1, axis2):
        if not -x.ndim <= a < x.ndim:
            raise ShapeError(f"transpose: axis {a} out of range for shape {list(x.shape)}")
    axes = list(range(x.ndim))
    a, b = axis1 % x.ndim, axis2 % x.ndim
    axes[a], axes[b] = axes[b], axes[a]
    return permute(x, tuple(axes))


# --- cont -----------------------------------------------------------------------------------------
def cont(x):
    """A contiguous copy of x (of a permuted view: its data in the view's order)."""
    return make_node("cont", (x,))


def cont_if_strided(x):
    """x itself if contiguous, else cont(x): for ops whose kernels read contiguous memory."""
    return x if x.contiguous else cont(x)


def contiguous_inputs(*tensors):
    """cont_if_strided of each tensor: the builders of the row-wise ops (softmax, norms,
    argmax, cross_entropy_loss) put it before their inputs."""
    return tuple(cont_if_strided(t) for t in tensors)


# --- broadcast_to ---------------------------------------------------------------------------------
def _broadcast_infer(x, shape):
    if broadcast_shapes("broadcast_to", x.shape, shape) != tuple(shape):
        raise ShapeError(f"broadcast_to: cannot broadcast {list(x.shape)} to {list(shape)}")
    return tuple(shape), x.dtype


def broadcast_to(x, shape):
    """x broadcast (numpy rules) to `shape`, materialised."""
    return make_node("broadcast_to", (x,),
                     shape=int_tuple("broadcast_to", "shape", shape, None, None))


@native_half
def cpu_broadcast_to(out, ins, shape):
    """A copy, of 16-bit floats as their patterns (nothing to widen; numpy copies
    ml_dtypes' bfloat16 element by element, uint16 as memory), broadcast to out's shape
    (a chunk's, when split): block.broadcast_block, whose compiled rows fill or copy
    (sum's gradient over all axes is one value everywhere, over the last axis a value per
    row)."""
    broadcast_block(as_patterns(out), as_patterns(ins[0]))


# big outputs in chunks along axis 0 on the engine's threads (split:cpu_broadcast_to): the
# gradient of a sum is its upstream gradient broadcast back, a pass over the summed tensor
_cpu_broadcast_to = native_half(threads.split(cpu_broadcast_to))


# --- samples and registration ---------------------------------------------------------------------
@both_dtypes
def _reshape_samples(dtype):
    return [Sample.make("reshape", [InputSpec("x", s)], dtype, shape=t)
            for s, t in [((12,), (3, 4)), ((2, 3, 4), (4, -1)), ((2, 3, 4, 5), (6, 20))]]


@both_dtypes
def _permute_samples(dtype):
    return [Sample.make("permute", [InputSpec("x", s)], dtype, axes=a)
            for s, a in [((3, 4), (1, 0)), ((2, 3, 4), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 1, 3)),
                         ((2, 3, 4, 5), (3, 2, 1, 0))]]


@both_dtypes
def _transpose_samples(dtype):
    return [Sample.make("transpose", [InputSpec("x", s)], dtype) for s in [(3, 4), (2, 3, 4)]]


@both_dtypes
def _cont_samples(dtype):
    return [Sample.make("cont", [InputSpec("x", (3, 4))], dtype)]


@both_dtypes
def _broadcast_samples(dtype):
    return [Sample.make("broadcast_to", [InputSpec("x", s)], dtype, shape=t)
            for s, t in [((4,), (3, 4)), ((3, 1), (2, 3, 5)), ((), (2, 2))]]


# --- strategies -----------------------------------------------------------------------------------
def _prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


@sample_strategy
def _reshape_strategy(draw, dtype):
    """A contiguous input reshaped to a random factorisation of its size (1s included),
    one axis sometimes given as -1."""
    from hypothesis import strategies as st
    x_shape = draw(shapes(min_dims=0, max_dims=4))
    factors = _prime_factors(math.prod(x_shape))
    ndim = draw(st.integers(1 if factors else 0, 4))
    target = [1] * ndim
    for f in factors:
        target[draw(st.integers(0, ndim - 1))] *= f
    if ndim and draw(st.booleans()):
        target[draw(st.integers(0, ndim - 1))] = -1
    return Sample.make("reshape", [draw_input(draw, "x", x_shape, layout=False)], dtype,
                       shape=tuple(target))


def _axis_order(draw, ndim):
    """A permutation of range(ndim), some axes written negative."""
    from hypothesis import strategies as st
    perm = draw(st.permutations(range(ndim)))
    return tuple(a - ndim if draw(st.booleans()) else a for a in perm)


@sample_strategy
def _permute_strategy(draw, dtype):
    """Any axis order (negative axes too) of a possibly already permuted input."""
    x_shape = draw(shapes(min_dims=1, max_dims=4))
    return Sample.make("permute", [draw_input(draw, "x", x_shape)], dtype,
                       axes=_axis_order(draw, len(x_shape)))


@sample_strategy
def _transpose_strategy(draw, dtype):
    """Two axes (possibly negative, possibly equal) of a possibly permuted input."""
    from hypothesis import strategies as st
    x_shape = draw(shapes(min_dims=2, max_dims=4))
    n = len(x_shape)
    return Sample.make("transpose", [draw_input(draw, "x", x_shape)],
                       dtype, axis1=draw(st.integers(-n, n - 1)),
                       axis2=draw(st.integers(-n, n - 1)))


@sample_strategy
def _cont_strategy(draw, dtype):
    """A contiguous copy of an input that is often a permuted view."""
    x_shape = draw(shapes(min_dims=1, max_dims=4))
    return Sample.make("cont", [draw_input(draw, "x", x_shape)], dtype)


@sample_strategy
def _broadcast_strategy(draw, dtype):
    """A target shape (0-d included) and a possibly permuted input that broadcasts to it."""
    shape = draw(shapes(min_dims=0, max_dims=4, max_side=4))
    x_shape = draw(broadcast_source(shape))
    return Sample.make("broadcast_to", [draw_input(draw, "x", x_shape)], dtype, shape=shape)


SHAPE = Params(dict(shape=ints_param(0, why="a node holds the shape with -1 resolved")))
register(OpDef("reshape", params=SHAPE,
               kind="view", infer=_reshape_infer, backward=_reshape_backward,
               view=lambda ins, shape: ins[0].reshape(shape), build=reshape,
               torch=lambda x, shape: x.reshape(shape), samples=_reshape_samples,
               strategy=_reshape_strategy,
               doc="a view with a new shape (input must be contiguous)"))
register(OpDef("permute", params=Params(dict(axes=ints_param(0))),
               kind="view", infer=_permute_infer, backward=_permute_backward,
               view=lambda ins, axes: ins[0].transpose(axes), build=permute,
               torch=lambda x, axes: x.permute(axes), samples=_permute_samples,
               strategy=_permute_strategy,
               doc="a strided view with axes reordered (numpy.transpose)"))
def _transpose_scale():
    """Scale case: SQUARE transposed (a view; its gradient a tiled copy)."""
    return [scale_case("transpose", [InputSpec("x", SQUARE)])]


def _transpose_bench():
    """Bench case: a (4096, 2048) matrix transposed (a view; its gradient a copy)."""
    return [bench_case("transpose", [InputSpec("x", BENCH_ELEMENTS[::-1])])]


register(OpDef("transpose", scale=_transpose_scale, bench=_transpose_bench, kind="composite",
               compose=transpose,
               params=Params(dict(axis1=int_param(default=-2), axis2=int_param(default=-1))),
               torch=lambda x, axis1=-2, axis2=-1: x.transpose(axis1, axis2),
               samples=_transpose_samples, strategy=_transpose_strategy,
               doc="swap two axes (default: last two); a view"))
def _cont_scale():
    """Scale cases: a transposed SQUARE (the tiled copy, ragged tiles, on the engine's
    threads) and a 3-D permuted view."""
    return [scale_case("cont", [InputSpec("x", SQUARE, permute=TRANSPOSED)]),
            scale_case("cont", [InputSpec("x", (131, 97, 89), permute=(2, 0, 1))])]


def _cont_bench():
    """Bench case: attention's heads made contiguous, a (B, T, H, D) = (8, 1024, 16, 64)
    leaf seen as (B, H, T, D)."""
    return [bench_case("cont", [InputSpec("x", (8, 16, 1024, 64), permute=(0, 2, 1, 3))])]


register(OpDef("cont", params={},
               infer=lambda x: (x.shape, x.dtype), backward=lambda g, out, x: (g,),
               scale=_cont_scale, bench=_cont_bench,
               kernels={"cpu": cpu.unary("cont"),
                        "cuda": "engine.backends.cuda.elementwise:cuda_cont"}, build=cont,
               torch=lambda x: x.contiguous(), samples=_cont_samples, strategy=_cont_strategy,
               doc="contiguous copy"))
def _broadcast_to_scale():
    """Scale cases: a row broadcast to SQUARE (its gradient: the sum over 1031 rows); one
    value broadcast to 16.1 MiB of float32, the size from which the threads' writes
    stream (block.STREAM_MIN_BYTES: broadcast:streaming)."""
    return [scale_case("broadcast_to", [InputSpec("x", (SQUARE[1],))], shape=SQUARE),
            scale_case("broadcast_to", [InputSpec("x", (1,))], shape=(2048, 2063))]


def _broadcast_to_bench():
    """Bench case: a row broadcast to BENCH_ELEMENTS (its gradient a sum over 2048 rows)."""
    return [bench_case("broadcast_to", [InputSpec("x", BENCH_ELEMENTS[1:])],
                       shape=BENCH_ELEMENTS)]


register(OpDef("broadcast_to", params=SHAPE,
               scale=_broadcast_to_scale, bench=_broadcast_to_bench, infer=_broadcast_infer,
               backward=lambda g, out, x, shape: (sum_to(g, x.shape),),
               kernels={"cpu": _cpu_broadcast_to,
                        "cuda": "engine.backends.cuda.elementwise:cuda_broadcast_to"},
               build=broadcast_to,
               torch=lambda x, shape: x.expand(shape).contiguous(),
               samples=_broadcast_samples, strategy=_broadcast_strategy,
               doc="numpy-style broadcast, materialised"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.backends.cpu import layout  # noqa: E402
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.kernels import prepared  # noqa: E402
from engine.mutation.patches import backward_replaced, prepare_replaced  # noqa: E402


def _permute_forward_axes(real):
    def backward(g, out, x, axes):
        return (permute(g, axes),)
    return backward


def _not_an_involution(case) -> bool:
    axes = case.kwargs["axes"]
    return any(axes[axes[i]] != i for i in range(len(axes)))


def _permute_cube_case(dtype):
    return [Sample.make("permute", [InputSpec("x", (3, 3, 3))], dtype, axes=(2, 0, 1))]


def tiled_copy_skips_ragged_rows(prepare):
    """cont of a transposed view: the tiled copy (copy:tiled) copies whole 8 x 8 tiles and
    the ragged columns, but not the rows past the last whole tile (x.shape[-2] % 8 of
    them, per thread's chunk), which are never written."""
    def mutated(out, ins, **params):
        run, tiled = prepared(prepare, out, ins, params, "copy:tiled")
        (x,) = ins
        whole = x.shape[-2] // 8 * 8
        if not tiled or whole == x.shape[-2]:
            return run
        return layout.copy_call(out[..., :whole, :], x[..., :whole, :])
    return mutated


mutation.register(
    Mutant("permute_grad_forward_axes", ("permute",),
           "permute's backward applies the forward axes instead of their inverse; invisible "
           "on swaps, a shape error on non-cubic 3-cycles (caught by shape check), wrong "
           "numbers on the extra cubic case (3,3,3)",
           lambda: backward_replaced("permute", _permute_forward_axes),
           where=_not_an_involution, extra=_permute_cube_case, kind="transposed gradient"),
    Mutant("tiled_copy_skips_ragged_rows", ("cont",),
           "cont's tiled transposed copy (copy:tiled) leaves the rows past the last whole "
           "8-row tile unwritten (1031 = 128 * 8 + 7; per thread's chunk)",
           lambda: prepare_replaced("cont", tiled_copy_skips_ragged_rows),
           where=lambda case: len(case.inputs[0].shape) == 2, tier="scale", max_cases=1,
           kind="unwritten edge"),
)
mutation.exempt("reshape", "no mutant yet: its gradient is g reshaped back to x's shape; "
                           "covered only by --inject scale")
mutation.exempt("broadcast_to", "no mutant yet: its gradient is g summed back to x's shape "
                                "(sum_to); covered only by --inject scale")
mutation.exempt("transpose", "composite: a permute, whose mutant permute_grad_forward_axes "
                             "covers its gradient")
