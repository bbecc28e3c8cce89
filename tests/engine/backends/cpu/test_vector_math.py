"""The vectorisable float64 math of the activations' float32 kernels (engine.backends.cpu.
vector_math) against mpmath: each function within the relative error its docstring states,
over its whole domain on a dense sample; its special values; erfc's coefficients the fit
its comment describes."""

from __future__ import annotations

import math

import mpmath
import numba
import numpy as np
import pytest

from engine.backends.cpu import vector_math as vm

ULP64 = 2.0 ** -52        # float64's relative spacing at 1


@numba.njit(cache=False)
def _apply(which, x):
    out = np.empty(x.size)
    for i in range(x.size):
        v = x[i]
        if which == 0:
            out[i] = vm.exp(v)
        elif which == 1:
            out[i] = vm.expm1(v)
        elif which == 2:
            out[i] = vm.log1p(v)
        elif which == 3:
            out[i] = vm.log(v)
        elif which == 4:
            out[i] = vm.erfc_nonneg(v, vm.exp(-(v * v)))
        elif which == 5:
            out[i] = vm.sin(v)
        elif which == 6:
            out[i] = vm.cos(v)
        elif which == 7:
            out[i] = vm.exp_expm1(v)[0]
        elif which == 8:
            out[i] = vm.exp_expm1(v)[1]
        elif which == 9:
            out[i] = vm.exp_short_nonpositive(v)
        elif which == 10:
            out[i] = vm.erfc_short_nonneg(v, vm.exp_short_nonpositive(-(v * v)))
        else:
            out[i] = vm.gelu_erf_slope_part(v)
    return out


def _gelu_erf_slope_part(a):
    # erfcx(x) / 2 - x / sqrt(pi) at x = a / sqrt 2
    x = a / mpmath.sqrt(2)
    return mpmath.exp(x * x) * mpmath.erfc(x) / 2 - x / mpmath.sqrt(mpmath.pi)


def _erfc_exact_square(v):
    # the kernels' erfc(x) gets exp(-x^2) of an exact square; here x^2 rounds, and exp's
    # relative error is then x^2 2^-53: compared against erfc at the rounded x instead
    square = float(v) * float(v)
    return mpmath.erfc(mpmath.sqrt(mpmath.mpf(square)))


# (index in _apply, mpmath function, inputs, bound: the relative error over 2^-52, as each
# function's docstring states it; measured maxima on these samples: exp 0.97, expm1 0.99,
# log1p 2.15, log 1.55, erfc 7.9, sin 1.40, cos 1.49)
_RNG = np.random.default_rng(0)


def _spread(low, high, n=3000):
    return np.concatenate([np.linspace(low, high, n), _RNG.uniform(low, high, n)])


def _logspread(low, high, n=3000):
    return np.concatenate([np.geomspace(low, high, n), np.exp(_RNG.uniform(
        math.log(low), math.log(high), n))])


