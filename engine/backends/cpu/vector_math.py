"""exp, expm1, log1p, log and erfc in float64 arithmetic that LLVM vectorises: no libm
call, no branch (every case computed and one selected), for the float32 kernels of the
activations (engine.backends.cpu.vector_unary).

libm's exp is a call per element, which no loop vectorises: the activations' float32
kernels ran 3-5 times slower than torch's on big tensors (issue 37). These functions
are range reductions and polynomials of plain arithmetic and integer operations on the
bit patterns, compiled into each kernel's loop (`scalar_math`, in kernels compiled
`contracting`, so that the polynomials' Horner steps are fused multiply-adds).

Their relative error is a few 2^-52 (the bound of each below, held by tests/engine/
backends/cpu/test_vector_math.py against mpmath over a dense sample of its domain): far
below float32's half ulp (2^-24), so a float32 result computed from them is its correctly
rounded value but within a tiny fraction of an ulp of a tie, as libm's float64 gives (the
two short ones, about 2^-42: within 10^-4 ulp of a tie still).
The inputs they are made for are float32 values widened to float64, so no input is a
float64 subnormal; NaN in gives NaN out.

    exp_parts(x)         (p, k, s1, s2): exp(x) = (1 + p) 2^k, 2^k = s1 s2, p = expm1(r)
    exp(x)               e^x, overflowing to inf above 709.78, 0 below -745.1
    exp_expm1(x)         (e^x, e^x - 1) for x <= 0, from one reduction
    expm1(x)             e^x - 1, accurate near 0
    log1p(y)             log(1 + y) for y in [0, 1] (or NaN)
    log(x)               natural logarithm: NaN below 0, -inf at +-0, inf at inf
    erfc_nonneg(x, e)    erfc(x) for x >= 0 (or NaN), given e = exp(-x^2)
    exp_short_nonpositive(x), erfc_short_nonneg(x, e)   the same to about 2^-42 in fewer
                         operations, for gelu_erf's float32 results
    gelu_erf_slope_part(a)   erfcx(x) / 2 - x / sqrt(pi), x = a / sqrt 2: gelu_erf's gradient
    sin(x), cos(x)       for |x| <= TRIG_REACH (2^20); beyond, the caller takes libm's

and in float32 arithmetic, for 16-bit results (relative errors a few 2^-24, see below):

    exp32_parts(x), exp32(x), log1p32(y), erfc32_nonneg(x, e)
    exp32_nonpositive(x), exp_expm1_32(x)     for x <= 0 (exp32's bits in fewer operations)

and in float32 arithmetic for float32 results, as unevaluated sums of two float32 (the
last section):

    fma32(a, b, c)       a b + c rounded once (the CPU's fused multiply-add)
    wide_vectors()       the kernel it is compiled into vectorises 512 bits wide
    exp32_pair(x)        (p, pl, k, s1, s2): e^x = (1 + p + pl) 2^k, 2^k = s1 s2, x <= 0

and without pairs, for the candidates that vector_unary keeps beside its pair functions:

    exp32_fast_parts(x)  (r, w, s): e^x = (1 + r + w) s 2^-64, x <= 0
"""

from __future__ import annotations

import math

import numpy as np
from numba.core import types
from numba.extending import intrinsic

from engine.backends.cpu.jit import scalar_math

# --- exp: x = k ln2 + r, |r| <= ln2 / 2, exp(r) - 1 by its Taylor series -----------------------
# k is rounded to an integer by adding 1.5 * 2^52: the sum's low bits are k, read from its
# pattern (no float-to-integer conversion: that of a NaN is undefined); ln2 in two parts
# (Cody and Waite: k * _LN2_HI is exact for |k| < 2^20); 2^k as two factors, so that k
# from -1076 to 1024 (x clamped to [-746, 710]) needs no float64 beyond the normal range:
# the product overflows to inf and underflows through the subnormals to 0 as exp does.
_SHIFTER = 6755399441055744.0                    # 1.5 * 2^52
_SHIFTER_BITS = np.int64(0x4338000000000000)     # its pattern
_INV_LN2 = 1.4426950408889634
_LN2_HI = 0.6931471803691238                     # ln 2's leading 32 bits
_LN2_LO = 1.9082149292705877e-10                 # ln 2 - _LN2_HI
_EXP_LOW = -746.0
_EXP_HIGH = 710.0
# 1/2!, ..., 1/13!: exp(r) - 1 = r (1 + r/2! + ... + r^12/13!), truncated after a term of
# relative size (ln2/2)^12 / 13! = 5e-16 and a first omitted one of 1e-17
_EXPM1 = tuple(1.0 / math.factorial(n) for n in range(13, 1, -1))


@scalar_math
def exp_parts(x):
    """(p, k, s1, s2) with exp(x) = (1 + p) 2^k and 2^k = s1 s2 (s1, s2 normal; k an
    int64), p = expm1(r) for the reduced |r| <= ln2 / 2 (relative error about 2^-53).
    x is clamped to [-746, 710] first, where exp is 0 or inf in float64; a NaN stays NaN
    in p (k, s1, s2 are then any numbers)."""
    x = _EXP_LOW if x < _EXP_LOW else x
    x = _EXP_HIGH if x > _EXP_HIGH else x
    t = x * _INV_LN2 + _SHIFTER
    k = t - _SHIFTER
    r = (x - k * _LN2_HI) - k * _LN2_LO
    q = _EXPM1[0]
    for c in _EXPM1[1:]:
        q = c + r * q
    p = r * (1.0 + r * q)                    # a product, so that expm1(-0) is -0
    kb = np.int64(np.float64(t).view(np.int64) - _SHIFTER_BITS)
    h = kb >> np.int64(1)
    s1 = np.int64((h + np.int64(1023)) << np.int64(52)).view(np.float64)
    s2 = np.int64((kb - h + np.int64(1023)) << np.int64(52)).view(np.float64)
    return p, kb, s1, s2


@scalar_math
def exp(x):
    """e^x, relative error below 1.5 2^-52 (measured: 0.97): inf above 709.78 (and at
    inf), 0 below -745.13 (and at -inf)."""
    p, _, s1, s2 = exp_parts(x)
    return ((1.0 + p) * s1) * s2


