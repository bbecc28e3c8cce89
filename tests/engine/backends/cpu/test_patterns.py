"""Element access over float and 16-bit pattern arrays (engine.backends.cpu.patterns): the
integer order keys, the vectorising exponentials, the any-order sums, and the kernels
that use them against numpy in float64."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import ml_dtypes
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.backends.cpu import half, patterns
from engine.backends.cpu.patterns import (
    as_patterns,
    dot_any_order,
    exp_capped,
    exp_into,
    fmt_of,
    key_value,
    order_key,
    rounded,
    rounded_number,
    row_extreme,
    sum_any_order,
    value,
    value_number,
    work,
)

DTYPES = {"f64": np.float64, "f32": np.float32, "f16": np.float16,
          "bf16": ml_dtypes.bfloat16}


@numba.njit
def _keys(x):
    out = np.empty(x.size, np.int64)
    for i in range(x.size):
        out[i] = order_key(x[i])
    return out


@numba.njit
def _key_values(keys, like, fmt):
    out = np.empty(keys.size, np.float64)
    for i in range(keys.size):
        out[i] = key_value(keys[i], like, fmt)
    return out


@numba.njit
def _values(x, fmt):
    out = np.empty(x.size, np.float64)
    for i in range(x.size):
        out[i] = value(x[i], fmt)
    return out


@numba.njit
def _exps(v, like):
    out = np.empty(v.size, np.float64)
    for i in range(v.size):
        out[i] = exp_into(work(v[i], like), like)
    return out


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_keys_order_all_16_bit_patterns_as_their_values(dtype):
    patterns = np.arange(1 << 16, dtype=np.uint16)
    values = patterns.view(DTYPES[dtype]).astype(np.float64)
    keys = _keys(patterns)
    finite = ~np.isnan(values)
    order = np.argsort(keys[finite], kind="stable")
    assert np.all(np.diff(values[finite][order]) >= 0)
    # and back: the key's value is the pattern's
    fmt = fmt_of(np.empty(1, DTYPES[dtype]))
    back = _key_values(keys[finite], patterns, fmt)
    assert np.array_equal(back, values[finite])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=2, max_size=50))
def test_float32_keys_order_as_values(xs):
    x = np.array(xs, np.float32)
    keys = _keys(x)
    for i in range(len(x) - 1):
        if x[i] < x[i + 1]:
            assert keys[i] < keys[i + 1]
        elif x[i] > x[i + 1]:
            assert keys[i] > keys[i + 1]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("lowest", [False, True])
def test_row_extreme_is_numpys(dtype, lowest):
    rng = np.random.default_rng(3)
    for n in (1, 7, 8, 33, 1024):
        x = (rng.normal(size=n) * 100).astype(DTYPES[dtype])
        got = row_extreme(as_patterns(x), n, fmt_of(x), lowest)
        want = x.astype(np.float64).min() if lowest else x.astype(np.float64).max()
        assert got == want


def test_row_extreme_finds_a_nan():
    x = np.array([1.0, np.nan, 3.0], np.float32)
    assert np.isnan(row_extreme(x, 3, 0, False))


@pytest.mark.parametrize("dst", ["f32", "f16", "bf16"])
def test_exp_into_is_accurate_for_narrow_outputs(dst):
    """The polynomials: below 3e-10 relative error for float32 outputs (computed in
    float64), below 1e-6 for 16-bit ones (computed in float32) where the result is a
    normal float32, within float32's subnormal spacing below; exp(0) = 1 exactly."""
    like = as_patterns(np.empty(1, DTYPES[dst]))
    v = np.concatenate([np.linspace(-103.0, 0.0, 200001), [0.0, -1e-30, -0.5]])
    v = v.astype(np.float32 if dst != "f32" else np.float64)
    got = _exps(v, like)
    want = np.exp(v.astype(np.float64))
    normal = want >= np.finfo(np.float32).tiny
    bound = 3e-10 if dst == "f32" else 1e-6
    assert np.max(np.abs(got[normal] / want[normal] - 1)) < bound
    assert np.max(np.abs(got[~normal] - want[~normal])) <= 2.0 ** -149
    assert got[-3] == 1.0


