"""CUDA kernel of dropout, and 4-axis C-order views of strided device arrays.

dropout keeps element i (C order) of its output when the CPU kernel's splitmix64 hash of
(seed, i) clears the threshold (engine.backends.cpu.dropout states it), so both backends
draw the same mask, bit for bit:

    out[i] = x[i] * (1 / (1 - p) rounded to out's dtype)   if keep(seed, i, threshold)
             0                                              otherwise

One thread per element in a grid-stride loop over the C-contiguous output (launched by
engine.backends.cuda.launch); x may be any strided view, read through `c_order_rank4`:
adjacent axes merged where the strides allow (a contiguous array becomes one axis), unit
axes put in front up to four; the kernel splits a flat C-order position into that view's
four indices (launch.unravel4).

The hash is written out in the kernel, the CPU kernel's steps with its constants; the tests
compare the mask with the CPU kernel's.
"""

from __future__ import annotations

import warnings

import numpy as np
from numba import cuda

from engine.backends.cpu.dropout import GAMMA, MIX1, MIX2, ONE, S11, S27, S30, S31, threshold
from engine.backends.cpu.layout import coalesce
from engine.backends.cuda.arrays import SIMULATED, flat, strided
from engine.backends.cuda.launch import grid_stride, unravel4
from engine.errors import BackendError

RANK = 4                                   # kernels see strided arrays with four axes
if SIMULATED:   # numpy runs the hash there, and warns on its intended uint64 wrap-around
    warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning, __name__)


def c_order_rank4(arr, what: str = "array"):
    """A 4-axis view of device array `arr` whose C-order traversal is arr's: unit axes
    dropped, adjacent axes (i, i+1) merged where stride[i] = stride[i+1] * shape[i+1], unit
    axes put in front. BackendError (naming `what`) if more than four axes remain."""
    dims = coalesce(arr.shape, arr.strides)
    shape = [int(n) for n, _ in dims]
    strides = [int(st[0]) for _, st in dims]
    if len(shape) > RANK:
        raise BackendError(f"the cuda kernels read strided arrays of at most {RANK} "
                           f"non-mergeable axes; {what} has shape {list(arr.shape)} and byte "
                           f"strides {list(arr.strides)}")
    pad = RANK - len(shape)
    return strided(arr, [1] * pad + shape, [0] * pad + strides)


@cuda.jit
def _dropout(x, out, seed, thresh, scale):
    """out[i] = x[i] * scale where element i survives, else 0 (out flat, x 4-axis)."""
    s = out.dtype.type(scale)
    zero = out.dtype.type(0)
    _, d1, d2, d3 = x.shape
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        z = seed + (np.uint64(i) + ONE) * GAMMA
        z = (z ^ (z >> S30)) * MIX1
        z = (z ^ (z >> S27)) * MIX2
        z = z ^ (z >> S31)
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        out[i] = x[i0, i1, i2, i3] * (s if (z >> S11) >= thresh else zero)


def cuda_dropout(out, ins, p, seed):
    """Dispatcher of dropout: kernel(out, [x], p, seed)."""
    (x,) = ins
    n = out.size
    if n == 0:
        return
    grid_stride(_dropout, n, c_order_rank4(x, "dropout's input"), flat(out, "dropout's output"),
                np.uint64(seed), threshold(p), 1.0 / (1.0 - p))


PTX_SIGNATURES = [(_dropout, f"void({dt}[:, :, :, :], {dt}[::1], uint64, uint64, float64)")
                  for dt in ("float32", "float64")] + \
                 [(_dropout, f"void({dt}[:, :, :, ::1], {dt}[::1], uint64, uint64, float64)")
                  for dt in ("float32", "float64")]
