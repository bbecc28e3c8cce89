"""The activations' float32 scalar math on engine.backends.cpu.vector_math: the fast path
of their float32 kernels (engine.backends.cpu.elementwise), keyed by op name.

Each op's row of engine.elementwise is its definition, and its plain twin: scalar math
on libm (math.exp, math.tanh, math.erfc, ...), which is what the float64 kernels, the CUDA
kernels and, in plain mode (engine.backends.cpu.paths.plain), the float32 kernels run. A
libm call per element keeps LLVM from vectorising the loop, and those kernels ran 3-5
times slower than torch's on 8M float32 elements (issue 37). The functions here compute
the rows' values in the rows' forms (none cancels: sigmoid's 1 - s as e^-|x| / (1 +
e^-|x|), tanh's 1 - t^2 as 4 e^-2|x| / (1 + e^-2|x|)^2, gelu's 0.5 (1 + tanh) as a
sigmoid; gelu_erf's gradient as e^(-v^2/2) times a polynomial carrying the factor of its
zero), in float64 from vector_math's exp, expm1, log1p, log and erfc (gelu_erf: their short
forms, about 2^-42, which float32 results need no more than), each rounded once when
stored in float32.

Accuracy: each forward and each gradient (at g = 1) is within 0.5001 ulp of float32 at the
true value, the correctly rounded result but within 10^-4 ulp of a tie, except the float32
arithmetic of sigmoid and tanh below (and softplus's gradient, g times sigmoid's float32
forward), 0.76, and gelu_erf's and silu's float32 arithmetic (gelu_erf_f32, silu_f32,
issue 37's fourteenth round), 3.5 to 4.5 (each docstring says its bound). Against
float64 references without cancellation (libm, mpmath where a gradient crosses 0),
tests/engine/backends/cpu/test_vector_unary.py holds the bounds over all 2^32 float32
inputs (slow) and on every exponent, the saturation points, the gradients' zeros and the
special values (fast); 16-bit results are within 0.5 + 2^-10 ulp of their format on all
2^16 patterns. Special values are the row's: NaN in gives NaN out, the infinities give the
row's limits (NaN where the row's formula gives inf * 0, as torch's does), a zero the
row's zero with its sign.

16-bit results need 11 (float16) or 8 (bfloat16) significant bits, and sigmoid, silu,
gelu_quick, gelu_erf, softplus, tanh and elu compute theirs in float32 arithmetic instead
(forward16, gradient16: vector_math's float32 section, whose vectors hold twice the lanes;
elu's products with its alpha, any float64, in float64): from the same forms, within 0.5 +
2^-10 ulp of the format as the float64 functions, over all 2^16 patterns (the same test);
gelu_erf's and gelu_quick's gradients within 1/32 of their zeros from Taylor polynomials
there. Their
exponentials are all of x <= 0 (vector_math.exp32_nonpositive: exp32's bits in fewer
operations), and every result comes out of an arithmetic operation, never a select of an
input, so that the kernels load and store without the NaN fix-ups (elementwise._BARE16).
Each kernel takes about a third to a half of the float64 one's time: per float16 element,
forward and backward, sigmoid 0.64 and 0.50 ns, tanh 0.67 and 0.55, gelu_erf 1.01 and
0.83 (CPU time of the serial kernels over 8M values in [-6, 6], one thread, load 11),
where the float64 math took sigmoid 1.77 and 1.46, gelu_erf 2.21 and 2.47 (load 6;
docs/performance.md's activations section).

Float32 results computed in float64 took 1.5-1.6 times torch's forward + backward for
sigmoid, tanh and silu (bench_ops on the quiet machine; target 1.2), and sigmoid and
tanh compute theirs in float32 arithmetic instead (forward32, gradient32; the last
section below), in 512-bit vectors (vector_math.wide_vectors: LLVM's default for this
CPU is 256 bits, which left a float32 loop as many lanes as a float64 one). Every
intermediate value is a pair of float32 (hi + lo, from fused multiply-adds and ordered
sums: vector_math's pair section), e^-|x| within 2^-28 of itself, and only the
result is rounded, once: within 0.76 ulp of float32 over all 2^32 inputs (the slow test:
sigmoid 0.7505 forward and backward, tanh 0.5390 and 0.7527), the largest errors where the
result is subnormal, rounded to 24 bits and then to the subnormal's fewer (on the dense
sample's normal results at most 0.54). silu keeps its float64 math: its gradient in
float32 pairs (1 + v (1 - s) cancels near its zero at -1.2785: a Taylor polynomial there;
0.7556 ulp over all 2^32 inputs) took as long as the float64 kernel on 1M elements (1.49
ns an element against 1.46-1.52) and longer on 8M (2.2 against 1.5), and its forward
(0.7505 on the dense sample) must give swiglu's bits (engine.backends.cpu.glu, on the
float64 functions) and was 0-12% faster. On the tight parts below (issue 37's eighth
round: e^-|v| clamped at -120, where v e^v underflows at -108.6; a Taylor polynomial within
1/16 of the gradient's zero; subnormal results rounded once, the double rounding's 0.79 ulp
fixed at its ties) both were within the bound (0.549 and 0.623 on the dense sample) and
still no faster: forward 0.86x the float64 kernel's CPU time on 128K elements but 1.11x on
8M, gradient 1.04x and 1.28x (110 instructions per 16 elements against 49 per 8;
docs/performance.md's activations section has the figures and the command).

    FAST[name] = VectorMath(forward, gradient, reach, forward16, gradient16, forward32,
                            gradient32)
    forward(v, params), gradient(g, v, params)     # params: the row's, a tuple of floats

gradient is None for exp and log, whose gradients are composed of engine ops; `reach`
bounds the inputs the functions take (sin and cos: |x| <= 2^20, vector_math.TRIG_REACH),
beyond which the kernel computes the row's libm math instead (in float64).

Since issue 37's fourteenth round silu's float32 results compute in float32 arithmetic
without pairs (silu_f32, silu_gradient_f32: each value rounded as it comes, within 3.5 and
4.5 ulps over all 2^32 inputs, measured 3.08 at -3.23 and 3.99 at -0.844; a Taylor
polynomial within 1/8 of the gradient's zero), as
gelu_erf's: the float64 math above took 1.7-2.0 times torch's forward + backward; swiglu's
float32 kernel takes silu_f32, so that a gate of one keeps silu's bits.

Since issue 37's twelfth round softplus's gradient for float32 results is g times
sigmoid's tight forward (gradient32: the forward within the same 0.76 ulp, the product
exact at g = 1; forward + backward over 8M float32 elements 32.0 -> 23.9 ms against torch's
20-22, docs/performance.md's activations section).

Since issue 37's seventh round FAST's sigmoid and tanh take the `tight` forms (the last
section): e^x as (1 + r + w) 2^k from vector_math.exp32_fast_parts, its range reduction's
rounding kept but no pair after it, 1 / (1 + e) with its residual, the result rounded
once, within the same 0.76 ulp over all 2^32 inputs (sigmoid 0.7578 forward and gradient,
tanh 0.5852 and 0.7565, the largest again where the result is subnormal) and 15-35%
faster in cache than the pairs above: the serial kernels, ns an element on 128K values,
sigmoid forward 0.68 and 0.59 against 0.96 and 0.91, gradient 0.87 and 0.86 against 1.14
and 1.07, tanh forward 0.92 and 0.79 against 1.03 and 0.99, gradient 0.91 and 0.91
against 1.17 and 1.10 (two runs, load 1-6; docs/performance.md's activations section
names the command). F32_CANDIDATES holds every form, the pairs among them, for the
precision decision issue 37 leaves open: `fast` (0.85 ulp), `mid` (1.5; tanh's forward
2.3) and `lean` (torch's forms, every operation rounded: 2.8-5.1), each faster;
tests/engine/backends/cpu/test_vector_unary.py holds their bounds (CANDIDATE_ULPS).

Since issue 37's fourteenth round gelu_erf's float32 results compute in float32 arithmetic
too (gelu_erf_f32, gelu_erf_gradient_f32 on vector_math's gelu_erf32 section), every value
rounded as it comes, no pairs: within 4 ulps, forward and gradient, over all 2^32 inputs
(measured: 3.93 at -9.32 and 3.70 at -1.758), where the float64 math kept 0.5001
at about three times torch's float32 forward + backward (the pairs would have cost more
than they saved: docs/performance.md's activations section). torch's own float32 gelu
errs by up to 1.7e7 ulps forward (1 + erf(v / sqrt 2) cancels in the left tail) and 1.2e8
for the gradient (its two terms cancel at its zero).

Every function is `scalar_math`: numba inlines it into the kernel that calls it (the
templates of engine.backends.cpu.elementwise), which is compiled contracting; inlined by
LLVM instead, gelu_erf's was too big to be, and its loop ran a call per element. So the
parameters come as one tuple, not spread as the rows' are (numba inlines no call with
*args).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from engine import elementwise as table
from engine.backends.cpu.jit import scalar_math
from engine.backends.cpu.vector_math import (
    EXP32_SCALED_LOW,
    TRIG_REACH,
    cos,
    erfc32_nonneg,
    erfc_short_nonneg,
    exp,
    exp32_fast_parts,
    exp32_nonpositive,
    exp32_pair,
    exp32_scaled,
    exp_expm1,
    exp_expm1_32,
    exp_short_nonpositive,
    expm1,
    fma32,
    gelu_erf32_exp,
    gelu_erf32_phi_part,
    gelu_erf32_slope_part,
    gelu_erf_slope_part,
    log,
    log1p,
    log1p32,
    sin,
    wide_vectors,
)
from engine.elementwise import GELU_CUBIC, GELU_QUICK_COEF, SOFTPLUS_THRESHOLD, SQRT_2_OVER_PI

_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@scalar_math
def _sigmoid_pair(u):
    """(sigmoid(u), 1 - sigmoid(u)), each to a few float64 ulps: with e = e^-|u|, 1 / (1 + e)
    and e / (1 + e), the larger and the smaller of the two."""
    e = exp(-abs(u))
    r = 1.0 / (1.0 + e)
    small = e * r
    return (r, small) if u >= 0.0 else (small, r)


@scalar_math
def sigmoid(v, params):
    """1 / (1 + e^-v), within 0.5001 ulp of float32."""
    return _sigmoid_pair(v)[0]


@scalar_math
def sigmoid_gradient(g, v, params):
    """g s (1 - s) = g e / (1 + e)^2, e = e^-|v|; within 0.5001 ulp of float32 (at g = 1)."""
    e = exp(-abs(v))
    r = 1.0 / (1.0 + e)
    return g * (e * r * r)


@scalar_math
def tanh(v, params):
    """tanh |v| = -m / (2 + m), m = e^-2|v| - 1, of v's sign; within 0.5001 ulp of float32."""
    _, m = exp_expm1(-2.0 * abs(v))
    return math.copysign(-m / (2.0 + m), v)