@scalar_math
def exp_expm1(x):
    """(e^x, e^x - 1) for x <= 0 (or NaN), as exp and expm1 give them (relative error
    below 1.5 2^-52), from one reduction: tanh's kernels need both."""
    p, _, s1, s2 = exp_parts(x)
    s = s1 * s2                              # 2^k, k <= 0: a subnormal or 0 below -708
    return ((1.0 + p) * s1) * s2, math.copysign(s * p + (s - 1.0), x)


@scalar_math
def expm1(x):
    """e^x - 1, relative error below 1.5 2^-52 (measured: 0.99; near 0 too), -1 below
    -37.4, inf above 709.78; of the sign of x (-0 at -0). (2^k - 1) + 2^k p for k < 64
    (each term exact but the sum's rounding); e^x - 1 beyond, where 2^k may overflow."""
    p, kb, s1, s2 = exp_parts(x)
    s = s1 * s2
    small = s * p + (s - 1.0)
    large = ((1.0 + p) * s1) * s2 - 1.0
    return math.copysign(small if kb < np.int64(64) else large, x)


# --- log1p and log: log(1 + f) = 2 atanh(f / (2 + f)), f in [sqrt(1/2) - 1, sqrt(2) - 1] -----
# s = f / (2 + f), |s| <= 0.1716: 2 atanh(s) = 2 s + 2 s^3/3 + 2 s^5/5 + ..., truncated
# after s^21 (the first omitted term is 2e-17 of the sum)
_ATANH = tuple(2.0 / (2 * n + 1) for n in range(10, 0, -1))       # 2/21, ..., 2/3
_SQRT2 = math.sqrt(2.0)
_LN2 = math.log(2.0)
_MANTISSA = np.int64(0x000FFFFFFFFFFFFF)
_ONE_BITS = np.int64(0x3FF0000000000000)             # the pattern of 1.0


@scalar_math
def _log1p_reduced(f):
    """log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1], relative error about 2^-52."""
    s = f / (2.0 + f)
    s2 = s * s
    q = _ATANH[0]
    for c in _ATANH[1:]:
        q = c + s2 * q
    return 2.0 * s + s * (s2 * q)


@scalar_math
def log1p(y):
    """log(1 + y) for y in [0, 1] (or NaN), relative error below 3 2^-52 (measured:
    2.15; y itself when tiny). Above sqrt(2) - 1, ln 2 + log(1 + f) with f = (1 + y) / 2 - 1 in
    [sqrt(1/2) - 1, 0] (the rounding of 1 + y costs at most 2^-52 of the result there)."""
    big = y > _SQRT2 - 1.0
    f = (1.0 + y) * 0.5 - 1.0 if big else y
    return (_LN2 if big else 0.0) + _log1p_reduced(f)


@scalar_math
def log(x):
    """log x, relative error below 2 2^-52 (measured: 1.55): NaN for x < 0 and NaN,
    -inf at +-0, inf at inf. x = 2^n m, m in [sqrt(1/2), sqrt(2)), from the pattern
    (x a normal float64, as every widened float32 is); log x = n ln2 + log(1 + (m - 1))."""
    bits = np.float64(x).view(np.int64)
    n = (bits >> np.int64(52)) - np.int64(1023)
    m = np.int64((bits & _MANTISSA) | _ONE_BITS).view(np.float64)
    big = m > _SQRT2
    m = m * 0.5 if big else m
    n = n + np.int64(1) if big else n
    fn = np.float64(n)
    y = fn * _LN2_HI + (_log1p_reduced(m - 1.0) + fn * _LN2_LO)
    y = y if x < np.inf else x                   # inf, NaN
    y = np.nan if x < 0.0 else y
    return -np.inf if x == 0.0 else y


# --- erfc: erfc(x) = exp(-x^2) erfcx(x), erfcx by a polynomial in t = (x - 4) / (x + 4) -------
# t maps x in [0, inf) to [-1, 1), over which erfcx(4 (1 + t) / (1 - t)) is smooth: its
# interpolant at the 22 Chebyshev nodes (mpmath, 50 digits; in powers of t, highest first;
# tests/engine/backends/cpu/test_vector_math.py fits it again) is within 2e-15 of erfcx
# for every x >= 0, evaluated in float64 (21 nodes: 5e-14).
_ERFCX_K = 4.0
_ERFCX = (1.1135088284602945e-09, -1.3639835103201336e-09, -1.324726314486992e-08,
          2.3270090926444534e-08, 9.332788860326101e-08, -2.8150179151028765e-07,
          -4.062429789853215e-07, 2.9425016481725e-06, -1.9045738125016195e-06,
          -2.255498238141092e-05, 7.898365425362107e-05, -2.1762074248607736e-05,
          -0.0007991269148180322, 0.004060263698399383, -0.012843946018779312,
          0.03129905650946151, -0.0631078156405381, 0.10896317739949331,
          -0.16425781669728917, 0.21871967891825023, -0.2590680487601717,
          0.13699945762506144)
_ERFC_ZERO = 27.3      # erfc(27.3) < 2^-1074: 0 in float64, and t stays finite


@scalar_math
def erfc_nonneg(x, e):
    """erfc(x) for x >= 0 (or NaN), given e = exp(-x^2) (the caller's exp of its exact
    square): relative error below 10 2^-52 (measured: 7.9) while erfc(x) is a normal
    float64."""
    x = _ERFC_ZERO if x > _ERFC_ZERO else x
    t = (x - _ERFCX_K) / (x + _ERFCX_K)
    high = _ERFCX[0]                     # two Horner chains of 11 coefficients, run side
    for c in _ERFCX[1:11]:               # by side (and each short enough that LLVM
        high = c + t * high              # unrolls its loop over the tuple: 21 steps it
    low = _ERFCX[11]                     # would not, and the function stopped inlining)
    for c in _ERFCX[12:]:
        low = c + t * low
    t2 = t * t
    t8 = (t2 * t2) * (t2 * t2)
    return e * (low + (t8 * t2 * t) * high)


