"""16-bit floats on the CUDA backend: conversion kernels and widened kernels.

Storage (engine.backends.cuda.arrays): a float16 tensor is a numba float16 device array, a
bfloat16 tensor a uint16 device array of its bit patterns. bfloat16 has no array dtype numba
knows: ml_dtypes' is a numpy "V" dtype that numba cannot type, and numba-cuda 0.30's
`numba.cuda.bf16` offers a scalar type (nv_bfloat16) and intrinsics on GPUs of compute
capability 8.0 and up only, nothing under the simulator (there `numba.cuda.bf16.bfloat16` is
None). float16 keeps numba's own float16 arrays (numba-cuda types, copies and prints them,
and numpy float16 host arrays copy to them directly), so that a device array's dtype alone
names its format: float16 is float16, uint16 bfloat16 (the engine has no uint16 dtype).

The kernels here never use numba's float16 arithmetic: both formats are read and written as
uint16 patterns (arrays.bits) and converted with the CPU backend's arithmetic
(engine.backends.cpu.half, same conventions: round to nearest even, subnormals, infinities,
NaN keeping sign and payload), so the two backends convert to the same bits on a GPU and
under the simulator alike: `widen` and `narrow` are the CPU's own scalar functions
(scalar_math: inlined into CUDA kernels, called compiled under the simulator), branchless,
in integer arithmetic but for one exact float32 subtraction (float16 subnormals widened)
and one float32 addition (their rounding), neither with a subnormal operand or result, so
a flush-to-zero mode changes nothing (numba-cuda 0.30 cannot lower np.rint).

`widened(kernel, update)` runs a float32 CUDA kernel on nodes of which some are 16-bit, as
engine.backends.cpu.half.widened does on the CPU (both are engine.backends.widening's): per
call, the 16-bit inputs are widened into new float32 device arrays (contiguous), the kernel
runs on them, and a 16-bit output is rounded to nearest even on store; an update op's
16-bit inputs are stored back too.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from engine.backends.cpu.half import narrow, widen
from engine.backends.cpu.jit import scalar_math
from engine.backends.cuda.arrays import (
    bits,
    c_contiguous,
    flat,
    half_format,
    overlap,
    overlapping_elements,
    rank4_pieces,
    strided,
)
from engine.backends.cuda.launch import grid_stride, unravel4
from engine.backends.widening import HalfArrays, run_widened
from engine.errors import BackendError


@scalar_math
def widen_bits(h, fmt):
    """The float32 bit pattern (uint32) of pattern `h` of format `fmt`. The widening kernel
    stores these bits: under the simulator a float returned to the kernel's Python is a
    double, and a signalling NaN would come back quieted."""
    return np.float32(widen(h, fmt)).view(np.uint32)


@scalar_math
def narrow_bits(b, fmt):
    """The pattern of format `fmt` nearest the float32 whose bits (uint32) are `b`. The
    rounding kernel reads bits for the same reason: a float handed from the simulator's
    Python to a compiled function passes through a double."""
    return narrow(np.uint32(b).view(np.float32), fmt)


@scalar_math
def add(a, b, fmt):
    """The pattern of widen(a) + widen(b), the float32 sum rounded to nearest even."""
    return narrow(widen(a, fmt) + widen(b, fmt), fmt)


# --- kernels: grid-stride loops, a flat contiguous array against a 4-axis strided view -------
@cuda.jit
def _widen_4d(dst, src, fmt):
    """dst[i] = float32 bits of pattern src[j] (j: the 4-D index of C-order position i);
    dst a flat uint32 view of a float32 array, src a uint16 view of any strides."""
    _, d1, d2, d3 = src.shape
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        dst[i] = widen_bits(src[i0, i1, i2, i3], fmt)


@cuda.jit
def _narrow_4d(dst, src, fmt):
    """dst[j] = pattern of src[i] rounded to nearest even (j: the 4-D index of C-order
    position i); src a flat uint32 view of a float32 array, dst a uint16 view of any
    strides."""
    _, d1, d2, d3 = dst.shape
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        dst[i0, i1, i2, i3] = narrow_bits(src[i], fmt)


@cuda.jit
def _add(dst, src, fmt):
    """dst[i] = pattern of widen(dst[i]) + widen(src[i]) (float32 sum rounded to nearest
    even); both flat uint16."""
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        dst[i] = add(dst[i], src[i], fmt)


@cuda.jit
def _add_strided(dst, src, fmt):
    """_add on 4-axis uint16 views of any strides (dst[j], src[j] for every 4-D index j)."""
    _, d1, d2, d3 = dst.shape
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        dst[i0, i1, i2, i3] = add(dst[i0, i1, i2, i3], src[i0, i1, i2, i3], fmt)


def _format_of(arr) -> int:
    fmt = half_format(arr)
    if fmt is None:
        raise TypeError(f"not a 16-bit float device array: {arr.dtype}")
    return fmt


def widen_into(dst, src) -> None:
    """dst[...] = 16-bit device array `src` (any strides) widened to float32; dst a
    C-contiguous float32 device array of src's shape."""
    fmt = _format_of(src)
    words = flat(_words(dst), "the float32 array widened into")
    for (view,), start in rank4_pieces(bits(src)):
        n = view.size
        grid_stride(_widen_4d, n, words[start:start + n], view, np.int64(fmt))