@scalar_math
def tanh_gradient(g, v, params):
    """g (1 - tanh^2 v) = g 4 e / (2 + m)^2, e = e^-2|v|, m = e - 1; within 0.5001 ulp of
    float32 (at g = 1)."""
    e, m = exp_expm1(-2.0 * abs(v))
    d = 2.0 + m
    return g * (4.0 * e / (d * d))


@scalar_math
def silu(v, params):
    """v sigmoid(v), within 0.5001 ulp of float32."""
    return v * _sigmoid_pair(v)[0]


@scalar_math
def silu_gradient(g, v, params):
    """g s (1 + v (1 - s)); within 0.5001 ulp of float32 (at g = 1)."""
    s, c = _sigmoid_pair(v)
    return g * (s * (1.0 + v * c))


@scalar_math
def gelu_quick(v, params):
    """v sigmoid(1.702 v), within 0.5001 ulp of float32."""
    return v * _sigmoid_pair(GELU_QUICK_COEF * v)[0]


@scalar_math
def gelu_quick_gradient(g, v, params):
    """g (s + 1.702 v s (1 - s)), s = sigmoid(1.702 v); within 0.5001 ulp of float32 (at g = 1)."""
    s, c = _sigmoid_pair(GELU_QUICK_COEF * v)
    return g * (s + GELU_QUICK_COEF * v * (s * c))


_gelu_u = scalar_math(table.gelu_u)       # the row's u: 0.5 (1 + tanh(u / 2)) = sigmoid(u)


@scalar_math
def gelu(v, params):
    """v sigmoid(2 sqrt(2/pi) (v + 0.044715 v^3)) = 0.5 v (1 + tanh(...)), the row's;
    within 0.5001 ulp of float32."""
    return v * _sigmoid_pair(_gelu_u(v))[0]


@scalar_math
def gelu_gradient(g, v, params):
    """g (S + v S (1 - S) u'), S = sigmoid(u), u' = 2 sqrt(2/pi) (1 + 3 0.044715 v^2): the
    row's 0.5 (1 + t) + 0.5 v (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 v^2); within 0.5001
    ulp of float32 (at g = 1)."""
    s, c = _sigmoid_pair(_gelu_u(v))
    du = 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * v * v)
    return g * (s + v * (s * c) * du)


@scalar_math
def _phi_parts(v):
    """(Phi(v), e^(-v^2/2)): the standard normal cdf, 0.5 erfc(|v| / sqrt 2) for v < 0 and
    1 - that for v >= 0, and the exponential it is made from (v^2 of a widened float32 is
    exact), each within about 2^-41 of itself (vector_math's short exp and erfc: float32
    results need no more, and the kernels were bound by the arithmetic of the longer)."""
    e = exp_short_nonpositive(-0.5 * (v * v))
    half = 0.5 * erfc_short_nonneg(abs(v) * _INV_SQRT_2, e)
    return (half if v < 0.0 else 1.0 - half), e


_HALF_REACH = 2.0 ** -30        # below, Phi(v) = 1/2 + v / sqrt(2 pi) to 2^-90


@scalar_math
def gelu_erf(v, params):
    """v Phi(v), within 0.5001 ulp of float32; v (1/2 + v / sqrt(2 pi)) for |v| < 2^-30,
    Phi's first two terms, exact there to float64's rounding: the short erfc's 1 - 2^-45.7
    at 0 would round the smallest subnormal's half, a tie, up rather than to even (1/2 +
    v / sqrt(2 pi) is 1/2 exactly in float64 there, as the row's erfc is 1), and v / 2
    alone, off by 0.8 v relatively (0.012 ulp at 2^-30), took geglu_erf's product a
    Phi(a) b, rounded once, to 0.509 ulp near a tie (tests/engine/backends/cpu/
    test_glu.py, a = -9.18e-10)."""
    if abs(v) < _HALF_REACH:
        return v * (0.5 + v * _INV_SQRT_2PI)
    return v * _phi_parts(v)[0]


