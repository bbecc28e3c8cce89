"""The activations' vectorised float32 math (engine.backends.cpu.vector_unary) against
float64, in ulps of float32: every function within the bound its docstring states
(ULPS), on a dense sample of every exponent (fast) and on all 2^32 float32 inputs (slow),
run through the engine's own float32 kernels; its special values those of the op's row.

The references are float64 functions without cancellation on libm (sigmoid's 1 - s as
e^-|x| / (1 + e^-|x|), tanh's 1 - t^2 as 4 e^-2|x| / (1 + e^-2|x|)^2, ...), each within a
few float64 ulps of the truth, a few 2^-29 ulps of float32, wherever nothing cancels.
Where terms cancel (a gradient crossing 0: silu's at -1.28, gelu's at -0.75, ...) a
reference returns the size of its terms too, and an input whose result is 2^16 times
smaller than its terms gets its reference from mpmath instead (50 digits).
"""

from __future__ import annotations

import math

import ml_dtypes
import mpmath
import numba
import numpy as np
import pytest

from engine.backends.cpu import elementwise as cpu
from engine.backends.cpu import paths
from engine.backends.cpu.vector_unary import F32_CANDIDATES, FAST
from engine.elementwise import (
    GELU_CUBIC,
    GELU_QUICK_COEF,
    SOFTPLUS_THRESHOLD,
    SQRT_2_OVER_PI,
    UNARY,
)

# the bound of each function, in ulps of float32 at the true value (the correctly rounded
# result errs up to 0.5): the one the function's docstring in vector_unary states. Over
# all 2^32 inputs the largest errors of the float64 math are 0.50000004 but for a gradient
# at the float32 inputs nearest its zero (GRADIENT_ZEROS), where the float64 computation's
# absolute error of a few 2^-53 is a visible part of a tiny result: silu's 0.50004 at
# -1.27847 (gelu_erf's was 0.5081 at -0.75179 until its gradient took the factor of its
# zero into its polynomial: vector_math.gelu_erf_slope_part). sigmoid and tanh compute in
# float32 arithmetic (vector_unary's forward32 and gradient32: the `tight` forms of
# F32_CANDIDATES, e^x as (1 + r + w) 2^k, the result rounded once at the end; F32_MATH_ULPS;
# over all 2^32 inputs at most 0.7579, where the result is subnormal), and softplus's
# gradient as g times sigmoid's tight forward (the same bound at g = 1); gelu_erf computes
# in float32 arithmetic without pairs since issue 37's fourteenth round (vector_unary.
# gelu_erf_f32: every value rounded as it comes; over all 2^32 inputs 3.93 forward and
# 3.70 for the gradient), and silu too (silu_f32: 3.08 and 3.99)
F32_MATH_ULPS = {("sigmoid", "forward"): 0.76, ("sigmoid", "gradient"): 0.76,
                 ("tanh", "forward"): 0.76, ("tanh", "gradient"): 0.76,
                 ("softplus", "gradient"): 0.76,
                 ("gelu_erf", "forward"): 4.0, ("gelu_erf", "gradient"): 4.0,
                 ("silu", "forward"): 3.5, ("silu", "gradient"): 4.5}
ULPS = {**{("sigmoid", "forward"): 0.5001, ("sigmoid", "gradient"): 0.5001,
        ("tanh", "forward"): 0.5001, ("tanh", "gradient"): 0.5001,
        ("silu", "forward"): 0.5001, ("silu", "gradient"): 0.5001,
        ("gelu_quick", "forward"): 0.5001, ("gelu_quick", "gradient"): 0.5001,
        ("gelu", "forward"): 0.5001, ("gelu", "gradient"): 0.5001,
        ("gelu_erf", "forward"): 0.5001, ("gelu_erf", "gradient"): 0.5001,
        ("elu", "forward"): 0.5001, ("elu", "gradient"): 0.5001,
        ("softplus", "forward"): 0.5001, ("softplus", "gradient"): 0.5001,
        ("expm1", "forward"): 0.5001, ("expm1", "gradient"): 0.5001,
        ("exp", "forward"): 0.5001, ("log", "forward"): 0.5001,
        ("sin", "forward"): 0.5001, ("sin", "gradient"): 0.5001,
        ("cos", "forward"): 0.5001, ("cos", "gradient"): 0.5001}, **F32_MATH_ULPS}
