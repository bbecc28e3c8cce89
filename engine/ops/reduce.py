"""Reductions: sum over all or some axes, mean (a composite of sum and scale), and sum_rows
(ggml's SUM_ROWS: the sum over the last axis, kept as size 1; a composite of sum)."""

from __future__ import annotations

import math

from engine.backends.cpu.reduce import cpu_sum
from engine.errors import DTypeError, ParamError, ShapeError
from engine.ops.shape import broadcast_to, cont_if_strided, reshape
from engine.params import Params, axes_param, bool_param, boolean, int_tuple, ints_param
from engine.registry import OpDef, make_node, register, registered
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import (
    BENCH_DTYPE,
    BENCH_HALF_DTYPES,
    BENCH_ROWS,
    HALF_ROWS,
    HALF_SCALE_DTYPES,
    SQUARE,
    TRANSPOSED,
    bench_case,
    bench_cases,
    scale_case,
)
from engine.strategies import draw_input, sample_strategy, shapes
from engine.tensor import is_float


def normalize_axes(op: str, shape, axis) -> tuple[int, ...]:
    """Axes as a sorted tuple of non-negative ints; None means all axes."""
    ndim = len(shape)
    if axis is None:
        return tuple(range(ndim))
    axes = int_tuple(op, "axis", axis if isinstance(axis, (tuple, list)) else (axis,), None, None)
    out = []
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise ShapeError(f"{op}: axis {a} out of range for shape {list(shape)}")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ParamError(f"{op}: repeated axis in {axes}")
    return tuple(sorted(out))


def reduced_shape(shape, axes, keepdims) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _sum_infer(x, axes, keepdims):
    if not is_float(x.dtype):
        raise DTypeError(f"sum: needs a float input, got {x.dtype}")
    if normalize_axes("sum", x.shape, axes) != axes:
        raise ShapeError(f"sum: axes must be a sorted tuple of distinct axes of shape "
                         f"{list(x.shape)}, got {axes!r}")
    return reduced_shape(x.shape, axes, keepdims), x.dtype


def _sum_backward(g, out, x, axes, keepdims):
    # the incoming gradient may be a strided view (a permute's backward hands one), which
    # reshape refuses
    return (broadcast_to(reshape(cont_if_strided(g), reduced_shape(x.shape, axes, True)),
                         x.shape),)


def sum(x, axis=None, keepdims=False):  # noqa: A001  (the engine's op, like np.sum)
    """Sum of x over `axis` (an int, a tuple, or None for all axes)."""
    return make_node("sum", (x,), axes=normalize_axes("sum", x.shape, axis),
                     keepdims=boolean("sum", "keepdims", keepdims))


def mean(x, axis=None, keepdims=False):
    """Mean of x over `axis`: sum times 1/n, n the number of elements reduced."""
    axes = normalize_axes("mean", x.shape, axis)
    n = math.prod(x.shape[a] for a in axes)
    if n == 0:
        raise ShapeError(f"mean: the axes {list(axes)} of shape {list(x.shape)} hold no "
                         f"elements to average (it would divide by 0)")
    return registered.scale(sum(x, axes, keepdims), scale=1.0 / n)


def sum_rows(x):
    """ggml's SUM_ROWS: out[..., 0] = sum_j x[..., j], the last axis kept as size 1."""
    if x.ndim < 1:
        raise ShapeError(f"sum_rows: needs at least one axis, got shape {list(x.shape)}")
    return sum(x, -1, keepdims=True)


# every axis of a 4-D shape in turn (keepdims alternating), pairs, all axes, and ggml's
# row lengths (33 and 32 elements: an odd row and a whole number of SIMD lanes)
REDUCE_CASES = [((10,), None, False), ((3, 4), None, False), ((3, 4), 0, False),
                ((3, 4), 1, True), ((2, 3, 4), (0, 2), False), ((2, 3, 4, 5), (1, 3), True),
                ((2, 3, 4, 5), -1, False), ((2, 3, 4, 5), 0, True), ((2, 3, 4, 5), 1, False),
                ((2, 3, 4, 5), 2, True), ((2, 3, 4, 5), 3, True), ((2, 3, 4, 5), (0, 1, 2), False),
                ((33,), -1, True), ((8, 32), -1, True), ((8, 33), 0, False)]