@scalar_math
def gelu_erf_gradient(g, v, params):
    """g (Phi(v) + v phi(v)), phi(v) = e^(-v^2/2) / sqrt(2 pi): with e = e^(-v^2/2) and G =
    vector_math.gelu_erf_slope_part(|v|), g e G for v < 0 and g (1 - e G) for v >= 0 (G
    carries the factor |v| - |Z| of the zero at Z = -0.75179: nothing cancels); within
    0.5001 ulp of float32 (at g = 1). Where e is 0 (|v| > 38.6), e G is -0 (G < 0 there):
    plus 0 makes it the row's 0 + v 0 = +0."""
    e = exp_short_nonpositive(-0.5 * (v * v))
    eg = e * gelu_erf_slope_part(abs(v))
    return g * (eg + 0.0 if v < 0.0 else 1.0 - eg)


@scalar_math
def elu(v, params):
    """v if v > 0 else alpha (e^v - 1), within 0.5001 ulp of float32."""
    alpha = params[0]
    return v if v > 0.0 else alpha * expm1(v)


@scalar_math
def elu_gradient(g, v, params):
    """g, or g alpha e^v for v <= 0; within 0.5001 ulp of float32 (at g = 1)."""
    alpha = params[0]
    return g if v > 0.0 else g * (alpha * exp(v))


@scalar_math
def softplus(v, params):
    """log(1 + e^v) = max(v, 0) + log1p(e^-|v|), and v above the row's threshold; within
    0.5001 ulp of float32."""
    tail = log1p(exp(-abs(v)))
    return v if v > SOFTPLUS_THRESHOLD else (v if v > 0.0 else 0.0) + tail


@scalar_math
def softplus_gradient(g, v, params):
    """g, or g sigmoid(v) up to the threshold; within 0.5001 ulp of float32 (at g = 1)."""
    return g if v > SOFTPLUS_THRESHOLD else g * _sigmoid_pair(v)[0]


@scalar_math
def expm1_gradient(g, v, params):
    """g e^v, within 0.5001 ulp of float32 (at g = 1)."""
    return g * exp(v)


@scalar_math
def expm1_forward(v, params):
    """e^v - 1, within 0.5001 ulp of float32."""
    return expm1(v)


@scalar_math
def exp_forward(v, params):
    """e^v, within 0.5001 ulp of float32."""
    return exp(v)


@scalar_math
def log_forward(v, params):
    """log v, within 0.5001 ulp of float32."""
    return log(v)


@scalar_math
def sin_forward(v, params):
    """sin v (libm's beyond |v| = 2^20), within 0.5001 ulp of float32."""
    return sin(v)


@scalar_math
def sin_gradient(g, v, params):
    """g cos v, within 0.5001 ulp of float32 (at g = 1)."""
    return g * cos(v)


@scalar_math
def cos_forward(v, params):
    """cos v (libm's beyond |v| = 2^20), within 0.5001 ulp of float32."""
    return cos(v)


@scalar_math
def cos_gradient(g, v, params):
    """-g sin v, within 0.5001 ulp of float32 (at g = 1)."""
    return -g * sin(v)


# --- float32 arithmetic for 16-bit results (vector_math's float32 section) --------------------
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_ZERO = np.float32(0.0)
_INV_SQRT_2_32 = np.float32(_INV_SQRT_2)
_INV_SQRT_2PI_32 = np.float32(_INV_SQRT_2PI)
_SOFTPLUS_THRESHOLD_32 = np.float32(SOFTPLUS_THRESHOLD)


@scalar_math
def _sigmoid_pair32(u):
    """_sigmoid_pair in float32: each of the two within a few 2^-24 of its size."""
    e = exp32_nonpositive(-abs(u))
    r = _ONE / (_ONE + e)
    small = e * r
    return (r, small) if u >= _ZERO else (small, r)


@scalar_math
def sigmoid32(v, params):
    """sigmoid for 16-bit results, in float32."""
    return _sigmoid_pair32(v)[0]


@scalar_math
def sigmoid_gradient32(g, v, params):
    """sigmoid_gradient for 16-bit results, in float32."""
    e = exp32_nonpositive(-abs(v))
    r = _ONE / (_ONE + e)
    return g * (e * r * r)


@scalar_math
def silu32(v, params):
    """silu for 16-bit results, in float32."""
    return v * _sigmoid_pair32(v)[0]


@scalar_math
def silu_gradient32(g, v, params):
    """silu_gradient for 16-bit results, in float32."""
    s, c = _sigmoid_pair32(v)
    return g * (s * (_ONE + v * c))


# gelu_quick's u = 1.702 v is rounded once to float32: every pattern of both formats within
# the bound, forward and gradient (1.702 split into 12 bits, whose product with a 16-bit
# value is exact, and a correction factor e^b for the rest, was tried first and gave the
# same verdicts in more operations)
_GQ32 = np.float32(GELU_QUICK_COEF)


@scalar_math
def _gelu_quick_pair32(v):
    """(sigmoid(1.702 v), 1 - sigmoid(1.702 v)) in float32, each within a few 2^-24 of its
    size."""
    e = exp32_nonpositive(-abs(_GQ32 * v))
    r = _ONE / (_ONE + e)
    small = e * r
    return (r, small) if v >= _ZERO else (small, r)


@scalar_math
def gelu_quick32(v, params):
    """gelu_quick for 16-bit results, in float32."""
    return v * _gelu_quick_pair32(v)[0]


# gelu_quick's gradient s (1 + u (1 - s)) crosses 0 at v = ZQ = -0.75115425544128895130
# (mpmath, u = 1.702 v at silu's zero): near it 1 + u (1 - s) cancels, and the float32 error
# of 1 - s, a few 2^-24, is a visible part of the result (without the polynomial float16's
# -0.75244140625 came out 0.5686 ulp off). Within 1/32 of ZQ it is its Taylor polynomial in
# d = v - ZQ instead, as gelu_erf's (v - _ZQ_HI exact), of degree 5 (mpmath.taylor, 50
# digits; the first omitted term below 2.6e-10 of the gradient at |d| = 1/32).
_ZQ_HI = np.float32(-0.75115425544128895130)
_ZQ_LO = np.float32(-1.149521351184497e-08)       # ZQ - _ZQ_HI
_ZQ_REACH = np.float32(1.0 / 32.0)
_ZQ_TAYLOR = tuple(np.float32(c) for c in (      # the coefficients of d^5, ..., d^1
    -0.094357207128861515142, -0.12774050660220322881, 0.093059636757291570033,
    0.42481282173594376823, 0.37071552313509976812))