FUNCTIONS = {
    "exp": (0, mpmath.exp, _spread(-745.0, 709.7), 1.5),
    "expm1": (1, mpmath.expm1, np.concatenate([_spread(-60.0, 709.7),
                                                _logspread(1e-300, 1.0),
                                                -_logspread(1e-300, 1.0)]), 1.5),
    "log1p": (2, mpmath.log1p, np.concatenate([_spread(0.0, 1.0), _logspread(1e-300, 1.0)]),
              3.0),
    "log": (3, mpmath.log, np.concatenate([_logspread(1e-307, 1e307), _spread(0.5, 2.0)]),
            2.0),
    "erfc": (4, _erfc_exact_square, np.concatenate([_spread(0.0, 26.5),
                                                    _logspread(1e-300, 1.0)]), 10.0),
    "sin": (5, mpmath.sin, np.concatenate([_spread(-vm.TRIG_REACH, vm.TRIG_REACH),
                                           _spread(-10.0, 10.0), _logspread(1e-300, 1.0)]),
            2.0),
    "cos": (6, mpmath.cos, np.concatenate([_spread(-vm.TRIG_REACH, vm.TRIG_REACH),
                                           _spread(-10.0, 10.0)]), 2.0),
    "exp_expm1[0]": (7, mpmath.exp, _spread(-745.0, 0.0), 1.5),
    "exp_expm1[1]": (8, mpmath.expm1, np.concatenate([_spread(-745.0, 0.0),
                                                       -_logspread(1e-300, 1.0)]), 1.5),
    # the short ones, for gelu_erf's float32 results: 2^-46 and 2^-41 (measured 2^-46.7
    # and 2^-42.3), 2^6 and 2^11 float64 ulps
    "exp_short_nonpositive": (9, mpmath.exp, np.concatenate([_spread(-745.0, 0.0),
                                                             -_logspread(1e-300, 1.0)]),
                              2.0 ** 6),
    "erfc_short_nonneg": (10, _erfc_exact_square,
                          np.concatenate([_spread(0.0, vm._ERFCX_SHORT_X_HIGH),
                                          _logspread(1e-300, 1.0)]), 2.0 ** 11),
    # gelu_erf's gradient's G: 2^-44, 2^8 float64 ulps, to 14 sqrt 2 and around its zero
    "gelu_erf_slope_part": (11, _gelu_erf_slope_part, np.concatenate([
        _spread(0.0, 14.0 * math.sqrt(2.0)), _logspread(1e-300, 1.0),
        vm._ZERO_ABS_HI + _logspread(1e-16, 0.1), vm._ZERO_ABS_HI - _logspread(1e-16, 0.1)]),
        2.0 ** 8),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_within_the_stated_relative_error(name):
    """Against mpmath (40 digits) on a dense sample of the function's domain: the relative
    error over 2^-52 (about a float64 ulp), normal results only (a subnormal's relative
    error grows as it shrinks)."""
    which, exact, x, bound = FUNCTIONS[name]
    got = _apply(which, x.astype(np.float64))
    mpmath.mp.dps = 40
    worst, where = 0.0, None
    for v, y in zip(x, got, strict=True):
        t = float(exact(mpmath.mpf(float(v))))
        if t == 0.0 or abs(t) < 2.0 ** -1022:
            assert abs(y) <= 2.0 ** -1022, (name, v, y, t)
            continue
        err = abs(y - t) / (abs(t) * ULP64)
        if err > worst:
            worst, where = err, v
    assert worst <= bound, f"{name}: {worst:.2f} float64 ulps at {where!r}"


def test_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 800.0, -800.0])
    exp = _apply(0, x)
    np.testing.assert_array_equal(exp, [1.0, 1.0, np.inf, 0.0, np.nan, np.inf, 0.0])
    expm1 = _apply(1, x)
    np.testing.assert_array_equal(expm1, [0.0, -0.0, np.inf, -1.0, np.nan, np.inf, -1.0])
    assert math.copysign(1.0, expm1[1]) == -1.0 and math.copysign(1.0, _apply(8, x)[1]) == -1.0
    log = _apply(3, np.array([0.0, -0.0, -1.0, np.inf, -np.inf, np.nan, 1.0]))
    np.testing.assert_array_equal(log, [-np.inf, -np.inf, np.nan, np.inf, np.nan, np.nan, 0.0])
    assert np.isnan(_apply(2, np.array([np.nan]))).all()
    np.testing.assert_array_equal(_apply(4, np.array([0.0, 28.0, 1e300, np.inf])),
                                  [1.0, 0.0, 0.0, 0.0])
    assert np.isnan(_apply(4, np.array([np.nan]))).all()
    np.testing.assert_array_equal(_apply(9, np.array([0.0, -0.0, -800.0, -np.inf])),
                                  [1.0, 1.0, 0.0, 0.0])
    assert np.isnan(_apply(9, np.array([np.nan]))).all()
    short = _apply(10, np.array([0.0, 28.0, 1e300, np.inf]))      # erfc(0): 1 - 2^-45.7
    assert abs(short[0] - 1.0) < 2.0 ** -41 and (short[1:] == 0.0).all()
    assert np.isnan(_apply(10, np.array([np.nan]))).all()
    slope = _apply(11, np.array([np.inf, np.nan]))
    assert slope[0] == -np.inf and np.isnan(slope[1])
    sin = _apply(5, np.array([0.0, -0.0, np.nan]))
    assert sin[0] == 0.0 and math.copysign(1.0, sin[1]) == -1.0 and np.isnan(sin[2])
    np.testing.assert_array_equal(_apply(6, np.array([0.0, -0.0])), [1.0, 1.0])


