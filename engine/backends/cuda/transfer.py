"""Device-side copies: a strided array into another, dst += src, and a fill.

Used by the scheduler (a view flagged as an output gets its own buffer; a tensor computed on
one backend and read on another), by gradient accumulation, and by Tensor.fill, which this
module registers as the filler of numba device arrays when it is loaded (the CUDA backend
loads it before it makes any device copy).

Layouts: any strides on either side, as the CPU backend's numpy copies take them. A
C-contiguous destination (every buffer the scheduler hands) is written through a flat view
(arrays.flat, which checks the layout), the other side read as 4-axis views in the same C
order (arrays.rank4_pieces); any other destination is written through its own 4-axis
views. Never through a device array's reshape: on a GPU numba's DeviceNDArray.reshape of a
transposed (F-contiguous) array returns its memory order, not its C order (numba-cuda
0.30.4), and raises for a stepped slice; the simulator's reshape of either copies, so that
writes into it were lost (arrays' module doc). A destination whose elements share memory (a
broadcast view) is refused for copy and dst += src, whose threads would race on it; a
source that overlaps the destination is read from a copy of it first, as numpy does.

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
from engine.backends.cuda.arrays import (
    bits,
    c_contiguous,
    flat,
    half_format,
    overlap,
    overlapping_elements,
    rank4_pieces,
    same_elements,
)
from engine.backends.cuda.launch import grid_stride, unravel4
from engine.errors import BackendError
from engine.tensor import DTYPES, register_device_filler


@cuda.jit
def _copy_4d(dst, src):
    """dst[i] = src[j] (j: the 4-D index of C-order position i); dst flat."""
    _, d1, d2, d3 = src.shape
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        dst[i] = src[i0, i1, i2, i3]


@cuda.jit
def _copy_strided(dst, src):
    """dst[j] = src[j] for every 4-D index j; both of any strides."""
    _, d1, d2, d3 = dst.shape
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        dst[i0, i1, i2, i3] = src[i0, i1, i2, i3]


@cuda.jit
def _add(dst, src):
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        dst[i] = dst[i] + src[i]


@cuda.jit
def _add_strided(dst, src):
    """dst[j] += src[j] for every 4-D index j; both of any strides."""
    _, d1, d2, d3 = dst.shape
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        dst[i0, i1, i2, i3] = dst[i0, i1, i2, i3] + src[i0, i1, i2, i3]


@cuda.jit
def _fill(dst, value):
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        dst[i] = value


@cuda.jit
def _fill_strided(dst, value):
    _, d1, d2, d3 = dst.shape
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        dst[i0, i1, i2, i3] = value


def checked_pair(op: str, dst, src):
    """src, or a C-contiguous copy of it where it shares memory with dst (and is not dst
    itself, element for element); BackendError where the shapes differ or dst's elements
    share memory (see the module doc)."""
    if tuple(dst.shape) != tuple(src.shape):
        raise BackendError(f"{op}: the destination has shape {list(dst.shape)}, the source "
                           f"{list(src.shape)}")
    if overlapping_elements(dst):
        raise BackendError(f"{op}: the destination's elements share memory (shape "
                           f"{list(dst.shape)}, byte strides {list(dst.strides)}): a "
                           f"broadcast view cannot be written element by element")
    if overlap(dst, src) and not same_elements(dst, src):
        tmp = cuda.device_array(src.shape, src.dtype)
        copy(tmp, src)
        return tmp
    return src


def copy(dst, src) -> None:
    """dst[...] = src, both of one shape and any strides (16-bit floats: their bit
    patterns)."""
    if dst.size == 0 and tuple(dst.shape) == tuple(src.shape):
        return
    src = checked_pair("copy", dst, src)
    if half_format(dst) is not None:
        dst, src = bits(dst), bits(src)
    if c_contiguous(dst):
        out = flat(dst, "copy's destination")
        for (s4,), start in rank4_pieces(src):
            grid_stride(_copy_4d, s4.size, out[start:start + s4.size], s4)
        return
    for (d4, s4), _ in rank4_pieces(dst, src):
        grid_stride(_copy_strided, d4.size, d4, s4)


_PATTERN_DTYPES = {F16: DTYPES["f16"], BF16: DTYPES["bf16"]}


def fill(dst, value: float) -> None:
    """dst[...] = value, dst of any strides (16-bit floats: value rounded to nearest even,
    its pattern written). Elements that share memory all get the one value."""
    if dst.size == 0:
        return
    fmt = half_format(dst)
    if fmt is not None:
        pattern = np.asarray(value, np.float64).astype(_PATTERN_DTYPES[fmt]).view(np.uint16)
        dst, value = bits(dst), pattern[()]
    value = dst.dtype.type(value)
    if c_contiguous(dst):
        grid_stride(_fill, dst.size, flat(dst, "fill's destination"), value)
        return
    for (d4,), _ in rank4_pieces(dst):
        grid_stride(_fill_strided, d4.size, d4, value)


def accumulate(dst, src) -> None:
    """dst += src, both of one shape and any strides (16-bit floats: in float32, rounded to
    nearest even on store)."""
    if dst.size == 0 and tuple(dst.shape) == tuple(src.shape):
        return
    src = checked_pair("accumulate", dst, src)
    if half_format(dst) is not None:
        half.accumulate(dst, src)
        return
    if c_contiguous(dst) and c_contiguous(src):
        grid_stride(_add, dst.size, flat(dst, "accumulate's destination"),
                    flat(src, "accumulate's source"))
        return
    for (d4, s4), _ in rank4_pieces(dst, src):
        grid_stride(_add_strided, d4.size, d4, s4)


_COPIED = ("float32", "float64", "int32", "uint16")    # uint16: 16-bit floats' patterns
_VIEW = "[:, :, :, :]"
PTX_SIGNATURES = [(_copy_4d, f"void({t}[::1], {t}{_VIEW})") for t in _COPIED] + \
                 [(_copy_strided, f"void({t}{_VIEW}, {t}{_VIEW})") for t in _COPIED] + \
                 [(_add, f"void({t}[::1], {t}[::1])") for t in ("float32", "float64")] + \
                 [(_add_strided, f"void({t}{_VIEW}, {t}{_VIEW})")
                  for t in ("float32", "float64")] + \
                 [(_fill, f"void({t}[::1], {t})") for t in _COPIED] + \
                 [(_fill_strided, f"void({t}{_VIEW}, {t})") for t in _COPIED]

register_device_filler(cuda.devicearray.is_cuda_ndarray, fill)