@scalar_math
def gelu_quick_gradient32(g, v, params):
    """gelu_quick_gradient for 16-bit results, in float32: g (s + (1.702 s (1 - s)) v), the
    product with v last (a bfloat16 v times 1.702 may overflow float32, where s (1 - s) is
    0 and the term is the row's 0, NaN at v = inf); within 1/32 of its zero, its Taylor
    polynomial there."""
    s, c = _gelu_quick_pair32(v)
    far = s + (_GQ32 * (s * c)) * v
    d = (v - _ZQ_HI) - _ZQ_LO
    q = _ZQ_TAYLOR[0]
    for k in _ZQ_TAYLOR[1:]:
        q = k + d * q
    return g * (d * q if abs(d) < _ZQ_REACH else far)


@scalar_math
def _phi_parts32(v):
    """_phi_parts in float32 (v^2 of a 16-bit value is exact in float32)."""
    e = exp32_nonpositive(-_HALF * (v * v))
    half = _HALF * erfc32_nonneg(abs(v) * _INV_SQRT_2_32, e)
    return (half if v < _ZERO else _ONE - half), e


@scalar_math
def gelu_erf32(v, params):
    """gelu_erf for 16-bit results, in float32."""
    return v * _phi_parts32(v)[0]


# gelu_erf's gradient Phi(v) + v phi(v) crosses 0 at Z = -0.75179152469356445746 (mpmath):
# near it the two terms' float32 errors, a few 2^-24 of 0.23, are a visible part of the
# result (float16's input nearest Z, -0.751953125, came out 0.70 ulp off). Within 1/32 of
# Z it is its Taylor polynomial in d = v - Z instead, each term computed without
# cancellation (v - _Z_HI is exact, Sterbenz), of degree 5 (mpmath.taylor, 50 digits;
# the first omitted term is below 0.03 2^-24 of the sum at |d| = 1/32).
_Z_HI = np.float32(-0.7517915246935645)
_Z_LO = np.float32(1.211445e-08)                 # Z - _Z_HI
_Z_REACH = np.float32(1.0 / 32.0)
_Z_TAYLOR = tuple(np.float32(c) for c in (     # the coefficients of d^5, ..., d^1
    -0.014771522148244337, -0.1140082332972217, -0.018199676398671087, 0.388284982990552,
    0.4314939923140469))


@scalar_math
def gelu_erf_gradient32(g, v, params):
    """gelu_erf_gradient for 16-bit results, in float32; within 1/32 of its zero, its
    Taylor polynomial there."""
    p, e = _phi_parts32(v)
    far = p + v * (e * _INV_SQRT_2PI_32)
    d = (v - _Z_HI) - _Z_LO
    q = _Z_TAYLOR[0]
    for c in _Z_TAYLOR[1:]:
        q = c + d * q
    return g * (d * q if abs(d) < _Z_REACH else far)


@scalar_math
def softplus32(v, params):
    """softplus for 16-bit results, in float32."""
    tail = log1p32(exp32_nonpositive(-abs(v)))
    return v if v > _SOFTPLUS_THRESHOLD_32 else (v if v > _ZERO else _ZERO) + tail


@scalar_math
def softplus_gradient32(g, v, params):
    """softplus_gradient for 16-bit results, in float32: g sigmoid(v) for every v, since
    above the row's threshold (20) sigmoid(v) is 1 in float32 (1 + e^-v rounds to 1), so
    that the result is g's there too, and a NaN g comes out of a multiplication (quiet) as
    every other result does, for the kernels' bare conversions (elementwise._BARE16: g
    passed through a select kept a signalling bfloat16 NaN's pattern)."""
    return g * _sigmoid_pair32(v)[0]


@scalar_math
def tanh32(v, params):
    """tanh for 16-bit results, in float32."""
    _, m = exp_expm1_32(np.float32(-2.0) * abs(v))
    return np.copysign(-m / (np.float32(2.0) + m), v)


@scalar_math
def tanh_gradient32(g, v, params):
    """tanh_gradient for 16-bit results, in float32."""
    e, m = exp_expm1_32(np.float32(-2.0) * abs(v))
    d = np.float32(2.0) + m
    return g * (np.float32(4.0) * e / (d * d))


# elu's alpha is any float64: its products are taken in float64 (alpha rounded to float32
# could overflow, or stray by a float32 rounding more), each rounded once to float32
@scalar_math
def elu32(v, params):
    """elu for 16-bit results: alpha (e^v - 1) from float32's expm1, the product in
    float64."""
    _, m = exp_expm1_32(_ZERO if v > _ZERO else v)
    return v if v > _ZERO else np.float32(params[0] * np.float64(m))


@scalar_math
def elu_gradient32(g, v, params):
    """elu_gradient for 16-bit results: g e^min(v, 0) times alpha where v <= 0 (and 1
    above, where e^0 = 1 exactly), the products in float64; a product for every v, so
    that a NaN g comes out of a multiplication (quiet) as every other result does, for the
    kernels' bare conversions (elementwise._BARE16)."""
    e, _ = exp_expm1_32(_ZERO if v > _ZERO else v)
    return np.float32(np.float64(g) * (np.float64(e) * (1.0 if v > _ZERO else params[0])))


# --- float32 arithmetic for float32 results (vector_math's pairs) ----------------------------
_TWO = np.float32(2.0)


@scalar_math
def _logistic_pairs(u):
    """For float32 u <= 0 (or NaN), e = e^u and 1 / (1 + e), each as a pair: (eh, el, ah,
    al, rh, rl, p, pl, k, s1, s2) with e = (eh + el) s1 s2 (eh + el = 1 + p + pl, in
    [sqrt(1/2), sqrt 2]: vector_math.exp32_pair's, 2^k = s1 s2), e = ah + al (ah rounded;
    Fast2Sum of 1 and e below needs e <= 1), 1 / (1 + e) = rh + rl: rh rounded, rl its
    residual from the exact 1 - rh d of a fused multiply-add, each within about 2^-28 of
    its size (e's own error)."""
    p, pl, k, s1, s2 = exp32_pair(u)
    eh = _ONE + p
    el = ((_ONE - eh) + p) + pl                  # Fast2Sum: |p| < 1
    ah = (eh * s1) * s2
    al = (el * s1) * s2
    dh = _ONE + ah
    dl = ((_ONE - dh) + ah) + al                 # Fast2Sum: e <= 1
    rh = _ONE / dh
    rl = rh * fma32(-rh, dl, fma32(-rh, dh, _ONE))
    return eh, el, ah, al, rh, rl, p, pl, k, s1, s2


# Below exp32_pair's clamp (-120) its s2 is 0, where the row's float64 e^u is not until
# -745.13: a gradient g f'(v) there is 0 in float32 for every finite g, but inf for an
# infinite g (the row's inf times a tiny number), not inf * 0. That product is made of
# factors selected per element (the tiny one where the edge is, 1 elsewhere), never as a
# whole value selected afterwards: a vectorised select computes both of its values in every
# lane, and g times 2^-300 makes subnormals and underflows, which x86 CPUs finish in
# microcode (without flush-to-zero, as numpy and torch leave it) at some hundred cycles a
# vector. Selected afterwards, it took sigmoid's float32 gradient 2.1-2.4 ns an element
# against 1.5 (the serial kernel in cache, bench/bench_vector_kernels.py; issue 37, twelfth
# round; the same bits but NaN payloads, over all 2^32 inputs)
_ROW_EXP_ZERO = np.float32(-745.1332397460938)     # the largest float32 whose float64 exp is 0
_EXP_CLAMP = np.float32(-120.0)                     # vector_math.exp32_pair's
_TINY_FACTOR = np.float32(2.0 ** -100)              # cubed: below every finite float32's 2^-150


