"""CUDA kernels of the row-wise ops softmax (with an optional additive mask, ALiBi slopes and
attention sinks), its backward ops softmax_back and softmax_sink_back, log_softmax and its
backward op log_softmax_back,
along the last axis (n elements; rows are all leading axes):

    softmax:      out_j = exp(z_j - m) / (sum_k exp(z_k - m) + exp(sink_h - m)),
                  z = s x + slope_h mask,  m = max(max_k z_k, sink_h)
    softmax_back: out_j = s y_j (g_j - sum_k g_k y_k)
                  (renormalize: of y_j / sum_k y_k, the stored output of a
                  softmax without sinks, whose rounded row sums to 1 only nearly)
    softmax_sink_back: out_h = -sum over the rows of head h of p_sink sum_j g_j y_j,
                  p_sink = exp(sink_h - m) / (sum_k exp(z_k - m) + exp(sink_h - m))
    log_softmax:  out_j = x_j - m - log(sum_k exp(x_k - m)),   m = max_k x_k
    log_softmax_back: out_j = g_j - exp(y_j) sum_k g_k

h is a row's head, axis 1 of x seen as 4-D (B, H, R, n); slope_h = alibi_slope(h, H,
max_bias) (engine.backends.alibi_math, inlined; 1 without ALiBi); the sink terms only with
sinks. Each row has a segment of threads (engine.backends.cuda.launch: row_launch gives a
whole block to a long row, several rows to a block when they are short; the kernels'
skeleton is launch's too) that stride over its elements; row maxima and sums are
shared-memory trees in float64, exponentials are taken in float64, for float32 and float64
alike (as the CPU kernels).
softmax_sink_back is a block per head, whose segments step through that head's rows,
recomputing y and p_sink from x, mask and sinks; each row's term is added by its segment's
first thread, and one tree sums the block's threads (the order depends on the shape only).
x, g, y and out are C-contiguous (the ops insert `cont`); the mask is read in place through
its strides, broadcast to x's shape (at most 4 axes) with stride 0 on its broadcast axes.
"""

from __future__ import annotations

import math

from numba import cuda, float64

from engine.backends.alibi_math import alibi_slope
from engine.backends.cuda import launch
from engine.backends.cuda.arrays import broadcast, flat_view, rows_view, with_rank
from engine.backends.cuda.launch import (
    ROW_SIGNATURE,
    launch_rows,
    row_dot,
    row_kernel,
    row_launch,
    row_max,
    row_sum,
    segment_logsumexp,
    segment_max,
    segment_passes,
    segment_row,
    segment_scratch,
    segment_sum,
)


@cuda.jit(device=True)
def _divide(out, base, count, total, tid, width):
    """out[base + j] *= 1 / total over the row's count elements (rows past the end have
    none), by the segment of `width` threads."""
    inv = 1.0 / total if count else 0.0
    for j in range(tid % width, count, width):
        out[base + j] = float64(out[base + j]) * inv


@cuda.jit(device=True)
def _softmax_row(shared, x, x_, out, base, count, n, scale, tid, width):
    """out[base + j] = exp(s x[base + j] - m) / sum_k exp(s x[base + k] - m)."""
    m = row_max(shared, x, scale, base, count, tid, width)
    total = 0.0
    for j in range(tid % width, count, width):
        e = math.exp(scale * float64(x[base + j]) - m)
        out[base + j] = e
        total += e
    _divide(out, base, count, segment_sum(shared, total, tid, width), tid, width)


