"""Device-side copies: a strided array into a contiguous one, dst += src, and a fill.

Used by the scheduler (a view flagged as an output gets its own buffer; a tensor computed on
one backend and read on another), by gradient accumulation, and by Tensor.fill, which this
module registers as the filler of numba device arrays when it is loaded (the CUDA backend
loads it before it makes any device copy).

16-bit floats (arrays.half_format): copies and fills move their uint16 bit patterns
(arrays.bits), the same kernels for both formats; dst += src widens both to float32, adds
and rounds to nearest even (engine.backends.cuda.half.accumulate). The kernels are
grid-stride loops launched by engine.backends.cuda.launch.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from engine.backends.cpu.half import BF16, F16
from engine.backends.cuda import half
from engine.backends.cuda.arrays import bits, half_format, with_rank
from engine.backends.cuda.launch import grid_stride, unravel4
from engine.tensor import DTYPES, register_device_filler


@cuda.jit
def _copy_4d(dst, src):
    _, d1, d2, d3 = src.shape
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        dst[i] = src[i0, i1, i2, i3]


@cuda.jit
def _add(dst, src):
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        dst[i] = dst[i] + src[i]


@cuda.jit
def _fill(dst, value):
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        dst[i] = value


def _as_4d(a):
    """A view of `a` with exactly 4 axes (leading axes merged where contiguous)."""
    if a.ndim <= 4:
        return with_rank(a, 4)
    raise ValueError(f"the CUDA backend copies arrays of at most 4 axes, got {a.ndim}")


def copy(dst, src) -> None:
    """dst[...] = src, dst C-contiguous, src any strides, same shape (16-bit floats: their
    bit patterns)."""
    if dst.size == 0:
        return
    if half_format(dst) is not None:
        dst, src = bits(dst), bits(src)
    grid_stride(_copy_4d, dst.size, dst.reshape(dst.size), _as_4d(src))


_PATTERN_DTYPES = {F16: DTYPES["f16"], BF16: DTYPES["bf16"]}


def fill(dst, value: float) -> None:
    """dst[...] = value, dst C-contiguous (16-bit floats: value rounded to nearest even,
    its pattern written)."""
    if dst.size == 0:
        return
    fmt = half_format(dst)
    if fmt is not None:
        pattern = np.asarray(value, np.float64).astype(_PATTERN_DTYPES[fmt]).view(np.uint16)
        dst, value = bits(dst), pattern[()]
    grid_stride(_fill, dst.size, dst.reshape(dst.size), dst.dtype.type(value))


def accumulate(dst, src) -> None:
    """dst += src, both C-contiguous of one shape (16-bit floats: in float32, rounded to
    nearest even on store)."""
    if dst.size == 0:
        return
    if half_format(dst) is not None:
        half.accumulate(dst, src)
        return
    grid_stride(_add, dst.size, dst.reshape(dst.size), src.reshape(src.size))


PTX_SIGNATURES = [(k, f"void({t}[::1], {t}[:, :, :, :])") for k in (_copy_4d,)
                  for t in ("float32", "float64", "int32", "uint16")] + \
                 [(_add, f"void({t}[::1], {t}[::1])") for t in ("float32", "float64")] + \
                 [(_fill, f"void({t}[::1], {t})")
                  for t in ("float32", "float64", "int32", "uint16")]

register_device_filler(cuda.devicearray.is_cuda_ndarray, fill)
