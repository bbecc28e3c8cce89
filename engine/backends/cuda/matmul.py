"""CUDA kernel of matmul: a tiled shared-memory matrix product, batch axes broadcast.

    out[p, q, i, j] = sum_k a[p, q, i, k] b[p, q, k, j]

on 4-axis views: the batch axes of a and b are broadcast to out's (stride 0, numpy's rules)
and padded with unit axes in front to two; beyond two batch axes the dispatcher launches the
kernel once per index of the leading ones. A block of TILE x TILE threads computes one
TILE x TILE tile of out: for each TILE-wide slice of k it loads a tile of a and one of b
into shared memory (zeros past the matrices' edges), synchronises, and each thread adds
the slice's TILE products to its own sum, in k order, in the arrays' dtype. Blocks loop
over row tiles (grid y) and over the batch (grid z) where the grid is smaller than the
work. Every output element is written once, by one thread: no atomics.

Under the simulator (which runs each thread as a Python thread, and each syncthreads as a
polling barrier of milliseconds) the tile is 4 x 4, and a product of more than
SIM_TILED_MAX_WORK multiply-adds goes to `_matmul_direct` instead: no shared memory, no
barrier, a grid-stride loop over out's elements in C order on a small grid
(launch.grid_stride_shape), each element's sum taken over k in order from zero. That is the
tiled kernel's sum term for term (its zero padding adds +0.0 to a sum that is never -0.0),
so the two give the same bits there. A GPU always runs the tiled kernel.

The sums are rounded differently from the CPU kernel's BLAS (its own blocking, and fused
multiply-adds here), so the two agree to a few ulps per term, not bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from engine.backends.cuda.arrays import SIMULATED, broadcast, strided
from engine.backends.cuda.launch import grid_stride, unravel4

# 16 x 16 threads per block on a GPU; 4 x 4 under the simulator, which runs each thread as a
# Python thread (the same code, and small test shapes then span several tiles)
TILE = 4 if SIMULATED else 16
MAX_GRID_Y = 65535                        # CUDA's limit on gridDim.y and gridDim.z
MAX_BATCH_BLOCKS = 4 if SIMULATED else MAX_GRID_Y
# simulator only: products of more multiply-adds (batch x M x N x K) run without tiles
SIM_TILED_MAX_WORK = 1024


@cuda.jit
def _matmul_tiled(a, b, out):
    """out[p, q] = a[p, q] @ b[p, q] for 4-axis a (P, Q, M, K), b (P, Q, K, N), out
    (P, Q, M, N); launched with (TILE, TILE) blocks."""
    tile_a = cuda.shared.array((TILE, TILE), dtype=out.dtype)
    tile_b = cuda.shared.array((TILE, TILE), dtype=out.dtype)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    nq, m, n = out.shape[1], out.shape[2], out.shape[3]
    kdim = a.shape[3]
    zero = out.dtype.type(0)
    j = cuda.blockIdx.x * TILE + tx
    for z in range(cuda.blockIdx.z, out.shape[0] * nq, cuda.gridDim.z):
        p = z // nq
        q = z % nq
        for row0 in range(cuda.blockIdx.y * TILE, m, cuda.gridDim.y * TILE):
            i = row0 + ty
            acc = zero
            for k0 in range(0, kdim, TILE):
                ka = k0 + tx
                kb = k0 + ty
                tile_a[ty, tx] = a[p, q, i, ka] if i < m and ka < kdim else zero
                tile_b[ty, tx] = b[p, q, kb, j] if kb < kdim and j < n else zero
                cuda.syncthreads()
                for kk in range(TILE):
                    acc += tile_a[ty, kk] * tile_b[kk, tx]
                cuda.syncthreads()
            if i < m and j < n:
                out[p, q, i, j] = acc


@cuda.jit
def _matmul_direct(a, b, out):
    """out[p, q] = a[p, q] @ b[p, q] as _matmul_tiled, one output element per thread and
    grid-stride step: out[p, q, i, j] = sum over k = 0, 1, ... of a[p, q, i, k] b[p, q, k, j]
    (launched under the simulator only)."""
    nq, m, n = out.shape[1], out.shape[2], out.shape[3]
    kdim = a.shape[3]
    zero = out.dtype.type(0)
    for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        p, q, i, j = unravel4(e, nq, m, n)
        acc = zero
        for k in range(kdim):
            acc += a[p, q, i, k] * b[p, q, k, j]
        out[p, q, i, j] = acc


def _at(arr, index):
    """arr[index] for a tuple of leading indices, as a strided view."""
    offset = sum(i * s for i, s in zip(index, arr.strides, strict=False))
    return strided(arr, arr.shape[len(index):], arr.strides[len(index):], offset)


def _pad_batch(arr):
    """arr with unit batch axes (stride 0) in front up to 4 axes."""
    pad = 4 - arr.ndim
    return strided(arr, (1,) * pad + tuple(arr.shape), (0,) * pad + tuple(arr.strides))


def _launch(out, a, b):
    """out = a @ b on 4-axis views."""
    nbatch = out.shape[0] * out.shape[1]
    m, n = out.shape[2], out.shape[3]
    if SIMULATED and nbatch * m * n * a.shape[3] > SIM_TILED_MAX_WORK:
        grid_stride(_matmul_direct, out.size, a, b, out)
        return
    grid = (-(-n // TILE), min(-(-m // TILE), MAX_GRID_Y), min(nbatch, MAX_BATCH_BLOCKS))
    _matmul_tiled[grid, (TILE, TILE)](a, b, out)


def cuda_matmul(out, ins):
    """Dispatcher of matmul: kernel(out, [a, b]); out's shape is batch + (M, N)."""
    a, b = ins
    if out.size == 0:
        return
    batch = tuple(out.shape[:-2])
    a = broadcast(a, batch + tuple(a.shape[-2:]))
    b = broadcast(b, batch + tuple(b.shape[-2:]))
    lead = batch[:-2]
    for index in np.ndindex(*lead):
        _launch(_pad_batch(_at(out, index)), _pad_batch(_at(a, index)),
                _pad_batch(_at(b, index)))


def _signatures():
    """float32 and float64; operands strided (any layout) or C-contiguous."""
    sigs = []
    for dt in ("float32", "float64"):
        dense, view = f"{dt}[:, :, :, ::1]", f"{dt}[:, :, :, :]"
        for a in (dense, view):
            for b in (dense, view):
                sigs += [(kernel, f"void({a}, {b}, {dense})")
                         for kernel in (_matmul_tiled, _matmul_direct)]
    return sigs


PTX_SIGNATURES = _signatures()