@pytest.mark.parametrize("dst", ["f64", "f32", "f16", "bf16"])
def test_exp_into_underflows_to_zero_and_propagates_nan(dst):
    like = as_patterns(np.empty(1, DTYPES[dst]))
    v = np.array([-np.inf, -1e4, -300.0, np.nan], np.float64 if dst in ("f64", "f32")
                 else np.float32)
    got = _exps(v, like)
    assert np.isnan(got[3])
    if dst == "f64":                         # libm's exp
        assert np.array_equal(got[:3], [0.0, 0.0, np.exp(-300.0)])
    else:                                    # clamped: zero once in the output's dtype
        assert np.all(got[:3].astype(DTYPES[dst]) == 0)


@numba.njit
def _capped(v):
    out = np.empty(v.size, np.float64)
    for i in range(v.size):
        out[i] = exp_capped(v[i])
    return out


def test_exp_capped_is_accurate_over_float32s_range_and_overflows_to_inf():
    """exp_capped (log_softmax_back's exponential for any y): below 3e-10 relative error
    wherever exp is a normal float32 and beyond, up to 709.4; inf from float32's overflow
    on (its values there round to inf in float32 alike); zero in float32 below, NaN for
    NaN."""
    v = np.concatenate([np.linspace(-103.0, 709.4, 400001), [0.0, -0.0, 88.72, 1e-30]])
    got, want = _capped(v), np.exp(v)
    assert np.max(np.abs(got / want - 1)) < 3e-10
    assert got[-4] == 1.0 and got[-3] == 1.0
    big = np.array([88.73, 100.0, 709.5, 710.0, 1e4, 3.4e38, np.inf])
    assert np.all(_capped(big).astype(np.float32) == np.exp(big).astype(np.float32))
    assert np.all(np.isinf(_capped(big[2:])))
    tail = _capped(np.array([-np.inf, -1e4, -746.0, np.nan]))
    assert np.all(tail[:3].astype(np.float32) == 0) and np.isnan(tail[3])


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_the_clamps_lie_where_every_output_is_zero(dtype):
    """exp_into clamps at -200 (float32 outputs) and -104 (16-bit): exp there rounds to
    zero in the output's dtype, so the clamp changes no result."""
    floor = -200.0 if dtype == "f32" else -104.0
    assert np.array(np.exp(floor)).astype(DTYPES[dtype]) == 0


def test_any_order_sums_match_float64():
    rng = np.random.default_rng(5)
    for n in (0, 1, 5, 64, 1000, 4099):
        a = rng.normal(size=n)
        assert sum_any_order(a, n) == pytest.approx(np.sum(a), rel=1e-13, abs=1e-13)
        b = rng.normal(size=n).astype(ml_dtypes.bfloat16)
        c = rng.normal(size=n).astype(ml_dtypes.bfloat16)
        b64, c64 = b.astype(np.float64), c.astype(np.float64)
        got = dot_any_order(as_patterns(b), as_patterns(c), n, half.BF16)
        # float32 lanes: within 64 float32 ulps of the sum of the products' magnitudes
        assert abs(got - np.dot(b64, c64)) <= 64 * 2.0 ** -24 * np.sum(np.abs(b64 * c64))
        assert dot_any_order(a, a, n, 0) == pytest.approx(np.dot(a, a), rel=1e-13)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_values_widen_patterns_exactly(dtype):
    patterns = np.arange(1 << 16, dtype=np.uint16)
    values = patterns.view(DTYPES[dtype]).astype(np.float64)
    got = _values(patterns, fmt_of(np.empty(1, DTYPES[dtype])))
    same = (got == values) | (np.isnan(got) & np.isnan(values))
    assert same.all()


