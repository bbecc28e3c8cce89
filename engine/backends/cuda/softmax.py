"""CUDA kernels of the row-wise ops softmax (with an optional additive mask, ALiBi slopes and
attention sinks), its backward ops softmax_back and softmax_sink_back, and log_softmax,
along the last axis (n elements; rows are all leading axes):

    softmax:      out_j = exp(z_j - m) / (sum_k exp(z_k - m) + exp(sink_h - m)),
                  z = s x + slope_h mask,  m = max(max_k z_k, sink_h)
    softmax_back: out_j = s y_j (g_j - sum_k g_k y_k)
    softmax_sink_back: out_h = -sum over the rows of head h of p_sink sum_j g_j y_j,
                  p_sink = exp(sink_h - m) / (sum_k exp(z_k - m) + exp(sink_h - m))
    log_softmax:  out_j = x_j - m - log(sum_k exp(x_k - m)),   m = max_k x_k

h is a row's head, axis 1 of x seen as 4-D (B, H, R, n); slope_h = alibi_slope(h, H,
max_bias) (engine.backends.alibi_math, inlined; 1 without ALiBi); the sink terms only with
sinks. Each row has a segment of threads (block_reduce.row_launch: a whole block for long
rows, several rows per block for short ones; the kernels' prologue is row_segments') that
stride over its elements; row maxima and sums are shared-memory trees in float64,
exponentials are taken in float64, for float32 and float64 alike (as the CPU kernels).
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
from engine.backends.cuda import block_reduce
from engine.backends.cuda.arrays import broadcast, with_rank
from engine.backends.cuda.block_reduce import (
    flat_view,
    row_launch,
    rows_view,
    segment_logsumexp,
    segment_max,
    segment_sum,
)
from engine.backends.cuda.row_segments import segment_passes, segment_row, segment_scratch


@cuda.jit
def _softmax_kernel(x, out, rows, n, scale, width):
    """out[r n + j] = exp(s x[r n + j] - m_r) / sum_k exp(s x[r n + k] - m_r)."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    for first in range(start, rows, step):
        _, count, base = segment_row(first, tid, width, rows, n)
        m = -math.inf
        for j in range(lane, count, width):
            m = max(m, scale * float64(x[base + j]))
        m = segment_max(shared, m, tid, width)
        total = 0.0
        for j in range(lane, count, width):
            e = math.exp(scale * float64(x[base + j]) - m)
            out[base + j] = e
            total += e
        total = segment_sum(shared, total, tid, width)
        inv = 1.0 / total if count else 0.0    # rows past the end have none
        for j in range(lane, count, width):
            out[base + j] = float64(out[base + j]) * inv


