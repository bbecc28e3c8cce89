"""CPU kernels of the row normalisations rms_norm and norm (layer norm without affine), and
of their dedicated backward ops.

A row is the last axis (C elements); rows are all leading axes. The op modules make every
input C-contiguous, so the (rows, C) views never copy. Each row is one `prange` iteration
computed by one thread; every sum over a row is accumulated in float64, for float32 and
float64 inputs alike, and each output element is written once.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.jit import kernel, parallel_kernel, prange
from engine.backends.cpu.softmax import as_rows


@parallel_kernel
def _rms_norm_rows(x, out, eps):
    """out[r, j] = x[r, j] / sqrt(mean_k x[r, k]^2 + eps)."""
    rows, n = x.shape
    for r in prange(rows):
        ss = 0.0
        for j in range(n):
            v = np.float64(x[r, j])
            ss += v * v
        inv = 1.0 / np.sqrt(ss / n + eps)
        for j in range(n):
            out[r, j] = np.float64(x[r, j]) * inv


@parallel_kernel
def _rms_norm_back_rows(g, x, out, eps):
    """out[r, j] = s g[r, j] - x[r, j] s^3 (sum_k g[r, k] x[r, k]) / C,
    s = 1 / sqrt(mean_k x[r, k]^2 + eps)."""
    rows, n = x.shape
    for r in prange(rows):
        ss = 0.0
        gx = 0.0
        for j in range(n):
            v = np.float64(x[r, j])
            ss += v * v
            gx += np.float64(g[r, j]) * v
        s = 1.0 / np.sqrt(ss / n + eps)
        c = s * s * s * gx / n
        for j in range(n):
            out[r, j] = s * np.float64(g[r, j]) - c * np.float64(x[r, j])


@kernel
def _row_mean(x, r):
    """The mean of row r of x, summed in float64 in order (norm's first pass)."""
    n = x.shape[1]
    total = 0.0
    for j in range(n):
        total += np.float64(x[r, j])
    return total / n


@parallel_kernel
def _norm_rows(x, out, eps):
    """out[r, j] = (x[r, j] - mu_r) / sqrt(var_r + eps), mean mu_r and biased variance var_r
    of row r (two passes: the variance sums squared deviations from the mean)."""
    rows, n = x.shape
    for r in prange(rows):
        mu = _row_mean(x, r)
        ss = 0.0
        for j in range(n):
            d = np.float64(x[r, j]) - mu
            ss += d * d
        inv = 1.0 / np.sqrt(ss / n + eps)
        for j in range(n):
            out[r, j] = (np.float64(x[r, j]) - mu) * inv


@parallel_kernel
def _norm_back_rows(g, x, out, eps):
    """out[r, j] = s (g[r, j] - mean_k g[r, k] - xhat[r, j] mean_k g[r, k] xhat[r, k]),
    xhat = (x - mu) s, s = 1 / sqrt(var + eps)."""
    rows, n = x.shape
    for r in prange(rows):
        mu = _row_mean(x, r)
        ss = 0.0
        gsum = 0.0
        gd = 0.0
        for j in range(n):
            d = np.float64(x[r, j]) - mu
            gj = np.float64(g[r, j])
            ss += d * d
            gsum += gj
            gd += gj * d
        s = 1.0 / np.sqrt(ss / n + eps)
        gmean = gsum / n
        c = s * s * gd / n          # mean(g xhat) * s, so that xhat_j * it = d_j * c
        for j in range(n):
            out[r, j] = s * (np.float64(g[r, j]) - gmean - (np.float64(x[r, j]) - mu) * c)


def _row_dispatcher(rows_kernel, op: str):
    """The dispatcher of `op`: kernel(out, ins, eps) runs `rows_kernel` on the (rows, C) views
    of its inputs (x, or g and x) and of out, in that order."""
    def dispatch(out, ins, eps):
        rows_kernel(*(as_rows(a, op) for a in (*ins, out)), float(eps))
    dispatch.__name__ = dispatch.__qualname__ = f"cpu_{op}"
    dispatch.__doc__ = f"Dispatcher of {op}: kernel(out, ins, eps)."
    return dispatch


cpu_rms_norm = _row_dispatcher(_rms_norm_rows, "rms_norm")
cpu_rms_norm_back = _row_dispatcher(_rms_norm_back_rows, "rms_norm_back")
cpu_norm = _row_dispatcher(_norm_rows, "norm")
cpu_norm_back = _row_dispatcher(_norm_back_rows, "norm_back")
