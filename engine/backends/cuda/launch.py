"""How the CUDA kernels are launched and how their threads find their work, written once for
every kernel module of engine/backends/cuda: thread counts, grid sizes, the flat-index
unravel and the row-reduction skeleton (device functions, compiled into each kernel).

Grid-stride kernels (one thread per output element, most kernels): a launch of
`grid_stride_shape(n)`, THREADS threads per block and ceil(n / THREADS) blocks up to
MAX_BLOCKS, and a loop `for i in range(cuda.grid(1), n, cuda.gridsize(1))`, so any grid
covers any size and the result never depends on it. A thread turns its flat C-order
position i into per-axis indices with `unravel3` / `unravel4` (or into an element offset
through strides with `offset4`). `grid_stride(kernel, n, *args)` is that launch, skipped
for n = 0. The elementwise kernels (`map_shape`) take only the whole warps that n needs.

Launch shapes under the simulator: it runs every CUDA thread of a block as a Python thread
(starting one costs about as much as a few hundred loop steps) and each syncthreads as a
barrier that a polling thread releases (milliseconds each, whatever the work between). A
launch there is cheap when it has few threads that each loop over many elements and few
barriers, so `grid_stride_shape` gives at most SIM_THREADS threads in each of at most
SIM_BLOCKS blocks there (more than one block, so that small test shapes still cover
blockIdx > 0), and the GPU's shape on a GPU. A kernel that sizes shared memory by THREADS
reads its block's size from cuda.blockDim.x (never more than THREADS).

Row reductions (sums, softmax, cross-entropy, argmax, norms): a row, or one output
element's set of inputs, is reduced by a segment of `width` threads, width a power of two
of at most MAX_THREADS chosen from the row length alone (`threads_for`). Thread t of a
segment first accumulates its own share of the row, elements t, t + width, ..., privately
in float64; then the partials meet in shared memory and are combined as a tree:

    for s = width/2, width/4, ..., 1:   partial[t] = partial[t] + partial[t + s]   for t < s

The pairing depends on width only, and width on the shape only, so every result is the
same bits on every run (no atomics). `row_launch` packs `groups` segments into a block
(several short rows per block, one long row per block), and the blocks step through the
rows together (grid-stride). A kernel whose rows are C-contiguous and whose work is row by
row is `row_kernel(row)`: the skeleton below calling device function `row` on each row,
launched by `launch_rows`. A kernel that needs more reads it written out:

    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    for first in range(start, rows, step):             # every thread runs every pass
        r, count, base = segment_row(first, tid, width, rows, n)
        total = row_sum(shared, x, base, count, tid, width)     # or segment_sum of a partial
        for j in range(lane, count, width):            # the segment strides over its row
            ... x[base + j] ...

Every thread of the block runs every pass, even when its segment's row lies past the last
row (count 0: its loops are empty), because the segment reductions synchronise the whole
block. A kernel launched as one block (cross-entropy's loss) gets start 0 and step `groups`.
"""

from __future__ import annotations

import math
import os
import types

from numba import cuda, float64

from engine.backends.cuda.arrays import SIMULATED, rows_view

THREADS = 128         # threads per block of the grid-stride kernels
MAX_BLOCKS = 1024     # blocks per grid-stride launch; threads loop over further elements
MAX_MAP_BLOCKS = 4096     # blocks per launch of the elementwise kernels (map_shape)
SIM_THREADS = 32      # threads per block of a grid-stride launch under the simulator
SIM_BLOCKS = 2        # blocks of a grid-stride launch under the simulator

MAX_THREADS = 256     # threads per segment of a row reduction (a long row's whole block)
ROW_BLOCK = 128       # threads per block that short rows are packed into, several per block
SCRATCH = 256         # entries of a row block's shared scratch: at least its threads, which
                      # are at most max(MAX_THREADS, ROW_BLOCK) (tests lower MAX_THREADS)
MAX_ROW_BLOCKS = 65535    # blocks per row launch; the blocks loop over further rows

PTX_SIGNATURES = []   # device functions only: compiled into the kernels that call them


