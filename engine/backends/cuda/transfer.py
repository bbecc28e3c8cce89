"""Device-side copies: a strided array into a contiguous one, dst += src, and a fill.

Used by the scheduler (a view flagged as an output gets its own buffer; a tensor computed on
one backend and read on another), by gradient accumulation, and by Tensor.fill, which this
module registers as the filler of numba device arrays when it is loaded (the CUDA backend
loads it before it makes any device copy).
"""

from __future__ import annotations

from numba import cuda

from engine.backends.cuda.arrays import grid_stride_shape, with_rank
from engine.tensor import register_device_filler

THREADS = 128
MAX_BLOCKS = 1024
MAX_RANK = 6


@cuda.jit
def _copy_4d(dst, src):
    n1, n2, n3 = src.shape[1], src.shape[2], src.shape[3]
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, dst.size, step):
        i3 = i % n3
        r = i // n3
        i2 = r % n2
        r = r // n2
        i1 = r % n1
        i0 = r // n1
        dst[i] = src[i0, i1, i2, i3]


@cuda.jit
def _add(dst, src):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, dst.size, step):
        dst[i] = dst[i] + src[i]


@cuda.jit
def _fill(dst, value):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, dst.size, step):
        dst[i] = value


def _shape(n: int) -> tuple[int, int]:
    """(blocks, threads) of a grid-stride launch over n elements (capped in the simulator)."""
    return grid_stride_shape(n, THREADS, MAX_BLOCKS)


def _as_4d(a):
    """A view of `a` with exactly 4 axes (leading axes merged where contiguous)."""
    if a.ndim <= 4:
        return with_rank(a, 4)
    raise ValueError(f"the CUDA backend copies arrays of at most 4 axes, got {a.ndim}")


def copy(dst, src) -> None:
    """dst[...] = src, dst C-contiguous, src any strides, same shape."""
    if dst.size == 0:
        return
    _copy_4d[_shape(dst.size)](dst.reshape(dst.size), _as_4d(src))


def fill(dst, value: float) -> None:
    """dst[...] = value, dst C-contiguous."""
    if dst.size:
        _fill[_shape(dst.size)](dst.reshape(dst.size), dst.dtype.type(value))


def accumulate(dst, src) -> None:
    """dst += src, both C-contiguous of one shape."""
    if dst.size == 0:
        return
    _add[_shape(dst.size)](dst.reshape(dst.size), src.reshape(src.size))


PTX_SIGNATURES = [(k, f"void({t}[::1], {t}[:, :, :, :])") for k in (_copy_4d,)
                  for t in ("float32", "float64", "int32")] + \
                 [(_add, f"void({t}[::1], {t}[::1])") for t in ("float32", "float64")] + \
                 [(_fill, f"void({t}[::1], {t})") for t in ("float32", "float64", "int32")]

register_device_filler(cuda.devicearray.is_cuda_ndarray, fill)