# --- exp and erfc in fewer terms, for gelu_erf's float32 results ------------------------------
# A float32 result within 0.5001 ulp of the truth needs its float64 value within 10^-4 of an
# ulp, a relative 2^-37.3 (a float32 value is below 2^24 of its ulps); exp and erfc_nonneg
# keep about 2^-50, which gelu_erf's float32 kernels paid for: bound by their arithmetic
# (about 80 vector operations per 8 float64 lanes), forward and gradient took 1.7-1.8 ns an
# element against torch's float32 (bench_ops: 2.17 times torch's forward + backward on the
# quiet machine). These keep about 2^-42 in fewer operations: exp for x <= 0 to degree 11
# and 2^k as one factor, erfcx at 17 nodes over the x a float32 result needs (22 over all
# x >= 0 before), and the gradient one polynomial of its own (gelu_erf_slope_part, below):
# gelu_erf's forward 1.74 -> 1.43 ns an element and its gradient 1.84 -> 1.48 (median CPU
# time of a serial float32 kernel compiled contracting, on 64K values in [-6, 6], in cache,
# one thread; the tree before and this one alternately, load 6). tests/engine/backends/cpu/
# test_vector_math.py holds their bounds against mpmath, test_vector_unary.py gelu_erf's
# over all 2^32 float32 inputs.
# exp: the first omitted term of expm1(r) = r (1 + r/2! + ... + r^10/11!) is (ln2/2)^12 /
# 12!, 2^-46.5 of e^r (a degree less: 2^-41.6, most of erfc's error budget). The shifter
# carries the bias of 2^(k + 64), 1023 + 64, so that t's pattern shifted by 52 is that power
# (k from -1077 to 0: a normal float64), and the product ((1 + p) 2^(k + 64)) 2^-64 rounds
# once, into the subnormals too (exp32_nonpositive's way, in float64).
_EXPM1_SHORT = tuple(1.0 / math.factorial(n) for n in range(11, 1, -1))
_SHIFTER_BIASED = _SHIFTER + 1087.0
_TWO_M64_F64 = 2.0 ** -64


@scalar_math
def exp_short_nonpositive(x):
    """e^x for x <= 0 (or NaN), relative error below 2^-46 (measured: 2^-46.7) while e^x is
    a normal float64; 0 below -745.13 (and at -inf), through the subnormals as exp."""
    x = _EXP_LOW if x < _EXP_LOW else x
    t = x * _INV_LN2 + _SHIFTER_BIASED
    k = t - _SHIFTER_BIASED
    r = (x - k * _LN2_HI) - k * _LN2_LO
    q = _EXPM1_SHORT[0]
    for c in _EXPM1_SHORT[1:]:
        q = c + r * q
    p = r * (1.0 + r * q)
    s = np.int64(np.float64(t).view(np.int64) << np.int64(52)).view(np.float64)
    return ((1.0 + p) * s) * _TWO_M64_F64


# erfcx(4 (1 + t) / (1 - t)) in powers of t = (x - 4) / (x + 4), interpolated at the 17
# Chebyshev nodes of t in [-1, (14 - 4) / (14 + 4)] (x in [0, 14]; mpmath, 40 digits;
# tests/engine/backends/cpu/test_vector_math.py fits it again): within 2^-42.3 of erfcx
# there (16 nodes: 2^-38). Beyond x = 14 (|v| > 19.8 in gelu_erf) e^-x^2 is below 2^-282,
# and every float32 result made of it is 0, for every finite factor g (g Phi(v) and g v
# phi(v) below 2^128 2^-278): x is clamped there.
_ERFCX_SHORT_X_HIGH = 14.0
_ERFCX_SHORT = (-2.424498639789418e-07, -1.3473152103399022e-07, 3.06658561375927e-06,
                -2.110623958975957e-06, -2.2716138660086072e-05, 7.90463004672825e-05,
                -2.168684885950823e-05, -0.0007991338109063917, 0.004060246238483373,
                -0.012843946292468841, 0.031299058636663483, -0.06310781553678303,
                0.10896317727219705, -0.16425781670287815, 0.21871967892120114,
                -0.25906804876010814, 0.13699945762505)


@scalar_math
def erfc_short_nonneg(x, e):
    """erfc(x) for x >= 0 (or NaN), given e = exp(-x^2) (the caller's exp of its exact
    square, exp_short_nonpositive's): relative error below 2^-41 (measured: 2^-42.3) for x
    <= 14; beyond, e times erfcx(14)."""
    x = _ERFCX_SHORT_X_HIGH if x > _ERFCX_SHORT_X_HIGH else x
    t = (x - _ERFCX_K) / (x + _ERFCX_K)
    high = _ERFCX_SHORT[0]               # two Horner chains, as erfc_nonneg's
    for c in _ERFCX_SHORT[1:9]:
        high = c + t * high
    low = _ERFCX_SHORT[9]
    for c in _ERFCX_SHORT[10:]:
        low = c + t * low
    t2 = t * t
    t4 = t2 * t2
    return e * (low + (t4 * t4) * high)


# gelu_erf's gradient Phi(v) + v phi(v) crosses 0 at Z = -0.75179152469356445746 (mpmath),
# where its two terms are 0.226 each: from erfc's and exp's errors of 2^-42, a few ulps of
# the float32 results nearest Z. With x = |v| / sqrt 2 and e = e^-x^2 it is e G(x) for v < 0
# and 1 - e G(x) for v >= 0 (no cancellation there), G(x) = erfcx(x) / 2 - x / sqrt(pi),
# whose zero is at |v| = |Z|: G = (|v| - |Z|) H, with |v| - |Z| exact but for a rounding
# (Sterbenz near |Z|, |Z| in two parts) and H smooth, from -0.665 at 0 to -0.399 at infinity:
# as erfcx, in powers of t = (x - 4) / (x + 4), interpolated at the 16 Chebyshev nodes of t in
# [-1, (14 - 4) / (14 + 4)] (mpmath, 40 digits; tests/engine/backends/cpu/test_vector_math.py
# fits it again): within 2^-45.6 of H (15 nodes: 2^-41.8). One polynomial, where the
# gradient took erfc's and a Taylor polynomial near Z.
_ZERO_ABS_HI = 0.7517915246935645
_ZERO_ABS_LO = -1.4956759177009883e-17           # |Z| - _ZERO_ABS_HI
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_GELU_ERF_SLOPE = (-8.564075908330309e-08, -2.850855684144917e-07, 6.162420709440828e-07,
                   1.2287126716471595e-06, -8.823203101050674e-06, 1.4588845953497845e-05,
                   4.946061878095776e-05, -0.00041698368402217836, 0.001638016648832334,
                   -0.004697727297156997, 0.010961142547526453, -0.021814372961684488,
                   0.03801292401716537, -0.058974163612520364, 0.0824145777609969,
                   -0.4461224510575948)