def narrow_into(dst, src) -> None:
    """16-bit device array `dst` (any strides) = float32 device array `src` (C-contiguous,
    dst's shape) rounded to nearest even."""
    fmt = _format_of(dst)
    words = flat(_words(src), "the float32 array rounded from")
    for (view,), start in rank4_pieces(bits(dst)):
        n = view.size
        grid_stride(_narrow_4d, n, view, words[start:start + n], np.int64(fmt))


def _words(a):
    """The uint32 view of float32 device array `a` (its bits), with a's shape and strides."""
    return strided(a, a.shape, a.strides, 0, np.uint32)


def widened_copy(a):
    """A new C-contiguous float32 device array of 16-bit device array `a`'s values."""
    out = cuda.device_array(a.shape, np.float32)
    if a.size:
        widen_into(out, a)
    return out


def accumulate(dst, src) -> None:
    """dst += src for 16-bit device arrays of one format and shape, any strides: the
    float32 sum of each pair, rounded to nearest even (what numpy's float16 and ml_dtypes'
    bfloat16 additions give). A dst whose elements share memory is refused (its threads
    would race); a src overlapping dst is the caller's to copy first
    (engine.backends.cuda.transfer.accumulate does)."""
    if not dst.size:
        return
    fmt = np.int64(_format_of(dst))
    if overlapping_elements(dst):
        raise BackendError(f"accumulate: the destination's elements share memory (shape "
                           f"{list(dst.shape)}, byte strides {list(dst.strides)})")
    dbits, sbits = bits(dst), bits(src)
    if c_contiguous(dbits) and c_contiguous(sbits):
        grid_stride(_add, dbits.size, flat(dbits, "accumulate's destination"),
                    flat(sbits, "accumulate's source"), fmt)
        return
    for (d4, s4), _ in rank4_pieces(dbits, sbits):
        grid_stride(_add_strided, d4.size, d4, s4, fmt)


DEVICE_ARRAYS = HalfArrays(
    is_half=lambda a: half_format(a) is not None, overlap=overlap,
    widened_copy=widened_copy, empty32=lambda shape: cuda.device_array(shape, np.float32),
    store=narrow_into)


def widened(kernel, update: bool = False):
    """The float32 CUDA `kernel(out, ins, **params)` as a kernel on device arrays of which
    some are 16-bit (arrays.half_format): each call widens the 16-bit inputs into float32
    temporaries, runs `kernel` on them, and rounds a 16-bit output to nearest even on
    store (engine.backends.widening.run_widened, the CPU backend's too); `update`: the
    kernel writes its inputs in place too."""
    def call(out, ins, **params):
        run_widened(lambda o, i: kernel(o, i, **params), out, ins, update, DEVICE_ARRAYS)
    call.__name__ = f"widened_{getattr(kernel, '__name__', 'kernel')}"
    call.__doc__ = kernel.__doc__
    return call


def _signatures():
    """The conversions over flat float32 and strided 4-axis uint16 views (layout "A"), and
    the addition over flat uint16 arrays and over strided 4-axis views."""
    view = "uint16[:, :, :, :]"
    return [(_widen_4d, f"void(uint32[::1], {view}, int64)"),
            (_narrow_4d, f"void({view}, uint32[::1], int64)"),
            (_add, "void(uint16[::1], uint16[::1], int64)"),
            (_add_strided, f"void({view}, {view}, int64)")]


PTX_SIGNATURES = _signatures()
