"""The numerics are pure functions: check them on functions with known derivatives."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gradcheck.numeric import (
    MIN_SCALE,
    STEP,
    best_of,
    compare,
    numerical_gradient,
    step_for,
    steps_for,
)


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


def test_compare_a_subnormal_reference_warns_nothing_and_reports_an_infinite_ratio():
    # a relative error beyond float64's range (1e-8 against 1e-320) printed numpy's
    # overflow warning in the middle of a run's report
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = compare(np.array([1e-8]), np.array([1e-320]), "f32")
    assert c.ok and c.max_rel == np.inf


def test_compare_catches_one_percent_in_f32_and_reports_worst():
    n = np.linspace(-1, 1, 9)
    a = n.copy()
    a[2] *= 1.01
    c = compare(a, n, "f32")
    assert not c.ok and c.failures == 1 and c.worst_index == (2,)
    assert c.worst_expected == n[2]


def test_the_step_shrinks_with_tiny_inputs_only():
    assert step_for(np.array([0.5, -3.0])) == STEP
    assert step_for(np.array([1e3])) == STEP
    assert np.isclose(step_for(np.array([1e-3, -5e-4])), STEP * 1e-3)
    assert np.isclose(step_for(np.array([2.0]), np.array([0.01])), STEP * 0.01)
    assert step_for(np.array([np.nan, 0.5, np.nan])) == STEP * 0.5     # a slice's border
    assert step_for(np.zeros(3)) == STEP * MIN_SCALE


def test_a_function_of_tiny_inputs_has_no_false_kinks_at_their_step():
    """x / sqrt(mean(x^2) + eps) (rms_norm) of a row of 1e-3s with eps 1e-6 curves over
    lengths of 1e-3: at the fixed step 1e-4 the one-sided slopes part (false kinks) and the
    error estimate swallows 1e-5 relative errors; at step_for's step neither."""
    x = np.random.default_rng(0).uniform(-1e-3, -5e-4, 12)
    w = np.linspace(-1.5, 1.5, x.size)

    def f():
        return float(np.sum(w * x / np.sqrt(np.mean(x * x) + 1e-6)))
    s = 1 / np.sqrt(np.mean(x * x) + 1e-6)
    exact = s * w - x * s ** 3 * np.mean(w * x)
    coarse = numerical_gradient(f, x, STEP)
    fine = numerical_gradient(f, x, step_for(x))
    assert coarse.kink.any() or np.max(coarse.error / np.abs(exact)) > 1e-6
    assert not fine.kink.any() and np.max(fine.error / np.abs(exact)) < 1e-7
    np.testing.assert_allclose(fine.value, exact, rtol=1e-8)


def test_each_element_keeps_the_step_of_the_smaller_error_and_the_error_covers_it():
    """A loss linear in tiny inputs that passes through values of 1e4 (as acc's of a tiny a
    beside a huge b): the small step would drown the difference in rounding. Its error
    estimate, with the terms' magnitude given, covers the actual error at either step;
    best_of keeps STEP's, the more accurate."""
    x = np.random.default_rng(1).uniform(-1e-3, 1e-3, 6)
    w = np.linspace(-1.5, 1.5, x.size)
    big = np.full(x.size, 1e4)

    def f():
        return float(np.sum(w * (x + big)) - np.sum(w * big))
    magnitude = float(np.sum(np.abs(w * (x + big))))
    assert steps_for(x) == (STEP, step_for(x))
    estimates = [numerical_gradient(f, x, h, magnitude) for h in steps_for(x)]
    for d in estimates:
        assert np.all(np.abs(d.value - w) <= d.error) and not d.kink.any()
    best = best_of(*estimates)
    np.testing.assert_array_equal(best.error, np.minimum(*(d.error for d in estimates)))
    assert np.max(np.abs(best.value - w)) < 1e-6 < np.max(np.abs(estimates[1].value - w))
    assert steps_for(np.array([0.7, -0.9])) == (STEP,)
