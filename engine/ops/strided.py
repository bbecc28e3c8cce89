"""Strided views: strided_slice (an offset and a step per axis) and expand (stride 0).

    strided_slice(x, ((start, stop, step), ...))[k] = x[start + k step],
                                                     0 <= k < len(range(start, stop, step))
    expand(x, shape)[k] = x[k with 0 on every axis where x has side 1 and shape more]

per axis: numpy's x[start:stop:step] (step >= 1) and torch's x.expand(shape) (no new axes:
x has shape's number of axes). Both are views: the result aliases x (its strides are x's
times the steps, or 0 along an expanded axis), no copy; gradcheck's samples feed ops these
views of their leaves (engine.samples.InputSpec's `slice` and `expand`), so that every
kernel meets offsets, gaps between rows and elements, and broadcast inputs it must not
write through.

Both are linear. The gradient of strided_slice puts g at the view's places in zeros of x's
shape: on each stepped axis, g (n elements) gets step - 1 zeros after each element (a unit
axis padded to `step` and merged: n step elements, g at multiples of step), then the result
is cut to what fits and padded to x's side, `start` zeros before. The gradient of expand is
g summed over the expanded axes (engine.ops.broadcast.sum_to).
"""

from __future__ import annotations

import math

import numpy as np

from engine.errors import ParamError, ShapeError
from engine.ops.block import block
from engine.ops.broadcast import sum_to
from engine.ops.pad import pad
from engine.ops.shape import cont_if_strided, reshape
from engine.params import Params, int_rows_param, int_tuple, ints_param, show_value
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.strategies import draw_input, sample_strategy, shapes


# --- strided_slice ----------------------------------------------------------------------------
def _normalize_slices(slices, ndim: int) -> tuple[tuple[int, int, int], ...]:
    if not isinstance(slices, (tuple, list)):
        raise ParamError(f"strided_slice: slices must be (start, stop, step) triples, got "
                         f"{show_value(slices)}")
    triples = tuple(int_tuple("strided_slice", f"slices[{i}]", t, 3, None)
                    for i, t in enumerate(slices))
    if len(triples) != ndim:
        raise ParamError(f"strided_slice: one (start, stop, step) triple per axis: {ndim} "
                         f"axes, got {slices!r}")
    return triples


def _slice_infer(x, slices):
    if len(slices) != x.ndim:
        raise ShapeError(f"strided_slice: one (start, stop, step) triple per axis: {x.ndim} "
                         f"axes of shape {list(x.shape)}, got {len(slices)}")
    out = []
    for axis, ((start, stop, step), n) in enumerate(zip(slices, x.shape, strict=True)):
        if step < 1 or not 0 <= start < stop <= n:
            raise ShapeError(f"strided_slice: {start}:{stop}:{step} on axis {axis} of shape "
                             f"{list(x.shape)} (needs 0 <= start < stop <= side, step >= 1)")
        out.append(len(range(start, stop, step)))
    # contiguous: unit steps (or one element), and whole trailing axes after the first
    # axis of more than one element, as for block
    sized = [i for i, d in enumerate(out) if d != 1]
    contiguous = (x.contiguous and all(slices[i][2] == 1 for i in sized)
                  and all(out[i] == x.shape[i] for i in range(sized[0] + 1 if sized else 0,
                                                               x.ndim)))
    return tuple(out), x.dtype, contiguous


def strided_slice(x, slices):
    """x[start:stop:step, ...], one (start, stop, step) per axis (step >= 1): a view."""
    return make_node("strided_slice", (x,), slices=_normalize_slices(slices, x.ndim))


def _spread(g, axis: int, step: int):
    """g with step - 1 zeros after each element along `axis` (side n becomes n step)."""
    lead, n = math.prod(g.shape[:axis]), g.shape[axis]
    rest = math.prod(g.shape[axis + 1:])
    t = reshape(cont_if_strided(g), (lead, n, 1, rest))
    t = pad(t, ((0, 0), (0, 0), (0, step - 1), (0, 0)))
    return reshape(t, g.shape[:axis] + (n * step,) + g.shape[axis + 1:])


def _slice_backward(g, out, x, slices):
    for axis, (_, _, step) in enumerate(slices):
        if step > 1 and g.shape[axis] > 1:
            g = _spread(g, axis, step)
    # g's side on each axis, from start: the view's reach (n - 1) step + 1 at least, at
    # most what x has left
    fit = tuple(min(g.shape[i], n - start) for i, ((start, _, _), n)
                in enumerate(zip(slices, x.shape, strict=True)))
    if fit != g.shape:
        g = block(g, (0,) * g.ndim, fit)
    return (pad(g, tuple((start, n - start - f) for (start, _, _), n, f
                         in zip(slices, x.shape, fit, strict=True))),)


def _slice_view(ins, slices):
    return ins[0][tuple(slice(*t) for t in slices)]


def _torch_slice(x, slices):
    return x[tuple(slice(*t) for t in slices)]


