"""CUDA kernels of the row-wise ops softmax (with an optional additive mask), softmax_back
and log_softmax, along the last axis (n elements; rows are all leading axes):

    softmax:      out_j = exp(z_j - m) / sum_k exp(z_k - m),   z = s x + mask,  m = max_k z_k
    softmax_back: out_j = s y_j (g_j - sum_k g_k y_k)
    log_softmax:  out_j = x_j - m - log(sum_k exp(x_k - m)),   m = max_k x_k

Each row has a segment of threads (block_reduce.row_launch: a whole block for long rows,
several rows per block for short ones; the kernels' prologue is row_segments') that stride
over its elements; row maxima and sums are shared-memory trees in float64, exponentials are
taken in float64, for float32 and float64 alike (as the CPU kernels). x, g, y and out are
C-contiguous (the ops insert `cont`); the mask is read in place through its strides,
broadcast to x's shape (at most 4 axes) with stride 0 on its broadcast axes.
"""

from __future__ import annotations

import math

from numba import cuda, float64

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


@cuda.jit
def _softmax_masked_kernel(x, mask, out, lead, mstrides, n, scale, width):
    """As _softmax_kernel with z = s x + mask: row r of x (shape lead + (n,), lead the
    first 3 of 4 axes) meets the mask at element offset a ms0 + b ms1 + i ms2 + j ms3."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    b1 = lead[1]
    nr = lead[2]
    rows = lead[0] * b1 * nr
    for first in range(start, rows, step):
        r, count, base = segment_row(first, tid, width, rows, n)
        mbase = ((r // (b1 * nr)) * mstrides[0] + ((r // nr) % b1) * mstrides[1]
                 + (r % nr) * mstrides[2])
        ms = mstrides[3]
        m = -math.inf
        for j in range(lane, count, width):
            m = max(m, scale * float64(x[base + j]) + float64(mask[mbase + j * ms]))
        m = segment_max(shared, m, tid, width)
        total = 0.0
        for j in range(lane, count, width):
            e = math.exp(scale * float64(x[base + j]) + float64(mask[mbase + j * ms]) - m)
            out[base + j] = e
            total += e
        total = segment_sum(shared, total, tid, width)
        inv = 1.0 / total if count else 0.0    # rows past the end have none
        for j in range(lane, count, width):
            out[base + j] = float64(out[base + j]) * inv


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


def cuda_softmax(out, ins, scale=1.0):
    """The dispatcher of softmax: ins = [x] or [x, mask]."""
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
    _softmax_masked_kernel[blocks, threads](xf, mf, of, tuple(x4.shape), mstrides, n,
                                            float(scale), width)


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
     f"void({t}[::1], {t}[::1], {t}[::1], {_TUPLE}, {_TUPLE}, int64, float64, int64)"),
    (_softmax_back_kernel, f"void({t}[::1], {t}[::1], {t}[::1], int64, int64, float64, int64)"),
    (_log_softmax_kernel, f"void({t}[::1], {t}[::1], int64, int64, int64)"),
]]