# permuted inputs (ggml: row-contiguous but non-contiguous, and fully strided)
PERMUTED_CASES = [((3, 4, 5), (1, 2, 0), None), ((3, 4, 5), (1, 2, 0), 1),
                  ((3, 4, 5), (1, 2, 0), (0, 2)), ((2, 3, 4, 5), (0, 2, 1, 3), None),
                  ((2, 3, 4, 5), (3, 2, 1, 0), 2), ((2, 3, 4, 5), (0, 2, 1, 3), -1)]


# sliced (an offset and steps) and expanded (stride 0) inputs
VIEW_CASES = [((3, 4, 5), {"slice": ((0, 3, 1), (1, 5, 1), (0, 10, 2))}, 1),
              ((3, 4, 5), {"slice": ((1, 4, 1), (0, 8, 2), (1, 6, 1))}, None),
              ((3, 4, 5), {"expand": (1,)}, -1), ((3, 4, 5), {"expand": (0, 2)}, (0, 1)),
              ((2, 3, 6), {"slice": ((0, 2, 1), (1, 2, 1), (0, 12, 2)), "expand": (1,)}, None)]


def _samples(name):
    @both_dtypes
    def samples(dtype):
        return [Sample.make(name, [InputSpec("x", s)], dtype, axis=ax, keepdims=kd)
                for s, ax, kd in REDUCE_CASES] + [
            Sample.make(name, [InputSpec("x", s, permute=p)], dtype, axis=ax,
                        keepdims=False) for s, p, ax in PERMUTED_CASES] + [
            Sample.make(name, [InputSpec("x", s, **view)], dtype, axis=ax, keepdims=False)
            for s, view, ax in VIEW_CASES]
    return samples


def _strategy(name):
    @sample_strategy
    def strategy(draw, dtype):
        from hypothesis import strategies as st
        shape = draw(shapes(1, 4, 1, 6))
        ndim = len(shape)
        axes = draw(st.lists(st.integers(0, ndim - 1), unique=True, min_size=1,
                                  max_size=ndim))
        axis = draw(st.sampled_from([None, tuple(a - ndim if draw(st.booleans()) else a
                                                 for a in axes)]))
        if axis is not None and len(axis) == 1 and draw(st.booleans()):
            axis = axis[0]                      # a plain int
        return Sample.make(name, [draw_input(draw, "x", shape)], dtype, axis=axis,
                           keepdims=draw(st.booleans()))
    strategy.__name__ = f"_{name}_strategy"
    return strategy


# ggml's SUM_ROWS cases: a 4-D tensor (rows of 10 and 16), permuted with the rows kept
# (row-contiguous, non-contiguous) or moved (strided rows), one row, many rows
SUM_ROWS_CASES = [((2, 3, 4, 10), None), ((2, 3, 4, 16), None), ((33,), None), ((8, 33), None),
                  ((2, 3, 4, 10), (1, 2, 0, 3)), ((3, 2, 4, 6), (0, 2, 1, 3)),
                  ((4, 3, 10), (2, 0, 1)), ((4, 5, 6), (1, 0, 2))]


@both_dtypes
def _sum_rows_samples(dtype):
    return [Sample.make("sum_rows", [InputSpec("x", s, permute=p)], dtype)
            for s, p in SUM_ROWS_CASES]


@sample_strategy
def _sum_rows_strategy(draw, dtype):
    shape = draw(shapes(1, 4, 1, 8))
    return Sample.make("sum_rows", [draw_input(draw, "x", shape)], dtype)


def _torch_reduce(fn):
    def ref(x, axis=None, keepdims=False):
        if axis is None:
            r = fn(x)
            return r.reshape([1] * x.ndim) if keepdims else r
        return fn(x, dim=axis, keepdim=keepdims)
    return ref