CASES = sorted(ULPS)
CANCELS = 2.0 ** 16       # terms / result beyond which mpmath gives the reference
_J = {"cache": False, "error_model": "numpy", "nogil": True}


# --- float64 references: (value, size of the terms; 0 where nothing cancels) ----------------
@numba.njit(**_J)
def _sigmoid_pair(u):
    e = math.exp(-abs(u))
    return (1.0 / (1.0 + e), e / (1.0 + e)) if u >= 0.0 else (e / (1.0 + e), 1.0 / (1.0 + e))


@numba.njit(**_J)
def _sigmoid(v, a):
    return _sigmoid_pair(v)[0], 0.0


@numba.njit(**_J)
def _sigmoid_g(v, a):
    e = math.exp(-abs(v))
    return e / ((1.0 + e) * (1.0 + e)), 0.0


@numba.njit(**_J)
def _tanh(v, a):
    return math.tanh(v), 0.0


@numba.njit(**_J)
def _tanh_g(v, a):
    e = math.exp(-2.0 * abs(v))
    return 4.0 * e / ((1.0 + e) * (1.0 + e)), 0.0


@numba.njit(**_J)
def _silu(v, a):
    return v * _sigmoid_pair(v)[0], 0.0


@numba.njit(**_J)
def _silu_g(v, a):
    s, c = _sigmoid_pair(v)
    return s * (1.0 + v * c), s * (1.0 + abs(v * c))


@numba.njit(**_J)
def _gelu_quick(v, a):
    return v * _sigmoid_pair(GELU_QUICK_COEF * v)[0], 0.0


@numba.njit(**_J)
def _gelu_quick_g(v, a):
    s, c = _sigmoid_pair(GELU_QUICK_COEF * v)
    t = GELU_QUICK_COEF * v * (s * c)
    return s + t, s + abs(t)


@numba.njit(**_J)
def _gelu_u(v):
    return 2.0 * SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v)


@numba.njit(**_J)
def _gelu(v, a):
    return v * _sigmoid_pair(_gelu_u(v))[0], 0.0


@numba.njit(**_J)
def _gelu_g(v, a):
    s, c = _sigmoid_pair(_gelu_u(v))
    t = v * (s * c) * (2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * v * v))
    return s + t, s + abs(t)


@numba.njit(**_J)
def _phi(v):
    return 0.5 * math.erfc(-v / math.sqrt(2.0))


@numba.njit(**_J)
def _gelu_erf(v, a):
    return v * _phi(v), 0.0


@numba.njit(**_J)
def _gelu_erf_g(v, a):
    p = _phi(v)
    t = v * math.exp(-0.5 * v * v) / math.sqrt(2.0 * math.pi)
    return p + t, p + abs(t)


@numba.njit(**_J)
def _elu(v, a):
    return (v if v > 0.0 else a * math.expm1(v)), 0.0


@numba.njit(**_J)
def _elu_g(v, a):
    return (1.0 if v > 0.0 else a * math.exp(v)), 0.0


@numba.njit(**_J)
def _softplus(v, a):
    return (v if v > SOFTPLUS_THRESHOLD else math.log1p(math.exp(v))), 0.0


@numba.njit(**_J)
def _softplus_g(v, a):
    return (1.0 if v > SOFTPLUS_THRESHOLD else _sigmoid_pair(v)[0]), 0.0


@numba.njit(**_J)
def _expm1(v, a):
    return math.expm1(v), 0.0


@numba.njit(**_J)
def _exp(v, a):
    return math.exp(v), 0.0


@numba.njit(**_J)
def _log(v, a):
    return math.log(v), 0.0


@numba.njit(**_J)
def _sin(v, a):
    return math.sin(v), 0.0


@numba.njit(**_J)
def _cos(v, a):
    return math.cos(v), 0.0


@numba.njit(**_J)
def _minus_sin(v, a):
    return -math.sin(v), 0.0