# --- expand -------------------------------------------------------------------------------------
def _expand_infer(x, shape):
    if len(shape) != x.ndim or any(n != d and d != 1 for n, d in zip(shape, x.shape,
                                                                      strict=True)):
        raise ShapeError(f"expand: cannot expand shape {list(x.shape)} to {list(shape)} "
                         "(same number of axes; only axes of side 1 grow)")
    grown = any(n != d for n, d in zip(shape, x.shape, strict=True))
    return tuple(shape), x.dtype, x.contiguous and not grown


def expand(x, shape):
    """x repeated along its axes of side 1 to `shape` (as many axes as x): a view with
    stride 0 along them."""
    return make_node("expand", (x,), shape=int_tuple("expand", "shape", shape, None, None))


def _expand_view(ins, shape):
    x = ins[0]
    strides = tuple(0 if n != d else s for n, d, s in zip(shape, x.shape, x.strides,
                                                           strict=True))
    # writeable, as the other operands of a kernel are (one numba type for all); nothing
    # writes through a view op's result
    return np.lib.stride_tricks.as_strided(x, shape, strides)


# --- samples, strategies, registration ----------------------------------------------------------
SLICE_CASES = [((10,), ((2, 7, 1),)), ((10,), ((1, 10, 3),)),
               ((6, 8), ((1, 5, 1), (0, 8, 2))), ((5, 7), ((0, 5, 2), (2, 7, 1))),
               ((3, 4, 9), ((1, 2, 1), (0, 4, 1), (1, 8, 3))),
               ((2, 3, 4, 5), ((0, 2, 1), (1, 3, 1), (0, 4, 3), (1, 5, 2)))]
EXPAND_CASES = [((3, 1), (3, 4)), ((1, 5), (3, 5)), ((2, 1, 4), (2, 3, 4)),
                ((1, 3, 1), (2, 3, 5)), ((1,), (7,))]


@both_dtypes
def _slice_samples(dtype):
    out = [Sample.make("strided_slice", [InputSpec("x", s)], dtype, slices=t)
           for s, t in SLICE_CASES]
    # a sliced view of a sliced view, and a slice of a permuted leaf
    out.append(Sample.make("strided_slice", [InputSpec("x", (4, 4),
                                                       slice=((1, 5, 1), (0, 8, 2)))],
                           dtype, slices=((0, 4, 2), (1, 4, 1))))
    out.append(Sample.make("strided_slice", [InputSpec("x", (4, 6), permute=(1, 0))],
                           dtype, slices=((1, 4, 2), (0, 5, 2))))
    return out


@both_dtypes
def _expand_samples(dtype):
    out = [Sample.make("expand", [InputSpec("x", s)], dtype, shape=t) for s, t in EXPAND_CASES]
    out.append(Sample.make("expand", [InputSpec("x", (4, 1), permute=(1, 0))], dtype,
                           shape=(4, 3)))
    return out


@sample_strategy
def _slice_strategy(draw, dtype):
    """An input in a range of SIGNED, possibly a view itself, and a start, stop and step
    (1-3) per axis."""
    from hypothesis import strategies as st
    x_shape = draw(shapes(1, 4, 1, 7))
    slices = []
    for n in x_shape:
        start = draw(st.integers(0, n - 1))
        stop = draw(st.integers(start + 1, n))
        slices.append((start, stop, draw(st.integers(1, 3))))
    return Sample.make("strided_slice", [draw_input(draw, "x", x_shape)], dtype,
                       slices=tuple(slices))


@sample_strategy
def _expand_strategy(draw, dtype):
    """A target shape and an input with side 1 on some of its axes, in a range of SIGNED,
    possibly a view."""
    from hypothesis import strategies as st
    shape = draw(shapes(1, 4, 1, 5, max_size=120))
    x_shape = tuple(d if draw(st.booleans()) else 1 for d in shape)
    return Sample.make("expand", [draw_input(draw, "x", x_shape)], dtype, shape=shape)


register(OpDef("strided_slice", params=Params(dict(slices=int_rows_param(
                   3, 0, why="a view never starts before its base"))),
               kind="view", infer=_slice_infer, backward=_slice_backward,
               view=_slice_view, build=strided_slice, torch=_torch_slice,
               samples=_slice_samples, strategy=_slice_strategy,
               doc="x[start:stop:step, ...] as a view (an offset and strides); gradient: g "
                   "spread over zeros"))
register(OpDef("expand", params=Params(dict(shape=ints_param(0))), kind="view", infer=_expand_infer,
               backward=lambda g, out, x, shape: (sum_to(g, x.shape),),
               view=_expand_view, build=expand,
               torch=lambda x, shape: x.expand(shape), samples=_expand_samples,
               strategy=_expand_strategy,
               doc="x's axes of side 1 repeated to `shape` as a view (stride 0); gradient: "
                   "the sum over them"))


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("expand", "no mutant yet: its gradient is g summed back to x's shape (sum_to); "
                          "covered only by --inject scale")
mutation.exempt("strided_slice", "no mutant yet: its gradient spreads and pads g; covered only by"
                                 " --inject scale")
