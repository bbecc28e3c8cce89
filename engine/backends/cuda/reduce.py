"""CUDA kernel of sum over axes (mean and sum_rows are composites of it).

    out[k] = sum_r x[k, r]      k over the kept axes, r over the reduced axes

The kept axes and the reduced axes of the (possibly strided) input are each merged where
their memory allows and padded to 4 axes. Each output element has its own segment of
threads (the whole block when the reduction is long; several outputs share a block when it
is short), which stride over the reduced elements in row-major order, accumulate in float64
and meet in a shared-memory tree (block_reduce). A full reduction to a scalar is one block.
The order of additions depends on the shape only: same bits on every run.
"""

from __future__ import annotations

import math

from numba import cuda, float64

from engine.backends.cuda.arrays import strided
from engine.backends.cuda.block_reduce import (
    MAX_THREADS,
    flat_view,
    offset4,
    pad4,
    row_launch,
    segment_sum,
)


@cuda.jit
def _sum_kernel(x, out, kshape, kstrides, rshape, rstrides, nred, width):
    """out[o] = sum over t < nred of x[offset4(o, kept) + offset4(t, reduced)], one segment
    of `width` threads per output o."""
    shared = cuda.shared.array(MAX_THREADS, float64)
    tid = cuda.threadIdx.x
    lane = tid % width
    groups = cuda.blockDim.x // width
    nout = out.shape[0]
    for first in range(cuda.blockIdx.x * groups, nout, cuda.gridDim.x * groups):
        o = first + tid // width
        count = nred if o < nout else 0
        base = offset4(o, kshape, kstrides) if o < nout else 0
        acc = 0.0
        for t in range(lane, count, width):
            acc += float64(x[base + offset4(t, rshape, rstrides)])
        total = segment_sum(shared, acc, tid, width)
        if lane == 0 and o < nout:
            out[o] = total


def merge_axes(dims):
    """[(size, stride)] with unit axes dropped and neighbours merged where one stride steps
    over the other axis exactly; the row-major order of the elements is kept."""
    merged: list[tuple[int, int]] = []
    for n, s in dims:
        if n == 1:
            continue
        if merged and merged[-1][1] == s * n:
            merged[-1] = (merged[-1][0] * n, s)
        else:
            merged.append((n, s))
    return merged


def cuda_sum(out, ins, axes, keepdims):
    """The dispatcher of sum: out (C-contiguous, the kept axes in order) from x."""
    (x,) = ins
    if out.size == 0:
        return
    xflat, xstrides = flat_view(x, "sum")
    kept = merge_axes([(x.shape[i], xstrides[i]) for i in range(x.ndim) if i not in axes])
    reduced = merge_axes([(x.shape[i], xstrides[i]) for i in axes])
    kshape, kstrides = pad4(kept, "sum")
    rshape, rstrides = pad4(reduced, "sum")
    nred = math.prod(x.shape[i] for i in axes)
    oflat = strided(out, (out.size,), (out.dtype.itemsize,))
    blocks, threads, width = row_launch(out.size, nred)
    _sum_kernel[blocks, threads](xflat, oflat, kshape, kstrides, rshape, rstrides, nred, width)


_TUPLE = "UniTuple(int64, 4)"
PTX_SIGNATURES = [
    (_sum_kernel, f"void({t}[::1], {t}[::1], {_TUPLE}, {_TUPLE}, {_TUPLE}, {_TUPLE}, int64, int64)")
    for t in ("float32", "float64")]