REFERENCES = {("sigmoid", "forward"): _sigmoid, ("sigmoid", "gradient"): _sigmoid_g,
              ("tanh", "forward"): _tanh, ("tanh", "gradient"): _tanh_g,
              ("silu", "forward"): _silu, ("silu", "gradient"): _silu_g,
              ("gelu_quick", "forward"): _gelu_quick, ("gelu_quick", "gradient"): _gelu_quick_g,
              ("gelu", "forward"): _gelu, ("gelu", "gradient"): _gelu_g,
              ("gelu_erf", "forward"): _gelu_erf, ("gelu_erf", "gradient"): _gelu_erf_g,
              ("elu", "forward"): _elu, ("elu", "gradient"): _elu_g,
              ("softplus", "forward"): _softplus, ("softplus", "gradient"): _softplus_g,
              ("expm1", "forward"): _expm1, ("expm1", "gradient"): _exp,
              ("exp", "forward"): _exp, ("log", "forward"): _log,
              ("sin", "forward"): _sin, ("sin", "gradient"): _cos,
              ("cos", "forward"): _cos, ("cos", "gradient"): _minus_sin}


def _mp_sigmoid(u):
    return 1 / (1 + mpmath.exp(-u))


def _mp_gelu_u(v):
    return 2 * mpmath.sqrt(2 / mpmath.pi) * (v + mpmath.mpf(GELU_CUBIC) * v ** 3)


# the gradients that cross 0 (CANCELS), in mpmath
MPMATH = {
    ("silu", "gradient"): lambda v, a: _mp_sigmoid(v) * (1 + v * (1 - _mp_sigmoid(v))),
    ("gelu_quick", "gradient"): lambda v, a: (
        _mp_sigmoid(GELU_QUICK_COEF * v) + GELU_QUICK_COEF * v * _mp_sigmoid(GELU_QUICK_COEF * v)
        * (1 - _mp_sigmoid(GELU_QUICK_COEF * v))),
    ("gelu", "gradient"): lambda v, a: (
        _mp_sigmoid(_mp_gelu_u(v)) + v * _mp_sigmoid(_mp_gelu_u(v)) * (1 - _mp_sigmoid(
            _mp_gelu_u(v))) * 2 * mpmath.sqrt(2 / mpmath.pi) * (1 + 3 * mpmath.mpf(GELU_CUBIC)
                                                                * v ** 2)),
    ("gelu_erf", "gradient"): lambda v, a: mpmath.ncdf(v) + v * mpmath.npdf(v),
}


# where the gradients cross 0 (mpmath.findroot on MPMATH's): near them the float64
# computation's absolute error is a larger part of the result
GRADIENT_ZEROS = (1.2784645427610738, 0.751154255441289, 0.7524614220710163,
                  0.7517915246935645)


# where the float32 math changes form or its results turn subnormal: tanh's k = 0 (|x| < ln2
# / 4), the first subnormal results of sigmoid (87.34) and tanh's gradient (44.36),
# vector_math.exp32_pair's clamp (120, tanh's at 60); gelu_erf's short erfc's clamp (|v| = 14
# sqrt 2); gelu_erf's float32 math: its gradient's scaling (13), its polynomials' clamps (16,
# 20) and its exponential's (16.1245)
F32_MATH_POINTS = (0.17329, 87.34, 44.36, 120.0, 60.0, 19.79899, 13.0, 16.0, 16.1245, 20.0)


# --- errors in ulps ---------------------------------------------------------------------------
_FLT_MAX_ROUNDING = 3.4028235677973366e38     # float32's largest value plus half an ulp


@numba.njit(**_J)
def _ulp32(t):
    """The spacing of float32 at |t| (the subnormals' below 2^-126)."""
    t = abs(t)
    if t < 2.0 ** -126:
        return 2.0 ** -149
    return math.ldexp(1.0, math.frexp(t)[1] - 24)


@numba.njit(**_J)
def _error(y, t):
    """float32 result y's error in ulps at the true value t: 0 or inf for NaN and for a t
    beyond float32's range (y must be NaN, or the infinity of t's sign)."""
    if math.isnan(t) or math.isnan(y):
        return 0.0 if math.isnan(t) and math.isnan(y) else np.inf
    if abs(t) >= _FLT_MAX_ROUNDING:
        return 0.0 if math.isinf(y) and (y > 0) == (t > 0) else np.inf
    if math.isinf(y):
        return np.inf
    return abs(y - t) / _ulp32(t)


def _scan(reference):
    @numba.njit(parallel=True, **_J)
    def scan(x, y, a, err):
        """err[i] = y[i]'s error in ulps, or -1 where the reference's terms cancel."""
        for i in numba.prange(x.size):
            t, terms = reference(np.float64(x[i]), a)
            err[i] = -1.0 if terms > CANCELS * abs(t) else _error(np.float64(y[i]), t)
    return scan


