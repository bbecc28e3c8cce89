"""CUDA kernels of get_rows (a gather of table rows) and get_rows_back (its sum over
repeated indices), both gathers: one thread per output element, no atomics.

    get_rows:       out[b, k, c] = table[idx[b, k], c]
    get_rows_back:  out[r, c]    = sum over (b, k) in C order with idx[b, k] = r of g[b, k, c]

get_rows_back starts each sum from 0 and adds in the CPU kernel's order (the CPU adds the
gradient rows into a zeroed table in (b, k) order), so both backends give the same bits.
Each block stages the indices in shared memory, a block's size (at most launch.THREADS) at a
time, and every thread scans them for its own row: the work is rows x columns x indices
comparisons, which suits the small tables of gradcheck and training inputs of moderate size.

Index range: the CPU dispatchers raise RowIndexError before touching memory; a CUDA
dispatcher cannot read the indices without copying them to the host, so the kernels make
a bad index visible in the output instead, never reading or writing outside the buffers:
get_rows writes NaN to every element of a row whose index lies outside [0, R), and
get_rows_back writes NaN to the whole output when any index does.
"""

from __future__ import annotations

import math

from numba import cuda

from engine.backends.cuda.arrays import with_rank
from engine.backends.cuda.launch import THREADS, grid_stride, input_layouts, unravel3


@cuda.jit
def _get_rows(table, idx, out):
    """out[b, k, c] = table[idx[b, k], c], NaN where the index is outside the table."""
    _, nk, nc = out.shape
    nrows = table.shape[0]
    for flat in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        b, k, c = unravel3(flat, nk, nc)
        row = idx[b, k]
        if 0 <= row < nrows:
            out[b, k, c] = table[row, c]
        else:
            out[b, k, c] = math.nan


@cuda.jit
def _get_rows_back(g, idx, out):
    """out[r, c] = sum of g[b, k, c] over (b, k) in C order with idx[b, k] = r; all of out
    NaN if any index lies outside [0, R). A block walks its elements in lockstep (the loop
    bounds are the same for all its threads) so that it can stage indices in shared
    memory (blocks of at most THREADS threads)."""
    staged = cuda.shared.array(THREADS, dtype=idx.dtype)
    tid = cuda.threadIdx.x
    block = cuda.blockDim.x
    nrows, nc = out.shape[0], out.shape[1]
    nk = idx.shape[1]
    nidx = idx.shape[0] * nk
    zero = out.dtype.type(0)
    for base in range(cuda.blockIdx.x * block, out.size, cuda.gridDim.x * block):
        flat = base + tid
        r = flat // nc
        c = flat % nc
        total = zero
        bad = False
        for chunk in range(0, nidx, block):
            cuda.syncthreads()          # the previous chunk is no longer read
            s = chunk + tid
            if s < nidx:
                staged[tid] = idx[s // nk, s % nk]
            cuda.syncthreads()
            for j in range(min(block, nidx - chunk)):
                row = staged[j]
                if row < 0 or row >= nrows:
                    bad = True
                elif row == r:          # never true past the output (r >= nrows)
                    pos = chunk + j
                    total += g[pos // nk, pos % nk, c]
        if flat < out.size:
            out[r, c] = math.nan if bad else total


def cuda_get_rows(out, ins):
    """Dispatcher of get_rows: kernel(out, [table, idx]); out is idx.shape + (C,)."""
    table, idx = ins
    if out.size == 0:
        return
    idx2 = with_rank(idx, 2)
    grid_stride(_get_rows, out.size, table, idx2, with_rank(out, 3))   # idx2.shape + (C,)


def cuda_get_rows_back(out, ins, nrows):
    """Dispatcher of get_rows_back: kernel(out, [g, idx], nrows); out is (nrows, C)."""
    g, idx = ins
    if out.size == 0:
        return
    grid_stride(_get_rows_back, out.size, with_rank(g, 3), with_rank(idx, 2), out)


# _get_rows's out: C-contiguous for a 2-D idx, a unit axis of stride 0 in front of it for a
# 1-D one (with_rank), which numba types as layout "A"
PTX_SIGNATURES = [sig for dt, lay2, lay3 in input_layouts(2, 3) for sig in [
    *[(_get_rows, f"void({dt}{lay2}, int32{lay2}, {dt}{out})")
      for out in ("[:, :, ::1]", "[:, :, :]")],
    (_get_rows_back, f"void({dt}{lay3}, int32{lay2}, {dt}[:, ::1])")]]
