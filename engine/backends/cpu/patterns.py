"""Element access for kernels that read and write 16-bit floats in place, as their uint16
bit patterns, instead of through half.widened's float32 temporaries.

    value(x[i], fmt)                   x float32/float64: the value in float64; uint16
                                       patterns of format fmt (half.F16, half.BF16): the
                                       value in float32 (exact)
    value_number(x[i], fmt)            value(x[i], fmt) for an element that is not a NaN
                                       (a NaN pattern may come back with its quiet bit set)
    work(v, x)                         float v in the type value() gives for x's elements
    out[i] = rounded(v, out, fmt)      out float: v (numba casts on store); out uint16:
                                       the pattern of v rounded to nearest even (via float32:
                                       correctly rounded, see half.narrow_array)
    out[i] = rounded_number(v, out, fmt)   the same for v known not to be a NaN: the same
                                       bits, without the NaN fix-ups
    exp_into(v, out)                   exp(v) for v <= 0 (v in work(., out)'s type), as
                                       accurate as out's dtype needs
    exp_capped(v)                      exp(v) for any float64 v, for float32 or narrower
                                       results
    row_extreme(xr, n, fmt, lowest)    max (or min) of xr[:n]'s values, by integer keys
    sum_any_order(a, n)                a[0] + ... + a[n - 1] in float64, in vector lanes
    dot_any_order(a, b, n, fmt)        the same for the products of a's and b's values
    number_sum_any_order, number_dot_any_order   value_sum_any_order and dot_any_order
                                       for rows holding no NaN pattern (value_number's
                                       loads: the same bits there)

Which implementation runs is chosen by numba when it compiles a kernel, from the argument
types (numba.extending.overload): one kernel source serves float64, float32 and both
16-bit formats. Work is in float64 for float arrays and in float32 for 16-bit ones
(computed in float32, accumulated in float32 or better, as engine.tensor says of the
16-bit dtypes: float32 carries 13 or 16 bits more than the formats, and its vectors are
twice as wide). The 16-bit compilation widens in its loads and rounds in its stores, so a
16-bit tensor costs one pass over 16-bit memory, not a widening pass, the float32 kernel
and a rounding pass (half.widened). A kernel taking patterns is marked with
`native_half`; the backend then hands it the 16-bit arrays as they are
(CpuBackend.kernel).
"""

from __future__ import annotations

import platform
from types import FunctionType

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba.core import config, types
from numba.extending import intrinsic, overload

from engine.backends.cpu.half import BF16, F16, narrow, narrow_bf16, widen, widen_bf16
from engine.backends.cpu.jit import any_order, kernel, scalar_math
from engine.tensor import is_half


def value(v, fmt):
    """The float64 value of array element `v` (a 16-bit pattern of format `fmt`, or a
    float). Compiled code only."""
    raise NotImplementedError("patterns.value runs inside numba kernels only")


def value_number(v, fmt):
    """value(v, fmt) for an element `v` that is not a NaN pattern (the same value; for a NaN
    pattern some NaN). Compiled code only."""
    raise NotImplementedError("patterns.value_number runs inside numba kernels only")


def rounded(v, dst, fmt):
    """`v` as an element of array `dst` (a pattern of format `fmt` for uint16 `dst`).
    Compiled code only."""
    raise NotImplementedError("patterns.rounded runs inside numba kernels only")


def rounded_number(v, dst, fmt):
    """rounded(v, dst, fmt) for `v` that is not a NaN (the same bits). Compiled code only."""
    raise NotImplementedError("patterns.rounded_number runs inside numba kernels only")


def work(v, arr):
    """Float `v` in the working type of array `arr` (see value). Compiled code only."""
    raise NotImplementedError("patterns.work runs inside numba kernels only")


def exp_into(v, dst):
    """exp(v), v <= 0 or NaN, for an element of array `dst`. Compiled code only."""
    raise NotImplementedError("patterns.exp_into runs inside numba kernels only")