_SCANS = {case: _scan(ref) for case, ref in REFERENCES.items()}
_ONES = np.ones(1 << 22, np.float32)


def kernel_output(name: str, which: str, x: np.ndarray, alpha: float) -> np.ndarray:
    """The engine's float32 kernel of op `name` (its forward, or its gradient at g = 1) on
    x: the vector kernel, as a float32 graph runs it."""
    row = UNARY[name]
    params = {"alpha": alpha} if row.params else {}
    y = np.empty_like(x)
    with paths.recording() as taken:
        if which == "forward":
            cpu.unary(name)(y, [x], **params)
        else:
            g = _ONES[:x.size] if x.size <= _ONES.size else np.ones_like(x)
            cpu.unary_back(name)(y, [g, x], **params)
    assert any(p.startswith("vector:") for p in taken), sorted(taken)
    return y


def worst_error(case, x: np.ndarray, alpha: float = 1.0,
                y: np.ndarray | None = None) -> tuple[float, float]:
    """(largest error in ulps over float32 inputs x, the input where it is) of the engine's
    float32 kernel (or of outputs y), against the float64 reference (mpmath where terms
    cancel)."""
    name, which = case
    y = kernel_output(name, which, x, alpha) if y is None else y
    err = np.empty(x.size)
    _SCANS[case](x, y, alpha, err)
    at = int(np.argmax(err))
    worst = float(err[at])
    flagged = np.flatnonzero(err < 0)
    assert flagged.size <= 4096, f"{case}: {flagged.size} inputs whose terms cancel"
    mpmath.mp.dps = 50
    for i in flagged:
        truth = float(MPMATH[case](mpmath.mpf(float(x[i])), alpha))
        e = _error(float(y[i]), truth)
        if not e <= worst:
            worst, at = e, i
    return worst, float(x[at])


# --- the dense sample and the exhaustive sweep -----------------------------------------------
def dense_sample() -> np.ndarray:
    """Every exponent of both signs, 4099 mantissas each (a stride through the 2^23), and
    around the points where the ops saturate or change form and where gradients cross 0:
    every float32 within 2^-10 of them (relative), and +-0, +-inf, NaN, the smallest
    subnormal and normal."""
    exponents = np.arange(256, dtype=np.uint32) << np.uint32(23)
    mantissas = (np.arange(4099, dtype=np.uint32) * np.uint32(2045)) & np.uint32(0x7FFFFF)
    bits = (exponents[:, None] | mantissas[None, :]).reshape(-1)
    points = [SOFTPLUS_THRESHOLD, 9.01, 17.33, 88.72, 103.97, 709.78, 745.13, 7.3, 13.3,
              14.5, 0.347, 1.0, 2.0, 0.41421356, math.pi, 2 ** 20, 0.785398, 355.0,
              *GRADIENT_ZEROS, *F32_MATH_POINTS]
    around = [np.arange(-(1 << 13), 1 << 13, dtype=np.int64)
              + int(np.float32(p).view(np.uint32)) for p in points]
    bits = np.concatenate([bits, *(a.astype(np.uint32) for a in around),
                           np.array([0, 1, 0x00800000, 0x7F800000, 0x7FC00000,
                                     0x7F800001], np.uint32)])
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    return bits.view(np.float32)


@pytest.fixture(scope="module")
def sample():
    return dense_sample()


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_dense_sample_within_the_stated_ulps(case, sample):
    alphas = (1.0, 0.5) if case[0] == "elu" else (1.0,)
    for alpha in alphas:
        worst, where = worst_error(case, sample, alpha)
        assert worst <= ULPS[case], f"{case}: {worst:.6f} ulps at {where!r} (alpha {alpha})"


def every_input(case, step: int = 1 << 22):
    """The float32 inputs of an exhaustive check, in chunks of `step` patterns: all 2^32
    but the NaNs (the dense sample has some: NaN in gives NaN out), and for sin and cos
    those of |x| <= 2^20 (beyond, the kernel computes libm's float64 sin rounded, which is
    the reference itself: the dense sample checks that it does)."""
    offsets = np.arange(step, dtype=np.uint32)
    for first, count in input_chunks(case, step):
        yield chunk_inputs(first, count, offsets)


