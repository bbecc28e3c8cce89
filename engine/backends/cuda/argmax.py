"""CUDA kernel of argmax along the last axis (n elements per row): out[r] = the first j with
x[r, j] maximal, a NaN counting as larger than any number (so the first NaN wins), as the
CPU kernel, numpy and torch.

Each row has a segment of threads (launch.row_launch, the row skeleton). Thread t scans
elements t, t + T, ... keeping the first best; then the (value, index) pairs meet in a
shared-memory tree that keeps the better pair, the lower index on ties, so the answer does
not depend on which thread saw which element.
"""

from __future__ import annotations

import math

from numba import cuda, float64, int64

from engine.backends.cuda.arrays import rows_view, strided
from engine.backends.cuda.launch import (
    SCRATCH,
    row_launch,
    segment_passes,
    segment_row,
    segment_scratch,
)


@cuda.jit(device=True)
def _beats(v, i, w, k):
    """Whether (value v, index i) is a better argmax than (w, k): larger, or NaN where w is
    not, or equal (both NaN included) with a lower index."""
    if math.isnan(v):
        return not math.isnan(w) or i < k
    if math.isnan(w):
        return False
    return v > w or (v == w and i < k)


@cuda.jit
def _argmax_kernel(x, out, rows, n, width):
    """out[r] = first argmax of x[r n : r n + n]."""
    values = segment_scratch()
    indices = cuda.shared.array(SCRATCH, int64)
    tid, lane, start, step = segment_passes(width)
    for first in range(start, rows, step):
        r, count, base = segment_row(first, tid, width, rows, n)
        best = -math.inf
        idx = n                 # no element seen: loses to every element
        for j in range(lane, count, width):
            v = float64(x[base + j])
            if _beats(v, j, best, idx):
                best = v
                idx = j
        values[tid] = best
        indices[tid] = idx
        cuda.syncthreads()
        s = width // 2
        while s > 0:
            if lane < s and _beats(values[tid + s], indices[tid + s], values[tid],
                                   indices[tid]):
                values[tid] = values[tid + s]
                indices[tid] = indices[tid + s]
            cuda.syncthreads()
            s //= 2
        if lane == 0 and r < rows:
            out[r] = indices[tid]
        cuda.syncthreads()


def cuda_argmax(out, ins):
    """The dispatcher of argmax: out (int32, x.shape[:-1]) from x."""
    if out.size == 0:
        return
    xf, rows, n = rows_view(ins[0], "argmax")
    oflat = strided(out, (out.size,), (out.dtype.itemsize,))
    blocks, threads, width = row_launch(rows, n)
    _argmax_kernel[blocks, threads](xf, oflat, rows, n, width)


PTX_SIGNATURES = [(_argmax_kernel, f"void({t}[::1], int32[::1], int64, int64, int64)")
                  for t in ("float32", "float64")]