@numba.njit
def _value_numbers(x, fmt):
    out = np.empty(x.size, np.float64)
    for i in range(x.size):
        out[i] = value_number(x[i], fmt)
    return out


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_value_number_is_value_on_every_number(dtype):
    """value_number() leaves out value()'s signalling-NaN fix-up: the same value for every
    pattern that is not a NaN, a NaN for every NaN."""
    patterns = np.arange(1 << 16, dtype=np.uint16)
    fmt = fmt_of(np.empty(1, DTYPES[dtype]))
    got, want = _value_numbers(patterns, fmt), _values(patterns, fmt)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint64), want[~nan].view(np.uint64))


@numba.njit
def _rounded_all(x, dst, fmt):
    for i in range(x.size):
        dst[i] = rounded(x[i], dst, fmt)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_rounded_is_halfs_narrowing(dtype):
    """rounded() (float16 through the CPU's conversion instructions) gives half.narrow's
    bits: on every float32 NaN's sign and top payload bits, the float16 subnormal and
    overflow ranges, the ties, and 2^22 random patterns."""
    fmt = fmt_of(np.empty(1, DTYPES[dtype]))
    rng = np.random.default_rng(11)
    nans = (np.uint32(0x7F800001) + np.arange(0, 1 << 23, 97, dtype=np.uint32))
    pieces = [nans, nans | np.uint32(0x80000000),
              np.arange(0x33000000, 0x38800000 + 1, 37, dtype=np.uint32),     # subnormals
              np.arange(0x477FE000, 0x47800000 + (1 << 4), dtype=np.uint32),    # near 65520
              rng.integers(0, 1 << 32, 1 << 22, dtype=np.uint32),
              np.array([0, 0x80000000, 0x7F800000, 0xFF800000], np.uint32)]
    bits = np.concatenate(pieces)
    x = bits.view(np.float32)
    got = np.empty(x.size, np.uint16)
    _rounded_all(x, got, fmt)
    want = np.empty(x.size, np.uint16)
    half.narrow_array.serial(x, want, fmt)
    assert np.array_equal(got, want)


@numba.njit
def _rounded_numbers(x, dst, fmt):
    for i in range(x.size):
        dst[i] = rounded_number(x[i], dst, fmt)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_rounded_number_is_rounded_on_every_number(dtype):
    """rounded_number() leaves out rounded()'s NaN fix-ups: the same bits for every float32
    that is not a NaN (infinities, the subnormal and overflow ranges, the ties, and 2^22
    random patterns)."""
    fmt = fmt_of(np.empty(1, DTYPES[dtype]))
    rng = np.random.default_rng(12)
    bits = np.concatenate([
        np.arange(0x33000000, 0x38800000 + 1, 37, dtype=np.uint32),
        np.arange(0x477FE000, 0x47800000 + (1 << 4), dtype=np.uint32),
        np.arange(0x7F7F0000, 0x7F800001, 3, dtype=np.uint32),
        rng.integers(0, 1 << 32, 1 << 22, dtype=np.uint32),
        np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x3F808000, 0x3F818000], np.uint32)])
    x = bits.view(np.float32)
    x = x[~np.isnan(x)]
    x = np.concatenate([x, -x])
    got, want = np.empty(x.size, np.uint16), np.empty(x.size, np.uint16)
    _rounded_numbers(x, got, fmt)
    _rounded_all(x, want, fmt)
    assert np.array_equal(got, want)


def _fresh_run(tmp_path, **env):
    """This module's fast tests in a new process, compiling everything anew, numba's
    pedantic IR warnings (which the overloads once raised) as errors."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-W", "error::numba.core.errors.NumbaIRAssumptionWarning",
                           "-m", "not slow", __file__], env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_compiled_afresh_without_warnings(tmp_path):
    run = _fresh_run(tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


@pytest.mark.slow
def test_a_cpu_without_f16c_takes_the_arithmetic_conversions(tmp_path):
    """Compiled for a generic x86-64 (no F16C), LLVM would turn the conversion
    instructions into runtime calls numba's JIT cannot link, and the process would
    abort: this module's tests pass there, on half's arithmetic conversions."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("an x86-64 test")
    run = _fresh_run(tmp_path, NUMBA_CPU_NAME="x86-64", NUMBA_CPU_FEATURES="")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


def test_conversion_instructions_follow_the_target():
    assert patterns.F16C == patterns.conversion_instructions()