def chunk_inputs(first: int, count: int, offsets) -> np.ndarray:
    """The `count` float32 of consecutive bit patterns from `first` (offsets: 0, 1, ...)."""
    return (offsets[:count] + np.uint32(first)).view(np.float32)


def input_chunks(case, step: int):
    """every_input's chunks as (first bit pattern, number of patterns)."""
    top = 0x7F800000 + 1                       # +inf's pattern, included
    if FAST[case[0]].reach < math.inf:
        top = int(np.float32(FAST[case[0]].reach).view(np.uint32)) + 1
    for sign in (0, 0x80000000):
        for start in range(0, top, step):
            yield start + sign, min(step, top - start)


def test_every_input_leaves_out_nan_only():
    """The chunks tile +0..+inf and -0..-inf (sin: up to 2^20) without a gap or overlap,
    and each is those patterns (the first two and the last, materialised)."""
    step = 1 << 22
    offsets = np.arange(step, dtype=np.uint32)
    for case, top in ((("exp", "forward"), 0x7F800000), (("sin", "forward"), 0x49800000)):
        chunks = list(input_chunks(case, step))
        assert sum(count for _, count in chunks) == 2 * (top + 1)
        for sign in (0, 0x80000000):
            half = [c for c in chunks if c[0] & 0x80000000 == sign]
            assert half[0][0] == sign and half[-1][0] + half[-1][1] == sign + top + 1
            assert all(a + n == b for (a, n), (b, _) in zip(half[:-1], half[1:], strict=True))
        for first, count in chunks[:2] + chunks[-1:]:
            bits = chunk_inputs(first, count, offsets).view(np.uint32)
            assert bits.size == count and bits[0] == first and np.all(np.diff(bits) == 1)
        assert bits[-1] == 0x80000000 + top
        assert next(every_input(case, step)).view(np.uint32)[0] == 0
    assert np.isinf(np.uint32(0x7F800000).view(np.float32))
    assert np.float32(2 ** 20).view(np.uint32) == 0x49800000


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_every_float32_input_within_the_stated_ulps(case):
    """All 2^32 float32 bit patterns (every_input), in chunks of 2^22."""
    worst, where = 0.0, math.nan
    for x in every_input(case):
        w, at = worst_error(case, x)
        if not w <= worst:
            worst, where = w, at
    assert worst <= ULPS[case], f"{case}: {worst:.6f} ulps at {where!r}"


# --- 16-bit: every pattern, through the activations' native 16-bit kernels ------------------
HALF = {"f16": (np.float16, 10, -14, 65520.0), "bf16": (ml_dtypes.bfloat16, 7, -126,
                                                      3.3961775292304703e38)}
HALF_ULPS = 0.5 + 2.0 ** -10


@pytest.mark.parametrize("dtype", sorted(HALF))
@pytest.mark.parametrize("case", [c for c in CASES if UNARY[c[0]].in_float64], ids="-".join)
def test_every_16_bit_input_is_rounded_right(case, dtype):
    """All 2^16 patterns of each 16-bit format through the op's native 16-bit kernel (one
    pass over the patterns): within HALF_ULPS of the float64 reference in ulps of the
    format, i.e. the correctly rounded value but within 2^-10 ulp of a tie (the kernel
    rounds to float32, then to 16 bits: twice, exact but there)."""
    name, which = case
    np_dtype, mantissa, min_exp, overflow = HALF[dtype]
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np_dtype)
    row = UNARY[name]
    params = {k: 1.0 for k in row.params}
    y = np.empty_like(x)
    with paths.recording() as taken:
        if which == "forward":
            cpu.unary(name)(y, [x], **params)
        else:
            cpu.unary_back(name)(y, [np.ones_like(x), x], **params)
    assert taken[f"vector:{name}" + ("" if which == "forward" else "_back")] > 0
    reference = REFERENCES[case]
    with np.errstate(invalid="ignore"):         # bfloat16's NaN patterns
        x64 = x.astype(np.float64)
    t = np.array([reference(v, 1.0)[0] for v in x64])
    got = y.astype(np.float64)
    nan = np.isnan(t)
    assert np.array_equal(np.isnan(got), nan), f"{case} {dtype}: NaN where the truth is not"
    big = ~nan & (np.abs(t) >= overflow)
    assert np.array_equal(got[big], np.copysign(np.inf, t[big])), f"{case} {dtype}: overflow"
    rest = ~nan & ~big
    with np.errstate(divide="ignore"):
        exponent = np.maximum(np.floor(np.log2(np.abs(t[rest]))), min_exp)
    ulp = np.ldexp(1.0, (exponent - mantissa).astype(np.int64))
    err = np.abs(got[rest] - t[rest]) / ulp
    worst = int(np.argmax(err))
    assert err[worst] <= HALF_ULPS, \
        f"{case} {dtype}: {err[worst]:.6f} ulps at {x64[rest][worst]!r}"


