"""concat: two tensors joined along one axis (ggml's CONCAT, numpy's concatenate).

    concat(a, b, axis): a and b have one dtype, one number of axes and equal sizes on
    every axis but `axis`; out = a followed by b along `axis`:
    out[..., k, ...] = a[..., k, ...] for k < n_a,  b[..., k - n_a, ...] for k >= n_a.

concat is linear; its gradient slices g back: a gets block(g, 0, a.shape) and b gets
block(g, (0, ..., n_a, ..., 0), b.shape), both views of g.
"""

from __future__ import annotations

import math

from engine.backends.cpu.concat import cpu_concat
from engine.errors import DTypeError, ShapeError
from engine.ops.block import block
from engine.params import Params, int_param, integer
from engine.registry import OpDef, make_node, register, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import BENCH_ELEMENTS, SIDE, bench_case, scale_case
from engine.strategies import draw_input, sample_strategy, shapes
from engine.tensor import is_float


def _concat_infer(a, b, axis):
    if a.dtype != b.dtype or not is_float(a.dtype):
        raise DTypeError(f"concat: needs float inputs of one dtype, got {a.dtype} and "
                         f"{b.dtype} for shapes {shapes_str(a, b)}")
    if axis >= a.ndim:
        raise ShapeError(f"concat: axis {axis} out of range for shapes {shapes_str(a, b)}")
    if a.ndim != b.ndim or any(da != db for i, (da, db)
                               in enumerate(zip(a.shape, b.shape, strict=True)) if i != axis):
        raise ShapeError(f"concat: shapes {shapes_str(a, b)} must agree on every axis but "
                         f"axis {axis}")
    shape = list(a.shape)
    shape[axis] += b.shape[axis]
    return tuple(shape), a.dtype


def concat(a, b, axis):
    """a and b joined along `axis` (negative counts from the end)."""
    axis = integer("concat", "axis", axis)
    if not -a.ndim <= axis < a.ndim:
        raise ShapeError(f"concat: axis {axis} out of range for shapes {shapes_str(a, b)}")
    return make_node("concat", (a, b), axis=axis % a.ndim)


def _concat_backward(g, out, a, b, axis):
    offset = [0] * g.ndim
    offset[axis] = a.shape[axis]
    return block(g, (0,) * g.ndim, a.shape), block(g, offset, b.shape)


def _torch_concat(a, b, axis):
    import torch
    return torch.cat([a, b], dim=axis)


# --- samples and registration ---------------------------------------------------------------
A_SHAPE = (2, 3, 4, 5)


def _with(shape, axis, n):
    return tuple(n if i == axis else d for i, d in enumerate(shape))


@both_dtypes
def _concat_samples(dtype):
    # ggml: every axis of a 4-D pair, contiguous or not (here: permuted views)
    out = [Sample.make("concat", [InputSpec("a", A_SHAPE), InputSpec("b", _with(A_SHAPE, ax, 2))],
                       dtype, axis=ax) for ax in range(4)]
    out += [Sample.make("concat", [InputSpec("a", (7,)), InputSpec("b", (4,))], dtype, axis=0),
            Sample.make("concat", [InputSpec("a", (3, 4)), InputSpec("b", (3, 1))], dtype,
                        axis=-1)]
    for ax, pa, pb in [(0, (2, 0, 1), None), (1, None, (1, 2, 0)), (2, (2, 1, 0), (0, 2, 1))]:
        out.append(Sample.make("concat", [InputSpec("a", (3, 4, 5), permute=pa),
                                          InputSpec("b", _with((3, 4, 5), ax, 2), permute=pb)],
                               dtype, axis=ax))
    return out


@sample_strategy
def _concat_strategy(draw, dtype):
    from hypothesis import strategies as st
    shape = draw(shapes(1, 4, 1, 5, max_size=150))
    axis = draw(st.integers(0, len(shape) - 1))
    rest = math.prod(shape) // shape[axis]
    b_shape = _with(shape, axis, draw(st.integers(1, max(1, min(4, 150 // rest)))))
    inputs = [draw_input(draw, "a", shape), draw_input(draw, "b", b_shape)]
    return Sample.make("concat", inputs, dtype, axis=draw(st.sampled_from([axis,
                                                                          axis - len(shape)])))


def _concat_scale():
    """Scale cases: two halves of a (1031, 1031) joined along each axis; a (2048, 2063)
    and a one-column b joined along the last, a's block and a's gradient 16.1 MiB, the size
    from which the threads' copies stream (engine.backends.cpu.block.STREAM_MIN_BYTES:
    copy:streaming; a b as big as a would take the case past the scale tier's memory,
    tests/gradcheck/test_repro.py)."""
    return [scale_case("concat", [InputSpec("a", (SIDE, 515)), InputSpec("b", (SIDE, 516))],
                       axis=1),
            scale_case("concat", [InputSpec("a", (515, SIDE)), InputSpec("b", (516, SIDE))],
                       axis=0),
            scale_case("concat", [InputSpec("a", (2048, 2063)), InputSpec("b", (2048, 1))],
                       axis=1)]


def _concat_bench():
    """Bench case: two halves of BENCH_ELEMENTS joined along the last axis."""
    rows, cols = BENCH_ELEMENTS
    return [bench_case("concat", [InputSpec("a", (rows, cols // 2)),
                                  InputSpec("b", (rows, cols // 2))], axis=1)]


register(OpDef("concat", params=Params(dict(axis=int_param(
                   0, why="a node holds the axis counted from the front"))),
               scale=_concat_scale, bench=_concat_bench, infer=_concat_infer,
               backward=_concat_backward,
               kernels={"cpu": cpu_concat, "cuda": "engine.backends.cuda.indexing:cuda_concat"},
               build=concat, torch=_torch_concat,
               samples=_concat_samples, strategy=_concat_strategy,
               doc="a and b joined along an axis; gradient: the two blocks of g"))


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("concat", "no mutant yet: its gradient is two blocks of g; covered only by "
                          "--inject scale")
