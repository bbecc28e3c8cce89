"""CUDA kernel of sum over axes (mean and sum_rows are composites of it).

    out[k] = sum_r x[k, r]      k over the kept axes, r over the reduced axes

The kept axes and the reduced axes of the (possibly strided) input are each merged where
their memory allows and padded to 4 axes. Each output element has its own segment of
threads, as each row has in the row kernels (engine.backends.cuda.launch): the whole block
when the reduction is long, several outputs to a block when it is short. The segment's
threads stride over the reduced elements in row-major order, accumulate in float64 and meet
in a shared-memory tree (launch.segment_sum). A full reduction to a scalar is one block. The
order of additions depends on the shape only: same bits on every run.

Under the simulator, which runs each thread as a Python thread and each syncthreads as a
polling barrier of milliseconds, the grid is capped at SIM_BLOCKS blocks (the blocks loop
over the outputs: neither the segments nor the order of additions change), and a reduction
of more than SIM_TREE_MAX_WORK elements in all goes to `_sum_serial` instead: one thread per
output and grid-stride step forms the same `width` partial sums, one after the other, in
local memory, and combines them by the same tree, with no barrier. Same additions in the
same order: the same bits as _sum_kernel. A GPU always runs _sum_kernel.
"""

from __future__ import annotations

import math

from numba import cuda, float64

from engine.backends.cuda.arrays import SIMULATED, flat_view, pad4, strided
from engine.backends.cuda.launch import (
    SCRATCH,
    SIM_BLOCKS,
    grid_stride,
    offset4,
    row_launch,
    segment_passes,
    segment_row,
    segment_scratch,
    segment_sum,
)

SIM_TREE_MAX_WORK = 1024    # simulator only: larger reductions (inputs read) run serially


@cuda.jit
def _sum_kernel(x, out, kshape, kstrides, rshape, rstrides, nred, width):
    """out[o] = sum over t < nred of x[offset4(o, kept) + offset4(t, reduced)], one segment
    of `width` threads per output o."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    nout = out.shape[0]
    for first in range(start, nout, step):
        o, count, _ = segment_row(first, tid, width, nout, nred)
        base = offset4(o, kshape, kstrides) if o < nout else 0
        acc = 0.0
        for t in range(lane, count, width):
            acc += float64(x[base + offset4(t, rshape, rstrides)])
        total = segment_sum(shared, acc, tid, width)
        if lane == 0 and o < nout:
            out[o] = total


@cuda.jit
def _sum_serial(x, out, kshape, kstrides, rshape, rstrides, nred, width):
    """out[o] as _sum_kernel computes it, by one thread per output o (launched under the
    simulator only):

        partial[l] = sum over t = l, l + width, ... < nred of x[...]      l < width
        for s = width/2, ..., 1:  partial[l] = partial[l] + partial[l + s]   l < s
        out[o] = partial[0]
    """
    partial = cuda.local.array(SCRATCH, float64)
    for o in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        base = offset4(o, kshape, kstrides)
        for lane in range(width):
            acc = 0.0
            for t in range(lane, nred, width):
                acc += float64(x[base + offset4(t, rshape, rstrides)])
            partial[lane] = acc
        s = width // 2
        while s > 0:
            for lane in range(s):
                partial[lane] += partial[lane + s]
            s //= 2
        out[o] = partial[0]


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
    args = (xflat, oflat, kshape, kstrides, rshape, rstrides, nred, width)
    if SIMULATED and out.size * nred > SIM_TREE_MAX_WORK:
        grid_stride(_sum_serial, out.size, *args)
        return
    if SIMULATED:
        blocks = min(blocks, SIM_BLOCKS)
    _sum_kernel[blocks, threads](*args)


_TUPLE = "UniTuple(int64, 4)"
PTX_SIGNATURES = [
    (kernel, f"void({t}[::1], {t}[::1], {_TUPLE}, {_TUPLE}, {_TUPLE}, {_TUPLE}, int64, int64)")
    for kernel in (_sum_kernel, _sum_serial) for t in ("float32", "float64")]
