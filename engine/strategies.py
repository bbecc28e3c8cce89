"""Shared pieces of the ops' hypothesis strategies (the `OpDef.strategy` field).

An op's `strategy(dtype)` returns a hypothesis strategy of `Sample`s of that op: random
shapes and parameters, with the inputs kept off the op's kinks and ties exactly as its
hand-written samples keep them. The pieces here keep those strategies short:

- `sample_strategy`: decorator turning `build(draw, dtype) -> Sample` into `strategy(dtype)`;
- `shapes`: small shapes whose size stays within a budget (default MAX_ELEMENTS);
- `broadcast_source`, `broadcast_pair`: shapes that broadcast by numpy's rules;
- `permutations`: None or a non-identity axis order, for `InputSpec(permute=...)`;
- `window_axis`: one spatial axis of a sliding window (side, kernel, stride, padding,
  dilation) that fits at least one window;
- `draw_row_input`: the input of a row-wise op (softmax, the norms), rows along its last axis.

Input ranges stay fixed per op: an InputSpec's range is not part of the sample's string
form (its id and seed), so a drawn range would make two different cases print alike.

hypothesis is imported inside each function, so importing the engine does not import it.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from engine.samples import InputSpec
from engine.tensor import dtype_name

# Input elements per case: the finite-difference check costs 4 graph evaluations each.
MAX_ELEMENTS = 300


def sample_strategy(build):
    """Decorator: `build(draw, dtype) -> Sample`, drawing with hypothesis' `draw`, becomes
    `strategy(dtype)` (dtype "f32" or "f64"), which returns a hypothesis strategy of the
    op's Samples; the form OpDef.strategy takes."""
    @functools.wraps(build)
    def strategy(dtype="f32"):
        from hypothesis import strategies as st
        name = dtype_name(dtype)
        if name not in ("f32", "f64"):
            raise ValueError(f"{build.__qualname__}: dtype must be f32 or f64, got {dtype!r}")
        return st.composite(lambda draw: build(draw, name))()
    return strategy


def shapes(min_dims=1, max_dims=3, min_side=1, max_side=5, max_size=MAX_ELEMENTS):
    """Shapes of min_dims..max_dims axes, each side in min_side..max_side, with at most
    max_size elements (sides are drawn in turn, each within what the budget leaves)."""
    from hypothesis import strategies as st
    if min_side ** min_dims > max_size:
        raise ValueError(f"shapes: {min_dims} axes of at least {min_side} exceed "
                         f"{max_size} elements")

    @st.composite
    def shape(draw):
        ndim = draw(st.integers(min_dims, max_dims))
        while min_side ** ndim > max_size:
            ndim -= 1
        sides = []
        for i in range(ndim):
            budget = max_size // (math.prod(sides) * min_side ** (ndim - i - 1))
            sides.append(draw(st.integers(min_side, max(min_side, min(max_side, budget)))))
        return tuple(sides)
    return shape()


def broadcast_source(shape, min_dims=0):
    """Shapes that broadcast to `shape`: leading axes dropped (keeping at least min_dims),
    some of the rest set to 1."""
    from hypothesis import strategies as st
    shape = tuple(shape)

    @st.composite
    def source(draw):
        ndim = draw(st.integers(min(min_dims, len(shape)), len(shape)))
        return tuple(d if draw(st.booleans()) else 1 for d in shape[len(shape) - ndim:])
    return source()


def broadcast_pair(max_dims=4, max_side=4, max_size=MAX_ELEMENTS // 2):
    """Pairs of shapes that broadcast together; their broadcast (so each of them) has at
    most max_size elements. 0-d shapes included."""
    from hypothesis import strategies as st
    return shapes(0, max_dims, 1, max_side, max_size).flatmap(
        lambda out: st.tuples(broadcast_source(out), broadcast_source(out)))


def permutations(ndim):
    """None (a contiguous input) or an axis order other than the identity (the op then gets
    a strided view: `InputSpec(..., permute=...)`). Always None below 2 axes."""
    from hypothesis import strategies as st
    if ndim < 2:
        return st.none()
    identity = tuple(range(ndim))
    return st.none() | st.permutations(identity).map(
        lambda p: None if tuple(p) == identity else tuple(p))


class WindowAxis(NamedTuple):
    """One spatial axis of a sliding-window op: image side and the window's parameters."""

    side: int
    kernel: int
    stride: int
    padding: int
    dilation: int


def window_axis(kernel=(1, 3), stride=(1, 3), padding=None, dilation=(1, 1), max_side=9):
    """WindowAxis draws: kernel, stride and dilation in the given (low, high) ranges,
    padding in `padding` (None: 0..kernel//2, pool_2d's rule), and a side up to max_side
    (at least the extent d (k - 1) + 1 - 2 p, so the output has >= 1 element)."""
    from hypothesis import strategies as st

    @st.composite
    def axis(draw):
        k = draw(st.integers(*kernel))
        d = draw(st.integers(*dilation))
        p = draw(st.integers(0, k // 2) if padding is None else st.integers(*padding))
        s = draw(st.integers(*stride))
        low = max(d * (k - 1) + 1 - 2 * p, 1)
        if low > max_side:
            raise ValueError(f"window_axis: extent {low} exceeds max_side {max_side}")
        return WindowAxis(draw(st.integers(low, max_side)), k, s, p, d)
    return axis()


def draw_row_input(draw, name, kind="uniform", low=-3.0, high=3.0, grad=True, min_cols=1):
    """For the strategies of the row-wise ops: an InputSpec of 1-4 axes and at most 150
    elements, rows of min_cols to 8 elements, contiguous or a permuted view."""
    from hypothesis import strategies as st
    lead = draw(shapes(0, 3, max_side=5, max_size=150 // min_cols))
    rows = math.prod(lead)
    shape = lead + (draw(st.integers(min_cols, max(min_cols, min(8, 150 // rows)))),)
    return InputSpec(name, shape, kind, low, high, grad=grad,
                     permute=draw(permutations(len(shape))))