def test_sin_and_cos_near_multiples_of_half_pi():
    """The float32 values nearest k pi/2 (k up to 2^20 2 / pi): their sines and cosines
    are tiny, and right only when the reduction keeps r to its last bits."""
    mpmath.mp.dps = 60
    ks = np.unique(np.concatenate([np.arange(1, 200), np.geomspace(200, 667000, 300)
                                   .astype(np.int64)]))
    near = np.float32(ks * (math.pi / 2)).astype(np.float64)
    for which, exact in ((5, mpmath.sin), (6, mpmath.cos)):
        got = _apply(which, near)
        for v, y in zip(near, got, strict=True):
            t = float(exact(mpmath.mpf(float(v))))
            assert abs(y - t) <= 2.0 * ULP64 * abs(t), (which, v, y, t)


def test_erfcx_coefficients_are_the_documented_fit():
    """erfcx(4 (1 + t) / (1 - t)) interpolated at the 22 Chebyshev nodes of [-1, 1] in
    mpmath (50 digits), turned into powers of t: vector_math's coefficients, highest power
    first (a change of the comment's method or the numbers shows here)."""
    mpmath.mp.dps = 50
    n = len(vm._ERFCX)
    k = vm._ERFCX_K

    def f(t):
        x = k * (1 + t) / (1 - t)
        return mpmath.exp(x * x) * mpmath.erfc(x)
    nodes = [mpmath.cos(mpmath.pi * (j + mpmath.mpf(1) / 2) / n) for j in range(n)]
    values = [f(t) for t in nodes]
    cheb = [2 * mpmath.fsum(values[j] * mpmath.cos(mpmath.pi * m * (j + mpmath.mpf(1) / 2)
                                                   / n) for j in range(n)) / n
            for m in range(n)]
    cheb[0] /= 2
    # Chebyshev to powers: T_0 = 1, T_1 = t, T_m = 2 t T_(m-1) - T_(m-2)
    basis = [[mpmath.mpf(1)], [mpmath.mpf(0), mpmath.mpf(1)]]
    for m in range(2, n):
        twice = [mpmath.mpf(0)] + [2 * c for c in basis[m - 1]]
        before = basis[m - 2] + [mpmath.mpf(0)] * (len(twice) - len(basis[m - 2]))
        basis.append([a - b for a, b in zip(twice, before, strict=True)])
    powers = [mpmath.fsum(cheb[m] * basis[m][p] for m in range(p, n) if p < len(basis[m]))
              for p in range(n)]
    assert tuple(float(c) for c in reversed(powers)) == vm._ERFCX


def _erfcx_fit(n: int, x_high: float):
    """erfcx(k (1 + t) / (1 - t)), k = vector_math's _ERFCX_K, interpolated at the n
    Chebyshev nodes of t in [-1, (x_high - k) / (x_high + k)] in mpmath (40 digits): its
    powers of t, highest first."""
    mpmath.mp.dps = 40
    k = vm._ERFCX_K
    low, high = -1.0, (x_high - k) / (x_high + k)
    nodes = [(low + high) / 2 + (high - low) / 2 * mpmath.cos(mpmath.pi * (j + 0.5) / n)
             for j in range(n)]
    values = [mpmath.exp(x * x) * mpmath.erfc(x) for x in (k * (1 + t) / (1 - t) for t in nodes)]
    powers = mpmath.lu_solve(mpmath.matrix([[t ** p for p in range(n)] for t in nodes]),
                             mpmath.matrix(values))
    return [powers[p] for p in reversed(range(n))]


def test_erfcx_short_coefficients_are_the_documented_fit():
    """erfcx(4 (1 + t) / (1 - t)) interpolated at the 17 Chebyshev nodes of t in [-1,
    (14 - 4) / (14 + 4)] in mpmath (40 digits), in powers of t: vector_math's
    _ERFCX_SHORT, highest power first."""
    powers = _erfcx_fit(len(vm._ERFCX_SHORT), vm._ERFCX_SHORT_X_HIGH)
    assert tuple(float(c) for c in powers) == vm._ERFCX_SHORT


