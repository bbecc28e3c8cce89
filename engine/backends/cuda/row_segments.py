"""The prologue of the CUDA row kernels (norms, softmax, argmax, cross-entropy, sum): which
row each thread works on, written once.

A row kernel is launched with block_reduce.row_launch: blocks of `groups` segments of
`width` threads (width a power of two, the same for every row), one segment per row. The
block's segments take `groups` consecutive rows at a time, and the blocks step through the
rows together (grid-stride), so a kernel reads:

    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    for first in range(start, rows, step):             # every thread runs every pass
        r, count, base = segment_row(first, tid, width, rows, n)
        for j in range(lane, count, width):            # the segment strides over its row
            ... x[base + j] ...
        total = segment_sum(shared, partial, tid, width)

Every thread of the block runs every pass, even when its segment's row lies past the last
row (count 0: its loops are empty), because the segment reductions synchronise the whole
block. A kernel launched as one block (cross-entropy's loss) gets start 0 and step `groups`.
"""

from __future__ import annotations

from numba import cuda, float64

from engine.backends.cuda.block_reduce import MAX_THREADS

PTX_SIGNATURES = []   # device functions only: compiled into the kernels that call them


@cuda.jit(device=True, inline="always")
def segment_scratch():
    """The block's float64 scratch of the segment reductions (block_reduce.segment_sum,
    segment_max, segment_logsumexp): MAX_THREADS entries, one per thread.

    Inlined into the kernel (numba-cuda lets a device function return only an array it was
    given, not one it allocated), so the shared array is the calling kernel's. Call it once
    per kernel: the simulator identifies shared arrays by source line, and would give two
    calls the same memory."""
    return cuda.shared.array(MAX_THREADS, float64)


@cuda.jit(device=True)
def segment_passes(width):
    """(tid, lane, start, step) of this thread in a launch of segments of `width` threads:
    its index in the block, its index in its segment, and the first row and row step of its
    block's passes over the rows (`groups` = blockDim / width rows per pass)."""
    tid = cuda.threadIdx.x
    groups = cuda.blockDim.x // width
    return tid, tid % width, cuda.blockIdx.x * groups, cuda.gridDim.x * groups


@cuda.jit(device=True)
def segment_row(first, tid, width, rows, n):
    """(r, count, base) for thread `tid` in the pass whose first row is `first`: its
    segment's row r = first + tid // width, the number of that row's n elements it has
    (n, or 0 for a row past the last), and the row's first element offset r n in a
    C-contiguous (rows, n) view."""
    r = first + tid // width
    return r, (n if r < rows else 0), r * n