def _sum_scale():
    """Scale cases (engine.scale_cases): a whole-tensor sum (chunked, each chunk's
    accumulators private), a sum over 1.5 million rows (float32 data, float64 accumulator
    rows: a float32 accumulator errs 10^4 times more there), a sum of contiguous runs
    (kept elements as ranges on the engine's threads), a channel's bias gradient (the sum
    of (N, C, H, W) over N, H and W: many short runs added eight at a time,
    sum:runs_grouped; N = 547 leaves three runs after the last eight, H W = 121 two blocks
    of lanes, the second partial), a transposed input; in float16 and
    bfloat16 a whole-tensor sum, a sum over the rows of positive values (HALF_ROWS) and
    one along the rows (16-bit runs in vector lanes: the path sum:lanes)."""
    positive = dict(kind="uniform", low=0.5, high=1.0, show_range=True)
    return [scale_case("sum", [InputSpec("x", SQUARE)], axis=None, keepdims=False),
            scale_case("sum", [InputSpec("x", (1500007, 3))], axis=0, keepdims=False),
            scale_case("sum", [InputSpec("x", SQUARE)], axis=1, keepdims=True),
            scale_case("sum", [InputSpec("x", (547, 16, 11, 11))], axis=(0, 2, 3),
                       keepdims=True),
            scale_case("sum", [InputSpec("x", SQUARE, permute=TRANSPOSED)], axis=0,
                       keepdims=False)] + [
        case for dtype in HALF_SCALE_DTYPES for case in (
            scale_case("sum", [InputSpec("x", SQUARE)], dtype, axis=None, keepdims=False),
            scale_case("sum", [InputSpec("x", HALF_ROWS, **positive)], dtype, axis=0,
                       keepdims=False),
            scale_case("sum", [InputSpec("x", SQUARE)], dtype, axis=1, keepdims=False))]


def _sum_bench():
    """Bench cases: the row sums of BENCH_ROWS (4096 rows of 4096), in float32, float16 and
    bfloat16, the sum of all of it, and a convolution's bias gradient (the sum of MNIST's
    CNN's second convolution output, (500, 16, 14, 14), over images and pixels)."""
    x = [InputSpec("x", BENCH_ROWS)]
    return bench_cases("sum", x, (BENCH_DTYPE, *BENCH_HALF_DTYPES), axis=-1,
                       keepdims=False) + [
        bench_case("sum", x, axis=None, keepdims=False),
        bench_case("sum", [InputSpec("x", (500, 16, 14, 14))], axis=(0, 2, 3), keepdims=True)]


register(OpDef("sum", params=Params(dict(axes=ints_param(0), keepdims=bool_param())),
               scale=_sum_scale, bench=_sum_bench, infer=_sum_infer, backward=_sum_backward,
               kernels={"cpu": cpu_sum, "cuda": "engine.backends.cuda.reduce:cuda_sum"},
               build=sum, samples=_samples("sum"),
               strategy=_strategy("sum"), adds_up=True,
               torch=_torch_reduce(lambda x, **k: x.sum(**k)),
               doc="sum over axes (all by default), optionally keeping them as size 1"))
def _mean_scale():
    """Scale cases: the mean of everything and of the rows (sum's paths, then a scale)."""
    return [scale_case("mean", [InputSpec("x", SQUARE)], axis=None, keepdims=False),
            scale_case("mean", [InputSpec("x", SQUARE)], axis=-1, keepdims=False)]


def _mean_bench():
    """Bench case: the mean of each row of BENCH_ROWS."""
    return [bench_case("mean", [InputSpec("x", BENCH_ROWS)], axis=-1, keepdims=False)]


register(OpDef("mean", scale=_mean_scale, bench=_mean_bench, kind="composite", compose=mean,
               params=Params(dict(axis=axes_param(), keepdims=bool_param(default=False))),
               samples=_samples("mean"),
               strategy=_strategy("mean"),
               torch=_torch_reduce(lambda x, **k: x.mean(**k)),
               doc="mean over axes: sum * (1/n)"))
def _sum_rows_scale():
    """Scale case: the sum along the rows of SQUARE."""
    return [scale_case("sum_rows", [InputSpec("x", SQUARE)])]


def _sum_rows_bench():
    """Bench case: the row sums of BENCH_ROWS, kept as a column."""
    return [bench_case("sum_rows", [InputSpec("x", BENCH_ROWS)])]