@scalar_math
def _times_scale(g, y, s1, s2, u):
    """g (y 2^k) (2^k = s1 s2, exact but where the result is subnormal), for y made of e^u;
    where e^u is below exp32_pair's clamp but not 0 in float64, g y times a number too
    small for any finite g y (+-0, and +-inf for an infinite g, as the row's)."""
    clamped = u < _EXP_CLAMP and u >= _ROW_EXP_ZERO
    a = y * (_TINY_FACTOR if clamped else s1)
    b = _TINY_FACTOR if clamped else _ONE
    return ((g * (a * (_ONE if clamped else s2))) * b) * b


@scalar_math
def _logistic_slope(g, u, scale):
    """g scale e / (1 + e)^2, e = e^u, u <= 0, scale a power of 2: (eh + el)(rh + rl)^2 with
    eh rh as an exact pair (m + ml), rounded once (at g = 1; then scaled by 2^k, exactly
    but where the result is subnormal)."""
    eh, el, _, _, rh, rl, _, _, _, s1, s2 = _logistic_pairs(u)
    m = eh * rh
    ml = fma32(eh, rh, -m)
    c = fma32(fma32(el, rh, ml), rh, _TWO * m * rl)
    return _times_scale(g, fma32(m, rh, c) * scale, s1, s2, u)


@scalar_math
def sigmoid_f32(v, params):
    """sigmoid in float32 arithmetic: 1 / (1 + e) for v >= 0, e / (1 + e) below, e =
    e^-|v|, from _logistic_pairs, rounded once."""
    eh, el, _, _, rh, rl, _, _, _, s1, s2 = _logistic_pairs(-abs(v))
    small = (fma32(eh, rh, fma32(el, rh, eh * rl)) * s1) * s2
    return rh + rl if v >= _ZERO else small


@scalar_math
def sigmoid_gradient_f32(g, v, params):
    """sigmoid_gradient in float32 arithmetic: g e / (1 + e)^2, e = e^-|v|."""
    return _logistic_slope(g, -abs(v), _ONE)


@scalar_math
def tanh_f32(v, params):
    """tanh in float32 arithmetic: tanh |v| = (1 - e) / (1 + e), e = e^-2|v|, of v's sign,
    with 1 - e as the pair -(p + pl) where k = 0 (|v| < ln2 / 4: e - 1 without
    cancellation), else by Fast2Sum (e < 0.71), rounded once."""
    _, _, ah, al, rh, rl, p, pl, k, _, _ = _logistic_pairs(-_TWO * abs(v))
    near = k == np.int32(0)
    nh = -p if near else _ONE - ah
    nl = -pl if near else ((_ONE - nh) - ah) - al
    return math.copysign(fma32(nh, rh, fma32(nh, rl, nl * rh)), v)


@scalar_math
def tanh_gradient_f32(g, v, params):
    """tanh_gradient in float32 arithmetic: g 4 e / (1 + e)^2, e = e^-2|v|."""
    return _logistic_slope(g, -_TWO * abs(v), np.float32(4.0))


# --- float32 arithmetic for float32 results without pairs (FAST's tight; candidates) -------
# The functions above carry e^x as a pair (vector_math.exp32_pair), about 30 of the ~55
# operations (counted in the source) of sigmoid's kernel: 0.92 ns an element in cache
# against torch's 0.58 (tanh 0.95 against 0.51; serial kernels, one thread, 128K values in
# [-6, 6]; docs/performance.md's activations section has the candidates'). These take
# vector_math.exp32_fast_parts' e^x = (1 + r + w) 2^k instead, in four forms each: `tight`
# within the pairs' 0.76 ulp (FAST's since issue 37's seventh round), the others for the
# owner's choice of accuracy against speed:
#   tight: e 2^64 = ehs + els from r and w unrounded (h + hl = s + r s exactly, then w s
#          added by Fast2Sum), the rest as the pair functions above: 1 / (1 + e) = rh + rl,
#          the result rounded once;
#   fast:  the same with p = r + w rounded once (e = (1 + p) 2^k as its rounded value and
#          exact residual): three operations fewer;
#   mid:   e rounded once, then as fast (1 / (1 + e) = rh + rl for that e, the result
#          rounded once): e's residual and its uses dropped;
#   lean:  torch's forms, each operation rounded: 1 / (1 + e), e / (1 + e), (1 - e) / (1 +
#          e), e / (1 + e)^2 as e r r.
# tanh takes its Taylor polynomial below |v| = 1/4 in every form (_tanh_near). Their bounds
# over all 2^32 inputs, and their times, are in tests/engine/backends/cpu/
# test_vector_unary.py (CANDIDATE_ULPS).
_TWO_M64 = np.float32(2.0 ** -64)
_SLOPE_SCALE = np.float32(2.0 ** -64)
_SLOPE_SCALE4 = np.float32(2.0 ** -62)         # 4 2^-64: tanh's 4 e / (1 + e)^2


@scalar_math
def _e_fast(u):
    """(ehs, els) for float32 u <= 0 (or NaN): ehs + els = (1 + p) s exactly, p = r + w rounded
    (exp32_fast_parts), = e^u 2^64; ehs rounded, els its residual (s - ehs exact, Sterbenz)."""
    r, w, s = exp32_fast_parts(u)
    p = r + w
    ehs = fma32(p, s, s)
    return ehs, fma32(p, s, s - ehs)


@scalar_math
def _e_tight(u):
    """(ehs, els) for float32 u <= 0 (or NaN): ehs + els = (1 + r + w) s = e^u 2^64, r + w
    not rounded: h + hl = s + r s exactly (hl: the fused residual, s - h exact), then w s
    added to hl and the pair renormalised (Fast2Sum: |h| > |hl + w s|)."""
    r, w, s = exp32_fast_parts(u)
    h = fma32(r, s, s)
    lo = fma32(w, s, fma32(r, s, s - h))
    ehs = h + lo
    return ehs, (h - ehs) + lo


@scalar_math
def _logistic_of(ehs, els):
    """(eh, el, rh, rl) from e 2^64 = ehs + els: e = eh + el (scaled by 2^-64, exactly but
    where subnormal) and 1 / (1 + e) = rh + rl (rh rounded, rl its residual from the exact
    1 - rh dh of a fused multiply-add)."""
    eh = ehs * _TWO_M64
    el = els * _TWO_M64
    dh = _ONE + eh
    dl = ((_ONE - dh) + eh) + el                 # Fast2Sum: e <= 1
    rh = _ONE / dh
    rl = rh * fma32(-rh, dl, fma32(-rh, dh, _ONE))
    return eh, el, rh, rl


@scalar_math
def _slope_times(g, y, u):
    """g y for y the slope made of e^u (0 where e^u is below 2^-150 in float32): where the
    row's float64 e^u is not 0 (u >= -745.13) but y is, g times a number too small for any
    finite g (+-0, and +-inf for an infinite g, as the row's), not inf * 0."""
    edge = y == _ZERO and u >= _ROW_EXP_ZERO
    a = _TINY_FACTOR if edge else y
    b = _TINY_FACTOR if edge else _ONE
    return ((g * a) * b) * b


