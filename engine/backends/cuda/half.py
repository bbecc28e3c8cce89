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

import itertools

import numpy as np
from numba import cuda

from engine.backends.cpu.half import narrow, widen
from engine.backends.cpu.jit import scalar_math
from engine.backends.cpu.layout import coalesce
from engine.backends.cuda.arrays import bits, half_format, overlap, strided
from engine.backends.cuda.launch import grid_stride, unravel4
from engine.backends.widening import HalfArrays, run_widened

RANK = 4                  # the conversion kernels read and write strided views of 4 axes



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


def _pieces(arr):
    """(4-axis view, first C-order position) pieces covering device array `arr` in C
    order: adjacent axes merged where the strides allow, unit axes dropped; more than four
    left: one piece per index of the leading ones."""
    dims = coalesce(arr.shape, arr.strides)
    shape = [int(n) for n, _ in dims]
    strides = [int(st[0]) for _, st in dims]
    lead, inner = len(shape) - RANK, RANK
    if lead <= 0:
        pad = RANK - len(shape)
        yield strided(arr, [1] * pad + shape, [0] * pad + strides), 0
        return
    block = int(np.prod(shape[lead:]))
    for k, index in enumerate(itertools.product(*(range(n) for n in shape[:lead]))):
        offset = sum(i * s for i, s in zip(index, strides[:lead], strict=True))
        yield strided(arr, shape[lead:lead + inner], strides[lead:], offset), k * block


def _format_of(arr) -> int:
    fmt = half_format(arr)
    if fmt is None:
        raise TypeError(f"not a 16-bit float device array: {arr.dtype}")
    return fmt


def widen_into(dst, src) -> None:
    """dst[...] = 16-bit device array `src` (any strides) widened to float32; dst a
    C-contiguous float32 device array of src's shape."""
    fmt = _format_of(src)
    flat = strided(dst, (dst.size,), (4,), 0, np.uint32)
    for view, start in _pieces(bits(src)):
        n = view.size
        grid_stride(_widen_4d, n, flat[start:start + n], view, np.int64(fmt))


def narrow_into(dst, src) -> None:
    """16-bit device array `dst` (any strides) = float32 device array `src` (C-contiguous,
    dst's shape) rounded to nearest even."""
    fmt = _format_of(dst)
    flat = strided(src, (src.size,), (4,), 0, np.uint32)
    for view, start in _pieces(bits(dst)):
        n = view.size
        grid_stride(_narrow_4d, n, view, flat[start:start + n], np.int64(fmt))


def widened_copy(a):
    """A new C-contiguous float32 device array of 16-bit device array `a`'s values."""
    out = cuda.device_array(a.shape, np.float32)
    if a.size:
        widen_into(out, a)
    return out


def accumulate(dst, src) -> None:
    """dst += src for 16-bit device arrays of one format, both C-contiguous: the float32
    sum of each pair, rounded to nearest even (what numpy's float16 and ml_dtypes'
    bfloat16 additions give)."""
    if dst.size:
        grid_stride(_add, dst.size, bits(dst).reshape(dst.size), bits(src).reshape(src.size),
                    np.int64(_format_of(dst)))


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
    the addition over flat uint16 arrays."""
    view = "uint16[:, :, :, :]"
    return [(_widen_4d, f"void(uint32[::1], {view}, int64)"),
            (_narrow_4d, f"void({view}, uint32[::1], int64)"),
            (_add, "void(uint16[::1], uint16[::1], int64)")]


PTX_SIGNATURES = _signatures()