def test_gelu_erf_slope_coefficients_are_the_documented_fit():
    """(erfcx(x) / 2 - x / sqrt(pi)) / (sqrt(2) x - |Z|), Z where Phi(v) + v phi(v) crosses
    0 (mpmath.findroot, 40 digits: vector_math's two parts of |Z|), interpolated at the 16
    Chebyshev nodes of t = (x - 4) / (x + 4) in [-1, (14 - 4) / (14 + 4)] in mpmath, in
    powers of t: vector_math's _GELU_ERF_SLOPE, highest power first."""
    mpmath.mp.dps = 40
    zero = -mpmath.findroot(lambda v: mpmath.ncdf(v) + v * mpmath.npdf(v), -0.75)
    assert (vm._ZERO_ABS_HI, vm._ZERO_ABS_LO) == (float(zero), float(zero - float(zero)))
    n, k = len(vm._GELU_ERF_SLOPE), vm._ERFCX_K
    x_high = vm._ERFCX_SHORT_X_HIGH
    low, high = -1.0, (x_high - k) / (x_high + k)
    nodes = [(low + high) / 2 + (high - low) / 2 * mpmath.cos(mpmath.pi * (j + 0.5) / n)
             for j in range(n)]
    values = [(mpmath.exp(x * x) * mpmath.erfc(x) / 2 - x / mpmath.sqrt(mpmath.pi))
              / (mpmath.sqrt(2) * x - zero) for x in (k * (1 + t) / (1 - t) for t in nodes)]
    powers = mpmath.lu_solve(mpmath.matrix([[t ** p for p in range(n)] for t in nodes]),
                             mpmath.matrix(values))
    assert tuple(float(powers[p]) for p in reversed(range(n))) == vm._GELU_ERF_SLOPE


# --- float32 arithmetic (the 16-bit kernels' math) ---------------------------------------------
ULP32 = 2.0 ** -24        # float32's unit roundoff


@numba.njit(cache=False)
def _apply32(which, x):
    out = np.empty(x.size)
    for i in range(x.size):
        v = np.float32(x[i])
        if which == 0:
            out[i] = vm.exp32(v)
        elif which == 1:
            out[i] = vm.log1p32(v)
        elif which == 3:
            out[i] = vm.exp_expm1_32(v)[1]
        else:
            out[i] = vm.erfc32_nonneg(v, vm.exp32(-(v * v)))
    return out


def _float32_sample(low, high, n=200_000):
    """Float32 values spread evenly over [low, high], and at random."""
    x = np.concatenate([np.linspace(low, high, n), _RNG.uniform(low, high, n)])
    return x.astype(np.float32)


def _erfc32_exact(x):
    # the kernels' v^2 is exact (a 16-bit v); here x^2 rounds to float32: erfc at the
    # rounded square's root
    square = np.float32(x) * np.float32(x)
    return mpmath.erfc(mpmath.sqrt(mpmath.mpf(float(square))))


# (index in _apply32, exact function, float32 inputs, bound in 2^-24 of the result; measured
# maxima on these samples: exp32 1.63, log1p32 3.41, erfc32 5.71, expm1_32 1.99)
FUNCTIONS32 = {
    "exp32": (0, mpmath.exp, _float32_sample(-87.0, 88.7), 2.0),
    "log1p32": (1, mpmath.log1p, _float32_sample(0.0, 1.0), 4.0),
    "erfc32": (2, _erfc32_exact, _float32_sample(0.0, 9.3), 8.0),
    "expm1_32": (3, mpmath.expm1, np.concatenate([_float32_sample(-104.0, 0.0),
                                                  _float32_sample(-1.0, 0.0),
                                                  -np.logspace(-37, 0, 4000, dtype=np.float32)]),
                 3.0),
}


@pytest.mark.parametrize("name", list(FUNCTIONS32))
def test_float32_math_within_the_stated_relative_error(name):
    """The float32 functions against mpmath on a dense sample (a 20th of it against mpmath,
    the rest against float64 libm: within 2^-52 of the truth), in units of 2^-24 of the
    result; normal float32 results only (erfc to 9.3, where it is still one)."""
    which, exact, x, bound = FUNCTIONS32[name]
    got = _apply32(which, x)
    mpmath.mp.dps = 40
    checks = [(x[::20], got[::20], np.array([float(exact(mpmath.mpf(float(v))))
                                             for v in x[::20]]))]
    if which != 2:
        ref = {0: np.exp, 1: np.log1p, 3: np.expm1}[which](x.astype(np.float64))
        checks.append((x, got, ref))
    for xs, ys, truth in checks:
        zero = truth == 0.0
        assert (ys[zero] == 0.0).all(), name
        err = np.abs(ys[~zero] - truth[~zero]) / (np.abs(truth[~zero]) * ULP32)
        worst = int(np.argmax(err))
        assert err[worst] <= bound, f"{name}: {err[worst]:.2f} at {xs[~zero][worst]!r}"