@scalar_math
def _sigmoid_of(v, ehs, els):
    """sigmoid from e^-|v| 2^64 = ehs + els: rh + rl for v >= 0, (ehs + els)(rh + rl) 2^-64
    below, rounded once."""
    _, _, rh, rl = _logistic_of(ehs, els)
    small = fma32(ehs, rh, fma32(els, rh, ehs * rl)) * _TWO_M64
    return rh + rl if v >= _ZERO else small


@scalar_math
def _slope_of(g, u, ehs, els, scale):
    """g e / (1 + e)^2 times scale 2^64 (scale 2^-64, or 4 2^-64), e = e^u 2^64 = ehs + els:
    (ehs + els)(rh + rl)^2 with ehs rh as an exact pair, rounded once (at g = 1; then scaled,
    exactly but where subnormal)."""
    _, _, rh, rl = _logistic_of(ehs, els)
    m = ehs * rh
    ml = fma32(ehs, rh, -m)
    c = fma32(fma32(els, rh, ml), rh, _TWO * m * rl)
    return _slope_times(g, fma32(m, rh, c) * scale, u)


# tanh a for a = |v| < 1/4 (where 1 - e^-2a is below 0.4): a + a^3 (-1/3 + 2/15 a^2 - ...
# - 1382/155925 a^8), its Taylor polynomial (the first omitted term, 21844/6081075 a^13, is
# 2^-32 of tanh a at 1/4): the cubic part is below a / 48, so that its roundings are a few
# 2^-30 of the result, rounded once
_TANH_NEAR = np.float32(0.25)
_TANH_TAYLOR = tuple(np.float32(c) for c in (
    -1382.0 / 155925.0, 62.0 / 2835.0, -17.0 / 315.0, 2.0 / 15.0, -1.0 / 3.0))


@scalar_math
def _tanh_near(a):
    """tanh a for 0 <= a < 1/4 (_TANH_TAYLOR)."""
    z = a * a
    q = _TANH_TAYLOR[0]
    for c in _TANH_TAYLOR[1:]:
        q = fma32(q, z, c)
    return fma32(a * z, q, a)


@scalar_math
def _tanh_of(v, a, ehs, els):
    """tanh from e^-2|v| 2^64 = ehs + els, a = |v|: (1 - e) / (1 + e) as (nh + nl)(rh + rl),
    1 - e = nh + nl by Fast2Sum, rounded once, of v's sign; _tanh_near below 1/4."""
    eh, el, rh, rl = _logistic_of(ehs, els)
    nh = _ONE - eh
    nl = ((_ONE - nh) - eh) - el
    far = fma32(nh, rh, fma32(nh, rl, nl * rh))
    return math.copysign(_tanh_near(a) if a < _TANH_NEAR else far, v)


@scalar_math
def sigmoid_f32_fast(v, params):
    """sigmoid in float32 arithmetic, e^-|v| as (1 + p) 2^k, p rounded once; within 0.85 ulp."""
    ehs, els = _e_fast(-abs(v))
    return _sigmoid_of(v, ehs, els)


@scalar_math
def sigmoid_f32_tight(v, params):
    """sigmoid in float32 arithmetic, e^-|v| as (1 + r + w) 2^k; within 0.76 ulp."""
    ehs, els = _e_tight(-abs(v))
    return _sigmoid_of(v, ehs, els)


@scalar_math
def sigmoid_gradient_f32_fast(g, v, params):
    """sigmoid_gradient in float32 arithmetic, e^-|v| as (1 + p) 2^k, p rounded once;
    within 0.83 ulp (at g = 1)."""
    u = -abs(v)
    ehs, els = _e_fast(u)
    return _slope_of(g, u, ehs, els, _SLOPE_SCALE)


@scalar_math
def sigmoid_gradient_f32_tight(g, v, params):
    """sigmoid_gradient in float32 arithmetic, e^-|v| as (1 + r + w) 2^k;
    within 0.76 ulp (at g = 1)."""
    u = -abs(v)
    ehs, els = _e_tight(u)
    return _slope_of(g, u, ehs, els, _SLOPE_SCALE)


@scalar_math
def softplus_gradient_f32_tight(g, v, params):
    """softplus_gradient in float32 arithmetic: g sigmoid(v), sigmoid_f32_tight's; within
    0.76 ulp (at g = 1). Above the row's threshold (20) that sigmoid is 1 (1 / (1 + e^-v)
    rounds to 1 from 17.33 on), so the result is g there as the row's, out of a
    multiplication."""
    return g * sigmoid_f32_tight(v, params)


@scalar_math
def tanh_f32_fast(v, params):
    """tanh in float32 arithmetic, e^-2|v| as (1 + p) 2^k, p rounded once; within 0.85 ulp."""
    a = abs(v)
    ehs, els = _e_fast(-_TWO * a)
    return _tanh_of(v, a, ehs, els)


@scalar_math
def tanh_f32_tight(v, params):
    """tanh in float32 arithmetic, e^-2|v| as (1 + r + w) 2^k; within 0.59 ulp."""
    a = abs(v)
    ehs, els = _e_tight(-_TWO * a)
    return _tanh_of(v, a, ehs, els)


@scalar_math
def tanh_gradient_f32_fast(g, v, params):
    """tanh_gradient in float32 arithmetic, e^-2|v| as (1 + p) 2^k, p rounded once;
    within 0.83 ulp (at g = 1)."""
    u = -_TWO * abs(v)
    ehs, els = _e_fast(u)
    return _slope_of(g, u, ehs, els, _SLOPE_SCALE4)


@scalar_math
def tanh_gradient_f32_tight(g, v, params):
    """tanh_gradient in float32 arithmetic, e^-2|v| as (1 + r + w) 2^k;
    within 0.76 ulp (at g = 1)."""
    u = -_TWO * abs(v)
    ehs, els = _e_tight(u)
    return _slope_of(g, u, ehs, els, _SLOPE_SCALE4)


@scalar_math
def _logistic_mid(u):
    """For float32 u <= 0 (or NaN): (e 2^64, e, rh, rl), e = e^u rounded once and 1 / (1 +
    e) = rh + rl for that e (as _logistic_of's)."""
    r, w, s = exp32_fast_parts(u)
    es = fma32(r + w, s, s)
    e = es * _TWO_M64
    dh = _ONE + e
    dl = (_ONE - dh) + e                         # Fast2Sum: e <= 1
    rh = _ONE / dh
    rl = rh * fma32(-rh, dl, fma32(-rh, dh, _ONE))
    return es, e, rh, rl


@scalar_math
def _slope_mid(g, u, scale):
    """_slope_of from e^u rounded once: e (rh + rl)^2, e rh an exact pair, rounded once."""
    es, _, rh, rl = _logistic_mid(u)
    m = es * rh
    ml = fma32(es, rh, -m)
    return _slope_times(g, fma32(m, rh, fma32(ml, rh, _TWO * m * rl)) * scale, u)


@scalar_math
def sigmoid_f32_mid(v, params):
    """sigmoid in float32 arithmetic, e = e^-|v| rounded once: rh + rl for v >= 0, e (rh +
    rl) below, rounded once; within 1.48 ulp."""
    es, _, rh, rl = _logistic_mid(-abs(v))
    return rh + rl if v >= _ZERO else fma32(es, rh, es * rl) * _TWO_M64


