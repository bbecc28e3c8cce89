"""Known bugs, each patched into the registry for one check, to prove gradcheck's power.

A mutant is a named, documented bug in one op: in its backward rule, or in one of its CPU
kernels (a backward op's, a forward one, its thread split, a fast path: the makers are in
gradcheck.kernel_mutants). `mutant.patch()` puts the bug in place and restores the registry
afterwards (the very same objects), even on error (gradcheck.patches). Kernel mutants wrap
the real kernel: they call it with wrong parameters, bounds, slices or accumulators, or
call it and then corrupt its result the way the bug would.

Each mutant has a `kind` (KINDS) and a `tier`, the cheapest tier of cases that sees it:
- "fast": the registry's small samples (OpDef.samples). A mutant of a forward kernel also
  changes the float64 reference there (our engine's float64 graph runs the same kernels),
  so it is caught against torch, or by NaN where the bug leaves memory unwritten;
- "scale": the ops' scale cases (OpDef.scale, gradcheck.scale), for a bug in a fast path
  that no small case takes (a split over threads, the chunked sums, the tiled copy, the
  zero-skipping product, a big scatter). Such a bug is never taken in plain mode, which
  makes the scale tier's float64 reference, so the reference stays right.

`ops` names the ops whose cases must catch the bug; `where` keeps the cases that exercise
it (an im2col case without dilation cannot show a dilation bug); `extra` adds cases the
registry lacks. CONTROL, the machinery with no bug, must not be flagged (gradcheck.selftest).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable

import numpy as np

from engine import ops
from engine.backends.alibi_math import alibi_slope
from engine.ops.broadcast import sum_to
from engine.ops.softmax import n_heads
from engine.registry import get_op
from engine.samples import InputSpec, Sample
from engine.scale_cases import SIDE
from engine.tensor import constant
from gradcheck import kernel_mutants as km
from gradcheck.patches import (
    all_of,
    backward_replaced,
    chunks_replaced,
    half_function_replaced,
    half_kernel_replaced,
    kernel_replaced,
    prepare_replaced,
    scaled_backward,
)

KINDS = {
    "scaled gradient": "a gradient multiplied by a wrong factor",
    "transposed gradient": "a gradient in the wrong axis order",
    "dropped term": "a term of the gradient's formula left out",
    "wrong broadcast reduction": "a broadcast input's gradient summed over the wrong axes",
    "off-by-one window": "a pooling or im2col window (or its gradient) in the wrong cells",
    "wrong branch": "one piece of a piecewise derivative wrong",
    "chunk boundary": "a chunk of a split or chunked kernel ending one element off",
    "scatter race": "a parallel scatter-add whose threads write one element: adds lost",
    "float32 accumulator": "a sum accumulated in float32 where the kernel promises float64",
    "dropped tail": "the last elements of a row, a chunking or a sparse row not computed",
    "permuted stride": "a permuted (strided) input read in memory order, as if contiguous",
    "broadcast split": "a thread split that slices a broadcast operand with the output",
    "unwritten edge": "part of the output never written: right only on a zeroed buffer",
    "16-bit accumulator": "a sum accumulated in float16 or bfloat16 where the kernel "
                          "promises float32",
    "rounding mode": "16-bit results rounded toward zero instead of to nearest even",
    "16-bit widening": "16-bit values widened to float32 wrongly on load",
    "wrong saved statistic": "a backward pass recomputing from a wrong saved statistic (a "
                             "log-sum-exp)",
    "control": "no bug: the patching machinery alone, which must not be flagged",
}
TIERS = ("fast", "scale")


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    ops: tuple[str, ...]                    # whose sample cases must catch it
    description: str
    patch: Callable[[], contextlib.AbstractContextManager]
    where: Callable[[Sample], bool] = lambda case: True
    extra: Callable[[str], list[Sample]] = lambda dtype: []   # cases the registry lacks
    max_cases: int = 3                      # per op and dtype, smallest first
    cotangents: bool = False                # also the op's cotangent cases (gradcheck.cotangents)
    kind: str = ""                          # one of KINDS
    tier: str = "fast"                      # TIERS: the cases it runs on (module doc)
    control: bool = False                   # no bug: passes when no case flags it
    dtypes: tuple[str, ...] | None = None   # a fast-tier mutant's dtypes (None: the run's)


def scaled(op_name: str, factor: float) -> Callable:
    """The patch of a mutant that scales every gradient of op `op_name` by `factor`."""
    return lambda: backward_replaced(op_name, lambda real: scaled_backward(real, factor))


# --- the bugs ---------------------------------------------------------------------------------
def _one_element_grad_mean(real):
    def backward(g, out, a, b):
        ga, gb = real(g, out, a, b)
        n = math.prod(g.shape)
        if math.prod(b.shape) == 1 and n > 1:
            gb = ops.scale(gb, 1.0 / n)
        return ga, gb
    return backward


def _silu_back_negative_branch(real):
    def kernel(out, ins, **params):
        real(out, ins, **params)
        g, x = (np.broadcast_to(a, out.shape) for a in ins)
        below = x < 0
        out[below] = (g / (1.0 + np.exp(-x)))[below]
    return kernel


def _glu_halves_unswapped(real):
    """The real gradient of the fused input with its two halves exchanged when swapped."""
    def backward(g, out, *xs, swapped=False):
        grads = real(g, out, *xs, swapped=swapped)
        if len(xs) != 1 or not swapped:
            return grads
        n = xs[0].shape[-1] // 2
        gx = ops.cont_if_strided(grads[0])
        lead = gx.shape[:-1]
        first = ops.block(gx, (0,) * len(lead) + (0,), lead + (n,))
        second = ops.block(gx, (0,) * len(lead) + (n,), lead + (n,))
        return (ops.concat(second, first, axis=-1),)
    return backward


def _mask_from_the_diagonal(real):
    return lambda g, out, x, n_past: real(g, out, x, n_past=0)


def _rope_other_pairing(real):
    def backward(g, out, x, pos, *ff, mode, **params):
        other = {"neox": "normal", "normal": "neox"}[mode]
        return real(g, out, x, pos, *ff, mode=other, **params)
    return backward


def _window_counts(case) -> tuple[int, int]:
    h, w = case.inputs[0].shape[:2]
    window = case.kwargs["window"]
    return -(-h // window), -(-w // window)


def _window_grid(case) -> bool:
    npy, npx = _window_counts(case)
    return npy == npx > 1


def _win_part_column_major(real):
    def backward(g, out, x, window):
        npy, npx = -(-x.shape[0] // window), -(-x.shape[1] // window)
        rest = g.shape[1:]
        swapped = ops.reshape(ops.cont(ops.transpose(ops.reshape(g, (npx, npy, *rest)), 0, 1)),
                              g.shape)
        return real(swapped, out, x, window=window)
    return backward

def _matmul_grad_a_untransposed(real):
    """grad_a = g @ b with b merely reshaped to b^T's shape: on square b exactly g @ b."""
    def backward(g, out, a, b):
        bt_shape = b.shape[:-2] + (b.shape[-1], b.shape[-2])
        grad_a = sum_to(ops.matmul(g, ops.reshape(ops.cont_if_strided(b), bt_shape)), a.shape)
        return grad_a, real(g, out, a, b)[1]
    return backward