def test_float32_special_values():
    np.testing.assert_array_equal(_apply32(0, np.array([0.0, -np.inf, np.inf, -200.0, 200.0])),
                                  [1.0, 0.0, np.inf, 0.0, np.inf])
    assert _apply32(0, np.array([-103.0]))[0] > 0.0          # through float32's subnormals
    assert np.isnan(_apply32(0, np.array([np.nan]))).all()
    np.testing.assert_array_equal(_apply32(1, np.array([0.0, -0.0])), [0.0, 0.0])
    assert np.isnan(_apply32(1, np.array([np.nan]))).all()
    np.testing.assert_array_equal(_apply32(2, np.array([0.0, 11.0, np.inf])), [1.0, 0.0, 0.0])
    assert np.isnan(_apply32(2, np.array([np.nan]))).all()


@numba.njit(cache=False, fastmath={"contract"})     # compiled as the kernels are
def _nonpositive_mismatches(x):
    """How many float32 x <= 0 of `x` get other bits from exp32_nonpositive, or from
    exp_expm1_32's e^x, than from exp32, and the first such x's index (-1: none)."""
    count, first = 0, -1
    for i in range(x.size):
        v = np.float32(x[i])
        want = np.float32(vm.exp32(v)).view(np.uint32)
        got = np.float32(vm.exp32_nonpositive(v)).view(np.uint32)
        pair = np.float32(vm.exp_expm1_32(v)[0]).view(np.uint32)
        if got != want or pair != want:
            count += 1
            first = i if first < 0 else first
    return count, first


@numba.njit(cache=False, fastmath={"contract"})
def _nonpositive_mismatches_of_every_float32():
    """_nonpositive_mismatches over every float32 pattern with the sign set (-0 to -NaN),
    NaNs compared as NaN."""
    count = 0
    for b in range(0x80000000, 0x100000000):
        v = np.uint32(b).view(np.float32)
        want = vm.exp32(v)
        got = vm.exp32_nonpositive(v)
        pair = vm.exp_expm1_32(v)[0]
        if np.isnan(want):
            count += not (np.isnan(got) and np.isnan(pair))
        else:
            count += (np.float32(got).view(np.uint32) != np.float32(want).view(np.uint32)
                      or np.float32(pair).view(np.uint32) != np.float32(want).view(np.uint32))
    return count


def test_exp32_nonpositive_is_exp32_on_the_16_bit_exponents():
    """exp32_nonpositive and exp_expm1_32 give exp32's bits on the exponents the 16-bit
    kernels take (-|v|, -2|v|, -v^2/2 of every float16 and bfloat16 value), on a dense
    sample of float32 x <= 0 and at -0, -inf and exp32's clamp."""
    import ml_dtypes
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(invalid="ignore", over="ignore"):
        values = [patterns.view(np.float16).astype(np.float32),
                  patterns.view(ml_dtypes.bfloat16).astype(np.float32)]
        x = np.concatenate([-np.abs(v) for v in values] + [-2 * np.abs(v) for v in values]
                           + [np.float32(-0.5) * (v * v) for v in values]
                           + [-_float32_sample(0.0, 104.0), np.array([-0.0, -np.inf, -104.0,
                                                                      -103.99, -150.0])])
    x = x[~np.isnan(x)].astype(np.float32)
    count, first = _nonpositive_mismatches(x)
    assert count == 0, f"{count} values differ, the first at {x[first]!r}"


@pytest.mark.slow
def test_exp32_nonpositive_is_exp32_on_every_nonpositive_float32():
    assert _nonpositive_mismatches_of_every_float32() == 0