# --- special values: the row's ----------------------------------------------------------------
SPECIAL_X = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4028235e38,
                      -3.4028235e38, 1e-30, -1e-30, 20.0, -20.0, 30.0, -30.0, 100.0,
                      -100.0, 800.0, -800.0, 2.0 ** 21, -(2.0 ** 21)], np.float32)
SPECIAL_G = np.array([1.0, -1.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 1e30], np.float32)


def _row_float64(name: str, which: str, x, g=None):
    """The row's libm math on x (and g) in float64, the plain kernel, rounded to float32."""
    row = UNARY[name]
    params = {k: 1.0 for k in row.params}
    out = np.empty(x.shape)
    if which == "forward":
        cpu.unary(name)(out, [x.astype(np.float64)], **params)
    else:
        cpu.unary_back(name)(out, [g.astype(np.float64), x.astype(np.float64)], **params)
    with np.errstate(over="ignore"):
        return out.astype(np.float32)


def _classes(a):
    return np.select([np.isnan(a), np.isposinf(a), np.isneginf(a), a == 0], [1, 2, 3, 4], 0)


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_special_values_are_the_rows(case):
    """NaN where the row's float64 math gives NaN, the same infinities, zero where it is
    zero with its sign (a forward's -0 at -0); gradients for every g of SPECIAL_G too."""
    name, which = case
    x = SPECIAL_X if name != "log" else np.abs(SPECIAL_X)
    if which == "forward":
        got = kernel_output(name, which, x, 1.0)
        want = _row_float64(name, which, x)
    else:
        gg, xx = (a.reshape(-1) for a in np.meshgrid(SPECIAL_G, x, indexing="ij"))
        got = np.empty_like(xx)
        cpu.unary_back(name)(got, [gg, xx], **{k: 1.0 for k in UNARY[name].params})
        want = _row_float64(name, which, xx, gg)
    same = _classes(got) == _classes(want)
    zeros = want == 0
    same[zeros] &= np.signbit(got[zeros]) == np.signbit(want[zeros])
    i = int(np.argmin(same))
    assert same.all(), f"{case}: got {got[i]!r} where the row gives {want[i]!r} (element {i})"


@pytest.mark.parametrize("g", [3e38, -1e30, 1e20, 1e-30])
def test_gelu_erf_float32_gradient_of_any_g_far_out(g):
    """gelu_erf's float32 gradient for |v| in [12, 20.5], where e^(-v^2/2) leaves float32's
    normal range (vector_unary.gelu_erf_gradient_f32 carries it scaled by 2^164), for g up
    to float32's largest: within its bound of the row's float64 math (whose terms do not
    cancel there) wherever the result is a float32, subnormals and zeros included."""
    x = -np.linspace(12.0, 20.5, 40001).astype(np.float32)
    gg = np.full_like(x, g)
    got = np.empty_like(x)
    cpu.unary_back("gelu_erf")(got, [gg, x])
    truth = np.empty(x.shape)
    cpu.unary_back("gelu_erf")(truth, [gg.astype(np.float64), x.astype(np.float64)])
    err = np.array([_error(float(y), float(t)) for y, t in zip(got, truth, strict=True)])
    worst = int(np.argmax(err))
    assert err[worst] <= F32_MATH_ULPS[("gelu_erf", "gradient")], (x[worst], got[worst])
    assert (truth != 0).sum() > 1000          # the range reaches results that are not 0


@pytest.mark.parametrize("case", sorted(MPMATH), ids="-".join)
def test_gradient_zeros_are_where_the_gradients_cross_zero(case):
    mpmath.mp.dps = 30
    f = MPMATH[case]
    assert any(abs(f(mpmath.mpf(-z), 1.0)) < 1e-15 for z in GRADIENT_ZEROS), case


