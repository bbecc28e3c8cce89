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
- `draw_layout`: how the op sees an input: its leaf itself (most often), a permuted view,
  a sliced view (offset and steps, a border around it) or an expanded one (stride 0), as
  InputSpec keyword arguments;
- `draw_range`, `draw_input`: an input range drawn from a family of ranges that fits the
  op (one of the family's ranges, or a part of one), and an InputSpec with that range and
  a drawn layout;
- `draw_row_input`: the input of a row-wise op (softmax, the norms), rows along its last axis.

Input ranges are drawn: every input a strategy makes has `show_range` set, so its range is
part of the case's string (`x=[3,4]range[-8,8]`), its id and its seed, and the printed
repro (the repr) reproduces it. A family is a tuple of (kind, low, high) ranges, each
inside the op's domain and off its kinks: the shared ones below (SIGNED, MAGNITUDES,
DISTINCT) and the ops' own (engine.elementwise's rows: `domain`, `wide` and `special`,
the ranges around an activation's special points).

hypothesis is imported inside each function, so importing the engine does not import it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

from engine.samples import InputSpec
from engine.tensor import FLOAT_NAMES, dtype_name

# Input elements per case: the finite-difference check costs 4 graph evaluations each.
MAX_ELEMENTS = 300
# a sliced input's leaf (view and border) has at most this many elements more than its view
MAX_BORDER = 300

Range = tuple    # (kind, low, high): an engine.samples.InputSpec generator and its range

# plain values: moderate, huge and tiny magnitudes, and a large mean against a small spread
SIGNED: tuple[Range, ...] = (("uniform", -1.0, 1.0), ("uniform", -1e3, 1e3),
                             ("uniform", -1e-3, 1e-3), ("uniform", 2.0, 4.0))
# the rows of softmax and the norms: tiny to huge magnitudes, and a shifted row
MAGNITUDES: tuple[Range, ...] = (("uniform", -3.0, 3.0), ("uniform", -1e-3, 1e-3),
                                 ("uniform", -1.0, 1.0), ("uniform", -1e3, 1e3),
                                 ("uniform", 2.0, 4.0))
# no ties (max-pool, argmax): a grid over a moderate, a huge and a shifted range
DISTINCT: tuple[Range, ...] = (("distinct", -1.0, 1.0), ("distinct", -1e3, 1e3),
                               ("distinct", 2.0, 4.0))
NARROWINGS = 8   # a drawn part of a range: from one of its 8 equal parts to the next
# a 16-bit case's ranges are scaled so that their largest bound lies in this span: float16
# overflows at 65504 (exp(11), a square of 256) and has 11 bits, so that a thousand's
# products overflow and a thousandth's squares are subnormal; bfloat16 keeps 8 bits
HALF_SPAN = (1.0 / 16, 8.0)


@functools.cache
def _composite(draw_fn):
    """hypothesis' st.composite of a module-level `draw_fn(draw, *args)`, made once per
    function: st.composite reads the function's source (tokenize and ast, to warn about an
    unused `draw`), about 3 ms a call, and the strategies below are made afresh for every
    drawn case (flatmap, shapes that depend on drawn ones): made inside them, composites
    were 7.4 s of a warm `gradcheck --random 60` on six ops' 93 s of CPU (cProfile). The
    arguments go to the strategy instead, so each draw makes the same draws as before."""
    from hypothesis import strategies as st
    return st.composite(draw_fn)


def _built(draw, build, name):
    return build(draw, name)


def _half_built(draw, build, name):
    return half_ranged(build(draw, name))


def sample_strategy(build):
    """Decorator: `build(draw, dtype) -> Sample`, drawing with hypothesis' `draw`, becomes
    `strategy(dtype)` (dtype a float dtype: f16, bf16, f32, f64), which returns a hypothesis
    strategy of the op's Samples; the form OpDef.strategy takes."""
    @functools.wraps(build)
    def strategy(dtype="f32"):
        name = dtype_name(dtype)
        if name not in FLOAT_NAMES:
            raise ValueError(f"{build.__qualname__}: dtype must be one of "
                             f"{', '.join(FLOAT_NAMES)}, got {dtype!r}")
        return _composite(_half_built if name in ("f16", "bf16") else _built)(build, name)
    return strategy


