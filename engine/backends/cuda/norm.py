"""CUDA kernels of the row normalisations rms_norm and norm (layer norm without affine) and
of their dedicated backward ops, along the last axis (n elements; rows are all leading axes):

    rms_norm:      out_j = x_j s,                         s = 1 / sqrt(mean_k x_k^2 + eps)
    rms_norm_back: out_j = s g_j - x_j s^3 mean_k(g_k x_k)
    norm:          out_j = (x_j - mu) s,                  s = 1 / sqrt(mean_k (x_k - mu)^2 + eps)
    norm_back:     out_j = s (g_j - mean_k g_k - xhat_j mean_k(g_k xhat_k)),  xhat = (x - mu) s

Each kernel is launch.row_kernel of its row's work (a segment of threads per row; row_sum
and row_dot); every row sum is a shared-memory tree in float64 (for float32 and float64
inputs alike, as the CPU kernels), and norm's variance sums squared deviations from the mean
(two passes), as the CPU kernel. Inputs are C-contiguous (the ops insert `cont`).
"""

from __future__ import annotations

import math

from numba import cuda, float64

from engine.backends.cuda.launch import (
    ROW_SIGNATURE,
    launch_rows,
    row_dot,
    row_kernel,
    row_sum,
)


@cuda.jit(device=True)
def _normalised(shared, x, out, mu, base, count, n, eps, tid, width):
    """out[base + j] = (x[base + j] - mu) / sqrt(mean_k (x[base + k] - mu)^2 + eps)."""
    ss = row_dot(shared, x, mu, x, mu, base, count, tid, width)
    inv = 1.0 / math.sqrt(ss / n + eps) if count else 0.0    # unused past the last row
    for j in range(tid % width, count, width):
        out[base + j] = (float64(x[base + j]) - mu) * inv


@cuda.jit(device=True)
def _rms_norm_row(shared, x, x_, out, base, count, n, eps, tid, width):
    """out[base + j] = x[base + j] / sqrt(mean_k x[base + k]^2 + eps) (x - 0.0 is x)."""
    _normalised(shared, x, out, 0.0, base, count, n, eps, tid, width)


@cuda.jit(device=True)
def _norm_row(shared, x, x_, out, base, count, n, eps, tid, width):
    """out[base + j] = (x[base + j] - mu) / sqrt(var + eps), mu and the biased var the
    row's mean and variance."""
    mu = row_sum(shared, x, base, count, tid, width) / n
    _normalised(shared, x, out, mu, base, count, n, eps, tid, width)


@cuda.jit(device=True)
def _rms_norm_back_row(shared, g, x, out, base, count, n, eps, tid, width):
    """out[base + j] = s g_j - x_j s^3 (sum_k g_k x_k) / n over the row."""
    ss = row_dot(shared, x, 0.0, x, 0.0, base, count, tid, width)
    gx = row_dot(shared, g, 0.0, x, 0.0, base, count, tid, width)
    s = 1.0 / math.sqrt(ss / n + eps) if count else 0.0
    c = s * s * s * gx / n
    for j in range(tid % width, count, width):
        out[base + j] = s * float64(g[base + j]) - c * float64(x[base + j])


@cuda.jit(device=True)
def _norm_back_row(shared, g, x, out, base, count, n, eps, tid, width):
    """out[base + j] = s (g_j - mean_k g_k - xhat_j mean_k g_k xhat_k) over the row,
    xhat = (x - mu) s, s = 1 / sqrt(var + eps)."""
    mu = row_sum(shared, x, base, count, tid, width) / n
    ss = row_dot(shared, x, mu, x, mu, base, count, tid, width)
    gmean = row_sum(shared, g, base, count, tid, width) / n
    gd = row_dot(shared, g, 0.0, x, mu, base, count, tid, width)
    s = 1.0 / math.sqrt(ss / n + eps) if count else 0.0
    c = s * s * gd / n          # mean(g xhat) * s, so that xhat_j * it = d_j * c
    for j in range(tid % width, count, width):
        out[base + j] = s * (float64(g[base + j]) - gmean - (float64(x[base + j]) - mu) * c)


_rms_norm_kernel = row_kernel(_rms_norm_row, "_rms_norm_kernel")
_norm_kernel = row_kernel(_norm_row, "_norm_kernel")
_rms_norm_back_kernel = row_kernel(_rms_norm_back_row, "_rms_norm_back_kernel")
_norm_back_kernel = row_kernel(_norm_back_row, "_norm_back_kernel")


def cuda_rms_norm(out, ins, eps):
    """The dispatcher of rms_norm: ins = [x]."""
    launch_rows(_rms_norm_kernel, "rms_norm", out, ins, eps)


def cuda_rms_norm_back(out, ins, eps):
    """The dispatcher of rms_norm_back: ins = [g, x]."""
    launch_rows(_rms_norm_back_kernel, "rms_norm_back", out, ins, eps)


def cuda_norm(out, ins, eps):
    """The dispatcher of norm: ins = [x]."""
    launch_rows(_norm_kernel, "norm", out, ins, eps)


def cuda_norm_back(out, ins, eps):
    """The dispatcher of norm_back: ins = [g, x]."""
    launch_rows(_norm_back_kernel, "norm_back", out, ins, eps)


PTX_SIGNATURES = [(kernel, ROW_SIGNATURE.format(t=t)) for t in ("float32", "float64")
                  for kernel in (_rms_norm_kernel, _rms_norm_back_kernel, _norm_kernel,
                                 _norm_back_kernel)]
