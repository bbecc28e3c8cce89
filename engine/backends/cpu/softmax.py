"""CPU kernels of the row-wise ops: softmax (with an optional additive mask), its backward,
and log_softmax.

A row is the last axis; rows are all leading axes. The op modules make every input
C-contiguous (they insert `cont` for strided views), so a (rows, C) view never copies.
Each row is one `prange` iteration, computed by one thread; exponentials and row sums are
taken in float64 for float32 and float64 inputs alike.

The masked softmax sees x and out as 4-D (leading axes of size 1 prepended) and the mask as
numpy's broadcast of it to that shape: a strided view whose broadcast axes have stride 0, so
a mask shared by every batch and head is read in place, never copied (ggml's mask of shape
(rows, C) broadcast over dims 2 and 3).
"""

from __future__ import annotations

import math

import numpy as np

from engine.backends.cpu.jit import bindable, call, kernel, parallel_kernel, prange
from engine.errors import BackendError


def as_rows(arr: np.ndarray, op: str) -> np.ndarray:
    """The (rows, C) view of a C-contiguous array whose last axis has C elements."""
    if not arr.flags.c_contiguous:
        raise BackendError(f"{op}: the cpu kernel needs C-contiguous inputs, got strides "
                           f"{arr.strides} for shape {list(arr.shape)}")
    return arr.reshape(math.prod(arr.shape[:-1]), arr.shape[-1])


@kernel
def row_logsumexp(x, r):
    """log(sum_k exp(x[r, k])) in float64, stably: m + log(sum_k exp(x[r, k] - m)), m the
    row max. Shared by log_softmax and the cross-entropy kernels."""
    n = x.shape[1]
    m = -np.inf
    for j in range(n):
        m = max(m, np.float64(x[r, j]))
    total = 0.0
    for j in range(n):
        total += np.exp(np.float64(x[r, j]) - m)
    return m + np.log(total)


@parallel_kernel
def _softmax_rows(x, out, scale):
    """out[r, j] = exp(s x[r, j] - m_r) / sum_k exp(s x[r, k] - m_r), m_r = max_k s x[r, k]."""
    rows, n = x.shape
    for r in prange(rows):
        m = -np.inf
        for j in range(n):
            m = max(m, scale * np.float64(x[r, j]))
        total = 0.0
        for j in range(n):
            e = np.exp(scale * np.float64(x[r, j]) - m)
            out[r, j] = e
            total += e
        inv = 1.0 / total
        for j in range(n):
            out[r, j] = np.float64(out[r, j]) * inv


@parallel_kernel
def _softmax_masked_rows(x, mask, out, scale):
    """out[a, b, i, j] = exp(z_j - m) / sum_k exp(z_k - m), z_j = s x[a, b, i, j] +
    mask[a, b, i, j] and m = max_k z_k, for (B0, B1, R, C) x and out and a mask of that
    shape (possibly with zero strides)."""
    b0, b1, nr, n = x.shape
    for r in prange(b0 * b1 * nr):
        a = r // (b1 * nr)
        b = (r // nr) % b1
        i = r % nr
        m = -np.inf
        for j in range(n):
            m = max(m, scale * np.float64(x[a, b, i, j]) + np.float64(mask[a, b, i, j]))
        total = 0.0
        for j in range(n):
            e = np.exp(scale * np.float64(x[a, b, i, j]) + np.float64(mask[a, b, i, j]) - m)
            out[a, b, i, j] = e
            total += e
        inv = 1.0 / total
        for j in range(n):
            out[a, b, i, j] = np.float64(out[a, b, i, j]) * inv


@parallel_kernel
def _softmax_back_rows(g, y, out, scale):
    """out[r, j] = s y[r, j] (g[r, j] - sum_k g[r, k] y[r, k])."""
    rows, n = y.shape
    for r in prange(rows):
        dot = 0.0
        for j in range(n):
            dot += np.float64(g[r, j]) * np.float64(y[r, j])
        for j in range(n):
            out[r, j] = scale * np.float64(y[r, j]) * (np.float64(g[r, j]) - dot)


@parallel_kernel
def _log_softmax_rows(x, out):
    """out[r, j] = x[r, j] - m_r - log(sum_k exp(x[r, k] - m_r)), m_r = max_k x[r, k]."""
    rows, n = x.shape
    for r in prange(rows):
        lse = row_logsumexp(x, r)
        for j in range(n):
            out[r, j] = np.float64(x[r, j]) - lse


def as_4d(arr: np.ndarray) -> np.ndarray:
    """arr (at most 4 axes) viewed with leading axes of size 1 prepended up to 4 axes."""
    return arr[(None,) * (4 - arr.ndim)]


@bindable
def cpu_softmax(out, ins, scale=1.0):
    if len(ins) == 1:
        (x,) = ins
        return call(_softmax_rows, as_rows(x, "softmax"), as_rows(out, "softmax"),
                    float(scale))
    x, mask = ins
    as_rows(x, "softmax")       # checks that x is C-contiguous
    x4 = as_4d(x)
    return call(_softmax_masked_rows, x4, np.broadcast_to(mask, x4.shape), as_4d(out),
                float(scale))


@bindable
def cpu_softmax_back(out, ins, scale=1.0):
    g, y = ins
    return call(_softmax_back_rows, as_rows(g, "softmax_back"), as_rows(y, "softmax_back"),
                as_rows(out, "softmax_back"), float(scale))


@bindable
def cpu_log_softmax(out, ins):
    (x,) = ins
    return call(_log_softmax_rows, as_rows(x, "log_softmax"), as_rows(out, "log_softmax"))
