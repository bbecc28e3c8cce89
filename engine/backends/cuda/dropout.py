"""CUDA kernel of dropout, and 4-axis C-order views of strided device arrays.

dropout keeps element i (C order) of its output when the CPU kernel's splitmix64 hash of
(seed, i) clears the threshold (engine.backends.cpu.dropout states it), so both backends
draw the same mask, bit for bit:

    out[i] = x[i] * (1 / (1 - p) rounded to out's dtype)   if keep(seed, i, threshold)
             0                                              otherwise

One thread per element in a grid-stride loop over the C-contiguous output; x may be any
strided view, read through `c_order_rank4`: adjacent axes merged where the strides allow (a
contiguous array becomes one axis), unit axes put in front up to four; the kernel splits a
flat C-order position into that view's four indices.

The hash is written out in the kernel rather than called: numba-cuda compiles a called
function (device function or register_jitable) for the current GPU, so cuda.compile_ptx
could not check this module on a machine without one. The tests compare the mask with the
CPU kernel's.
"""

from __future__ import annotations

import warnings

import numpy as np
from numba import cuda

from engine.backends.cpu.dropout import GAMMA, MIX1, MIX2, ONE, S11, S27, S30, S31, threshold
from engine.backends.cpu.layout import coalesce
from engine.backends.cuda.arrays import SIMULATED, strided
from engine.errors import BackendError

RANK = 4                                   # kernels see strided arrays with four axes
THREADS = 128                              # threads per block of the elementwise kernels
if SIMULATED:   # numpy runs the hash there, and warns on its intended uint64 wrap-around
    warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning, __name__)
MAX_BLOCKS = 4 if SIMULATED else 1024      # the simulator runs each thread as a Python thread


def blocks(n: int) -> int:
    """Blocks of THREADS for a grid-stride loop over n items (at least 1, at most
    MAX_BLOCKS)."""
    return max(1, min(MAX_BLOCKS, -(-n // THREADS)))


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
    n1, n2, n3 = x.shape[1], x.shape[2], x.shape[3]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        z = seed + (np.uint64(i) + ONE) * GAMMA
        z = (z ^ (z >> S30)) * MIX1
        z = (z ^ (z >> S27)) * MIX2
        z = z ^ (z >> S31)
        i3 = i % n3
        rest = i // n3
        i2 = rest % n2
        rest //= n2
        out[i] = x[rest // n1, rest % n1, i2, i3] * (s if (z >> S11) >= thresh else zero)


def cuda_dropout(out, ins, p, seed):
    """Dispatcher of dropout: kernel(out, [x], p, seed)."""
    (x,) = ins
    n = out.size
    if n == 0:
        return
    _dropout[blocks(n), THREADS](c_order_rank4(x, "dropout's input"), out.reshape(n),
                                 np.uint64(seed), threshold(p), 1.0 / (1.0 - p))


PTX_SIGNATURES = [(_dropout, f"void({dt}[:, :, :, :], {dt}[::1], uint64, uint64, float64)")
                  for dt in ("float32", "float64")] + \
                 [(_dropout, f"void({dt}[:, :, :, ::1], {dt}[::1], uint64, uint64, float64)")
                  for dt in ("float32", "float64")]
