"""The numerics are pure functions: check them on functions with known derivatives."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gradcheck.numeric import compare, numerical_gradient


@given(st.lists(st.floats(-2, 2), min_size=1, max_size=8))
def test_numerical_gradient_of_smooth_function(values):
    x = np.array(values, np.float64)
    w = np.linspace(0.5, 1.5, x.size)
    d = numerical_gradient(lambda: float(np.sum(w * np.sin(x) * np.exp(x))), x)
    exact = w * (np.cos(x) + np.sin(x)) * np.exp(np.array(values))
    np.testing.assert_allclose(d.value, exact, rtol=1e-9, atol=1e-9)
    assert np.all(d.error < 1e-6) and not d.kink.any()
    np.testing.assert_array_equal(x, values)    # restored


def test_compare_nan_and_inf_fail():
    a = np.array([1.0, np.nan, 3.0])
    assert compare(a, np.array([1.0, 2.0, 3.0]), "f64").nonfinite == 1
    assert not compare(a, np.array([1.0, 2.0, 3.0]), "f64").ok
    assert not compare(np.array([np.inf]), np.array([np.inf]), "f64").ok


def test_compare_zero_over_zero_is_zero():
    c = compare(np.zeros(3), np.zeros(3), "f32")
    assert c.ok and c.max_rel == 0.0 and c.max_abs == 0.0


def test_compare_catches_one_percent_in_f32_and_reports_worst():
    n = np.linspace(-1, 1, 9)
    a = n.copy()
    a[2] *= 1.01
    c = compare(a, n, "f32")
    assert not c.ok and c.failures == 1 and c.worst_index == (2,)
    assert c.worst_expected == n[2]