# --- grids ----------------------------------------------------------------------------------
def grid_stride_shape(n: int, threads: int | None = None,
                      max_blocks: int | None = None) -> tuple[int, int]:
    """(blocks, threads per block) of a grid-stride launch over n items: `threads` per block
    (default THREADS) and ceil(n / threads) blocks, at most `max_blocks` (default
    MAX_BLOCKS; at least one block); under the simulator at most SIM_THREADS threads and
    SIM_BLOCKS blocks."""
    threads = THREADS if threads is None else threads
    max_blocks = MAX_BLOCKS if max_blocks is None else max_blocks
    if SIMULATED:
        threads, max_blocks = min(threads, SIM_THREADS), min(max_blocks, SIM_BLOCKS)
    return max(1, min(-(-n // threads), max_blocks)), threads


def keep_to_one_cpu(index: int = 0) -> None:
    """Under the simulator, this process keeps to one of its CPUs (the index-th, modulo
    their count; nothing on a GPU, or where the OS sets no affinity): the simulator's CUDA
    threads are Python threads, serialised by the GIL, which its main thread polls, and
    spread over cores every handoff of the GIL crosses cores. bench_gpu's simulated MNIST
    FC step took 24 s on one CPU against 3-5 minutes over both of a 2-core machine
    (tests/conftest.py gives each pytest-xdist worker its own CPU this way)."""
    if SIMULATED and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[index % len(cpus)]})


def map_shape(n: int) -> tuple[int, int]:
    """(blocks, threads per block) of an elementwise kernel over n elements: up to THREADS
    threads (fewer for small n, a whole number of warps), at most MAX_MAP_BLOCKS blocks."""
    return grid_stride_shape(n, min(THREADS, 32 * -(-n // 32)), MAX_MAP_BLOCKS)


def grid_stride(kernel, n: int, *args) -> None:
    """kernel[grid_stride_shape(n)](*args): a grid-stride kernel over n items (nothing for
    n = 0)."""
    if n:
        kernel[grid_stride_shape(n)](*args)


def threads_for(n: int) -> int:
    """Threads per segment for reducing n elements: the smallest power of two >= n, within
    [1, MAX_THREADS]."""
    return min(threads_for_rows(n), MAX_THREADS)


def threads_for_rows(rows: int) -> int:
    """The smallest power of two >= rows (at least 1)."""
    t = 1
    while t < rows:
        t *= 2
    return t


def row_launch(rows: int, n: int, block: int = ROW_BLOCK) -> tuple[int, int, int]:
    """(blocks, threads per block, width) for `rows` reductions of n elements each: a
    segment of width = threads_for(n) threads per row, as many rows per block as fill
    `block` threads (at least one row, at most `rows` rounded up to a power of two)."""
    width = threads_for(n)
    groups = max(1, min(threads_for_rows(rows), block // width))
    return max(1, min(-(-rows // groups), MAX_ROW_BLOCKS)), groups * width, width


def input_layouts(*ndims: int):
    """(dtype, layout per ndim) for float32 and float64, the layouts all C-contiguous
    ("[:, ::1]" for ndim 2), then all strided ("[:, :]"): the inputs a kernel is compiled
    for (the modules' PTX_SIGNATURES)."""
    for dt in ("float32", "float64"):
        for last in ("::1", ":"):
            yield (dt, *("[" + ", ".join([":"] * (d - 1) + [last]) + "]" for d in ndims))


# --- indices --------------------------------------------------------------------------------
@cuda.jit(device=True, inline="always")
def unravel3(i, d1, d2):
    """The 3-D index (i0, i1, i2) of C-order position i in a shape (d0, d1, d2)."""
    i2 = i % d2
    i //= d2
    return i // d1, i % d1, i2


@cuda.jit(device=True, inline="always")
def unravel4(i, d1, d2, d3):
    """The 4-D index (i0, i1, i2, i3) of C-order position i in a shape (d0, d1, d2, d3)."""
    i3 = i % d3
    i //= d3
    i2 = i % d2
    i //= d2
    return i // d1, i % d1, i2, i3


@cuda.jit(device=True)
def offset4(i, shape, strides):
    """The element offset of the i-th element, in row-major order, of a 4-axis view with
    `shape` and element `strides`."""
    off = 0
    for a in range(3, -1, -1):
        n = shape[a]
        off += (i % n) * strides[a]
        i //= n
    return off


# --- row segments ---------------------------------------------------------------------------
@cuda.jit(device=True, inline="always")
def segment_scratch():
    """The block's float64 scratch of the segment reductions: SCRATCH entries, one per
    thread.

    Inlined into the kernel (numba-cuda lets a device function return only an array it was
    given, not one it allocated), so the shared array is the calling kernel's. Call it once
    per kernel: the simulator identifies shared arrays by source line, and would give two
    calls the same memory."""
    return cuda.shared.array(SCRATCH, float64)


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


@cuda.jit(device=True)
def segment_reduce(shared, value, tid, width, take_max):
    """The sum (or, with take_max, the maximum) of `value` over the segment of `width`
    threads holding thread `tid`, as the fixed tree of the module doc; every thread of the
    segment gets it. All threads of the block must call."""
    shared[tid] = value
    cuda.syncthreads()
    lane = tid % width
    s = width // 2
    while s > 0:
        if lane < s:
            if take_max:
                shared[tid] = max(shared[tid], shared[tid + s])
            else:
                shared[tid] += shared[tid + s]
        cuda.syncthreads()
        s //= 2
    total = shared[tid - lane]
    cuda.syncthreads()          # everyone has read before the scratch is written again
    return total


@cuda.jit(device=True)
def segment_sum(shared, value, tid, width):
    """segment_reduce's sum."""
    return segment_reduce(shared, value, tid, width, False)


@cuda.jit(device=True)
def segment_max(shared, value, tid, width):
    """segment_reduce's maximum."""
    return segment_reduce(shared, value, tid, width, True)


@cuda.jit(device=True)
def row_sum(shared, x, base, count, tid, width):
    """sum_k x[base + k] over k < count, in float64, by the segment of `width` threads."""
    total = 0.0
    for j in range(tid % width, count, width):
        total += float64(x[base + j])
    return segment_sum(shared, total, tid, width)


@cuda.jit(device=True)
def row_dot(shared, a, a_shift, b, b_shift, base, count, tid, width):
    """sum_k (a[base + k] - a_shift) (b[base + k] - b_shift) over k < count, in float64, by
    the segment of `width` threads (shift 0.0: the element itself, exactly)."""
    total = 0.0
    for j in range(tid % width, count, width):
        total += (float64(a[base + j]) - a_shift) * (float64(b[base + j]) - b_shift)
    return segment_sum(shared, total, tid, width)


@cuda.jit(device=True)
def row_max(shared, x, scale, base, count, tid, width):
    """max_k scale x[base + k] over k < count (-inf for none), in float64, by the segment
    of `width` threads."""
    m = -math.inf
    for j in range(tid % width, count, width):
        m = max(m, scale * float64(x[base + j]))
    return segment_max(shared, m, tid, width)


@cuda.jit(device=True)
def segment_logsumexp(shared, x, base, count, tid, width):
    """log(sum_k exp(x[base + k])) over k < count, stably (m + log sum exp(x - m), m the
    max), in float64, by the segment of `width` threads. An empty row (count 0) gives
    -inf."""
    m = row_max(shared, x, 1.0, base, count, tid, width)
    total = 0.0
    for j in range(tid % width, count, width):
        total += math.exp(float64(x[base + j]) - m)
    total = segment_sum(shared, total, tid, width)
    if total == 0.0:
        return -math.inf
    return m + math.log(total)


# --- row kernels ----------------------------------------------------------------------------
def _rows(a, b, out, rows, n, p, width):
    """row(shared, a, b, out, base, count, n, p, tid, width) on every row of the C-contiguous
    (rows, n) views, by a segment of `width` threads (`row` bound per kernel: row_kernel)."""
    shared = segment_scratch()
    tid, _, start, step = segment_passes(width)
    for first in range(start, rows, step):
        _, count, base = segment_row(first, tid, width, rows, n)
        row(shared, a, b, out, base, count, n, p, tid, width)  # noqa: F821


def row_kernel(row, name: str):
    """The kernel `name`(a, b, out, rows, n, p, width) that runs device function `row` on
    each row (_rows; one-input ops get their input as both a and b): a copy of _rows whose
    global `row` is it."""
    fn = types.FunctionType(_rows.__code__, {**_rows.__globals__, "row": row}, name)
    fn.__doc__ = row.__doc__
    return cuda.jit(fn)


ROW_SIGNATURE = "void({t}[::1], {t}[::1], {t}[::1], int64, int64, float64, int64)"


def launch_rows(kernel, op: str, out, ins, p: float = 0.0) -> None:
    """A row_kernel over C-contiguous `ins` (one or two) and `out` of shape (..., n), with
    parameter p (op: the op named in a layout error)."""
    if out.size == 0:
        return
    flats = [rows_view(a, op)[0] for a in ins]
    of, rows, n = rows_view(out, op)
    blocks, threads, width = row_launch(rows, n)
    kernel[blocks, threads](flats[0], flats[-1], of, rows, n, float(p), width)