def test_every_fast_op_is_an_activation_or_exp_or_log():
    """FAST names rows of the table; each gradient is the row's one-pass op's."""
    for name, fast in FAST.items():
        row = UNARY[name]
        assert (fast.gradient is None) == (row.gradient is None), name
        assert row.in_float64 or name in ("exp", "log"), name
        assert fast.reach == math.inf or name in ("sin", "cos"), name
    assert set(CASES) == {(n, w) for n, f in FAST.items() for w in ("forward", "gradient")
                          if getattr(f, w) is not None}


def test_every_float32_16_bit_math_is_reached_at_scale():
    """An op whose 16-bit kernels compute in float32 math of their own (forward16,
    gradient16) has 16-bit scale cases, so gradcheck's scale tier compares them with the
    plain twin; its gradient's the same way as its forward's (both or neither)."""
    from engine.ops.unary import HALF_AT_SCALE
    for name, fast in FAST.items():
        assert (fast.forward16 is None) == (fast.gradient16 is None or fast.gradient is None), name
        if fast.forward16 is not None:
            assert name in HALF_AT_SCALE, name


# --- the float32 candidates (vector_unary.F32_CANDIDATES; FAST takes `tight`) -----------------
# The largest error of each over all 2^32 inputs (test_every_float32_input_of_the_candidates,
# slow; measured, then where), rounded up: the bound a switch of FAST to it would state
# (FAST takes `tight` since issue 37's seventh round: F32_MATH_ULPS).
CANDIDATE_ULPS = {
    (("sigmoid", "forward"), "pairs"): 0.76,     # 0.7505 (FAST's before the seventh round)
    (("sigmoid", "gradient"), "pairs"): 0.76,    # 0.7505
    (("tanh", "forward"), "pairs"): 0.76,        # 0.5390
    (("tanh", "gradient"), "pairs"): 0.76,       # 0.7527
    (("sigmoid", "forward"), "tight"): 0.76,     # 0.757849 at -87.698 (subnormal result)
    (("sigmoid", "forward"), "fast"): 0.85,      # 0.840695 at -16.977
    (("sigmoid", "forward"), "mid"): 1.48,       # 1.479658 at -4.8465
    (("sigmoid", "forward"), "lean"): 2.82,      # 2.819463 at -2.7092
    (("sigmoid", "gradient"), "tight"): 0.76,    # 0.757849 at 87.698 (subnormal result)
    (("sigmoid", "gradient"), "fast"): 0.83,     # 0.826146 at 17.666
    (("sigmoid", "gradient"), "mid"): 1.49,      # 1.487508 at 6.2344
    (("sigmoid", "gradient"), "lean"): 5.09,     # 5.083339 at 3.4052
    (("tanh", "forward"), "tight"): 0.59,        # 0.585241 at 0.51533
    (("tanh", "forward"), "fast"): 0.85,         # 0.846197 at 0.50888
    (("tanh", "forward"), "mid"): 2.30,          # 2.295484 at 0.25427 (e^-2|x| rounded, x 1.9)
    (("tanh", "forward"), "lean"): 3.19,         # 3.180103 at 0.25256
    (("tanh", "gradient"), "tight"): 0.76,     # 0.756481 at 44.541 (subnormal result)
    (("tanh", "gradient"), "fast"): 0.83,      # 0.826146 at 8.8328
    (("tanh", "gradient"), "mid"): 1.49,       # 1.487508 at 3.1172
    (("tanh", "gradient"), "lean"): 5.09}      # 5.083339 at 1.7026
CANDIDATES = sorted(CANDIDATE_ULPS)
_CANDIDATE_KERNELS: dict = {}


def candidate_kernel(case, form: str):
    """The serial float32 kernel of case's op with F32_CANDIDATES[case][form] as its float32
    math, made as the engine makes its own (elementwise._vector_kernels), under a name of
    its own (`<op>_<form>`): kernel(x, out, ()) or kernel(g, x, out, ())."""
    if (case, form) not in _CANDIDATE_KERNELS:
        name, which = case
        templates = ((cpu._vector_map, cpu._vector_map_reach) if which == "forward" else
                     (cpu._vector_gradient_map, cpu._vector_gradient_map_reach))
        kernels = cpu._vector_kernels(*templates, f"{name}_{form}", getattr(FAST[name], which),
                                      math.inf, None, None, which, F32_CANDIDATES[case][form])
        _CANDIDATE_KERNELS[(case, form)] = kernels[cpu.F32].serial
    return _CANDIDATE_KERNELS[(case, form)]