@scalar_math
def sigmoid_gradient_f32_mid(g, v, params):
    """sigmoid_gradient in float32 arithmetic, e = e^-|v| rounded once;
    within 1.49 ulp (at g = 1)."""
    return _slope_mid(g, -abs(v), _SLOPE_SCALE)


@scalar_math
def tanh_f32_mid(v, params):
    """tanh in float32 arithmetic, e = e^-2|v| rounded once: (nh + nl)(rh + rl), 1 - e = nh +
    nl by Fast2Sum, rounded once, of v's sign; _tanh_near below 1/4; within 2.30 ulp."""
    a = abs(v)
    _, e, rh, rl = _logistic_mid(-_TWO * a)
    nh = _ONE - e
    nl = (_ONE - nh) - e
    far = fma32(nh, rh, fma32(nh, rl, nl * rh))
    return math.copysign(_tanh_near(a) if a < _TANH_NEAR else far, v)


@scalar_math
def tanh_gradient_f32_mid(g, v, params):
    """tanh_gradient in float32 arithmetic, e = e^-2|v| rounded once;
    within 1.49 ulp (at g = 1)."""
    return _slope_mid(g, -_TWO * abs(v), _SLOPE_SCALE4)


@scalar_math
def _logistic_lean(u):
    """For float32 u <= 0 (or NaN): (e 2^64, e, 1 / (1 + e)), e = e^u, each rounded."""
    r, w, s = exp32_fast_parts(u)
    es = fma32(r + w, s, s)
    e = es * _TWO_M64
    return es, e, _ONE / (_ONE + e)


@scalar_math
def sigmoid_f32_lean(v, params):
    """sigmoid in float32 arithmetic, each operation rounded: 1 / (1 + e) for v >= 0, e / (1
    + e) below, e = e^-|v|; within 2.82 ulp."""
    es, _, r = _logistic_lean(-abs(v))
    return r if v >= _ZERO else (es * r) * _TWO_M64


@scalar_math
def sigmoid_gradient_f32_lean(g, v, params):
    """sigmoid_gradient in float32 arithmetic, each operation rounded: e r r, r = 1 / (1 +
    e), e = e^-|v|; within 5.09 ulp (at g = 1)."""
    u = -abs(v)
    es, _, r = _logistic_lean(u)
    return _slope_times(g, ((es * r) * r) * _SLOPE_SCALE, u)


@scalar_math
def tanh_f32_lean(v, params):
    """tanh in float32 arithmetic, each operation rounded: (1 - e) / (1 + e), e = e^-2|v|,
    of v's sign; _tanh_near below 1/4; within 3.19 ulp."""
    a = abs(v)
    _, e, r = _logistic_lean(-_TWO * a)
    return math.copysign(_tanh_near(a) if a < _TANH_NEAR else (_ONE - e) * r, v)


@scalar_math
def tanh_gradient_f32_lean(g, v, params):
    """tanh_gradient in float32 arithmetic, each operation rounded: 4 e r r, r = 1 / (1 +
    e), e = e^-2|v|; within 5.09 ulp (at g = 1)."""
    u = -_TWO * abs(v)
    es, _, r = _logistic_lean(u)
    return _slope_times(g, ((es * r) * r) * _SLOPE_SCALE4, u)


# --- gelu_erf in float32 arithmetic (vector_math's gelu_erf32 section) ----------------------
_HALF_REACH32 = np.float32(2.0 ** -30)   # below, Phi(v) is 1/2 in float32 (as the row's)
_GE32_BIG = np.float32(13.0)             # from here e^(-v^2/2) carries 2^164 in the gradient
_TWO_M100 = np.float32(2.0 ** -100)
_GE32_FAR = np.float32(20.0)             # beyond, e is 0 (vector_math.gelu_erf32_exp)
_ROW_E_EDGE = np.float32(38.603966)      # the largest float32 |v| of nonzero float64 e^(-v^2/2)
_FAR_SLOPE = np.float32(-(2.0 ** -126))  # times 2^-64 2^-100 and any finite g: -0


@scalar_math
def gelu_erf_f32(v, params):
    """gelu_erf in float32 arithmetic: v Phi(v), Phi(-|v|) = e^(-v^2/2) erfcx(|v| / sqrt 2)
    / 2 (vector_math.gelu_erf32_exp and gelu_erf32_phi_part, the scale 2^64 taken off
    last); v Phi(-|v|) for v <= 0 and v - v Phi(-|v|) above (one fused rounding, nothing
    cancels: the product is at most v / 2); v / 2 for |v| < 2^-30, as the row's (its erfc
    is 1 there: the smallest subnormal's half, a tie, rounds to even). Within 4 ulps over
    all 2^32 inputs (tests/engine/backends/cpu/test_vector_unary.py, F32_MATH_ULPS)."""
    wide_vectors()
    a = abs(v)
    half = gelu_erf32_phi_part(a) * gelu_erf32_exp(a, False)
    h = half * _TWO_M64                                      # Phi(-a)
    # where h is 0 (and for a NaN v), v + 0: +inf gives +inf, not fma's NaN, and a NaN
    # comes out of an arithmetic operation (quiet), as geglu_erf's product makes it
    above = fma32(-v, h, v) if h > _ZERO else v + _ZERO
    y = (v * half) * _TWO_M64 if v <= _ZERO else above
    return v * _HALF if a < _HALF_REACH32 else y


@scalar_math
def gelu_erf_gradient_f32(g, v, params):
    """gelu_erf_gradient in float32 arithmetic: with e = e^(-v^2/2) and G = (|v| - |Z|) H
    (vector_math.gelu_erf32_slope_part), g e G for v < 0 and g (1 - e G) above. e G is
    carried scaled, by 2^64 below |v| = 13 and by 2^164 from there, and where it is below
    float32's normal range g multiplies it first (g 2^-64, then the product, then 2^-100),
    so that a large g's result is computed, and rounded once, wherever it is not 0
    (through |v| = 19.9 for g near float32's largest). Within 4 ulps over all 2^32 inputs
    (at g = 1; F32_MATH_ULPS)."""
    wide_vectors()
    a = abs(v)
    big = a >= _GE32_BIG
    p = gelu_erf32_exp(a, big) * gelu_erf32_slope_part(a)    # e G 2^64, or 2^164 where big
    # e is 0 beyond |v| = 20, where every float32 result of a finite g is 0; the row's is
    # -0 times g's sign (and -inf for g = inf) while its float64 e^(-v^2/2) is not 0
    # (|v| <= 38.603966): a negative number too small for any finite g there, and beyond
    # it +0, the row's 0 + v 0 (p + 0: e G is -0, G < 0)
    p = _FAR_SLOPE if a > _GE32_FAR and a <= _ROW_E_EDGE else p + _ZERO
    below = ((g * (_TWO_M64 if big else _ONE)) * (p * (_ONE if big else _TWO_M64))) \
        * (_TWO_M100 if big else _ONE)
    # above: 1 - e G, e G below 2^-118 where big (the product with 0 keeps a NaN p's NaN)
    return below if v < _ZERO else g * fma32(-p, _ZERO if big else _TWO_M64, _ONE)


