"""engine.backends.cpu.softmax: softmax_back's 16-bit row sums read without the NaN fix-ups
where a row holds no NaN, the same bits as with them, and a row holding a NaN or an
infinity read again with them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.backends.cpu.patterns import (
    dot_any_order,
    fmt_of,
    number_dot_any_order,
    number_sum_any_order,
    value_sum_any_order,
)
from engine.backends.cpu.softmax import cpu_softmax_back

HALF = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}
# NaN patterns, signalling ones (quiet bit clear) among them
NANS = {"f16": [0x7C01, 0xFD05, 0x7E00, 0x7FFF], "bf16": [0x7F81, 0xFFA0, 0x7FC0, 0x7FFF]}


def _row(dtype, n, seed, scale):
    return (np.random.default_rng(seed).normal(size=n) * scale).astype(HALF[dtype])


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(sorted(HALF)), n=st.integers(1, 3000),
       seed=st.integers(0, 2 ** 32 - 1), scale=st.sampled_from([1e-3, 1.0, 300.0]))
def test_the_sums_without_fix_ups_are_the_sums_with_them(dtype, n, seed, scale):
    """number_sum_any_order and number_dot_any_order give value_sum_any_order's and
    dot_any_order's sums on rows of numbers (blocks of 1024 products and a tail, subnormals
    and products that overflow float32's blocks included at the scale 300), and both are
    the float64 sums up to the blocks' float32 rounding: within 2^-17 of the sum of the
    terms' magnitudes. Not always the same bits: the two loops are compiled apart and LLVM
    may order each one's lanes its own way (on an AVX2 machine 442 of 5,100 rows' sums
    differed, by at most 2^-22.8 of that sum), so softmax_back takes a row's sums from one
    of them, the other only where a sum is not finite."""
    a = _row(dtype, n, seed, scale).view(np.uint16)
    b = _row(dtype, n, seed + 1, scale).view(np.uint16)
    fmt = fmt_of(np.empty(1, HALF[dtype]))
    values_a = a.view(HALF[dtype]).astype(np.float64)
    values_b = b.view(HALF[dtype]).astype(np.float64)
    terms = [values_a, values_a * values_b]
    got = [number_sum_any_order(a, n, fmt), number_dot_any_order(a, b, n, fmt)]
    want = [value_sum_any_order(a, n, fmt), dot_any_order(a, b, n, fmt)]
    for t, g, w in zip(terms, got, want, strict=True):
        bound = 2.0 ** -17 * np.abs(t).sum()
        assert abs(g - w) <= bound and abs(w - t.sum()) <= bound, (g, w, t.sum(), bound)


def test_a_dropped_term_is_outside_the_sums_bound():
    """The bound above fails a sum that drops one term of a row's largest eighth."""
    a = _row("f16", 1500, 5, 1.0)
    terms = a.astype(np.float64)
    big = np.argsort(np.abs(terms))[-len(terms) // 8]
    assert abs(terms.sum() - (terms.sum() - terms[big])) > 2.0 ** -17 * np.abs(terms).sum()


@pytest.mark.parametrize("dtype", sorted(HALF))
def test_a_nan_in_a_row_makes_its_sums_nans(dtype):
    """A NaN pattern (signalling or quiet) in a row makes both sums NaN, with and without
    the fix-ups, so that softmax_back reads such a row again with them."""
    fmt = fmt_of(np.empty(1, HALF[dtype]))
    for k, pattern in enumerate(NANS[dtype]):
        a = _row(dtype, 1500, k, 1.0).view(np.uint16)
        b = _row(dtype, 1500, k + 9, 1.0).view(np.uint16)
        a[(k * 397) % a.size] = pattern
        assert np.isnan(number_sum_any_order(a, a.size, fmt))
        assert np.isnan(number_dot_any_order(a, b, a.size, fmt))
        assert np.isnan(value_sum_any_order(a, a.size, fmt))
        assert np.isnan(dot_any_order(b, a, a.size, fmt))


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", sorted(HALF))
def test_16_bit_nans_and_infinities_spread_along_their_rows_only(dtype, renormalize):
    """softmax_back's rows holding a NaN (signalling too) or an infinity in g or y are
    NaN where float32's are (read through the fix-ups), the rows of numbers finite and
    within the format's rounding of float32's."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 1100))
    y = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    g = rng.normal(size=x.shape)
    y16, g16 = y.astype(HALF[dtype]), g.astype(HALF[dtype])
    g16.view(np.uint16)[1, 5] = NANS[dtype][0]
    y16.view(np.uint16)[2, 9] = NANS[dtype][1]
    g16[3, 0], y16[4, 7] = np.inf, np.inf
    got = np.empty(x.shape, HALF[dtype])
    cpu_softmax_back(got, [g16, y16], scale=1.0, renormalize=renormalize)
    want = np.empty(x.shape, np.float32)
    cpu_softmax_back(want, [g16.astype(np.float32), y16.astype(np.float32)], scale=1.0,
                     renormalize=renormalize)
    got = got.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[[1, 2]]).all() and np.isnan(got[[3, 4]]).any()
    np.testing.assert_allclose(got[[0, 5, 6, 7]], want[[0, 5, 6, 7]],
                               rtol=2.0 ** -7, atol=1e-7)