def half_ranged(sample):
    """`sample` with its float inputs' ranges scaled into HALF_SPAN (their largest bound
    there, the range's shape kept; integer inputs as they are)."""
    lo, hi = HALF_SPAN

    def fit(spec):
        top = max(abs(spec.low), abs(spec.high))
        if spec.kind == "int" or (spec.dtype is not None and spec.dtype not in FLOAT_NAMES) \
                or top == 0 or lo <= top <= hi:
            return spec
        k = min(max(top, lo), hi) / top
        return dataclasses.replace(spec, low=spec.low * k, high=spec.high * k)
    return dataclasses.replace(sample, inputs=tuple(fit(s) for s in sample.inputs))


def shapes(min_dims=1, max_dims=3, min_side=1, max_side=5, max_size=MAX_ELEMENTS):
    """Shapes of min_dims..max_dims axes, each side in min_side..max_side, with at most
    max_size elements (sides are drawn in turn, each within what the budget leaves)."""
    if min_side ** min_dims > max_size:
        raise ValueError(f"shapes: {min_dims} axes of at least {min_side} exceed "
                         f"{max_size} elements")
    return _composite(_shape)(min_dims, max_dims, min_side, max_side, max_size)


def _shape(draw, min_dims, max_dims, min_side, max_side, max_size):
    from hypothesis import strategies as st
    ndim = draw(st.integers(min_dims, max_dims))
    while min_side ** ndim > max_size:
        ndim -= 1
    sides = []
    for i in range(ndim):
        budget = max_size // (math.prod(sides) * min_side ** (ndim - i - 1))
        sides.append(draw(st.integers(min_side, max(min_side, min(max_side, budget)))))
    return tuple(sides)


def broadcast_source(shape, min_dims=0):
    """Shapes that broadcast to `shape`: leading axes dropped (keeping at least min_dims),
    some of the rest set to 1."""
    return _composite(_source)(tuple(shape), min_dims)


def _source(draw, shape, min_dims):
    from hypothesis import strategies as st
    ndim = draw(st.integers(min(min_dims, len(shape)), len(shape)))
    return tuple(d if draw(st.booleans()) else 1 for d in shape[len(shape) - ndim:])


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
    return _composite(_axis)(kernel, stride, padding, dilation, max_side)


