"""add1: x plus a one-element tensor c (ggml's ADD1).

c holds exactly one element: any shape whose sides are all 1 ((), (1,), (1, 1, 1, 1), ...,
ggml_is_scalar). Every element of x gets that element added:

    add1(x, c)[i] = x[i] + c[0, ..., 0]                       shape x.shape, dtype x.dtype

Gradients (add1 is linear in both inputs):

    d/dx = g                    d/dc = sum over every i of g[i], shaped as c

A composite op: c reshaped to x's rank (all ones) and added with numpy broadcasting, so the
gradient of c is add's broadcast reduction (sum_to) reshaped back to c's shape.
torch: x + c.reshape(()).
"""

from __future__ import annotations

from engine.errors import DTypeError, ShapeError
from engine.ops.shape import cont_if_strided, reshape
from engine.registry import OpDef, register, registered, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import BENCH_ELEMENTS, SQUARE, TRANSPOSED, bench_case, scale_case
from engine.strategies import MAX_ELEMENTS, draw_input, sample_strategy, shapes
from engine.tensor import is_float


def _check(x, c):
    if not is_float(x.dtype) or not is_float(c.dtype):
        raise DTypeError(f"add1: needs float inputs, got {x.dtype} and {c.dtype} for shapes "
                         f"{shapes_str(x, c)}")
    if x.dtype != c.dtype:
        raise DTypeError(f"add1: dtypes differ ({x.dtype} and {c.dtype}) for shapes "
                         f"{shapes_str(x, c)}; convert one explicitly (cast)")
    if any(d != 1 for d in c.shape):
        raise ShapeError(f"add1: c must hold exactly one element (every side 1), got shapes "
                         f"{shapes_str(x, c)}")


def add1(x, c):
    """x + c, c a tensor of one element (every side 1): that element added to every element
    of x; the result has x's shape and dtype."""
    _check(x, c)
    return registered.add(x, reshape(cont_if_strided(c), (1,) * x.ndim))


def _torch_add1(x, c):
    return x + c.reshape(())


# --- samples and registration ---------------------------------------------------------------
# (x shape, c shape): ggml's case (a 4-D x, a 4-D one-element c), ranks up and down, a 0-d c
CASES = [((3, 5, 4, 2), (1, 1, 1, 1)), ((10,), (1,)), ((4, 6), ()), ((2, 3, 4), (1,)),
         ((5,), (1, 1, 1)), ((1,), (1, 1)), ((7, 3), (1, 1))]


@both_dtypes
def _add1_samples(dtype):
    out = [Sample.make("add1", [InputSpec("x", s), InputSpec("c", cs)], dtype)
           for s, cs in CASES]
    # views of x: permuted, sliced, expanded (stride 0); c permuted and expanded (1 -> 1)
    out += [Sample.make("add1", [InputSpec("x", (3, 4, 5), permute=(2, 0, 1)),
                                 InputSpec("c", (1, 1), permute=(1, 0))], dtype),
            Sample.make("add1", [InputSpec("x", (4, 6), slice=((1, 5, 1), (0, 12, 2))),
                                 InputSpec("c", (1,))], dtype),
            Sample.make("add1", [InputSpec("x", (3, 5), expand=(0,)),
                                 InputSpec("c", (1, 1))], dtype)]
    return out


@sample_strategy
def _add1_strategy(draw, dtype):
    from hypothesis import strategies as st
    shape = draw(shapes(0, 4, 1, 5, max_size=MAX_ELEMENTS - 1))    # and c's one
    c_shape = (1,) * draw(st.integers(0, 4))
    return Sample.make("add1", [draw_input(draw, "x", shape),
                                draw_input(draw, "c", c_shape)], dtype)


def _add1_scale():
    """Scale cases: SQUARE plus one element, x contiguous and transposed (the add kernel's
    threaded split, c's gradient a sum over a million elements)."""
    return [scale_case("add1", [InputSpec("x", SQUARE, permute=p), InputSpec("c", (1, 1))])
            for p in (None, TRANSPOSED)]


def _add1_bench():
    """Bench case: BENCH_ELEMENTS plus one element (c's gradient a sum over all of them)."""
    return [bench_case("add1", [InputSpec("x", BENCH_ELEMENTS), InputSpec("c", (1, 1))])]


register(OpDef("add1", kind="composite", compose=add1, torch=_torch_add1,
               samples=_add1_samples, scale=_add1_scale, bench=_add1_bench,
               strategy=_add1_strategy,
               doc="x plus a one-element tensor c (every side 1); gradients: g for x, "
                   "sum(g) shaped as c for c"))