@scalar_math
def gelu_erf_slope_part(a):
    """G(x) = erfcx(x) / 2 - x / sqrt(pi) at x = a / sqrt 2, for a = |v| >= 0 (or NaN), as
    (a - |Z|) H: relative error below 2^-44 (measured: 2^-45.6) for a <= 14 sqrt 2 (beyond,
    x is clamped to 14 in H: gelu_erf's results are 0 there, erfc_short_nonneg's note)."""
    x = a * _INV_SQRT_2
    x = _ERFCX_SHORT_X_HIGH if x > _ERFCX_SHORT_X_HIGH else x
    t = (x - _ERFCX_K) / (x + _ERFCX_K)
    high = _GELU_ERF_SLOPE[0]
    for c in _GELU_ERF_SLOPE[1:8]:
        high = c + t * high
    low = _GELU_ERF_SLOPE[8]
    for c in _GELU_ERF_SLOPE[9:]:
        low = c + t * low
    t2 = t * t
    t4 = t2 * t2
    return ((a - _ZERO_ABS_HI) - _ZERO_ABS_LO) * (low + (t4 * t4) * high)


# --- sin and cos: x = k pi/2 + r, |r| <= pi/4, sin r and cos r by their Taylor series -------
# pi/2 in three parts (the first two of 33 bits: k times each is exact for k < 2^20, and
# x - k _PIO2_1 is exact), so that r is right to 2^-90 or so absolutely however close x
# lies to a multiple of pi/2; that holds for |x| <= TRIG_REACH, beyond which the kernels
# call libm (engine.backends.cpu.elementwise: the float32 inputs there are rare).
TRIG_REACH = 1048576.0                       # 2^20: k <= 667,544
_TWO_OVER_PI = 0.6366197723675814
_PIO2_1 = 1.5707963267341256
_PIO2_2 = 6.077100506303966e-11
_PIO2_3 = 2.0222662487959506e-21
# sin r = r + r^3 (-1/3! + r^2/5! - ... + r^14/17!), cos r = 1 - r^2/2 + r^4 (1/4! - ...
# + r^14/18!): the first omitted terms, (pi/4)^19/19! and (pi/4)^20/20!, are below 1e-19
_SIN = tuple((-1.0) ** n / math.factorial(2 * n + 1) for n in range(8, 0, -1))
_COS = tuple((-1.0) ** n / math.factorial(2 * n) for n in range(9, 1, -1))


@scalar_math
def _sin_cos_reduced(x):
    """(sin r, cos r, k mod 4) for x = k pi/2 + r, |x| <= TRIG_REACH (or NaN)."""
    t = x * _TWO_OVER_PI + _SHIFTER
    k = t - _SHIFTER
    r = ((x - k * _PIO2_1) - k * _PIO2_2) - k * _PIO2_3
    quadrant = np.int64(np.float64(t).view(np.int64) - _SHIFTER_BITS) & np.int64(3)
    r2 = r * r
    s = _SIN[0]
    for c in _SIN[1:]:
        s = c + r2 * s
    c = _COS[0]
    for a in _COS[1:]:
        c = a + r2 * c
    return r * (1.0 + r2 * s), 1.0 - 0.5 * r2 + (r2 * r2) * c, quadrant    # -0 at -0


@scalar_math
def sin(x):
    """sin x for |x| <= TRIG_REACH (or NaN): sin r, cos r, -sin r, -cos r by quadrant;
    relative error below 2 2^-52 (measured: 1.40; -0 at -0)."""
    s, c, quadrant = _sin_cos_reduced(x)
    v = c if quadrant & np.int64(1) else s
    return -v if quadrant & np.int64(2) else v


@scalar_math
def cos(x):
    """cos x for |x| <= TRIG_REACH (or NaN): the sine of the next quadrant; relative
    error below 2 2^-52 (measured: 1.49)."""
    s, c, quadrant = _sin_cos_reduced(x)
    v = s if quadrant & np.int64(1) else c
    return -v if (quadrant + np.int64(1)) & np.int64(2) else v


# --- float32 arithmetic, for 16-bit results ---------------------------------------------------
# A 16-bit result needs 11 (float16) or 8 (bfloat16) significant bits: float32 arithmetic,
# whose vectors hold twice float64's lanes, leaves it 13 or 16 bits to spare. The inputs are
# 16-bit values widened (float16's 11 bits, bfloat16's 8: their squares are exact in
# float32), the results within a few 2^-24 (relative) of the truth, which
# engine.backends.cpu.vector_unary's 16-bit functions combine into results within 2^-21
# (float16's 2^-10 ulp at its smallest relative size: tests/engine/backends/cpu/
# test_vector_unary.py holds them over every 16-bit pattern).
_SHIFTER32 = np.float32(12582912.0)              # 1.5 * 2^23
_SHIFTER32_BITS = np.int32(0x4B400000)           # its pattern
_INV_LN2_32 = np.float32(1.4426950408889634)
_LN2_HI32 = np.float32(0.693145751953125)        # 15 significant bits: k * _LN2_HI32 exact
_LN2_LO32 = np.float32(1.428606765330187e-06)    # ln 2 - _LN2_HI32
_EXP32_LOW = np.float32(-104.0)                  # exp: 0 in float32 below -103.98
_EXP32_HIGH = np.float32(89.0)                   # inf above 88.73
# 1/2!, ..., 1/8!: expm1(r) = r (1 + r/2! + ... + r^6/7!) for |r| <= ln2 / 2, the first
# omitted term (ln2/2)^8 / 8! = 5e-9, a 12th of 2^-24
_EXPM1_32 = tuple(np.float32(1.0 / math.factorial(n)) for n in range(7, 1, -1))


@scalar_math
def _expm1_32_reduced(x, shifter):
    """(p, t) for float32 x (clamped by the caller): t = x / ln2 + shifter, whose pattern's
    low bits are k = round(x / ln2) plus the shifter's, and p = expm1(r) for the reduced r =
    x - k ln2 (|r| <= ln2 / 2), to a few 2^-24 of its size: the reduction and polynomial of
    exp32_parts and exp32_nonpositive_parts, which differ in the shifter alone."""
    t = x * _INV_LN2_32 + shifter
    k = t - shifter
    r = (x - k * _LN2_HI32) - k * _LN2_LO32
    q = _EXPM1_32[0]
    for c in _EXPM1_32[1:]:
        q = c + r * q
    return r * (np.float32(1.0) + r * q), t