def test_erfcx32_coefficients_are_the_documented_fit():
    """erfcx(4 (1 + t) / (1 - t)) interpolated at the 12 Chebyshev nodes of t in [-1,
    (10.5 - 4) / (10.5 + 4)] in mpmath (40 digits), in powers of t, rounded to float32:
    vector_math's _ERFCX32, highest power first."""
    powers = _erfcx_fit(len(vm._ERFCX32), vm._ERFCX32_X_HIGH)
    assert tuple(np.float32(float(c)) for c in powers) == vm._ERFCX32


# --- float32 pairs, for float32 results ------------------------------------------------------
@numba.njit(cache=False, fastmath={"contract"})
def _exp32_pair_all(x):
    """(1 + p + pl) 2^k in float64 (exact: p, pl and 2^k = s1 s2 are float32), and s2."""
    out = np.empty(x.size)
    s2s = np.empty(x.size)
    for i in range(x.size):
        p, pl, _, s1, s2 = vm.exp32_pair(x[i])
        out[i] = (1.0 + np.float64(p) + np.float64(pl)) * np.float64(s1) * np.float64(s2)
        s2s[i] = s2
    return out, s2s


def test_exp32_pair_within_2_to_the_minus_28():
    """e^x = (1 + p + pl) 2^k within 2^-28 of itself (measured: 2.4 2^-30) for float32 x in
    [-120, 0] (every exponent of x, and the k = 0 reach), |pl| <= 2^-25, against float64
    libm (within 2^-52 of the truth); s2 = 0 below -120 and at -inf; NaN in gives NaN out."""
    x = np.concatenate([-_float32_sample(0.0, 120.0), -np.geomspace(1e-38, 1.0, 20000),
                        -np.linspace(0.33, 0.36, 20000)]).astype(np.float32)
    got, _ = _exp32_pair_all(x)
    truth = np.exp(x.astype(np.float64))
    err = np.abs(got / truth - 1.0)
    worst = int(np.argmax(err))
    assert err[worst] <= 2.0 ** -28, f"{err[worst] / 2.0 ** -30:.3f} 2^-30 at {x[worst]!r}"
    pl = np.array([_pair_low(v) for v in x[::97]])
    assert (np.abs(pl) <= 2.0 ** -25).all()
    _, s2 = _exp32_pair_all(np.array([-120.5, -1e30, -np.inf], np.float32))
    assert (s2 == 0.0).all()
    assert np.isnan(_exp32_pair_all(np.array([np.nan], np.float32))[0]).all()


@numba.njit(cache=False, fastmath={"contract"})
def _pair_low(v):
    return vm.exp32_pair(v)[1]


# --- gelu_erf's float32 parts (vector_math's gelu_erf32 section) ------------------------------
def _gelu_erf32_fit(function, n: int, c):
    """The n float32 coefficients of a polynomial in s = a / (a + K) - C (a in [0, 16]) for
    function(a) (C = c), highest power first, fitted knowing they are rounded: from the constant
    term up, each the first of a least-squares fit of the relative error at 400 Chebyshev
    points of s (function values from mpmath, 40 digits) of what the rounded ones before
    it leave, rounded to float32."""
    mpmath.mp.dps = 40
    k, c = float(vm._GE32_K), float(c)
    s = c * np.cos(np.pi * (np.arange(400) + 0.5) / 400)
    f = np.array([float(function(mpmath.mpf(k) * (mpmath.mpf(float(v)) + c)
                                 / (1 - (mpmath.mpf(float(v)) + c)))) for v in s])
    fixed: list = []
    for j in range(n):
        rest = f - sum(coef * s ** i for i, coef in enumerate(fixed))
        columns = np.stack([s ** i for i in range(j, n)], 1) / f[:, None]
        coefs = np.linalg.lstsq(columns, rest / f, rcond=None)[0]
        fixed.append(float(np.float32(coefs[0])))
    return tuple(np.float32(coef) for coef in reversed(fixed))


def _erfcx(x):
    return mpmath.exp(x * x) * mpmath.erfc(x)


def _gelu_zero():
    return -mpmath.findroot(lambda v: mpmath.ncdf(v) + v * mpmath.npdf(v), -0.75)