register(OpDef("sum_rows", kind="composite", compose=sum_rows, samples=_sum_rows_samples,
               scale=_sum_rows_scale, bench=_sum_rows_bench,
               strategy=_sum_rows_strategy, torch=lambda x: x.sum(dim=-1, keepdim=True),
               doc="ggml's SUM_ROWS: sum over the last axis, kept as size 1"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
import functools  # noqa: E402  (imported here, with the declarations that use them)

import numpy as np  # noqa: E402

from engine import mutation  # noqa: E402
from engine.backends.cpu import threads  # noqa: E402
from engine.backends.cpu.reduce import SumInChunks, add_partials  # noqa: E402
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.kernels import prepared, reads_as_contiguous, unwritten  # noqa: E402
from engine.mutation.patches import half_kernel_replaced, prepare_replaced  # noqa: E402
from engine.tensor import is_half  # noqa: E402


def sum_chunks_drop_tail(prepare):
    """sum:chunks: when x.size is not a multiple of the chunk count, the last chunk stops
    one element short (its bound taken as size - 1): the last element is never added."""
    def mutated(out, ins, **params):
        run, chunked = prepared(prepare, out, ins, params, "sum:chunks")
        if not chunked:
            return run
        x_flat, acc = run.args[0], run.args[1]          # SumInChunks's
        if x_flat.size % acc.shape[0] == 0:
            return run
        return SumInChunks(x_flat[:-1], *run.args[1:])
    return mutated


def sum_chunks_overlap(prepare):
    """sum:chunks: each chunk runs one element past its bound (an inclusive end), so the
    first element of every chunk after the first is added twice."""
    def mutated(out, ins, **params):
        run, chunked = prepared(prepare, out, ins, params, "sum:chunks")
        if not chunked:
            return run
        x_flat, acc, flat_out = run.args[0], run.args[1], run.args[2]
        size = -(-x_flat.size // acc.shape[0])          # the kernel's chunk length

        def call():
            run()
            again = x_flat[size::size][:acc.shape[0] - 1]
            flat_out[0] += np.sum(again, dtype=np.float64)
        return call
    return mutated


def sum_chunks_split_drops_tail(prepare):
    """sum:chunks_split: the ranges of chunks given to the threads are nchunks // parts
    long each, so the last nchunks % parts chunks are never summed: their partials hold
    0, as fresh memory would (the scratch's stale partials of an earlier run could hold the
    right values, and the bug pass by luck of the allocator)."""
    def mutated(out, ins, **params):
        run, split = prepared(prepare, out, ins, params, "sum:chunks_split")
        if not split:
            return run
        x_flat, acc, flat_out, fmt, parts, chunks = run.args  # SumInChunks's
        per = acc.shape[0] // parts
        if per * parts == acc.shape[0]:
            return run

        def call():
            acc[per * parts:, 0] = 0.0
            threads.side_by_side([functools.partial(chunks, x_flat, acc, i * per,
                                                    (i + 1) * per, fmt)
                                  for i in range(parts)])()
            add_partials(acc, flat_out, fmt)
        return call
    return mutated


def sum_rows_float32_accumulator(prepare):
    """sum:rows: the rows added into one accumulator row of the input's dtype (float32 for
    a float32 x) instead of float64 rows, one per chunk: a chain of float32 additions as
    long as the reduced axis (over 1.5 million rows a relative error of about 1e-5, well
    inside float32's fixed tolerance of 1e-3, 23 times torch's float32 error)."""
    def mutated(out, ins, **params):
        run, chunked = prepared(prepare, out, ins, params, "sum:rows")
        if not chunked:
            return run
        # call(_sum_rows, x, rows, run, acc, out, fmt)
        x, acc = ins[0], run.args[3]
        return functools.partial(run.func, *run.args[:3], np.empty((1, acc.shape[1]), x.dtype),
                                 *run.args[4:])
    return mutated


def sum_runs_split_drops_tail(prepare):
    """sum:runs_split: the ranges of kept elements given to the threads are n // parts
    long each, so the last n % parts kept elements are never summed (never written)."""
    def mutated(out, ins, **params):
        run, split = prepared(prepare, out, ins, params, "sum:runs_split")
        parts = threads.parts()
        covered = out.size // parts * parts
        if not split or covered == out.size:
            return run
        return unwritten(run, out.reshape(-1), slice(covered, None))
    return mutated


def sum_runs_grouped_drops_leftover_runs(prepare):
    """sum:runs_grouped: the runs left after the last full group of eight (N mod 8 of a
    bias gradient's N images) are never added, the remainder loop forgotten. On one thread
    (the kernel bound whole); the scale tier runs every thread count."""
    def mutated(out, ins, **params):
        run, grouped = prepared(prepare, out, ins, params, "sum:runs_grouped")
        if not grouped or not isinstance(run, functools.partial):
            return run
        base, kept, reduced, n, group, acc, flat_out, fmt = run.args   # _sum_runs's
        full = reduced.size // 8 * 8
        if full == reduced.size:
            return run
        return functools.partial(run.func, base, kept, reduced[:full], n, group, acc,
                                 flat_out, fmt)
    return mutated


def sum_accumulated_in_half(real_sum):
    """sum on 16-bit nodes accumulated serially in the 16-bit type (each partial sum rounded
    to nearest in it) instead of in float32: over 256 rows of values in [0.5, 1] the
    partial sums reach 256, where float16's spacing is 0.25."""
    def mutated(out, ins, axes, keepdims):
        (x,) = ins
        if not is_half(out.dtype):
            return real_sum(out, ins, axes=axes, keepdims=keepdims)
        reduced = [a % x.ndim for a in axes]
        kept = [a for a in range(x.ndim) if a not in reduced]
        rows = np.transpose(x, reduced + kept).reshape(-1, *[x.shape[a] for a in kept])
        out[...] = np.add.accumulate(rows, axis=0, dtype=out.dtype)[-1].reshape(out.shape)
    return mutated


def _axis(axis):
    return lambda case: case.kwargs.get("axis") == axis and mutation.contiguous(case)


mutation.register(
    Mutant("sum_reads_permuted_input_as_contiguous", ("sum",),
           "sum reads a permuted input in memory order, ignoring its strides: invisible in "
           "a whole-tensor sum, wrong in a sum over some axes of a permuted input",
           lambda: prepare_replaced("sum", reads_as_contiguous),
           where=lambda case: mutation.permuted(case) and case.kwargs.get("axis") is not None,
           kind="permuted stride"),
    Mutant("sum_chunks_drop_tail", ("sum",),
           "the whole-tensor sum in chunks (sum:chunks, from 8,192 elements) drops the last "
           "element when the size is not a multiple of the chunk count",
           lambda: prepare_replaced("sum", sum_chunks_drop_tail),
           where=_axis(None), tier="scale", max_cases=1, kind="dropped tail"),
    Mutant("sum_chunks_overlap", ("sum",),
           "the whole-tensor sum in chunks (sum:chunks) runs each chunk one element past its "
           "end: the first element of every later chunk is added twice",
           lambda: prepare_replaced("sum", sum_chunks_overlap),
           where=_axis(None), tier="scale", max_cases=1, kind="chunk boundary"),
    Mutant("sum_chunks_split_drops_tail", ("sum",),
           "the whole-tensor sum's chunks on the engine's threads (sum:chunks_split) in "
           "ranges of nchunks // threads: the last nchunks % threads chunks are never "
           "summed", lambda: prepare_replaced("sum", sum_chunks_split_drops_tail),
           where=_axis(None), tier="scale", max_cases=1, kind="dropped tail"),
    Mutant("sum_rows_float32_accumulator", ("sum",),
           "the sum over rows (sum:rows, from 2^17 elements) adds 1.5 million rows into one "
           "float32 accumulator row instead of float64 rows per chunk: a relative error "
           "of 1e-5, within float32's fixed tolerance; the precision verdict catches it",
           lambda: prepare_replaced("sum", sum_rows_float32_accumulator),
           where=_axis(0), tier="scale", max_cases=1, kind="float32 accumulator"),
    Mutant("sum_runs_split_drops_tail", ("sum",),
           "the kept elements' sums on the engine's threads (sum:runs_split) in ranges of "
           "n // threads: the last n % threads elements are never summed (NaN on reused "
           "memory)", lambda: prepare_replaced("sum", sum_runs_split_drops_tail),
           where=_axis(1), tier="scale", max_cases=1, kind="dropped tail"),
    Mutant("sum_runs_grouped_drops_leftover_runs", ("sum",),
           "the sum of many short runs eight at a time (sum:runs_grouped, a channel's bias "
           "gradient) never adds the runs left after the last group of eight",
           lambda: prepare_replaced("sum", sum_runs_grouped_drops_leftover_runs),
           where=lambda case: isinstance(case.kwargs.get("axis"), (list, tuple))
           and tuple(case.kwargs["axis"]) == (0, 2, 3), tier="scale",
           max_cases=1, kind="dropped tail"),
    Mutant("sum_f16_accumulated_in_f16", ("sum",),
           "sum on float16 nodes accumulates serially in float16 (every partial sum rounded) "
           "instead of float32: over 320 rows of values in [0.5, 1] the sums err some 14 "
           "times (bar 8) what torch does, within float16's fixed tolerance",
           lambda: half_kernel_replaced("sum", sum_accumulated_in_half),
           where=lambda case: case.dtype == "f16" and case.kwargs.get("axis") == 0,
           tier="scale", max_cases=1, kind="16-bit accumulator"),
)
mutation.exempt("mean", "composite: sum scaled by 1/n; sum's mutants and --inject scale "
                        "cover its gradient")
mutation.exempt("sum_rows", "composite: sum over the last axis (keepdims), whose mutants "
                            "cover it")
