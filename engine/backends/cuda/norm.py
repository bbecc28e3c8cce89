"""CUDA kernels of the row normalisations rms_norm and norm (layer norm without affine) and
of their dedicated backward ops, along the last axis (n elements; rows are all leading axes):

    rms_norm:      out_j = x_j s,                         s = 1 / sqrt(mean_k x_k^2 + eps)
    rms_norm_back: out_j = s g_j - x_j s^3 mean_k(g_k x_k)
    norm:          out_j = (x_j - mu) s,                  s = 1 / sqrt(mean_k (x_k - mu)^2 + eps)
    norm_back:     out_j = s (g_j - mean_k g_k - xhat_j mean_k(g_k xhat_k)),  xhat = (x - mu) s

Each row has a segment of threads (block_reduce.row_launch, row_segments); every row sum is a
shared-memory tree in float64 (for float32 and float64 inputs alike, as the CPU kernels), and
norm's variance sums squared deviations from the mean (two passes), as the CPU kernel.
Inputs are C-contiguous (the ops insert `cont`).
"""

from __future__ import annotations

import math

from numba import cuda, float64

from engine.backends.cuda.block_reduce import row_launch, rows_view, segment_sum
from engine.backends.cuda.row_segments import segment_passes, segment_row, segment_scratch


@cuda.jit
def _rms_norm_kernel(x, out, rows, n, eps, width):
    """out[r n + j] = x[r n + j] / sqrt(mean_k x[r n + k]^2 + eps)."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    for first in range(start, rows, step):
        _, count, base = segment_row(first, tid, width, rows, n)
        ss = 0.0
        for j in range(lane, count, width):
            v = float64(x[base + j])
            ss += v * v
        ss = segment_sum(shared, ss, tid, width)
        inv = 1.0 / math.sqrt(ss / n + eps) if count else 0.0    # unused past the last row
        for j in range(lane, count, width):
            out[base + j] = float64(x[base + j]) * inv


@cuda.jit
def _rms_norm_back_kernel(g, x, out, rows, n, eps, width):
    """out[r n + j] = s g[r n + j] - x[r n + j] s^3 (sum_k g[r n + k] x[r n + k]) / n."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    for first in range(start, rows, step):
        _, count, base = segment_row(first, tid, width, rows, n)
        ss = 0.0
        gx = 0.0
        for j in range(lane, count, width):
            v = float64(x[base + j])
            ss += v * v
            gx += float64(g[base + j]) * v
        ss = segment_sum(shared, ss, tid, width)
        gx = segment_sum(shared, gx, tid, width)
        s = 1.0 / math.sqrt(ss / n + eps) if count else 0.0
        c = s * s * s * gx / n
        for j in range(lane, count, width):
            out[base + j] = s * float64(g[base + j]) - c * float64(x[base + j])


@cuda.jit
def _norm_kernel(x, out, rows, n, eps, width):
    """out[r n + j] = (x[r n + j] - mu_r) / sqrt(var_r + eps), mu_r and the biased var_r
    the mean and variance of row r."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    for first in range(start, rows, step):
        _, count, base = segment_row(first, tid, width, rows, n)
        total = 0.0
        for j in range(lane, count, width):
            total += float64(x[base + j])
        mu = segment_sum(shared, total, tid, width) / n
        ss = 0.0
        for j in range(lane, count, width):
            d = float64(x[base + j]) - mu
            ss += d * d
        ss = segment_sum(shared, ss, tid, width)
        inv = 1.0 / math.sqrt(ss / n + eps) if count else 0.0    # unused past the last row
        for j in range(lane, count, width):
            out[base + j] = (float64(x[base + j]) - mu) * inv


@cuda.jit
def _norm_back_kernel(g, x, out, rows, n, eps, width):
    """out[r n + j] = s (g_j - mean_k g_k - xhat_j mean_k g_k xhat_k) over row r,
    xhat = (x - mu) s, s = 1 / sqrt(var + eps)."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    for first in range(start, rows, step):
        _, count, base = segment_row(first, tid, width, rows, n)
        total = 0.0
        for j in range(lane, count, width):
            total += float64(x[base + j])
        mu = segment_sum(shared, total, tid, width) / n
        ss = 0.0
        gsum = 0.0
        gd = 0.0
        for j in range(lane, count, width):
            d = float64(x[base + j]) - mu
            gj = float64(g[base + j])
            ss += d * d
            gsum += gj
            gd += gj * d
        ss = segment_sum(shared, ss, tid, width)
        gsum = segment_sum(shared, gsum, tid, width)
        gd = segment_sum(shared, gd, tid, width)
        s = 1.0 / math.sqrt(ss / n + eps) if count else 0.0
        gmean = gsum / n
        c = s * s * gd / n          # mean(g xhat) * s, so that xhat_j * it = d_j * c
        for j in range(lane, count, width):
            out[base + j] = s * (float64(g[base + j]) - gmean - (float64(x[base + j]) - mu) * c)


def _launch_rows(kernel, op, out, ins, eps):
    """Launch a row kernel over C-contiguous `ins` and `out` of shape (..., n)."""
    if out.size == 0:
        return
    flats = [rows_view(a, op)[0] for a in ins]
    of, rows, n = rows_view(out, op)
    blocks, threads, width = row_launch(rows, n)
    kernel[blocks, threads](*flats, of, rows, n, float(eps), width)


def cuda_rms_norm(out, ins, eps):
    """The dispatcher of rms_norm: ins = [x]."""
    _launch_rows(_rms_norm_kernel, "rms_norm", out, ins, eps)


def cuda_rms_norm_back(out, ins, eps):
    """The dispatcher of rms_norm_back: ins = [g, x]."""
    _launch_rows(_rms_norm_back_kernel, "rms_norm_back", out, ins, eps)


def cuda_norm(out, ins, eps):
    """The dispatcher of norm: ins = [x]."""
    _launch_rows(_norm_kernel, "norm", out, ins, eps)


def cuda_norm_back(out, ins, eps):
    """The dispatcher of norm_back: ins = [g, x]."""
    _launch_rows(_norm_back_kernel, "norm_back", out, ins, eps)


PTX_SIGNATURES = [sig for t in ("float32", "float64") for sig in [
    (_rms_norm_kernel, f"void({t}[::1], {t}[::1], int64, int64, float64, int64)"),
    (_rms_norm_back_kernel, f"void({t}[::1], {t}[::1], {t}[::1], int64, int64, float64, int64)"),
    (_norm_kernel, f"void({t}[::1], {t}[::1], int64, int64, float64, int64)"),
    (_norm_back_kernel, f"void({t}[::1], {t}[::1], {t}[::1], int64, int64, float64, int64)"),
]]