def test_gelu_erf32_constants_and_coefficients_are_the_documented_fits():
    """K = 2 sqrt 2 and C = (16 / (16 + K)) / 2 rounded to float32 (H's C' with 20 for 16);
    erfcx(a / sqrt 2) / 2 (a + K) and H = (erfcx(x) / 2 - x / sqrt(pi)) / (a - |Z|) fitted
    in 11 float32 coefficients (_gelu_erf32_fit): vector_math's _GE32_PHI and _GE32_SLOPE;
    |Z| in two float32 parts."""
    assert vm._GE32_K == np.float32(2 * math.sqrt(2))
    assert vm._GE32_C == np.float32((16 / (16 + float(vm._GE32_K))) / 2)
    sqrt2 = mpmath.sqrt(2)
    assert _gelu_erf32_fit(lambda a: _erfcx(a / sqrt2) / 2 * (a + float(vm._GE32_K)),
                           len(vm._GE32_PHI), vm._GE32_C) == vm._GE32_PHI
    zero = _gelu_zero()
    assert (vm._GE32_ZERO_HI, vm._GE32_ZERO_LO) == (np.float32(float(zero)),
                                                    np.float32(float(zero - float(np.float32(
                                                        float(zero))))))
    slope = lambda a: ((_erfcx(a / sqrt2) / 2 - a / sqrt2 / mpmath.sqrt(mpmath.pi))  # noqa: E731
                       / (a - zero))
    assert vm._GE32_SLOPE_C == np.float32((20 / (20 + float(vm._GE32_K))) / 2)
    assert _gelu_erf32_fit(slope, len(vm._GE32_SLOPE), vm._GE32_SLOPE_C) == vm._GE32_SLOPE


@numba.njit(cache=False, fastmath={"contract"})     # compiled as the kernels are
def _gelu_erf32_parts(a):
    out = np.empty((4, a.size))
    for i in range(a.size):
        out[0, i] = vm.gelu_erf32_exp(a[i], False)
        out[1, i] = vm.gelu_erf32_phi_part(a[i])
        out[2, i] = vm.gelu_erf32_slope_part(a[i])
        out[3, i] = vm.gelu_erf32_exp(a[i], True)
    return out


def test_gelu_erf32_parts_within_the_stated_relative_error():
    """e^(-a^2/2) 2^64 within 1.0 2^-24 of itself over a in [0, 16] (2^164 within 1.1 over
    [13, 20], the gradient's), erfcx(a / sqrt 2) / 2 within 3.5 over [0, 16] and G = (a -
    |Z|) H within 3.5 over [0, 20] and around |Z| (measured: 0.99 and 1.0006, 2.33 and
    2.40), against mpmath; e 0 beyond its clamps, NaN in NaN out."""
    mpmath.mp.dps = 40
    sqrt2 = mpmath.sqrt(2)
    near_zero = (np.float32(0.7517915)
                 + np.arange(-300, 300, dtype=np.float32) * np.float32(2e-7))
    for row, bound, a, exact in (
            (0, 1.0, _float32_sample(0.0, 16.0, 3000),
             lambda v: mpmath.exp(-v * v / 2) * mpmath.mpf(2) ** 64),
            (3, 1.1, _float32_sample(13.0, 20.0, 3000),
             lambda v: mpmath.exp(-v * v / 2) * mpmath.mpf(2) ** 164),
            (1, 3.5, _float32_sample(0.0, 16.0, 3000), lambda v: _erfcx(v / sqrt2) / 2),
            (2, 3.5, np.concatenate([_float32_sample(0.0, 20.0, 3000), near_zero]),
             lambda v: _erfcx(v / sqrt2) / 2 - v / sqrt2 / mpmath.sqrt(mpmath.pi))):
        got = _gelu_erf32_parts(a)[row]
        truth = np.array([float(exact(mpmath.mpf(float(v)))) for v in a])
        err = np.abs(got - truth) / (np.abs(truth) * ULP32)
        worst = int(np.argmax(err))
        assert err[worst] <= bound, f"part {row}: {err[worst]:.2f} at {a[worst]!r}"
    edge = _gelu_erf32_parts(np.array([16.2, 20.1, np.inf, np.nan], np.float32))
    assert (edge[0, :3] == 0.0).all() and edge[3, 0] > 0.0 and (edge[3, 1:3] == 0.0).all()
    assert np.isnan(edge[:, 3]).all()
