"""Block-level shared-memory reductions and flat device views, shared by the CUDA kernels
of the reductions and row-wise ops (sum, softmax, cross-entropy, argmax, norms).

A row (or one output element's set of inputs) is reduced by a block of T threads, T a power
of two of at most MAX_THREADS chosen from the row length alone. Thread t first accumulates
its own share of the row, elements t, t + T, t + 2T, ..., privately in float64; then the T
partials meet in shared memory and are combined as a tree:

    for s = T/2, T/4, ..., 1:   partial[t] = partial[t] + partial[t + s]   for t < s

The pairing depends on T only, and T on the shape only, so every result is the same bits on
every run (no atomics). `segment_sum` and `segment_max` run the same tree inside segments
of `width` consecutive threads (a power of two dividing T), so one block can reduce several
short rows at once; with width = T the segment is the whole block.

Kernels take every array as a 1-D view over its memory (`flat_view`) and compute element
offsets from strides given as integers, so each kernel is compiled for one layout per dtype:
`float32[::1]` / `float64[::1]`, whatever the strides of the tensors it is handed.
"""

from __future__ import annotations

import math

from numba import cuda, float64

from engine.backends.cuda.arrays import strided
from engine.errors import BackendError

MAX_THREADS = 256     # threads per block, and the size of every shared-memory scratch array
ROW_BLOCK = 128       # threads per block that short rows are packed into, several per block
MAX_BLOCKS = 65535    # blocks per launch; kernels loop over further rows (grid-stride)

PTX_SIGNATURES = []   # device functions only: compiled into the kernels that call them


def threads_for(n: int) -> int:
    """Threads per block for reducing n elements: the smallest power of two >= n, within
    [1, MAX_THREADS]."""
    t = 1
    while t < min(n, MAX_THREADS):
        t *= 2
    return t


def row_launch(rows: int, n: int, block: int = ROW_BLOCK) -> tuple[int, int, int]:
    """(blocks, threads per block, width) for `rows` reductions of n elements each: a
    segment of width = threads_for(n) threads per row, as many rows per block as fill
    `block` threads (at least one row, at most `rows` rounded up to a power of two)."""
    width = threads_for(n)
    groups = max(1, min(threads_for_rows(rows), block // width))
    return max(1, min(-(-rows // groups), MAX_BLOCKS)), groups * width, width


def threads_for_rows(rows: int) -> int:
    """The smallest power of two >= rows (at least 1)."""
    t = 1
    while t < rows:
        t *= 2
    return t


def element_strides(arr, op: str) -> tuple[int, ...]:
    """arr's strides in elements; negative or unaligned strides raise."""
    item = arr.dtype.itemsize
    out = []
    for n, s in zip(arr.shape, arr.strides, strict=True):
        if n > 1 and (s < 0 or s % item):
            raise BackendError(f"{op}: the cuda kernel needs non-negative strides that are "
                               f"multiples of the item size, got strides {tuple(arr.strides)} "
                               f"for shape {list(arr.shape)}")
        out.append(s // item if n > 1 else 0)
    return tuple(out)


def flat_view(arr, op: str):
    """(view, element strides): a 1-D view of the memory arr spans, from its first element
    to its last, and the strides at which arr's elements lie in that view."""
    strides = element_strides(arr, op)
    if any(n == 0 for n in arr.shape):
        return strided(arr, (0,), (arr.dtype.itemsize,)), strides
    span = 1 + sum((n - 1) * s for n, s in zip(arr.shape, strides, strict=True))
    return strided(arr, (span,), (arr.dtype.itemsize,)), strides


def rows_view(arr, op: str):
    """(view, rows, n): the 1-D view of a C-contiguous array of shape (..., n) whose row r
    is view[r * n : (r + 1) * n]; a strided array raises (the ops insert `cont`)."""
    shape = tuple(arr.shape)    # the simulator's shapes refuse negative indices
    n = shape[-1] if shape else 1
    rows = math.prod(shape[:-1])
    expected = arr.dtype.itemsize
    for d, s in zip(reversed(shape), reversed(tuple(arr.strides)), strict=True):
        if d != 1 and s != expected:
            raise BackendError(f"{op}: the cuda kernel needs C-contiguous inputs, got strides "
                               f"{tuple(arr.strides)} for shape {list(arr.shape)}")
        expected *= d
    return strided(arr, (rows * n,), (arr.dtype.itemsize,)), rows, n


def pad4(dims, op: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, strides) of [(size, stride)] axes, padded in front with unit axes to 4."""
    if len(dims) > 4:
        raise BackendError(f"{op}: the cuda kernel handles at most 4 axes that cannot be "
                           f"merged on either side of a reduction, got sizes "
                           f"{[n for n, _ in dims]} with strides {[s for _, s in dims]}")
    pad = 4 - len(dims)
    return (1,) * pad + tuple(n for n, _ in dims), (0,) * pad + tuple(s for _, s in dims)


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


@cuda.jit(device=True)
def segment_sum(shared, value, tid, width):
    """The sum of `value` over the segment of `width` threads holding thread `tid`, as a
    fixed tree; every thread of the segment gets it. All threads of the block must call."""
    shared[tid] = value
    cuda.syncthreads()
    lane = tid % width
    s = width // 2
    while s > 0:
        if lane < s:
            shared[tid] += shared[tid + s]
        cuda.syncthreads()
        s //= 2
    total = shared[tid - lane]
    cuda.syncthreads()          # everyone has read before the scratch is written again
    return total


@cuda.jit(device=True)
def segment_max(shared, value, tid, width):
    """The maximum of `value` over the segment of `width` threads holding thread `tid`
    (as segment_sum, with max)."""
    shared[tid] = value
    cuda.syncthreads()
    lane = tid % width
    s = width // 2
    while s > 0:
        if lane < s:
            shared[tid] = max(shared[tid], shared[tid + s])
        cuda.syncthreads()
        s //= 2
    top = shared[tid - lane]
    cuda.syncthreads()
    return top


@cuda.jit(device=True)
def segment_logsumexp(shared, x, base, count, tid, width):
    """log(sum_k exp(x[base + k])) over k < count, stably (m + log sum exp(x - m), m the
    max), in float64; the `count` elements are shared by the segment of `width` threads.
    An empty row (count 0) gives -inf."""
    lane = tid % width
    m = -math.inf
    for j in range(lane, count, width):
        m = max(m, float64(x[base + j]))
    m = segment_max(shared, m, tid, width)
    total = 0.0
    for j in range(lane, count, width):
        total += math.exp(float64(x[base + j]) - m)
    total = segment_sum(shared, total, tid, width)
    if total == 0.0:
        return -math.inf
    return m + math.log(total)