def _permute_forward_axes(real):
    def backward(g, out, x, axes):
        return (ops.permute(g, axes),)
    return backward


def _sum_to_wrong_axis(g, shape):
    """sum_to that reduces each broadcast (size-1) axis's left neighbour instead of the axis
    itself, then reshapes: wrong numbers where the two lengths agree, a ShapeError elsewhere."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    right = [lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1]
    axes = sorted(set(range(lead)) | {(a - 1) % g.ndim for a in right})
    return ops.reshape(ops.sum(g, tuple(axes)), shape)


def _add_wrong_axis(real):
    return lambda g, out, a, b: (_sum_to_wrong_axis(g, a.shape), _sum_to_wrong_axis(g, b.shape))


def _pool_max_to_neighbour(real):
    """Max backward: each window's gradient lands one column right of its maximum (off the
    image at the right edge)."""
    def kernel(out, ins, **params):
        real(out, ins, **params)
        if params["mode"] == "max":
            out[..., 1:] = out[..., :-1].copy()
            out[..., 0] = 0
    return kernel


def _pool_avg_window_shifted(real):
    """Avg backward: windows start one column left (the column padding read as pw + 1)."""
    def kernel(out, ins, **params):
        if params["mode"] == "avg":
            ph, pw = params["padding"]
            params = {**params, "padding": (ph, pw + 1)}
        real(out, ins, **params)
    return kernel


def _softmax_back_no_subtraction(real):
    """s y g instead of s y (g - sum(g y)): the real result with the subtracted term added
    back."""
    def kernel(out, ins, **params):
        real(out, ins, **params)
        g, y = ins
        out += params.get("scale", 1.0) * y * np.sum(g * y, axis=-1, keepdims=True)
    return kernel


def _sink_gradient_dropped(real):
    """softmax's backward without the sinks' gradient (None: no gradient, zeros)."""
    def backward(g, out, x, *rest, **params):
        grads = real(g, out, x, *rest, **params)
        return grads[:2] + (None,) if len(rest) == 2 else grads
    return backward


def _alibi_mask_grad_next_heads_slope(real):
    """softmax's backward scaling head h's mask gradient by head h + 1's ALiBi slope."""
    def backward(g, out, x, *rest, scale, max_bias=0.0):
        grads = real(g, out, x, *rest, scale=scale, max_bias=max_bias)
        if not rest or max_bias == 0.0:
            return grads
        heads = n_heads(x.shape)
        shifted = np.array([alibi_slope(h + 1.0, float(heads), max_bias)
                            for h in range(heads)])
        gz = ops.softmax_back(g, out, 1.0)
        shifted = shifted.reshape((heads, 1, 1)[-min(3, gz.ndim):]).astype(gz.dtype)
        gm = sum_to(ops.mul(gz, constant(shifted, gz.dtype)), rest[0].shape)
        return (grads[0], gm) + tuple(grads[2:])
    return backward