@cuda.jit(device=True)
def _mask_base(r, lead, mstrides):
    """The mask's element offset of row r of x (shape lead + (n,), lead the first 3 of 4
    axes: a ms0 + h ms1 + i ms2), and the row's head h."""
    nh = lead[1]
    nr = lead[2]
    h = (r // nr) % nh
    return (r // (nh * nr)) * mstrides[0] + h * mstrides[1] + (r % nr) * mstrides[2], h


@cuda.jit(device=True)
def _logit(x, mask, base, mbase, ms, j, scale, slope):
    """z_j = s x[base + j] + slope mask[mbase + j ms] of a masked row, in float64."""
    return scale * float64(x[base + j]) + slope * float64(mask[mbase + j * ms])


@cuda.jit(device=True)
def _masked_max(shared, x, mask, base, mbase, ms, count, scale, slope, sink, tid, width):
    """max(sink, max_j z_j) over the row's count logits (_logit), by the segment."""
    m = sink
    for j in range(tid % width, count, width):
        m = max(m, _logit(x, mask, base, mbase, ms, j, scale, slope))
    return segment_max(shared, m, tid, width)


@cuda.jit
def _softmax_masked_kernel(x, mask, sinks, has_sinks, out, lead, mstrides, n, scale, max_bias,
                           width):
    """As _softmax_kernel with z = s x + slope_h mask and, if has_sinks, sink_h in the max
    and the normaliser: row r of x (shape lead + (n,)) meets the mask at element offset
    _mask_base(r) + j ms3."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    rows = lead[0] * lead[1] * lead[2]
    nh = float64(lead[1])
    ms = mstrides[3]
    for first in range(start, rows, step):
        r, count, base = segment_row(first, tid, width, rows, n)
        mbase, h = _mask_base(r, lead, mstrides)
        slope = alibi_slope(float64(h), nh, max_bias)
        sink = float64(sinks[h]) if has_sinks else -math.inf
        m = _masked_max(shared, x, mask, base, mbase, ms, count, scale, slope, sink, tid,
                        width)
        total = 0.0
        for j in range(lane, count, width):
            e = math.exp(_logit(x, mask, base, mbase, ms, j, scale, slope) - m)
            out[base + j] = e
            total += e
        total = segment_sum(shared, total, tid, width)
        if has_sinks:
            total += math.exp(sink - m)
        _divide(out, base, count, total, tid, width)


@cuda.jit
def _softmax_sink_back_kernel(g, x, mask, sinks, out, lead, mstrides, n, scale, max_bias,
                              width):
    """out[h] = -sum over the rows r of head h of p_sink(r) sum_j g_j y_j, y and p_sink
    recomputed from x, mask and sinks (module doc); block b takes heads b, b + gridDim, ..."""
    shared = segment_scratch()
    tid, lane, _, _ = segment_passes(width)
    groups = cuda.blockDim.x // width
    nb = lead[0]
    nh = lead[1]
    nr = lead[2]
    per_head = nb * nr
    ms = mstrides[3]
    for h in range(cuda.blockIdx.x, nh, cuda.gridDim.x):
        slope = alibi_slope(float64(h), float64(nh), max_bias)
        sink = float64(sinks[h])
        acc = 0.0
        for first in range(0, per_head, groups):
            k, count, _ = segment_row(first, tid, width, per_head, n)
            r = ((k // nr) * nh + h) * nr + k % nr      # batch k // nr, row k % nr of head h
            base = r * n
            mbase, _ = _mask_base(r, lead, mstrides)
            m = _masked_max(shared, x, mask, base, mbase, ms, count, scale, slope, sink, tid,
                            width)
            total = 0.0
            dot = 0.0
            for j in range(lane, count, width):
                e = math.exp(_logit(x, mask, base, mbase, ms, j, scale, slope) - m)
                total += e
                dot += float64(g[base + j]) * e
            total = segment_sum(shared, total, tid, width)
            dot = segment_sum(shared, dot, tid, width)
            if lane == 0 and count:
                e_sink = math.exp(sink - m)
                total += e_sink
                acc += -(e_sink / total) * (dot / total)
        acc = segment_sum(shared, acc, tid, cuda.blockDim.x)
        if tid == 0:
            out[h] = acc


@cuda.jit(device=True)
def _softmax_back_row(shared, g, y, out, base, count, n, scale, tid, width):
    """out[base + j] = s y[base + j] (g[base + j] - sum_k g[base + k] y[base + k])."""
    dot = row_dot(shared, g, 0.0, y, 0.0, base, count, tid, width)
    for j in range(tid % width, count, width):
        out[base + j] = scale * float64(y[base + j]) * (float64(g[base + j]) - dot)


@cuda.jit(device=True)
def _softmax_back_renormalized_row(shared, g, y, out, base, count, n, scale, tid, width):
    """_softmax_back_row of y[base + j] / t, t = sum_k y[base + k] (softmax_back's
    renormalize): out[base + j] = s / t y[base + j] (g[base + j] - sum_k g y / t)."""
    total = row_sum(shared, y, base, count, tid, width)
    dot = row_dot(shared, g, 0.0, y, 0.0, base, count, tid, width)
    inv = 1.0 / total if count else 0.0       # unused past the last row
    for j in range(tid % width, count, width):
        out[base + j] = scale * inv * float64(y[base + j]) * (float64(g[base + j]) - dot * inv)


@cuda.jit(device=True)
def _log_softmax_row(shared, x, x_, out, base, count, n, unused, tid, width):
    """out[base + j] = x[base + j] - logsumexp_k x[base + k]."""
    lse = segment_logsumexp(shared, x, base, count, tid, width)
    for j in range(tid % width, count, width):
        out[base + j] = float64(x[base + j]) - lse


@cuda.jit(device=True)
def _log_softmax_back_row(shared, g, y, out, base, count, n, unused, tid, width):
    """out[base + j] = g[base + j] - exp(y[base + j]) sum_k g[base + k], in float64."""
    total = row_sum(shared, g, base, count, tid, width)
    for j in range(tid % width, count, width):
        out[base + j] = float64(g[base + j]) - math.exp(float64(y[base + j])) * total


_softmax_kernel = row_kernel(_softmax_row, "_softmax_kernel")
_log_softmax_back_kernel = row_kernel(_log_softmax_back_row, "_log_softmax_back_kernel")
_softmax_back_kernel = row_kernel(_softmax_back_row, "_softmax_back_kernel")
_softmax_back_renormalized_kernel = row_kernel(_softmax_back_renormalized_row,
                                               "_softmax_back_renormalized_kernel")
_log_softmax_kernel = row_kernel(_log_softmax_row, "_log_softmax_kernel")


def cuda_softmax(out, ins, scale=1.0, max_bias=0.0):
    """The dispatcher of softmax: ins = [x], [x, mask] or [x, mask, sinks]."""
    if out.size == 0:
        return
    if len(ins) == 1:
        launch_rows(_softmax_kernel, "softmax", out, ins, scale)
        return
    xf, rows, n = rows_view(ins[0], "softmax")
    of, _, _ = rows_view(out, "softmax")
    blocks, threads, width = row_launch(rows, n)
    x4 = with_rank(ins[0], 4)
    mf, mstrides = flat_view(broadcast(ins[1], x4.shape), "softmax")
    sinks = rows_view(ins[2], "softmax")[0] if len(ins) > 2 else mf   # mf: never read
    _softmax_masked_kernel[blocks, threads](xf, mf, sinks, len(ins) > 2, of, tuple(x4.shape),
                                            mstrides, n, float(scale), float(max_bias), width)


def cuda_softmax_back(out, ins, scale=1.0, renormalize=False):
    """The dispatcher of softmax_back: ins = [g, y]."""
    kernel = _softmax_back_renormalized_kernel if renormalize else _softmax_back_kernel
    launch_rows(kernel, "softmax_back", out, ins, scale)


def cuda_softmax_sink_back(out, ins, scale=1.0, max_bias=0.0):
    """The dispatcher of softmax_sink_back: ins = [g, x, mask, sinks], out (H,): a block
    per head (up to launch.MAX_ROW_BLOCKS; a block takes several heads beyond)."""
    if out.size == 0:
        return
    g, x, mask, sinks = ins
    gf, _, n = rows_view(g, "softmax_sink_back")
    xf, _, _ = rows_view(x, "softmax_sink_back")
    of, _, _ = rows_view(out, "softmax_sink_back")
    sf, _, _ = rows_view(sinks, "softmax_sink_back")
    x4 = with_rank(x, 4)
    mf, mstrides = flat_view(broadcast(mask, x4.shape), "softmax_sink_back")
    nb, nh, nr, _ = x4.shape
    _, threads, width = row_launch(nb * nr, n)
    _softmax_sink_back_kernel[min(nh, launch.MAX_ROW_BLOCKS), threads](
        gf, xf, mf, sf, of, tuple(x4.shape), mstrides, n, float(scale), float(max_bias), width)


def cuda_log_softmax_back(out, ins):
    """The dispatcher of log_softmax_back: ins = [g, y]."""
    launch_rows(_log_softmax_back_kernel, "log_softmax_back", out, ins)


def cuda_log_softmax(out, ins):
    """The dispatcher of log_softmax: ins = [x]."""
    launch_rows(_log_softmax_kernel, "log_softmax", out, ins)


_TUPLE = "UniTuple(int64, 4)"
PTX_SIGNATURES = [sig for t in ("float32", "float64") for sig in [
    (_softmax_kernel, ROW_SIGNATURE.format(t=t)),
    (_softmax_masked_kernel,
     f"void({t}[::1], {t}[::1], {t}[::1], boolean, {t}[::1], {_TUPLE}, {_TUPLE}, int64, "
     "float64, float64, int64)"),
    (_softmax_back_kernel, ROW_SIGNATURE.format(t=t)),
    (_softmax_back_renormalized_kernel, ROW_SIGNATURE.format(t=t)),
    (_softmax_sink_back_kernel,
     f"void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {_TUPLE}, {_TUPLE}, int64, "
     "float64, float64, int64)"),
    (_log_softmax_kernel, ROW_SIGNATURE.format(t=t)),
    (_log_softmax_back_kernel, ROW_SIGNATURE.format(t=t)),
]]