# float16 through the CPU's own conversion instructions (x86's F16C: vcvtph2ps and
# vcvtps2ph, which LLVM emits for `fpext half` and `fptrunc ... to half`), where the
# target has them (conversion_instructions): both IEEE, rounding to nearest even,
# subnormals included, and several times faster in a loop than the arithmetic of
# half.widen_f16 and half.narrow_f16. NaNs alone differ (the instructions set the quiet
# bit), so NaN patterns take half's conventions: the same bits, tested over every float16
# pattern and, narrowing, every float32 NaN, the subnormal and overflow ranges and random
# patterns (tests/engine/backends/cpu/test_patterns.py, also compiled without F16C).
@intrinsic
def _f16_bits_to_f32(typingctx, h):
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@intrinsic
def _f32_to_f16_bits(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


@scalar_math
def _widen_fast(h, fmt):
    if fmt == BF16:
        return widen_bf16(h)
    bits = np.uint32(h)
    wide = np.float32(_f16_bits_to_f32(np.uint16(h))).view(np.uint32)
    # a signalling NaN (exponent all ones, quiet bit clear, payload not zero) comes back
    # with float32's quiet bit set: cleared (an integer select: a float one halves speed)
    signalling = (np.uint32(bits & np.uint32(0x7E00)) == np.uint32(0x7C00)
                  and np.uint32(bits & np.uint32(0x1FF)) != np.uint32(0))
    quiet = np.uint32(0x00400000) if signalling else np.uint32(0)
    return np.uint32(wide ^ quiet).view(np.float32)


@scalar_math
def _narrow_fast(x, fmt):
    if fmt == BF16:
        return narrow_bf16(x)
    bits = np.float32(x).view(np.uint32)
    payload = np.uint32(np.uint32(bits >> np.uint32(13)) & np.uint32(0x3FF))
    nan = np.uint16(np.uint32(np.uint32(bits >> np.uint32(16)) & np.uint32(0x8000))
                    | np.uint32(0x7C00) | max(payload, np.uint32(1)))
    hw = _f32_to_f16_bits(np.float32(x))
    return nan if (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else hw


@scalar_math
def _widen_number(h, fmt):
    if fmt == BF16:
        return widen_bf16(h)
    return np.float32(_f16_bits_to_f32(np.uint16(h)))


# A store through rounded() spends most of its time on the NaN fix-ups: rows of float16
# values scaled in float64 and stored into a float16 row took 6.2 ms per 16M elements (one
# thread), 2.4 ms with the fix-ups left out, as _narrow_number leaves them where the kernel
# knows its value is a number (norm.py: a row whose statistics are finite); bfloat16 alike.
@scalar_math
def _narrow_number(x, fmt):
    if fmt == BF16:                   # half.narrow_bf16 without its NaN branch
        bits = np.float32(x).view(np.uint32)
        lsb = np.uint32(np.uint32(bits >> np.uint32(16)) & np.uint32(1))
        return np.uint16(np.uint32(bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16))
    return _f32_to_f16_bits(np.float32(x))


def target_has(feature: str) -> bool:
    """Whether the x86 target numba compiles kernels for here (the host, or NUMBA_CPU_NAME
    and NUMBA_CPU_FEATURES) has `feature` (LLVM's name: "f16c", "avx512f"); a named CPU
    given without its features is taken to have none."""
    if config.CPU_FEATURES is not None:
        return f"+{feature}" in config.CPU_FEATURES.split(",")
    if config.CPU_NAME not in (None, "host"):
        return False
    return bool(llvm.get_host_cpu_features().get(feature, False))


def conversion_instructions() -> bool:
    """Whether kernels compiled now may use the float16 conversion instructions: on x86,
    where the target numba compiles for has F16C (target_has), and on 64-bit ARM, where
    they are part of the base architecture. Elsewhere LLVM would call runtime functions
    that numba's JIT cannot link (a process abort, found by compiling for a generic
    x86-64), so half's arithmetic conversions serve. numba's disk cache keys compilations
    by the target CPU and its features, so a cache written on one machine is not loaded on
    another."""
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return True
    if machine not in ("x86_64", "amd64"):
        return False
    return target_has("f16c")


F16C = conversion_instructions()


@overload(value)
def _value(v, fmt):
    if isinstance(v, types.Integer):
        if F16C:
            return lambda v, fmt: _widen_fast(v, fmt)
        return lambda v, fmt: widen(v, fmt)
    return lambda v, fmt: np.float64(v)


@overload(value_number)
def _value_number(v, fmt):
    if isinstance(v, types.Integer):
        if F16C:       # float16 without _widen_fast's signalling-NaN fix-up
            return lambda v, fmt: _widen_number(v, fmt)
        return lambda v, fmt: widen(v, fmt)
    return lambda v, fmt: np.float64(v)


@overload(work)
def _work(v, arr):
    if isinstance(arr.dtype, types.Integer):
        return lambda v, arr: np.float32(v)
    return lambda v, arr: np.float64(v)


@overload(rounded)
def _rounded(v, dst, fmt):
    if isinstance(dst.dtype, types.Integer):
        if F16C:
            return lambda v, dst, fmt: _narrow_fast(np.float32(v), fmt)
        return lambda v, dst, fmt: narrow(np.float32(v), fmt)
    return lambda v, dst, fmt: v


@overload(rounded_number)
def _rounded_number(v, dst, fmt):
    if isinstance(dst.dtype, types.Integer):
        if F16C:
            return lambda v, dst, fmt: _narrow_number(np.float32(v), fmt)
        return lambda v, dst, fmt: narrow(np.float32(v), fmt)
    return lambda v, dst, fmt: v


# exp for v <= 0 in float64 arithmetic that vectorises (libm's exp is a call per element):
# v = k ln2 + r with k = round(v / ln2) and |r| <= ln2 / 2 (ln2 in two parts, Cody and
# Waite, so that k ln2 is exact to float64's precision), exp(r) by its Taylor polynomial of
# degree 8 (relative error below (ln2/2)^9 / 9! = 2e-10, a 300th of float32's unit
# roundoff), times 2^k built in the exponent field. v is clamped at -200 first: exp(-200) =
# 1e-87 is zero in float32 and below (and a NaN passes the clamp, so it propagates).
_LN2_HI = 0.6931471803691238       # ln 2's leading 32 bits: k * _LN2_HI exact for |k| < 2^20
_LN2_LO = 1.9082149292705877e-10   # ln 2 - _LN2_HI
_INV_LN2 = 1.4426950408889634
_FLOOR = -200.0


@scalar_math
def _exp_narrow(v):
    v = _FLOOR if v < _FLOOR else v
    k = np.floor(v * _INV_LN2 + 0.5)
    r = (v - k * _LN2_HI) - k * _LN2_LO
    p = 1.0 / 40320.0 + r * (1.0 / 362880.0)
    p = 1.0 / 5040.0 + r * p
    p = 1.0 / 720.0 + r * p
    p = 1.0 / 120.0 + r * p
    p = 1.0 / 24.0 + r * p
    p = 1.0 / 6.0 + r * p
    p = 0.5 + r * p
    p = 1.0 + r * p
    p = 1.0 + r * p
    scale = np.int64((np.int64(k) + 1023) << 52)     # 2^k: k >= -289 is a normal float64
    return p * scale.view(np.float64)


# The same in float32 arithmetic for 16-bit outputs: degree 7 (relative error of the
# polynomial 5e-9, of the whole below 1e-6: a 500th of bfloat16's unit roundoff), v clamped
# at -104 (exp(-104) = 7e-46 rounds to zero in both 16-bit formats), 2^k as two float32
# factors, since k down to -150 is below float32's normal range and bfloat16 keeps
# float32's subnormals.
_LN2_HI32 = np.float32(0.693359375)            # 9 significant bits: k * _LN2_HI32 exact
_LN2_LO32 = np.float32(0.6931471805599453 - 0.693359375)
_INV_LN2_32 = np.float32(1.4426950408889634)
_FLOOR32 = np.float32(-104.0)


@scalar_math
def _exp_f32(v):
    v = _FLOOR32 if v < _FLOOR32 else v
    k = np.floor(v * _INV_LN2_32 + np.float32(0.5))
    r = (v - k * _LN2_HI32) - k * _LN2_LO32
    p = np.float32(1.0 / 5040.0) + r * np.float32(1.0 / 40320.0)
    p = np.float32(1.0 / 720.0) + r * p
    p = np.float32(1.0 / 120.0) + r * p
    p = np.float32(1.0 / 24.0) + r * p
    p = np.float32(1.0 / 6.0) + r * p
    p = np.float32(0.5) + r * p
    p = np.float32(1.0) + r * p
    p = np.float32(1.0) + r * p
    ki = np.int32(k)
    h = ki >> np.int32(1)
    s1 = np.int32((h + np.int32(127)) << np.int32(23))
    s2 = np.int32((ki - h + np.int32(127)) << np.int32(23))
    return p * s1.view(np.float32) * s2.view(np.float32)


# exp for any float64 v, for results rounded to float32 or narrower: _exp_narrow with v
# capped at _CAP (a NaN passes), where k = 1024 sets 2^k's exponent field to infinity's: inf
# from 709.44 on, where exp overflows float32 long before (at 88.73). Cheaper than
# vector_math.exp (a polynomial of degree 8, not 13; 2e-10 relative error, not 2^-52).
_CAP = 709.9


@scalar_math
def exp_capped(v):
    """exp(v) for float64 v: relative error below 3e-10 from -200 up to 709.4, inf above,
    exp(-200) = 1e-87 below (_exp_narrow's clamp: zero in float32), NaN for NaN."""
    return _exp_narrow(_CAP if v > _CAP else v)


@overload(exp_into)
def _exp_into(v, dst):
    if dst.dtype == types.float64:
        return lambda v, dst: np.exp(v)          # libm: float64's own accuracy
    if isinstance(dst.dtype, types.Integer):
        return lambda v, dst: _exp_f32(v)
    return lambda v, dst: _exp_narrow(v)


def order_key(v):
    """An integer whose order is the order of array element v's value (a float or a 16-bit
    pattern): integer maxima vectorise without fastmath, float maxima do not. Compiled
    code only."""
    raise NotImplementedError("patterns.order_key runs inside numba kernels only")


def key_value(k, arr, fmt):
    """The value (in arr's work type) of the element of array `arr` whose order_key is
    `k`. Compiled code only."""
    raise NotImplementedError("patterns.key_value runs inside numba kernels only")


# The keys: a sign-magnitude pattern with its sign clear is its own key; with its sign set,
# its magnitude negated (16-bit) or its magnitude bits flipped (float32 and float64, whose
# patterns read as two's complement integers: flipping makes a bigger magnitude a smaller
# integer). NaNs sort beyond the infinities of their sign; +0 and -0 get keys 0 and -1
# (16-bit: both 0), so a maximum over them can be -0 where the float maximum is +0: the
# same value.
@overload(order_key)
def _order_key(v):
    if isinstance(v, types.Integer):
        def key16(v):
            magnitude = np.int32(v & np.uint16(0x7FFF))
            return -magnitude if v & np.uint16(0x8000) else magnitude
        return key16
    if v == types.float32:
        def key32(v):
            b = np.float32(v).view(np.int32)
            return b if b >= 0 else b ^ np.int32(0x7FFFFFFF)
        return key32

    def key64(v):
        b = np.float64(v).view(np.int64)
        return b if b >= 0 else b ^ np.int64(0x7FFFFFFFFFFFFFFF)
    return key64


@overload(key_value)
def _key_value(k, arr, fmt):
    if isinstance(arr.dtype, types.Integer):
        return lambda k, arr, fmt: widen(np.uint16(k if k >= 0 else 0x8000 - k), fmt)
    if arr.dtype == types.float32:
        return lambda k, arr, fmt: np.float64(
            np.int32(k if k >= 0 else k ^ np.int32(0x7FFFFFFF)).view(np.float32))
    return lambda k, arr, fmt: np.int64(
        k if k >= 0 else k ^ np.int64(0x7FFFFFFFFFFFFFFF)).view(np.float64)


@kernel
def row_extreme(xr, n, fmt, lowest):
    """The maximum (`lowest`: the minimum) of the values of xr[0], ..., xr[n - 1] (n >= 1),
    in xr's work type; a NaN of either sign can be either. A function of its own, not
    inlined: inlined into a kernel, its loop ran five times slower (measured in
    softmax)."""
    best = order_key(xr[0])
    if lowest:
        for j in range(1, n):
            best = min(best, order_key(xr[j]))
    else:
        for j in range(1, n):
            best = max(best, order_key(xr[j]))
    return key_value(best, xr, fmt)


@any_order
def sum_any_order(a, n):
    """a[0] + ... + a[n - 1] in float64, in an order of LLVM's choosing (vector lanes):
    as accurate as a pairwise sum of lanes, the same bits on every run of one machine."""
    total = 0.0
    for j in range(n):
        total += a[j]
    return total


def _loading(template, load, name: str):
    """`template`, a sum over elements read through its global name `load`, with `load`
    bound (value, or value_number for rows known to hold no NaN pattern), compiled
    any_order under `name` (numba's disk cache keys a function by its qualified name):
    one loop for both loads, so that the two sum every row without a NaN alike (softmax's
    backward reads through value_number first, then value where a sum is not finite): the
    same sums up to the rounding of their float32 blocks, whose lanes LLVM orders for each
    compiled copy apart (the same bits on the AVX-512 machine, not always on the AVX2
    one)."""
    fn = FunctionType(template.__code__, {**template.__globals__, "load": load}, name)
    fn.__qualname__ = name
    fn.__doc__ = template.__doc__
    return any_order(fn)


def _sum_of_loads(a, n, fmt):
    """load(a[0]) + ... + load(a[n - 1]) in float64, in vector lanes, as sum_any_order
    (for 16-bit patterns too)."""
    total = 0.0
    for j in range(n):
        total += load(a[j], fmt)  # noqa: F821
    return total


def _dot_of_loads(a, b, n, fmt):
    """load(a[0]) load(b[0]) + ... + load(a[n - 1]) load(b[n - 1]) in an order of LLVM's
    choosing, as sum_any_order: in blocks of 1024 terms summed in the work type (float32
    lanes for 16-bit patterns, each lane adding at most 64 products, as
    reduce.run_sum_any_order), the blocks' sums in float64."""
    total = 0.0
    for lo in range(0, n, 1024):
        ab = a[lo:min(n, lo + 1024)]             # slices: indices known non-negative
        bb = b[lo:min(n, lo + 1024)]
        part = work(0.0, a)
        for j in range(ab.size):
            part += load(ab[j], fmt) * load(bb[j], fmt)  # noqa: F821
        total += part
    return total


value_sum_any_order = _loading(_sum_of_loads, value, "value_sum_any_order")
dot_any_order = _loading(_dot_of_loads, value, "dot_any_order")
# the same loops reading through value_number: for rows holding no NaN pattern
number_sum_any_order = _loading(_sum_of_loads, value_number, "number_sum_any_order")
number_dot_any_order = _loading(_dot_of_loads, value_number, "number_dot_any_order")


def fmt_of(a: np.ndarray) -> int:
    """The format code of 16-bit array `a` (F16 for float16, else BF16); F16 for a float
    array, whose kernels ignore it."""
    return BF16 if is_half(a.dtype) and np.dtype(a.dtype) != np.float16 else F16


def work_dtype(a: np.ndarray):
    """The numpy dtype of work(., a's patterns): float32 for 16-bit `a`, else float64."""
    return np.float32 if is_half(a.dtype) else np.float64


def as_patterns(a: np.ndarray) -> np.ndarray:
    """`a` as its kernels read it: a 16-bit float array as a uint16 view of its patterns
    (no copy), any other array as it is."""
    return a.view(np.uint16) if is_half(a.dtype) else a


def native_half(kernel):
    """Mark CPU kernel `kernel` as taking 16-bit arrays itself (through as_patterns and
    the functions above), so that the backend does not widen it (half.widened)."""
    kernel.native_half = True
    return kernel