def _im2col_back_no_dilation(real):
    def kernel(out, ins, **params):
        real(out, ins, **{**params, "dilation": (1, 1)})
    return kernel


_as_if_contiguous = km.as_if_contiguous     # where it was first defined (tests import it)


def _pool_back_reads_gradient_as_contiguous(real):
    """pool_2d_back reads its incoming gradient in memory order, ignoring its strides (ggml
    0.20.2's pool_2d backward does): right whenever that gradient is contiguous."""
    def kernel(out, ins, **params):
        g, *rest = ins
        real(out, [km.as_if_contiguous(g), *rest], **params)
    return kernel


def _cross_entropy_back_not_divided(real):
    def kernel(out, ins, **params):
        real(out, ins, **params)
        out *= out.size // out.shape[-1]            # the row count N the kernel divided by
    return kernel


# --- which cases exercise a bug -----------------------------------------------------------------
def _pair(v) -> tuple[int, int]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _dilated(case) -> bool:
    return _pair(case.kwargs.get("dilation", 1)) != (1, 1)


def _not_an_involution(case) -> bool:
    axes = case.kwargs["axes"]
    return any(axes[axes[i]] != i for i in range(len(axes)))


def _several_rows(case) -> bool:
    return math.prod(case.inputs[0].shape[:-1]) > 1


def _mode(mode):
    return lambda case: case.kwargs.get("mode") == mode


def _pools_tile_with_a_remainder(case) -> bool:
    """Max pooling whose windows tile the image (stride = kernel, no padding, windows of at
    most 4 a side: the tiled kernels) with rows or columns past the last window."""
    kw = case.kwargs
    if case.op == "pool_1d":
        k, s, p, h, w = (1, kw["kernel"]), (1, kw["stride"] or kw["kernel"]), \
            (0, kw["padding"]), 1, case.inputs[0].shape[-1]
    else:
        k, s, p = _pair(kw["kernel"]), _pair(kw["stride"] or kw["kernel"]), _pair(kw["padding"])
        h, w = case.inputs[0].shape[-2:]
    return (kw["mode"] == "max" and s == k and p == (0, 0) and max(k) <= 4
            and bool(h % k[0] or w % k[1]))


def _permuted(case) -> bool:
    return case.inputs[0].permute is not None