@scalar_math
def exp32_parts(x):
    """(p, s1, s2): exp(x) = (1 + p) s1 s2 for float32 x (NaN: p NaN), p = expm1(r) for the
    reduced |r| <= ln2 / 2 to a few 2^-24 of its size, s1 and s2 powers of 2 (normal
    float32: 2^k down to 2^-150 as two factors). As exp_parts, in float32."""
    x = _EXP32_LOW if x < _EXP32_LOW else x
    x = _EXP32_HIGH if x > _EXP32_HIGH else x
    p, t = _expm1_32_reduced(x, _SHIFTER32)
    kb = np.int32(np.float32(t).view(np.int32) - _SHIFTER32_BITS)
    h = kb >> np.int32(1)
    s1 = np.int32((h + np.int32(127)) << np.int32(23)).view(np.float32)
    s2 = np.int32((kb - h + np.int32(127)) << np.int32(23)).view(np.float32)
    return p, s1, s2


@scalar_math
def exp32(x):
    """e^x for float32 x, relative error below 2 2^-24 (measured: 1.63; tests/engine/
    backends/cpu/test_vector_math.py): inf above 88.73, 0 below -103.98 (through float32's
    subnormals)."""
    p, s1, s2 = exp32_parts(x)
    return ((np.float32(1.0) + p) * s1) * s2


# exp32 for x <= 0 (every 16-bit activation's exponent: -|v|, -2|v|, -v^2/2), the same
# bits in fewer operations: 2^k (k from -150 to 0) as one normal factor 2^(k + 64) and the
# constant 2^-64, where exp32_parts builds two factors from k. The shifter carries the
# exponent's bias, 127 + 64: t's pattern is then 0x4B400000 + k + 191 (k + 191 in [41,
# 191]), whose shift by 23 is 2^(k + 64)'s pattern. (1 + p) 2^(k + 64) is exact, and the
# product with 2^-64 rounds once, as exp32's second factor does, into the subnormals too.
# k is the same integer (rounding x / ln2 to one: ties cannot occur, x / ln2 of a float32 x
# never being a half-integer below 151), so r and p are exp32's. Sigmoid's float16 forward
# kernel took 0.38 ns an element on exp32, 0.31 on this (its serial compilation,
# elementwise._vector_kernels(...)[F16].serial, on 32K values in [-6, 6], in cache:
# the median CPU time of 11 runs of 256 calls, one thread; on AVX-512 the loop is bound by
# its two vector ports, and the two factors took 6 of its 37 operations). tests/engine/
# backends/cpu/test_vector_math.py compares the bits with exp32's on every float32 x <= 0
# (slow) and on the exponents of every 16-bit input (fast).
_SHIFTER32_BIASED = np.float32(12582912.0 + 191.0)  # 1.5 * 2^23 + 127 + 64
_TWO_M64 = np.float32(2.0 ** -64)


@scalar_math
def exp32_nonpositive_parts(x):
    """(p, s): exp(x) = ((1 + p) s) 2^-64 for float32 x <= 0 (or NaN: p NaN), p as
    exp32_parts', s = 2^(k + 64) (a normal float32: k + 64 in [-86, 64])."""
    x = _EXP32_LOW if x < _EXP32_LOW else x
    p, t = _expm1_32_reduced(x, _SHIFTER32_BIASED)
    s = np.int32(np.float32(t).view(np.int32) << np.int32(23)).view(np.float32)
    return p, s


@scalar_math
def exp32_nonpositive(x):
    """e^x for float32 x <= 0 (or NaN): exp32(x), bit for bit."""
    p, s = exp32_nonpositive_parts(x)
    return ((np.float32(1.0) + p) * s) * _TWO_M64


@scalar_math
def exp_expm1_32(x):
    """(e^x, e^x - 1) for float32 x <= 0 (or NaN), from one reduction: exp32's e^x, and
    2^k p + (2^k - 1) of the sign of x (each term exact but the fused sum's rounding, 2^k -
    1 for k >= -24, and -1 below), relative error below 3 2^-24 (measured: 1.99;
    tests/engine/backends/cpu/test_vector_math.py): tanh's and elu's 16-bit kernels."""
    p, s = exp32_nonpositive_parts(x)
    s2k = s * _TWO_M64                       # 2^k, k <= 0: 0 below -149
    m = s2k * p + (s2k - np.float32(1.0))
    return ((np.float32(1.0) + p) * s) * _TWO_M64, np.copysign(m, x)


# log1p: the float64 one's series in s = f / (2 + f), |s| <= 0.1716, truncated after s^11
# (the first omitted term, 2 s^13 / 13, is 1e-11 of the sum)
_ATANH32 = tuple(np.float32(2.0 / (2 * n + 1)) for n in range(5, 0, -1))   # 2/11, ..., 2/3
_SQRT2_M1_32 = np.float32(math.sqrt(2.0) - 1.0)
_LN2_32 = np.float32(math.log(2.0))


@scalar_math
def log1p32(y):
    """log(1 + y) for float32 y in [0, 1] (or NaN), relative error below 4 2^-24
    (measured: 3.41, just above sqrt(2) - 1, where 1 + y rounds): log1p's reduction, in
    float32."""
    big = y > _SQRT2_M1_32
    f = (np.float32(1.0) + y) * np.float32(0.5) - np.float32(1.0) if big else y
    s = f / (np.float32(2.0) + f)
    s2 = s * s
    q = _ATANH32[0]
    for c in _ATANH32[1:]:
        q = c + s2 * q
    return (_LN2_32 if big else np.float32(0.0)) + (np.float32(2.0) * s + s * (s2 * q))


# erfcx for 16-bit results: the float64 one's form, erfcx(4 (1 + t) / (1 - t)) in powers of
# t = (x - 4) / (x + 4), interpolated at the 12 Chebyshev nodes of t in [-1, 0.4483] (x in
# [0, 10.5], mpmath, 40 digits; tests/engine/backends/cpu/test_vector_math.py fits it
# again): beyond 10.5, e^-x^2 is 0 in float32, and below 10.5 the interpolant is within
# 0.01 2^-24 of erfcx (12 nodes; 11 left 0.9 2^-24), evaluated in float32 within 5 2^-24.
_ERFCX32_X_HIGH = 10.5
_ERFCX32 = tuple(np.float32(c) for c in (
    0.00010119560419614212, -2.886146304207519e-05, -0.000815051154796033,
    0.004059381157002968, -0.012839519825644989, 0.031299603436696154,
    -0.06310841569709084, 0.10896311869569661, -0.16425777949448858, 0.21871968037753464,
    -0.2590680494547588, 0.13699945762592972))