# --- silu in float32 arithmetic (issue 37's fourteenth round) -----------------------------
# e = e^-|v| from vector_math.exp32_scaled (scaled by 2^64, a normal float32 down to |v| =
# 130, where v e^v is long 0 in float32: below -108.6), each value rounded as it comes, as
# gelu_erf's float32 math. The gradient s (1 + v (1 - s)) is (1 + e + v e) / (1 + e)^2 for v
# >= 0 (nothing cancels) and e (1 + v + e) / (1 + e)^2 below, whose 1 + v + e crosses 0 at Z
# = -1.27846454276107 (mpmath): e's error of about 2^-24 of e there is a part of 1 + v + e
# that grows without bound towards Z, so within 1/8 of Z the gradient is its Taylor
# polynomial there, of degree 7 (mpmath.taylor, 50 digits; the first omitted term below 0.01
# 2^-24 of the gradient at |d| = 1/8), and at 1/8 that part is below 0.25 2^-24 of 1 + v + e.
_SILU_Z_HI = np.float32(-1.2784646)
_SILU_Z_LO = np.float32(1.29792825e-08)           # Z - _SILU_Z_HI
_SILU_REACH = np.float32(0.125)
_SILU_TAYLOR = tuple(np.float32(c) for c in (     # the coefficients of d^7, ..., d^1
    0.0007985218818397998, 0.000126627410081122, -0.006606589138356696,
    -0.015222655223188032, 0.018874814223782312, 0.1466487969969469, 0.2178117057198001))
_SILU_BIG = np.float32(80.0)       # beyond, e (1 + v + e) / (1 + e)^2 is below float32's normal
_MINUS_TINY = np.float32(-(2.0 ** -100))


@scalar_math
def silu_f32(v, params):
    """silu in float32 arithmetic: v / (1 + e) for v >= 0 and v e / (1 + e) below, e =
    e^-|v| (its 2^64 scale off last); within 3.5 ulps over all 2^32 inputs
    (tests/engine/backends/cpu/test_vector_unary.py, F32_MATH_ULPS); the product and the
    quotient of e's in one rounding each, nothing cancels."""
    wide_vectors()
    es = exp32_scaled(-abs(v))                                 # e 2^64
    d = _ONE + es * _TWO_M64
    return v / d if v >= _ZERO else ((v * es) / d) * _TWO_M64


@scalar_math
def silu_gradient_f32(g, v, params):
    """silu_gradient in float32 arithmetic (the forms above: Taylor within 1/8 of the zero),
    e (1 + v + e) / (1 + e)^2 carried scaled by 2^64 until g has multiplied it where it is
    below float32's normal range (|v| > 80), and where exp32_scaled's e is 0 but the row's
    float64 e^v is not (-745.13 <= v < -130) g times a negative number too small for any
    finite g (-0 times g's sign, -inf times an infinite g's: the row's). Within 4.5 ulps
    over all 2^32 inputs (at g = 1; F32_MATH_ULPS)."""
    wide_vectors()
    u = -abs(v)
    es = exp32_scaled(u)                                       # e 2^64
    e = es * _TWO_M64
    dd = fma32(e, e + _TWO, _ONE)                              # (1 + e)^2
    above = v >= _ZERO
    # one division for both sides: below, the gradient 2^64
    y = (fma32(v, e, _ONE + e) if above else es * ((_ONE + v) + e)) / dd
    t = (v - _SILU_Z_HI) - _SILU_Z_LO
    q = _SILU_TAYLOR[0]
    for c in _SILU_TAYLOR[1:]:
        q = fma32(q, t, c)
    near = abs(t) < _SILU_REACH
    big = v < -_SILU_BIG
    far = v < EXP32_SCALED_LOW and v >= _ROW_EXP_ZERO       # exp32_scaled's e is 0
    a = _MINUS_TINY if far else (t * q if near else (y if big or above else y * _TWO_M64))
    b = _TINY_FACTOR if far else (_TWO_M64 if big else _ONE)
    c = _TINY_FACTOR if far else _ONE
    return ((g * a) * b) * c


# the candidates, by (op, forward or gradient): {form: function}
F32_CANDIDATES = {
    ("sigmoid", "forward"): {"pairs": sigmoid_f32, "tight": sigmoid_f32_tight,
                             "fast": sigmoid_f32_fast, "mid": sigmoid_f32_mid,
                             "lean": sigmoid_f32_lean},
    ("sigmoid", "gradient"): {"pairs": sigmoid_gradient_f32,
                              "tight": sigmoid_gradient_f32_tight,
                              "fast": sigmoid_gradient_f32_fast,
                              "mid": sigmoid_gradient_f32_mid,
                              "lean": sigmoid_gradient_f32_lean},
    ("tanh", "forward"): {"pairs": tanh_f32, "tight": tanh_f32_tight, "fast": tanh_f32_fast,
                          "mid": tanh_f32_mid, "lean": tanh_f32_lean},
    ("tanh", "gradient"): {"pairs": tanh_gradient_f32, "tight": tanh_gradient_f32_tight,
                           "fast": tanh_gradient_f32_fast,
                           "mid": tanh_gradient_f32_mid, "lean": tanh_gradient_f32_lean},
}


class VectorMath(NamedTuple):
    forward: Callable
    gradient: Callable | None
    reach: float = math.inf          # beyond |x| > reach the kernel takes the row's math
    forward16: Callable | None = None     # float32 arithmetic for 16-bit results (None: the
    gradient16: Callable | None = None    # float64 functions serve them too)
    forward32: Callable | None = None     # float32 arithmetic for float32 results (None:
    gradient32: Callable | None = None    # the float64 functions)


FAST = {
    "sigmoid": VectorMath(sigmoid, sigmoid_gradient, forward16=sigmoid32,
                          gradient16=sigmoid_gradient32, forward32=sigmoid_f32_tight,
                          gradient32=sigmoid_gradient_f32_tight),
    "tanh": VectorMath(tanh, tanh_gradient, forward16=tanh32, gradient16=tanh_gradient32,
                       forward32=tanh_f32_tight, gradient32=tanh_gradient_f32_tight),
    "silu": VectorMath(silu, silu_gradient, forward16=silu32, gradient16=silu_gradient32,
                       forward32=silu_f32, gradient32=silu_gradient_f32),
    "gelu_quick": VectorMath(gelu_quick, gelu_quick_gradient, forward16=gelu_quick32,
                             gradient16=gelu_quick_gradient32),
    "gelu": VectorMath(gelu, gelu_gradient),
    "gelu_erf": VectorMath(gelu_erf, gelu_erf_gradient, forward16=gelu_erf32,
                           gradient16=gelu_erf_gradient32, forward32=gelu_erf_f32,
                           gradient32=gelu_erf_gradient_f32),
    "elu": VectorMath(elu, elu_gradient, forward16=elu32, gradient16=elu_gradient32),
    "softplus": VectorMath(softplus, softplus_gradient, forward16=softplus32,
                           gradient16=softplus_gradient32,
                           gradient32=softplus_gradient_f32_tight),
    "expm1": VectorMath(expm1_forward, expm1_gradient),
    "exp": VectorMath(exp_forward, None),
    "log": VectorMath(log_forward, None),
    "sin": VectorMath(sin_forward, sin_gradient, TRIG_REACH),
    "cos": VectorMath(cos_forward, cos_gradient, TRIG_REACH),
}