def candidate_output(case, form: str, x: np.ndarray, g: np.ndarray | None = None):
    """The candidate's float32 results on x (a gradient's at g, or 1)."""
    y = np.empty_like(x)
    if case[1] == "forward":
        candidate_kernel(case, form)(x, y, ())
    else:
        g = (_ONES[:x.size] if x.size <= _ONES.size else np.ones_like(x)) if g is None else g
        candidate_kernel(case, form)(g, x, y, ())
    return y


def test_candidates_are_forms_of_fast_ops():
    """Every candidate is a form of an op with float32 math, and FAST takes `tight`, whose
    bound is F32_MATH_ULPS's."""
    assert {case for case, _ in CANDIDATES} == set(F32_CANDIDATES)
    for (name, which), form in CANDIDATES:
        fast = getattr(FAST[name], which + "32")
        assert fast is not None, name                                  # float32 math today
        assert (F32_CANDIDATES[(name, which)][form] is fast) == (form == "tight")
        if form == "tight":
            assert CANDIDATE_ULPS[((name, which), form)] <= F32_MATH_ULPS[(name, which)]


@pytest.mark.parametrize("cand", CANDIDATES, ids=lambda c: "-".join((*c[0], c[1])))
def test_dense_sample_of_a_candidate_within_its_ulps(cand, sample):
    case, form = cand
    worst, where = worst_error(case, sample, y=candidate_output(case, form, sample))
    assert worst <= CANDIDATE_ULPS[cand], f"{cand}: {worst:.6f} ulps at {where!r}"


@pytest.mark.parametrize("cand", CANDIDATES, ids=lambda c: "-".join((*c[0], c[1])))
def test_special_values_of_a_candidate_are_the_rows(cand):
    """As test_special_values_are_the_rows, for the candidate's kernel."""
    (name, which), form = cand
    if which == "forward":
        got = candidate_output((name, which), form, SPECIAL_X)
        want = _row_float64(name, which, SPECIAL_X)
    else:
        gg, xx = (a.reshape(-1) for a in np.meshgrid(SPECIAL_G, SPECIAL_X, indexing="ij"))
        got = candidate_output((name, which), form, xx, gg)
        want = _row_float64(name, which, xx, gg)
    same = _classes(got) == _classes(want)
    zeros = want == 0
    same[zeros] &= np.signbit(got[zeros]) == np.signbit(want[zeros])
    i = int(np.argmin(same))
    assert same.all(), f"{cand}: got {got[i]!r} where the row gives {want[i]!r} (element {i})"


def _scan_forms(reference):
    @numba.njit(parallel=True, **_J)
    def scan(x, ys, a, err):
        """err[f, i] = ys[f, i]'s error in ulps (references without cancellation only)."""
        for i in numba.prange(x.size):
            t, _ = reference(np.float64(x[i]), a)
            for f in range(ys.shape[0]):
                err[f, i] = _error(np.float64(ys[f, i]), t)
    return scan


_SCAN_FORMS = {case: _scan_forms(REFERENCES[case]) for case in F32_CANDIDATES}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(F32_CANDIDATES), ids="-".join)
def test_every_float32_input_of_the_candidates(case):
    """All 2^32 float32 bit patterns (every_input), in chunks of 2^22, through every form
    of the case against one evaluation of its reference; prints each form's largest error
    and where (pytest -s)."""
    forms = sorted(F32_CANDIDATES[case])
    worst = dict.fromkeys(forms, 0.0)
    where = dict.fromkeys(forms, math.nan)
    ys = np.empty((len(forms), 1 << 22), np.float32)
    err = np.empty((len(forms), 1 << 22))
    for x in every_input(case):
        for f, form in enumerate(forms):
            ys[f, :x.size] = candidate_output(case, form, x)
        _SCAN_FORMS[case](x, ys[:, :x.size], 1.0, err[:, :x.size])
        for f, form in enumerate(forms):
            at = int(np.argmax(err[f, :x.size]))
            if not err[f, at] <= worst[form]:
                worst[form], where[form] = float(err[f, at]), float(x[at])
    for form in forms:
        print(f"\n{case} {form}: {worst[form]:.6f} ulps at {where[form]!r}")
    for form in forms:
        assert worst[form] <= CANDIDATE_ULPS[(case, form)], \
            f"{case} {form}: {worst[form]:.6f} ulps at {where[form]!r}"