_ERFCX32_K = np.float32(_ERFCX_K)
_ERFC32_ZERO = np.float32(_ERFCX32_X_HIGH)


@scalar_math
def erfc32_nonneg(x, e):
    """erfc(x) for float32 x >= 0 (or NaN), given e = exp(-x^2) in float32 (exp32 of an
    exact square): relative error below 8 2^-24 (measured: 5.71) while erfc(x) is a normal
    float32; 0 beyond 10.5, where e is."""
    x = _ERFC32_ZERO if x > _ERFC32_ZERO else x
    t = (x - _ERFCX32_K) / (x + _ERFCX32_K)
    q = _ERFCX32[0]
    for c in _ERFCX32[1:]:
        q = c + t * q
    return e * q


# --- float32 arithmetic for float32 results: pairs of float32 ---------------------------------
# A float32 result within about an ulp, computed in float32 arithmetic (twice float64's lanes
# per vector), must carry its intermediate values to more than float32's 24 bits: each is an
# unevaluated sum hi + lo of two float32, whose exact residuals (hi + lo - fl(hi + lo), a b -
# fl(a b), 1 - r d) come from fused multiply-adds and ordered sums (Fast2Sum: fl(a + b) - a
# is exact for |a| >= |b|), and only the final result is rounded, once
# (engine.backends.cpu.vector_unary's float32 section). Those residuals need the fused
# multiply-add itself: LLVM contracts a b + c only where it sees fit, and would fold a b -
# fl(a b) to 0.
@intrinsic
def fma32(typingctx, a, b, c):
    """a b + c rounded once, for float32 a, b and c (llvm.fma.f32: the CPU's instruction,
    vectorised with the loop)."""
    if not all(isinstance(t, types.Float) and t.bitwidth == 32 for t in (a, b, c)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return types.float32(types.float32, types.float32, types.float32), codegen


# The loop vectoriser sizes its vectors by the widest element the loop loads or stores and by
# the target's preferred vector width, which is 256 bits on this AVX-512 CPU (LLVM's tuning
# for it): a float32 kernel then runs 8 lanes, as many as the float64 math's (in 512-bit
# registers), and gained nothing (sigmoid's forward took 2.6 ns an element against 1.8).
# The 16-bit kernels load 16-bit elements and get 16 lanes. wide_vectors marks the function
# it is compiled into (the kernel: scalar_math inlines it there) as preferring 512-bit
# vectors, LLVM's function attribute "prefer-vector-width"; the kernels of float64 math and
# every other kernel keep the target's choice.
_PREFER_512 = '"prefer-vector-width"="512"'


@intrinsic
def wide_vectors(typingctx):
    """Let the loop this is compiled into vectorise 512 bits wide (16 float32 lanes)."""
    def codegen(context, builder, signature, args):
        attributes = builder.function.attributes
        set.add(attributes, _PREFER_512)         # llvmlite checks names against a list of
        return context.get_dummy_value()         # its own, which has no string attributes
    return types.none(), codegen


# exp for x <= 0: x = k ln2 + r + rl, r a float32 (|r| <= ln2 / 2 + 2^-20) and rl its
# rounding error (k ln2's three parts: _LN2_HI32 k exact, x - _LN2_HI32 k exact, then one
# fused rounding whose residual rl the next fused multiply-add recovers to 2^-24 of itself);
# e^(r + rl) - 1 = r + r^2/2 + r^3 (1/3! + ... + r^5/8!) + rl (1 + r), the first omitted
# term r^9/9! below 2^-32, r^2/2 exact as a pair (fma32), the cubic part rounded to 2^-24 of
# its size (below 0.007), and so is r^2/2's sum with r's low part: p + pl within 4 2^-30 of
# expm1(r + rl) (2.4 measured, at r near -ln2 / 2: tests/engine/backends/cpu/
# test_vector_math.py).
_EXP_PAIR_LOW = np.float32(-120.0)   # below, s2 = 0: x e^x (silu) is 0 in float32 below -108.6
_EXP_PAIR_CUBIC = tuple(np.float32(1.0 / math.factorial(n)) for n in range(8, 2, -1))
_HALF32 = np.float32(0.5)


@scalar_math
def exp32_pair(x):
    """(p, pl, k, s1, s2) for float32 x <= 0 (or NaN: p NaN): e^x = (1 + p + pl) 2^k, p +
    pl within 2^-28 of e^x 2^-k - 1 (in [sqrt(1/2) - 1, 0.42], |pl| <= 2^-25), k an int32
    (0 for |x| < ln2 / 2, where p + pl is expm1(x) to 2^-24 of itself) and 2^k = s1 s2,
    each a normal float32, but s2 = 0 below -120 (-inf included), where e^x is 0 to every
    float32 result made of it."""
    wide_vectors()
    low = x < _EXP_PAIR_LOW
    x = _EXP_PAIR_LOW if low else x
    t = fma32(x, _INV_LN2_32, _SHIFTER32)
    k = t - _SHIFTER32
    rh = fma32(-k, _LN2_HI32, x)                   # exact
    r = fma32(-k, _LN2_LO32, rh)
    rl = fma32(-k, _LN2_LO32, rh - r)              # r + rl = x - k ln2
    r2 = r * r
    r2l = fma32(r, r, -r2)                         # r^2 = r2 + r2l exactly
    q = _EXP_PAIR_CUBIC[0]
    for c in _EXP_PAIR_CUBIC[1:]:
        q = fma32(q, r, c)
    th = _HALF32 * r2                              # exact
    tl = fma32(r2 * r, q, fma32(rl, r, rl) + _HALF32 * r2l)
    u = r + th                                     # Fast2Sum: |r| >= r^2 / 2
    ul = (th - (u - r)) + tl
    p = u + ul                                     # Fast2Sum again: |pl| <= 2^-25
    pl = ul - (p - u)
    kb = np.int32(np.float32(t).view(np.int32) - _SHIFTER32_BITS)
    h = kb >> np.int32(1)
    s1 = np.int32((h + np.int32(127)) << np.int32(23)).view(np.float32)
    s2 = np.int32((kb - h + np.int32(127)) << np.int32(23)).view(np.float32)
    return p, pl, kb, s1, (np.float32(0.0) if low else s2)


# --- float32 arithmetic for float32 results without pairs (candidates) ----------------------
# exp32_pair's pairs carry e^x to 2^-28 of itself and take about 30 of the ~55 (counted)
# operations of sigmoid's float32 kernel (0.92 ns an element in cache, torch's 0.58).
# exp32_fast_parts keeps the reduction's rounding error rl (r + rl = x - k ln2, as
# exp32_pair's) and no pair after it: e^x = (1 + r + w) 2^k, w = rl (1 + r) + r^2 (1/2! +
# ... + r^6/8!) rounded (|w| <= 0.07; the first omitted term r^9/9! below 2^-32, and each of
# w's roundings below 2^-24 of r^2 / 2 <= 0.06: w within about 2^-26.5), 2^k as
# exp32_nonpositive's one factor s = 2^(k + 64) and the constant 2^-64. The caller adds r
# and w (p = r + w rounded once, half an ulp of p more) or keeps them apart
# (vector_unary's *_f32_fast, *_f32_tight and *_f32_lean: their bounds over all 2^32
# inputs are in tests/engine/backends/cpu/test_vector_unary.py, CANDIDATE_ULPS).
_EXP_FAST_LOW = np.float32(-106.0)       # 4 e^-106 < 2^-150: 0 in float32 (tanh's 4 e too)
_EXPM1_FAST = tuple(np.float32(1.0 / math.factorial(n)) for n in range(8, 1, -1))


@scalar_math
def _reduced32(x, shifter):
    """(t, r, rl) for float32 x (clamped by the caller): t = x / ln2 + shifter, whose
    pattern's low bits are k = round(x / ln2) plus the shifter's, and r + rl = x - k ln2 (r
    rounded, rl its residual: ln2 in three parts, k _LN2_HI32 exact)."""
    t = fma32(x, _INV_LN2_32, shifter)
    k = t - shifter
    rh = fma32(-k, _LN2_HI32, x)                   # exact
    r = fma32(-k, _LN2_LO32, rh)
    return t, r, fma32(-k, _LN2_LO32, rh - r)


@scalar_math
def exp32_fast_parts(x):
    """(r, w, s) for float32 x <= 0 (or NaN: r NaN): e^x = (1 + r + w) s 2^-64, |r| <= ln2 / 2
    + 2^-20, |w| <= 0.07 (r + w = expm1 of the reduced argument, to about 2^-26.5), s =
    2^(k + 64) (a normal float32, k from -153 to 0; x clamped to -106 first, where 4 s
    2^-64 is 0)."""
    wide_vectors()
    x = _EXP_FAST_LOW if x < _EXP_FAST_LOW else x
    t, r, rl = _reduced32(x, _SHIFTER32_BIASED)
    q = _EXPM1_FAST[0]
    for c in _EXPM1_FAST[1:]:
        q = fma32(q, r, c)
    w = fma32(r * r, q, fma32(rl, r, rl))
    s = np.int32(np.float32(t).view(np.int32) << np.int32(23)).view(np.float32)
    return r, w, s


# --- gelu_erf in float32 arithmetic, for float32 results ----------------------------------------
# gelu_erf's float32 kernels computed in float64 (the functions above: 0.5001 ulp) at about
# three times torch's float32 forward + backward (issue 37). These compute in float32, each
# value rounded as it comes (no pairs, whose cost the float64 math's was not worth), within a
# few ulps (vector_unary.gelu_erf_f32 states the bounds): with a = |v| and x = a / sqrt 2,
# Phi(-a) = erfc(x) / 2 = e^(-a^2/2) erfcx(x) / 2 and the gradient's G(x) = erfcx(x) / 2 -
# x / sqrt(pi) = (a - |Z|) H, as the float64 math's (gelu_erf_slope_part), but
# - e^(-a^2/2) from the exact square a^2 = hi + lo (a fused residual) and the reduction of
#   exp32_fast_parts, lo / 2 taken into the reduced argument's low part: within 2^-24 of
#   itself, where e^(-hi/2) alone erred up to a^2 2^-25 relatively (50 ulps at a = 10);
# - erfcx(x) / 2 (a + K) and H as polynomials in s = a / (a + K) - C (K = 2 sqrt 2, C the
#   middle of s's range over a in [0, 16]; H's over [0, 20], as far as the gradient of a
#   large g reaches): erfcx(x) / 2 (a + K) falls from 1.41 to 0.58 and H from -0.665 to
#   -0.45 smoothly, so their float32 Horner chains keep about an ulp
#   (in powers of vector_math's t = (x - 4) / (x + 4) they lost 4-5 ulps near x = 0, where
#   t's rounding is large beside x, and the terms of erfcx itself cancel towards x = 10);
#   11 float32 coefficients each, fitted knowing they are rounded: from the constant term
#   up, each the first of a weighted least-squares fit (relative error, at 400 Chebyshev
#   points of s; function values from mpmath) of what the rounded ones before it leave,
#   rounded to float32 (tests/engine/backends/cpu/test_vector_math.py fits them again).
#   Within 0.43 2^-24 (erfcx's) and 0.13 2^-24 (H) of the functions, where the rounded
#   coefficients of the interpolant at 11 Chebyshev nodes erred 1.61 (and H's 0.36 over
#   [0, 16]);
# - e^(-a^2/2) scaled by 2^64 (exp32_fast_parts' s; 2^164 for the gradient from a = 13),
#   so that every factor stays a normal float32 where the results of float32 factors g of
#   any size would turn subnormal in the products, and the scale comes off last (the
#   callers). Beyond a = 16 (x clamped there for the polynomials) the forward is 0 or v to
#   every float32 result.
_GE32_K = np.float32(2.0 * math.sqrt(2.0))
_GE32_A_HIGH = np.float32(16.0)
_GE32_C = np.float32(float(_GE32_A_HIGH) / (float(_GE32_A_HIGH) + float(_GE32_K)) / 2.0)
EXP32_SCALED_LOW = np.float32(-130.0)                 # 2^(k + 64) normal down to here
_GE32_PHI = tuple(np.float32(c) for c in (            # erfcx(x) / 2 (a + K), powers of s
    0.046214859932661057, -0.021036885678768158, -0.10350173711776733,
    -0.009816216304898262, 0.16044571995735168, 0.07770518213510513, -0.2856866419315338,
    -0.12602068483829498, 0.8281273245811462, -1.0935919284820557, 0.7998986840248108))
_GE32_SLOPE_A_HIGH = np.float32(20.0)
_GE32_SLOPE_C = np.float32(float(_GE32_SLOPE_A_HIGH)
                           / (float(_GE32_SLOPE_A_HIGH) + float(_GE32_K)) / 2.0)
_GE32_SLOPE = tuple(np.float32(c) for c in (          # H, powers of s' = a / (a + K) - C'
    -0.004326225724071264, -0.0036626493092626333, 0.008899183012545109,
    0.012071380391716957, -0.01193174347281456, -0.02993716485798359, 0.026807153597474098,
    0.08204378932714462, -0.22028039395809174, 0.27244630455970764, -0.4979286789894104))
_GE32_ZERO_HI = np.float32(_ZERO_ABS_HI)                           # |Z| in two float32
_GE32_ZERO_LO = np.float32(_ZERO_ABS_HI - float(_GE32_ZERO_HI) + _ZERO_ABS_LO)


# The gradient's e^(-a^2/2) for a >= 13 carries 2^164 (the shifter's bias 127 + 164): a
# normal float32 from a = 13 (2^-122 2^164) to 20 (2^-288.5 2^164), so that g e G of a g up
# to float32's largest is computed, and rounded once, wherever it is not 0 (below 2^-150 it
# is 0 beyond a = 19.9 for every finite g): with 2^64 alone such a result of a large g came
# out 0 beyond a = 16.1.
_SHIFTER32_BIASED_BIG = np.float32(12582912.0 + 291.0)   # 1.5 * 2^23 + 127 + 164
_GE32_E_LOW_BIG = np.float32(-200.0)                      # 2^(k + 164) normal down to here


@scalar_math
def exp32_scaled_parts(x, xl, shifter, low_end):
    """e^(x + xl) 2^B for float32 x <= 0 (or NaN) and its low part xl (|xl| below 2^-17), 2^B
    the power of 2 that `shifter` carries (_SHIFTER32_BIASED: 2^64, _SHIFTER32_BIASED_BIG:
    2^164), relative error below 1.1 2^-24 (exp32_fast_parts' reduction, xl taken into the
    reduced argument's low part, and (1 + r + w) s rounded once); 0 where x < low_end."""
    low = x < low_end
    x = low_end if low else x
    t, r, rl = _reduced32(x, shifter)
    rl = rl + xl                                   # r + rl = x + xl - k ln2
    q = _EXPM1_FAST[0]
    for c in _EXPM1_FAST[1:]:
        q = fma32(q, r, c)
    # every product that meets a sum is a fused multiply-add of its own (fma32): LLVM
    # contracts the others as it sees fit, which could differ between the kernels that
    # inline this, and geglu_erf's and swiglu's must give their activations' bits
    r2 = r * r
    w = r2 * q                                     # expm1(r) - r
    w = fma32(rl, fma32(r2, q, r) + np.float32(1.0), w)   # + rl e^r: rl up to 2^-18
    s = np.int32(np.float32(t).view(np.int32) << np.int32(23)).view(np.float32)
    h = fma32(r, s, s)                             # (1 + r + w) s, rounded once
    e = h + fma32(w, s, fma32(r, s, s - h))
    return np.float32(0.0) if low else e


@scalar_math
def exp32_scaled(x):
    """e^x 2^64 for float32 x <= 0 (or NaN), relative error below 1.1 2^-24: a normal
    float32 down to x = -130 (e^x itself is subnormal below -87.3), 0 below."""
    return exp32_scaled_parts(x, np.float32(0.0), _SHIFTER32_BIASED, EXP32_SCALED_LOW)


@scalar_math
def gelu_erf32_exp(a, big):
    """e^(-a^2/2) 2^64 for float32 a >= 0 (or NaN), 2^164 where `big` (a >= 13 only: the
    gradient's), relative error below 1.1 2^-24 (measured: 0.99, 1.0006 with 2^164 near a =
    20; the exact square's low part taken into the reduction: exp32_scaled_parts); 0 where
    -a^2/2 < -130 (a > 16.12, infinity included), -200 where big (a > 20)."""
    hi = a * a
    lo = fma32(a, a, -hi)                          # a^2 = hi + lo exactly
    return exp32_scaled_parts(-_HALF32 * hi, -_HALF32 * lo,
                              _SHIFTER32_BIASED_BIG if big else _SHIFTER32_BIASED,
                              _GE32_E_LOW_BIG if big else EXP32_SCALED_LOW)


@scalar_math
def _ge32_polynomial(a, a_high, center, coefficients):
    """(P(s), r) for float32 a >= 0 (or NaN): `coefficients` (highest power first) at s =
    c / (c + K) - center, r = 1 / (c + K), c = a clamped to a_high."""
    c = a_high if a > a_high else a
    r = np.float32(1.0) / (c + _GE32_K)
    s = fma32(c, r, -center)
    q = coefficients[0]
    for k in coefficients[1:]:
        q = fma32(q, s, k)
    return q, r


@scalar_math
def gelu_erf32_phi_part(a):
    """erfcx(a / sqrt 2) / 2 for float32 a >= 0 (or NaN), a clamped to 16: so that
    Phi(-a) = e^(-a^2/2) times it; relative error below 3.5 2^-24 (measured: 2.33;
    tests/engine/backends/cpu/test_vector_math.py)."""
    q, r = _ge32_polynomial(a, _GE32_A_HIGH, _GE32_C, _GE32_PHI)
    return q * r


@scalar_math
def gelu_erf32_slope_part(a):
    """G(a / sqrt 2) = erfcx(x) / 2 - x / sqrt(pi) for float32 a >= 0 (or NaN), as (a - |Z|)
    H, H clamped at a = 20 (beyond, every float32 result made of G is 0); relative error
    below 3.5 2^-24 (measured: 2.40)."""
    h, _ = _ge32_polynomial(a, _GE32_SLOPE_A_HIGH, _GE32_SLOPE_C, _GE32_SLOPE)
    return ((a - _GE32_ZERO_HI) - _GE32_ZERO_LO) * h
