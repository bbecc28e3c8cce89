"""16-bit floats for numba kernels: float16 and bfloat16 as uint16 bit patterns.

numba has no 16-bit float type on the CPU, so kernels read and write the patterns and
convert: widen to float32 on load (exact for both formats), compute in float32 or better,
round to nearest, ties to even, on store.

    widen_f16(h) -> float32          narrow_f16(x) -> uint16     (IEEE binary16)
    widen_bf16(h) -> float32         narrow_bf16(x) -> uint16    (bfloat16: float32's top half)
    widen_array(src_bits, dst_f32, fmt)   narrow_array(src_f32, dst_bits, fmt)   fmt: F16, BF16

Conventions, held by tests over all 65,536 patterns each way against numpy's float16 and
ml_dtypes' bfloat16: infinities stay infinities; a float32 beyond the largest finite value
(after rounding) becomes an infinity; float16's subnormals are produced and read; a NaN stays
a NaN of the same sign, keeping the top bits of its payload (float16: a payload that would
vanish becomes 1, as numpy does; bfloat16: the quiet bit is set, so that no NaN becomes an
infinity).
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.jit import parallel_kernel, prange, scalar_math
from engine.tensor import is_half

F16, BF16 = 0, 1          # the formats' codes (fmt arguments), as compiled constants

_SIGN32 = np.uint32(0x80000000)
_ABS32 = np.uint32(0x7FFFFFFF)
_INF32 = np.uint32(0x7F800000)
_INF16 = np.uint16(0x7C00)
_TWO_M24 = np.float32(2.0 ** -24)     # float16's smallest subnormal
_MIN_NORMAL16 = np.uint32(0x38800000)  # 2^-14 as float32 bits: float16's smallest normal
_OVERFLOW16 = np.uint32(0x47800000)    # 2^16 as float32 bits: beyond float16's range
_HIDDEN32 = np.uint32(0x00800000)      # float32's implicit leading significand bit


@scalar_math
def _as_f32(bits):
    """The float32 whose pattern is `bits` (numba widens mixed unsigned arithmetic to 64
    bits: narrowed back here, since a view keeps the itemsize)."""
    return np.uint32(bits).view(np.float32)


@scalar_math
def widen_bf16(h):
    """The float32 of bfloat16 pattern `h` (exact: the pattern is float32's top half)."""
    return _as_f32(np.uint32(h) << np.uint32(16))


@scalar_math
def narrow_bf16(x):
    """bfloat16 pattern of float32 `x`, rounded to nearest, ties to even."""
    bits = np.float32(x).view(np.uint32)
    if (bits & _ABS32) > _INF32:                      # NaN: keep sign and payload, quiet
        return np.uint16((bits >> np.uint32(16)) | np.uint32(0x0040))
    lsb = (bits >> np.uint32(16)) & np.uint32(1)      # ties go to the even pattern
    return np.uint16((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16))


@scalar_math
def widen_f16(h):
    """The float32 of float16 pattern `h` (exact, subnormals, infinities and NaN included)."""
    bits = np.uint32(h)
    sign = (bits & np.uint32(0x8000)) << np.uint32(16)
    exponent = (bits >> np.uint32(10)) & np.uint32(0x1F)
    mantissa = bits & np.uint32(0x3FF)
    if exponent == np.uint32(0x1F):                    # infinity or NaN (payload kept)
        return _as_f32(sign | _INF32 | (mantissa << np.uint32(13)))
    if exponent == np.uint32(0):                       # zero or subnormal: mantissa * 2^-24
        magnitude = np.float32(mantissa) * _TWO_M24
        return _as_f32(sign | np.float32(magnitude).view(np.uint32))
    # a normal number: rebias the exponent (15 -> 127), widen the mantissa (10 -> 23 bits)
    return _as_f32(sign | ((exponent + np.uint32(112)) << np.uint32(23))
                   | (mantissa << np.uint32(13)))


@scalar_math
def narrow_f16(x):
    """float16 pattern of float32 `x`, rounded to nearest, ties to even (in integers
    throughout, float16's subnormals too: numba-cuda has no rint, and the CUDA backend
    compiles this same function into its kernels)."""
    xbits = np.float32(x).view(np.uint32)
    sign = np.uint16((xbits & _SIGN32) >> np.uint32(16))
    magnitude = xbits & _ABS32
    if magnitude > _INF32:                             # NaN: the payload's top 10 bits
        payload = np.uint16((magnitude >> np.uint32(13)) & np.uint32(0x3FF))
        return sign | _INF16 | (payload if payload else np.uint16(1))
    if magnitude >= _OVERFLOW16:                       # infinity, or beyond 65504 and 65520
        return sign | _INF16
    if magnitude < _MIN_NORMAL16:
        # a subnormal (or zero) result, |x| * 2^24 rounded to an integer: |x| = M 2^(E-150)
        # with M the significand with its implicit bit, so |x| 2^24 = M / 2^(126 - E); the
        # quotient rounded to even is the pattern (1024, the smallest normal, included)
        exponent = magnitude >> np.uint32(23)
        if exponent < np.uint32(102):                  # |x| < 2^-25: rounds to zero
            return sign
        significand = (magnitude & np.uint32(0x7FFFFF)) | _HIDDEN32
        shift = np.uint32(126) - exponent              # 14 to 24
        q = significand >> shift
        rest = significand & ((np.uint32(1) << shift) - np.uint32(1))
        half = np.uint32(1) << (shift - np.uint32(1))
        if rest > half or (rest == half and (q & np.uint32(1))):
            q += np.uint32(1)
        return sign | np.uint16(q)
    # a normal result: drop 13 mantissa bits, rounding to even; a carry out of the mantissa
    # increments the exponent, and out of the largest exponent gives the infinity 0x7C00
    h = (magnitude - np.uint32(0x38000000)) >> np.uint32(13)
    rest = magnitude & np.uint32(0x1FFF)
    if rest > np.uint32(0x1000) or (rest == np.uint32(0x1000) and (h & np.uint32(1))):
        h += np.uint32(1)
    return sign | np.uint16(h)


@scalar_math
def widen(h, fmt):
    return widen_f16(h) if fmt == F16 else widen_bf16(h)


@scalar_math
def narrow(x, fmt):
    return narrow_f16(x) if fmt == F16 else narrow_bf16(x)


@parallel_kernel
def widen_array(src, dst, fmt):
    """dst[i] = float32 of pattern src[i], over 1-D contiguous arrays."""
    for i in prange(src.size):
        dst[i] = widen(src[i], fmt)


@parallel_kernel
def narrow_array(src, dst, fmt):
    """dst[i] = pattern of src[i], over 1-D contiguous arrays. A float64 src is rounded to
    float32 first; rounding twice gives the correctly rounded result here, as it does
    whenever the intermediate format has at least 2p + 2 significand bits for a target of
    p (float32: 24 >= 2 * 11 + 2 for float16, >= 2 * 8 + 2 for bfloat16)."""
    for i in prange(src.size):
        dst[i] = narrow(np.float32(src[i]), fmt)


# --- kernels on 16-bit arrays: widen, compute in float32, round on store --------------------
def _patterns(a: np.ndarray) -> np.ndarray:
    """The bit patterns of 16-bit array `a`, 1-D and contiguous (a copy only where `a` is
    strided)."""
    return np.ascontiguousarray(a.view(np.uint16)).reshape(-1)


def _format(dtype) -> int:
    return F16 if np.dtype(dtype) == np.float16 else BF16


def widened_copy(a: np.ndarray) -> np.ndarray:
    """A new contiguous float32 array holding 16-bit array `a`'s values (exact)."""
    out = np.empty(a.shape, np.float32)
    widen_array(_patterns(a), out.reshape(-1), _format(a.dtype))
    return out


def store(dst: np.ndarray, values: np.ndarray) -> None:
    """Round float32 (or float64) `values` to 16-bit `dst`'s dtype, to nearest even, into
    `dst` (contiguous, of the same shape)."""
    narrow_array(np.ascontiguousarray(values).reshape(-1), dst.view(np.uint16).reshape(-1),
                 _format(dst.dtype))


def widened(kernel, update: bool = False):
    """The float32 `kernel(out, ins, **params)` as a kernel on arrays of which some are
    16-bit (engine.tensor.is_half): each call widens the 16-bit inputs into float32
    temporaries, runs `kernel` on them (bound anew, so temporaries live only while the call
    runs: a plan of 16-bit tensors holds 16-bit buffers between calls), and rounds a 16-bit
    output to nearest even on store. An input that is the output's own buffer (an update op
    writing its param in place) gets the output's temporary; `update`: the kernel also
    writes its other inputs in place (optimizer state), so the 16-bit ones are stored back
    too. A bindable kernel (engine.backends.cpu.jit.bindable) stays one."""
    inner = getattr(kernel, "bind", None)

    def prepare(out, ins, **params):
        half_out = is_half(out.dtype)

        def run():
            wide_out = widened_copy(out) if half_out and update else (
                np.empty(out.shape, np.float32) if half_out else out)
            wide_ins = []
            for a in ins:
                if not isinstance(a, np.ndarray) or not is_half(a.dtype):
                    wide_ins.append(a)
                elif half_out and np.shares_memory(a, out):
                    wide_ins.append(wide_out)
                else:
                    wide_ins.append(widened_copy(a))
            if inner is not None:
                inner(wide_out, wide_ins, **params)()
            else:
                kernel(wide_out, wide_ins, **params)
            if half_out:
                store(out, wide_out)
            if update:
                for a, w in zip(ins, wide_ins, strict=True):
                    if w is not a and w is not wide_out:
                        store(a, w)
        return run

    def call(out, ins, **params):
        prepare(out, ins, **params)()
    call.bind = prepare
    call.__name__ = getattr(kernel, "__name__", "kernel")
    call.__doc__ = kernel.__doc__
    return call