def _contiguous(case) -> bool:
    return not case.inputs[0].is_view


def _axis(axis):
    return lambda case: case.kwargs.get("axis") == axis and _contiguous(case)


def _biased_enough(case) -> bool:
    """Whether a case's output may have enough elements for the bias test (twice the 16
    inexact ones of gradcheck.precision.BIAS_MIN_ELEMENTS)."""
    return min(math.prod(spec.shape) for spec in case.inputs) >= 32


def _add_square_case(dtype):
    return [Sample.make("add", [InputSpec("a", (3, 3)), InputSpec("b", (3, 1))], dtype)]


def _permute_cube_case(dtype):
    return [Sample.make("permute", [InputSpec("x", (3, 3, 3))], dtype, axes=(2, 0, 1))]


def _control_fast_cases(dtype):
    """The registry's first two fast-tier cases of sum, sub and get_rows."""
    return [s for op in ("sum", "sub", "get_rows")
            for s in [c for c in get_op(op).samples() if c.dtype == dtype][:2]]


MUTANTS: dict[str, Mutant] = {m.name: m for m in [
    # --- backward rules and backward kernels: the fast tier ---------------------------------
    Mutant("relu_grad_scaled", ("relu",),
           "relu's gradient multiplied by 1.01", scaled("relu", 1.01), kind="scaled gradient"),
    Mutant("matmul_grad_scaled", ("matmul",),
           "both of matmul's gradients multiplied by 1.01", scaled("matmul", 1.01),
           kind="scaled gradient"),
    Mutant("matmul_grad_a_untransposed", ("matmul",),
           "grad_a = g @ b instead of g @ b^T, b 'transposed' by a reshape to b^T's shape "
           "(shapes stay valid; on square b it is exactly g @ b)",
           lambda: backward_replaced("matmul", _matmul_grad_a_untransposed),
           kind="transposed gradient"),
    Mutant("permute_grad_forward_axes", ("permute",),
           "permute's backward applies the forward axes instead of their inverse; invisible "
           "on swaps, a shape error on non-cubic 3-cycles (caught by shape check), wrong "
           "numbers on the extra cubic case (3,3,3)",
           lambda: backward_replaced("permute", _permute_forward_axes),
           where=_not_an_involution, extra=_permute_cube_case, kind="transposed gradient"),
    Mutant("div_drops_denominator_grad", ("div",),
           "div's backward returns no gradient for the denominator b (zero)",
           lambda: backward_replaced("div", lambda real: lambda g, out, a, b:
                                     (real(g, out, a, b)[0], None)), kind="dropped term"),
    Mutant("log_softmax_drops_normaliser", ("log_softmax",),
           "log_softmax's gradient g - softmax * sum(g) loses its second term: just g",
           lambda: backward_replaced("log_softmax", lambda real: lambda g, out, x: (g,)),
           kind="dropped term"),
    Mutant("add_broadcast_wrong_axis", ("add",),
           "add's broadcast gradient reduced over the axis left of each broadcast axis, then "
           "reshaped: a shape error on the registry's cases (caught by shape check), wrong "
           "numbers on the extra case a (3,3) + b (3,1), which the registry lacks",
           lambda: backward_replaced("add", _add_wrong_axis), extra=_add_square_case,
           kind="wrong broadcast reduction"),
    Mutant("pool_max_grad_to_neighbour", ("pool_2d",),
           "pool_2d_back (max) routes each window's gradient to the cell right of its "
           "maximum", lambda: kernel_replaced("pool_2d_back", _pool_max_to_neighbour),
           where=_mode("max"), kind="off-by-one window"),
    Mutant("pool_avg_window_shifted", ("pool_2d",),
           "pool_2d_back (avg) spreads each window's gradient over a window shifted one "
           "column left", lambda: kernel_replaced("pool_2d_back", _pool_avg_window_shifted),
           where=_mode("avg"), kind="off-by-one window"),
    Mutant("pool_back_reads_gradient_as_contiguous", ("pool_2d",),
           "pool_2d_back reads its incoming gradient in memory order, ignoring its strides "
           "(ggml 0.20.2's bug, which broke its MNIST CNN): only a cotangent=permuted case "
           "hands it a strided gradient",
           lambda: kernel_replaced("pool_2d_back", _pool_back_reads_gradient_as_contiguous),
           where=lambda case: case.cotangent == "permuted", cotangents=True,
           kind="permuted stride"),
    Mutant("softmax_back_no_subtraction", ("softmax",),
           "softmax_back computes s * y * g instead of s * y * (g - sum(g * y))",
           lambda: kernel_replaced("softmax_back", _softmax_back_no_subtraction),
           kind="dropped term"),
    Mutant("softmax_sink_without_gradient", ("softmax",),
           "softmax's backward drops the attention sinks' gradient (as ggml 0.20.2's "
           "SOFT_MAX backward, which never writes one)",
           lambda: backward_replaced("softmax", _sink_gradient_dropped),
           where=lambda case: len(case.inputs) == 3 and case.inputs[2].grad,
           kind="dropped term"),
    Mutant("softmax_alibi_slopes_off_by_one_head", ("softmax",),
           "softmax's backward scales head h's mask gradient by ALiBi's slope of head h + 1",
           lambda: backward_replaced("softmax", _alibi_mask_grad_next_heads_slope),
           where=lambda case: case.kwargs.get("max_bias", 0.0) > 0 and case.inputs[1].grad,
           kind="scaled gradient"),
    Mutant("im2col_back_ignores_dilation", ("im2col", "conv_2d"),
           "im2col_back scatters the columns as if the dilation were 1",
           lambda: kernel_replaced("im2col_back", _im2col_back_no_dilation), where=_dilated,
           max_cases=1, kind="off-by-one window"),
    Mutant("cross_entropy_back_not_divided", ("cross_entropy_loss",),
           "cross_entropy_loss_back forgets to divide by the row count N",
           lambda: kernel_replaced("cross_entropy_loss_back", _cross_entropy_back_not_divided),
           where=_several_rows, kind="scaled gradient"),
    Mutant("hardswish_back_middle_slope_beyond_3", ("hardswish",),
           "hardswish_back uses the middle piece's slope x/3 + 1/2 above 3 instead of 1: "
           "only the wide-range cases (|x| in [3.1, 150]) reach it",
           lambda: prepare_replaced("hardswish_back", km.hardswish_back_middle_slope_beyond_3),
           where=lambda case: case.inputs[0].high > 3.0, max_cases=1, kind="wrong branch"),
    Mutant("repeat_back_reads_gradient_as_contiguous", ("repeat",),
           "repeat_back reads its incoming gradient in memory order, ignoring its strides: "
           "only the cotangent=permuted case hands it a strided gradient",
           lambda: prepare_replaced("repeat_back", km.reads_as_contiguous),
           where=lambda case: case.cotangent == "permuted", cotangents=True,
           kind="permuted stride"),
    Mutant("pool_back_tiled_edge_unzeroed", ("pool_2d", "pool_1d"),
           "pool_2d_back's tiled max kernel (windows tiling the image) does not zero the "
           "rows and columns past the last window: right on a zeroed buffer, NaN on reused "
           "memory; only windows that leave a remainder (pool_1d, kernel 3 over 8) show it",
           lambda: kernel_replaced("pool_2d_back", km.pool_back_tiled_edge_unzeroed),
           where=_pools_tile_with_a_remainder, max_cases=1, kind="unwritten edge"),
    # --- forward kernels: the fast tier ----------------------------------------------------
    Mutant("pad_border_unwritten", ("pad",),
           "pad copies x into the interior but never zeroes the border: right on a zeroed "
           "buffer, NaN on reused memory",
           lambda: kernel_replaced("pad", km.pad_border_unwritten),
           where=lambda case: any(any(p) for p in case.kwargs["pads"]), kind="unwritten edge"),
    Mutant("softmax_ragged_row_sum", ("softmax",),
           "softmax's row sum stops one element short on rows whose length is not a "
           "multiple of 8: each y_j becomes y_j / (1 - y_last)",
           lambda: prepare_replaced("softmax", km.softmax_ragged_row_sum),
           where=lambda case: case.inputs[0].shape[-1] % 8 != 0, kind="dropped tail"),
    Mutant("sum_reads_permuted_input_as_contiguous", ("sum",),
           "sum reads a permuted input in memory order, ignoring its strides: invisible in "
           "a whole-tensor sum, wrong in a sum over some axes of a permuted input",
           lambda: prepare_replaced("sum", km.reads_as_contiguous),
           where=lambda case: _permuted(case) and case.kwargs.get("axis") is not None,
           kind="permuted stride"),
    Mutant("dropout_mask_in_memory_order", ("dropout",),
           "dropout of a permuted input takes each element's mask by its place in memory "
           "instead of its index: only the one permuted dropout case shows it",
           lambda: kernel_replaced("dropout", km.dropout_mask_in_memory_order),
           where=_permuted, kind="permuted stride"),
    # --- fast paths: the scale tier --------------------------------------------------------
    Mutant("sum_chunks_drop_tail", ("sum",),
           "the whole-tensor sum in chunks (sum:chunks, from 8,192 elements) drops the last "
           "element when the size is not a multiple of the chunk count",
           lambda: prepare_replaced("sum", km.sum_chunks_drop_tail),
           where=_axis(None), tier="scale", max_cases=1, kind="dropped tail"),
    Mutant("sum_chunks_overlap", ("sum",),
           "the whole-tensor sum in chunks (sum:chunks) runs each chunk one element past its "
           "end: the first element of every later chunk is added twice",
           lambda: prepare_replaced("sum", km.sum_chunks_overlap),
           where=_axis(None), tier="scale", max_cases=1, kind="chunk boundary"),
    Mutant("sum_rows_float32_accumulator", ("sum",),
           "the sum over rows (sum:rows, from 2^17 elements) adds 1.5 million rows into one "
           "float32 accumulator row instead of float64 rows per chunk: a relative error "
           "of 1e-5, within float32's fixed tolerance; the precision verdict catches it",
           lambda: prepare_replaced("sum", km.sum_rows_float32_accumulator),
           where=_axis(0), tier="scale", max_cases=1, kind="float32 accumulator"),
    Mutant("sum_runs_split_drops_tail", ("sum",),
           "the kept elements' sums on the engine's threads (sum:runs_split) in ranges of "
           "n // threads: the last n % threads elements are never summed (NaN on reused "
           "memory)", lambda: prepare_replaced("sum", km.sum_runs_split_drops_tail),
           where=_axis(1), tier="scale", max_cases=1, kind="dropped tail"),
    Mutant("split_chunk_ends_one_short", ("tanh",),
           "tanh's thread split (from 2^20 elements) ends every chunk but the last one row "
           "short: the row before each chunk boundary is never computed",
           lambda: chunks_replaced("tanh", km.chunk_ends_one_short),
           where=_contiguous, tier="scale", max_cases=1, kind="chunk boundary"),
    Mutant("split_slices_broadcast_operand", ("sub",),
           "sub's thread split slices every operand with the output's number of axes, so a "
           "row b (1, C) broadcast over the rows is sliced too (an empty slice past the "
           "first chunk: the kernel cannot broadcast it and raises)",
           lambda: chunks_replaced("sub", km.slices_broadcast_operands),
           where=lambda case: case.inputs[1].shape == (1, SIDE), tier="scale",
           max_cases=1, kind="broadcast split"),
    Mutant("tiled_copy_skips_ragged_rows", ("cont",),
           "cont's tiled transposed copy (copy:tiled) leaves the rows past the last whole "
           "8-row tile unwritten (1031 = 128 * 8 + 7; per thread's chunk)",
           lambda: prepare_replaced("cont", km.tiled_copy_skips_ragged_rows),
           where=lambda case: len(case.inputs[0].shape) == 2, tier="scale", max_cases=1,
           kind="unwritten edge"),
    Mutant("sparse_product_drops_last_nonzero", ("matmul",),
           "the zero-skipping product (matmul:sparse) loses the last non-zero of each "
           "sparse row of its CSR",
           lambda: prepare_replaced("matmul", km.sparse_product_drops_last_nonzero),
           where=lambda case: case.inputs[0].kind == "sparse", tier="scale", max_cases=1,
           kind="dropped tail"),
    # --- 16-bit floats: what the fixed tolerance lets through, the precision verdict not ----
    Mutant("sum_f16_accumulated_in_f16", ("sum",),
           "sum on float16 nodes accumulates serially in float16 (every partial sum rounded) "
           "instead of float32: over 320 rows of values in [0.5, 1] the sums err some 14 "
           "times (bar 8) what torch does, within float16's fixed tolerance",
           lambda: half_kernel_replaced("sum", km.sum_accumulated_in_half),
           where=lambda case: case.dtype == "f16" and case.kwargs.get("axis") == 0,
           tier="scale", max_cases=1, kind="16-bit accumulator"),
    Mutant("store_truncates", ("exp", "add", "matmul"),
           "every 16-bit result rounded toward zero on store instead of to nearest even: "
           "one ulp at most, inside every tolerance and ratio, but biased (-0.5 ulp on "
           "average), which the precision verdict's bias test sees",
           lambda: half_function_replaced("store", km.store_truncated),
           where=_biased_enough, dtypes=("f16", "bf16"), max_cases=1, kind="rounding mode"),
    Mutant("bf16_widened_wrong_shift", ("relu", "abs", "mul"),
           "bfloat16 widened as (h >> 1) << 17 instead of h << 16: inputs whose mantissa's "
           "last bit is set read one bfloat16 ulp nearer zero (a relative 2^-8, a tenth of "
           "bfloat16's fixed tolerance); the outputs' bias shows it",
           lambda: half_function_replaced("widened_copy", km.bf16_widened_wrong_shift),
           where=_biased_enough, dtypes=("bf16",), max_cases=1, kind="16-bit widening"),
    Mutant("get_rows_back_lost_updates", ("get_rows",),
           "get_rows_back's scatter-add, once big enough to split, split among the engine's "
           "threads by ranges of indices instead of column bands: a table row indexed from "
           "two ranges keeps one range's adds (4096 indices into 97 rows)",
           lambda: kernel_replaced("get_rows_back", km.scatter_split_by_indices),
           where=_contiguous, tier="scale", max_cases=1, kind="scatter race"),
    Mutant("add1_grad_mean_not_sum", ("add1",),
           "the one-element operand's gradient is the mean of g instead of its sum (ggml "
           "0.20.2's ADD1 backward: 'TODO: should probably be sum instead of mean')",
           lambda: backward_replaced("add", _one_element_grad_mean),
           where=lambda case: math.prod(case.inputs[0].shape) > 1,
           kind="wrong broadcast reduction"),
    Mutant("win_part_grad_windows_column_major", ("win_part",),
           "win_part's backward reads the windows of g in column-major order (px * npy + "
           "py) instead of ggml's row-major py * npx + px: invisible on a single row or "
           "column of windows, wrong on a grid",
           lambda: backward_replaced("win_part", _win_part_column_major),
           where=_window_grid, kind="transposed gradient"),
    Mutant("rope_back_rotates_forward", ("rope",),
           "rope_back rotates g by +theta (rope's own kernel) instead of -theta: the "
           "transpose of a rotation taken as the rotation itself",
           lambda: kernel_replaced("rope_back", lambda real: get_op("rope").kernels["cpu"]),
           kind="transposed gradient"),
    Mutant("rope_grad_pairs_swapped", ("rope",),
           "rope's backward rotates neox's pairs (i, i + n_dims/2) where the forward rotated "
           "adjacent ones (2i, 2i + 1), and the other way round",
           lambda: backward_replaced("rope", _rope_other_pairing), kind="transposed gradient"),
    Mutant("diag_mask_grad_ignores_n_past", ("diag_mask_inf", "diag_mask_zero"),
           "the causal mask's backward masks as if n_past were 0: the gradient of the cells "
           "between the diagonal and n_past is dropped",
           lambda: all_of(*(lambda op=op: backward_replaced(op, _mask_from_the_diagonal)
                            for op in ("diag_mask_inf", "diag_mask_zero"))),
           where=lambda case: case.kwargs["n_past"] > 0, kind="off-by-one window"),
    Mutant("swiglu_silu_grad_wrong_below_zero", ("swiglu",),
           "silu's derivative, as swiglu's backward takes it (silu_back), is sigmoid(x) on "
           "the negative branch: the term x sigmoid(x) (1 - sigmoid(x)) dropped where x < 0",
           lambda: kernel_replaced("silu_back", _silu_back_negative_branch),
           kind="wrong branch"),
    Mutant("glu_grad_halves_unswapped", ("swiglu", "geglu"),
           "the fused GLU's gradient joined as (activated half, gate half) even when "
           "swapped=True put the activated half second",
           lambda: all_of(*(lambda op=op: backward_replaced(op, _glu_halves_unswapped)
                            for op in ("swiglu", "geglu"))),
           where=lambda case: len(case.inputs) == 1 and case.kwargs.get("swapped"),
           kind="transposed gradient"),
    Mutant("attention_back_drops_d_term", ("attention", "attention_back"),
           "attention's backward drops the softmax Jacobian's -D_i (D_i = sum_d dO_id O_id): "
           "dS = P (dP + g_lse) instead of P (dP - D_i + g_lse)",
           lambda: kernel_replaced("attention_back", km.attention_back_without_d),
           kind="dropped term"),
    Mutant("attention_back_unmasked_lse", ("attention", "attention_back"),
           "attention's backward recomputes P from the log-sum-exp of the row without its "
           "mask and causal cut, instead of the saved (masked) one",
           lambda: kernel_replaced("attention_back", km.attention_back_wrong_lse(masked=False)),
           where=lambda case: case.kwargs.get("causal") or any(
               s.name == "mask" for s in case.inputs), kind="wrong saved statistic"),
    Mutant("attention_back_unscaled_lse", ("attention", "attention_back"),
           "attention's backward recomputes P from the log-sum-exp of the row's dot products "
           "without the scale",
           lambda: kernel_replaced("attention_back", km.attention_back_wrong_lse(scaled=False)),
           where=lambda case: case.kwargs.get("scale", 0.5) != 1.0,
           kind="wrong saved statistic"),
    Mutant("attention_gqa_grad_wrong_groups", ("attention", "attention_back"),
           "grouped-query attention's K and V gradients summed over the query heads h with "
           "h % Hkv = c instead of h // G = c (G = Hq / Hkv)",
           lambda: kernel_replaced("attention_back", km.attention_back_gqa_wrong_groups),
           where=lambda case: _gqa_groups(case) == "mixed",
           kind="wrong broadcast reduction"),
    Mutant("attention_causal_skip_one_key_short", ("attention",),
           "causal attention's query blocks (attention:causal_skip, from 129 query rows) "
           "stop their products one key short: each block's last row loses its diagonal "
           "key",
           lambda: all_of(*(lambda op=op: kernel_replaced(
               op, km.attention_causal_skip_one_key_short)
               for op in ("attention_fwd", "attention_back"))),
           where=lambda case: case.kwargs.get("causal") and case.dtype == "f32",
           tier="scale", max_cases=1, kind="chunk boundary"),
]}

CONTROL = Mutant(
    "control_no_bug", ("sub", "get_rows"),
    "the kernel-swapping machinery with no bug: sum's and mul's preparations, sub's and "
    "mul's chunkings and get_rows_back's kernel each replaced by an identity wrapper of "
    "the real one (every scale case's loss is a sum of a product)",
    lambda: all_of(lambda: prepare_replaced("sum", km.identity),
                   lambda: prepare_replaced("mul", km.identity),
                   lambda: chunks_replaced("mul", km.identity),
                   lambda: chunks_replaced("sub", km.identity),
                   lambda: kernel_replaced("get_rows_back", km.identity)),
    where=lambda case: case.op != "sub" or case.inputs[1].shape == (1, SIDE),
    extra=_control_fast_cases, tier="scale", max_cases=1, kind="control", control=True)


def _gqa_groups(case) -> str:
    """"mixed" where attention's kv heads h // G and h % Hkv of some query head h differ
    (Hkv > 1 and G > 1), else "same"."""
    shapes = {s.name: s.shape for s in case.inputs}
    hq, hkv = shapes["q"][-3], shapes["k"][-3]
    return "mixed" if hkv > 1 and hq // hkv > 1 else "same"