def _axis(draw, kernel, stride, padding, dilation, max_side):
    from hypothesis import strategies as st
    k = draw(st.integers(*kernel))
    d = draw(st.integers(*dilation))
    p = draw(st.integers(0, k // 2) if padding is None else st.integers(*padding))
    s = draw(st.integers(*stride))
    low = max(d * (k - 1) + 1 - 2 * p, 1)
    if low > max_side:
        raise ValueError(f"window_axis: extent {low} exceeds max_side {max_side}")
    return WindowAxis(draw(st.integers(low, max_side)), k, s, p, d)


def _clean(v: float) -> float:
    """v to 6 significant digits, as the case's string prints it."""
    return float(f"{v:.6g}")


def draw_range(draw, family, narrow=True) -> Range:
    """One range of `family` ((kind, low, high) ranges), or, when `narrow` and half of the
    time, a part of it: from the start of one of its NARROWINGS equal parts to the end of
    a later one (so at least an eighth of it; inside it, so off the kinks it is off)."""
    from hypothesis import strategies as st
    kind, low, high = draw(st.sampled_from(tuple(family)))
    if narrow and draw(st.booleans()):
        i = draw(st.integers(0, NARROWINGS - 1))
        j = draw(st.integers(i + 1, NARROWINGS))
        low, high = (low + (high - low) * i / NARROWINGS,
                     low + (high - low) * j / NARROWINGS)
    return kind, _clean(low), _clean(high)


def _slice_views(shape):
    """Slices of a leaf around a view of `shape`: per axis a start of 0-2 and a step of
    1-2 (at least one axis offset or stepped), the leaf at most MAX_BORDER elements more
    than the view; else the plain leaf ({})."""
    return _composite(_sliced)(shape)


def _sliced(draw, shape):
    from hypothesis import strategies as st
    triples = []
    for n in shape:
        start, step = draw(st.integers(0, 2)), draw(st.integers(1, 2)) if n > 1 else 1
        triples.append((start, start + (n - 1) * step + 1, step))
    if all(t[0] == 0 and t[2] == 1 for t in triples):
        start, stop, step = triples[-1]
        triples[-1] = (start + 1, stop + 1, step)
    leaf = math.prod(start + stop for start, stop, _ in triples)
    return {"slice": tuple(triples)} if leaf - math.prod(shape) <= MAX_BORDER else {}


def _expand_views(shape, longer, sliced):
    """Expansions of a view of `shape` along a non-empty set of the axes `longer` (longer
    than 1), the expanded axes at an offset (sliced to one element of two) when `sliced`."""
    return _composite(_expanded)(shape, longer, sliced)


def _expanded(draw, shape, longer, sliced):
    from hypothesis import strategies as st
    axes = tuple(sorted(draw(st.sets(st.sampled_from(longer), min_size=1))))
    layout = {"expand": axes}
    if sliced and draw(st.booleans()):
        starts = [draw(st.integers(0, 1)) for _ in shape]
        layout["slice"] = tuple((a, a + 1, 1) if i in axes else (0, d, 1)
                                for i, (a, d) in enumerate(zip(starts, shape, strict=True)))
    return layout


def draw_layout(shape, permute=True, sliced=True, expand=True):
    """InputSpec keyword arguments for how the op sees an input of `shape`: {} (its leaf,
    what hypothesis shrinks to), a permutation (2 axes or more), a slice or an expansion
    along axes longer than 1: any (expand True), none (False: inputs whose values must not
    repeat, such as the distinct inputs of max-pooling) or those of a tuple of axes."""
    from hypothesis import strategies as st
    shape = tuple(shape)
    options = [st.just({})]
    if permute and len(shape) >= 2:
        options.append(permutations(len(shape)).map(lambda p: {"permute": p} if p else {}))
    if sliced and shape:
        options.append(_slice_views(shape))
    allowed = range(len(shape)) if expand is True else expand or ()
    longer = [i for i in allowed if shape[i] > 1]
    if longer:
        options.append(_expand_views(shape, longer, sliced))
    return st.one_of(options)


def _expandable(kind: str, ndim: int, expand):
    """The axes draw_layout may expand for an input of `kind`: none of distinct values
    (they would tie), not the rows of probabilities (a repeated row is no distribution)."""
    if kind == "distinct" or expand is False:
        return False
    if kind in ("probs", "log_probs"):
        axes = range(ndim - 1) if expand is True else [a for a in expand if a != ndim - 1]
        return tuple(axes)
    return expand


def draw_input(draw, name, shape, family=SIGNED, narrow=True, layout=None, **spec) -> InputSpec:
    """An InputSpec of `shape` whose range is drawn from `family` (printed in the case's
    string) and whose layout is drawn by draw_layout(shape, **layout) (layout None: any;
    False: the leaf itself); `spec`: InputSpec's other fields (grad, dtype)."""
    kind, low, high = draw_range(draw, family, narrow)
    layout = {} if layout is None else layout
    if layout is not False:
        layout = {**layout, "expand": _expandable(kind, len(shape), layout.get("expand", True))}
    views = {} if layout is False else draw(draw_layout(shape, **layout))
    return InputSpec(name, tuple(shape), kind, low, high, show_range=True, **views, **spec)


def draw_row_input(draw, name, family=MAGNITUDES, grad=True, min_cols=1, layout=None):
    """For the strategies of the row-wise ops: an InputSpec of 1-4 axes and at most 150
    elements, rows of min_cols to 8 elements, its range drawn from `family`, its layout by
    draw_layout (`layout`: its keyword arguments). An expansion never runs along the rows:
    a constant row is where softmax's and the norms' gradients cancel to zero (a check of
    rounding, not of the op)."""
    from hypothesis import strategies as st
    lead = draw(shapes(0, 3, max_side=5, max_size=150 // min_cols))
    rows = math.prod(lead)
    shape = lead + (draw(st.integers(min_cols, max(min_cols, min(8, 150 // rows)))),)
    layout = {"expand": tuple(range(len(lead))), **(layout or {})}
    return draw_input(draw, name, shape, family, layout=layout, grad=grad)