@cuda.jit(device=True)
def _mask_base(r, lead, mstrides):
    """The mask's element offset of row r of x (shape lead + (n,), lead the first 3 of 4
    axes: a ms0 + h ms1 + i ms2), and the row's head h."""
    nh = lead[1]
    nr = lead[2]
    h = (r // nr) % nh
    return (r // (nh * nr)) * mstrides[0] + h * mstrides[1] + (r % nr) * mstrides[2], h


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
        m = sink
        for j in range(lane, count, width):
            m = max(m, scale * float64(x[base + j]) + slope * float64(mask[mbase + j * ms]))
        m = segment_max(shared, m, tid, width)
        total = 0.0
        for j in range(lane, count, width):
            e = math.exp(scale * float64(x[base + j]) + slope * float64(mask[mbase + j * ms])
                         - m)
            out[base + j] = e
            total += e
        total = segment_sum(shared, total, tid, width)
        if has_sinks:
            total += math.exp(sink - m)
        inv = 1.0 / total if count else 0.0    # rows past the end have none
        for j in range(lane, count, width):
            out[base + j] = float64(out[base + j]) * inv


@cuda.jit
def _softmax_sink_back_kernel(g, x, mask, sinks, out, lead, mstrides, n, scale, max_bias,
                              width):
    """out[h] = -sum over the rows r of head h of p_sink(r) sum_j g_j y_j, y and p_sink
    recomputed from x, mask and sinks (module doc); block b takes heads b, b + gridDim, ..."""
    shared = segment_scratch()
    tid = cuda.threadIdx.x
    lane = tid % width
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
            k = first + tid // width
            count = n if k < per_head else 0
            r = ((k // nr) * nh + h) * nr + k % nr      # batch k // nr, row k % nr of head h
            base = r * n
            mbase, _ = _mask_base(r, lead, mstrides)
            m = sink
            for j in range(lane, count, width):
                m = max(m, scale * float64(x[base + j])
                        + slope * float64(mask[mbase + j * ms]))
            m = segment_max(shared, m, tid, width)
            total = 0.0
            dot = 0.0
            for j in range(lane, count, width):
                e = math.exp(scale * float64(x[base + j])
                             + slope * float64(mask[mbase + j * ms]) - m)
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


@cuda.jit
def _softmax_back_kernel(g, y, out, rows, n, scale, width):
    """out[r n + j] = s y[r n + j] (g[r n + j] - sum_k g[r n + k] y[r n + k])."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    for first in range(start, rows, step):
        _, count, base = segment_row(first, tid, width, rows, n)
        dot = 0.0
        for j in range(lane, count, width):
            dot += float64(g[base + j]) * float64(y[base + j])
        dot = segment_sum(shared, dot, tid, width)
        for j in range(lane, count, width):
            out[base + j] = scale * float64(y[base + j]) * (float64(g[base + j]) - dot)


@cuda.jit
def _log_softmax_kernel(x, out, rows, n, width):
    """out[r n + j] = x[r n + j] - logsumexp_k x[r n + k]."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    for first in range(start, rows, step):
        _, count, base = segment_row(first, tid, width, rows, n)
        lse = segment_logsumexp(shared, x, base, count, tid, width)
        for j in range(lane, count, width):
            out[base + j] = float64(x[base + j]) - lse


def cuda_softmax(out, ins, scale=1.0, max_bias=0.0):
    """The dispatcher of softmax: ins = [x], [x, mask] or [x, mask, sinks]."""
    if out.size == 0:
        return
    xf, rows, n = rows_view(ins[0], "softmax")
    of, _, _ = rows_view(out, "softmax")
    blocks, threads, width = row_launch(rows, n)
    if len(ins) == 1:
        _softmax_kernel[blocks, threads](xf, of, rows, n, float(scale), width)
        return
    x4 = with_rank(ins[0], 4)
    mf, mstrides = flat_view(broadcast(ins[1], x4.shape), "softmax")
    sinks = rows_view(ins[2], "softmax")[0] if len(ins) > 2 else mf   # mf: never read
    _softmax_masked_kernel[blocks, threads](xf, mf, sinks, len(ins) > 2, of, tuple(x4.shape),
                                            mstrides, n, float(scale), float(max_bias), width)


def cuda_softmax_back(out, ins, scale=1.0):
    """The dispatcher of softmax_back: ins = [g, y]."""
    if out.size == 0:
        return
    g, y = ins
    gf, rows, n = rows_view(g, "softmax_back")
    yf, _, _ = rows_view(y, "softmax_back")
    of, _, _ = rows_view(out, "softmax_back")
    blocks, threads, width = row_launch(rows, n)
    _softmax_back_kernel[blocks, threads](gf, yf, of, rows, n, float(scale), width)


def cuda_softmax_sink_back(out, ins, scale=1.0, max_bias=0.0):
    """The dispatcher of softmax_sink_back: ins = [g, x, mask, sinks], out (H,): a block
    per head (up to MAX_BLOCKS; a block takes several heads beyond)."""
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
    _softmax_sink_back_kernel[min(nh, block_reduce.MAX_BLOCKS), threads](
        gf, xf, mf, sf, of, tuple(x4.shape), mstrides, n, float(scale), float(max_bias), width)


def cuda_log_softmax(out, ins):
    """The dispatcher of log_softmax: ins = [x]."""
    if out.size == 0:
        return
    xf, rows, n = rows_view(ins[0], "log_softmax")
    of, _, _ = rows_view(out, "log_softmax")
    blocks, threads, width = row_launch(rows, n)
    _log_softmax_kernel[blocks, threads](xf, of, rows, n, width)


_TUPLE = "UniTuple(int64, 4)"
PTX_SIGNATURES = [sig for t in ("float32", "float64") for sig in [
    (_softmax_kernel, f"void({t}[::1], {t}[::1], int64, int64, float64, int64)"),
    (_softmax_masked_kernel,
     f"void({t}[::1], {t}[::1], {t}[::1], boolean, {t}[::1], {_TUPLE}, {_TUPLE}, int64, "
     "float64, float64, int64)"),
    (_softmax_back_kernel, f"void({t}[::1], {t}[::1], {t}[::1], int64, int64, float64, int64)"),
    (_softmax_sink_back_kernel,
     f"void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {_TUPLE}, {_TUPLE}, int64, "
     "float64, float64, int64)"),
    (_log_softmax_kernel, f"void({t}[::1], {t}[::1], int64, int64, int64)"),
]]
