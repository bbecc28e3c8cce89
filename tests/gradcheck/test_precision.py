"""The precision verdict (gradcheck.precision): its arithmetic, its error model, and the rows
it judges."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engine.mutation.patches import kernel_replaced, scaled
from engine.registry import get_op
from engine.samples import InputSpec, Sample
from gradcheck import precision
from gradcheck.check import check_sample


def test_ratio_is_the_error_over_the_bound_scaled_to_the_bar():
    truth = np.array([1.0, 2.0, 3.0])
    r = precision.judge("output", truth + [1e-3, 0, 0], truth, 1e-4, "f32", "torch f32")
    floor = precision.FLOOR_ULPS * 2 * 2.0 ** -24 * 3.0       # 4 float32 ulps of 3
    assert r.err == pytest.approx(1e-3) and r.ref_err == 1e-4
    assert r.ratio == pytest.approx(1e-3 / (8 * 1e-4 + floor) * 8) and not r.ok
    # exact results: the floor decides, no division by zero; a NaN is infinitely off
    assert precision.judge("output", truth, truth, 0.0, "f16", "model").ratio == 0.0
    nan = precision.judge("output", truth + [np.nan, 0, 0], truth, 0.0, "f16", "model")
    assert nan.ratio == np.inf and not nan.ok


def test_the_floor_is_a_few_ulps_of_the_dtype_at_the_cases_magnitude():
    truth = np.zeros(3)                   # a result that vanishes by cancellation ...
    off = np.array([2e-3, 0.0, 0.0])
    alone = precision.judge("mask", off, truth, 0.0, "f16", "torch f16")
    assert alone.ratio == np.inf or alone.ratio > 1e6
    # ... judged at the scale of the terms that cancel: 4 float16 ulps of 1 is 3.9e-3
    beside = precision.judge("mask", off, truth, 0.0, "f16", "torch f16", size=1.0)
    assert beside.ok and beside.ratio == pytest.approx(2e-3 / (4 * 2 ** -10) * 8)


def test_the_verdict_names_the_worst_result_and_its_reference():
    truth = np.ones(4)
    results = [precision.judge("output", truth, truth, 1e-3, "bf16", "torch bf16"),
               precision.judge("x", truth + 0.5, truth, 1e-3, "bf16", "torch bf16")]
    v = precision.worst_of(results, "bf16")
    assert not v.ok and v.worst.what == "x"
    assert v.problem.startswith("precision: x errs 0.5 against float64")
    assert "torch bf16 in bf16" in v.problem
    assert set(v.metrics()) == {"err_vs_f64", "ref_err", "ratio", "precision_ref"}
    assert precision.worst_of([], "f16").ok and precision.worst_of([], "f16").metrics() == {}


def test_the_error_model_of_a_sum_is_a_rounding_and_the_move_of_its_inputs():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.5, 10_000)
    draws = precision.perturbed([x, np.arange(3)], "f16", seed=1)
    assert len(draws) == precision.MODEL_DRAWS
    moved, ints = draws[0]
    assert np.array_equal(ints, np.arange(3))                   # integers stay
    assert np.allclose(np.abs(moved / x - 1), 2.0 ** -11)       # one unit roundoff each
    (err,) = precision.model_errors([np.array([x.sum()])],
                                    [[np.array([d[0].sum()])] for d in draws], "f16")
    u = 2.0 ** -11
    # one rounding of the sum, plus u times a norm of the terms: far below the n u sum|x|
    # of a sum accumulated in float16
    assert u * x.sum() < err < u * x.sum() + 4 * u * np.sqrt(np.sum(x * x))
    assert err < 0.01 * len(x) * u * x.sum()


def test_a_row_of_each_low_precision_dtype_reports_the_verdict():
    for dtype in ("f16", "bf16", "f32"):
        case = next(c for c in get_op("softmax").samples() if c.dtype == dtype)
        r = check_sample(case)
        assert r.status == "pass", r.message
        assert r.metrics["precision_ref"] == f"torch {dtype}"
        assert 0 <= r.metrics["ratio"] <= precision.PRECISION_RATIO
        assert r.metrics["err_vs_f64"] >= 0 and r.metrics["ref_err"] >= 0
    f64 = next(c for c in get_op("softmax").samples() if c.dtype == "f64")
    assert "ratio" not in check_sample(f64).metrics


def test_without_torch_the_error_model_stands_in():
    case = next(c for c in get_op("sum").samples() if c.dtype == "bf16")
    r = check_sample(case, use_torch=False)
    assert r.status == "pass", r.message
    assert r.metrics["precision_ref"] == "model"


def _through_float16(kernel):
    """A float32 kernel that rounds its result through float16 on the way out (as ggml's
    conv_2d computes its im2col in float16 for a float32 kernel): a relative error of up
    to 2^-11, inside float32's fixed tolerance of 1e-3."""
    def mutant(out, ins, **params):
        kernel(out, ins, **params)
        if out.dtype == np.float32:      # the float64 reference keeps the real kernel
            out[...] = out.astype(np.float16)
    return mutant


def test_a_float32_kernel_rounding_through_float16_passes_the_tolerance_not_the_ratio():
    case = Sample.make("sin", [InputSpec("x", (64,), low=-1.0, high=1.0)], "f32")
    assert check_sample(case).status == "pass"
    with kernel_replaced("sin", _through_float16):
        r = check_sample(case)
    assert r.status == "fail"
    assert r.message.startswith("precision: output") and r.metrics["ratio"] > 100
    # the fixed float32 tolerance alone would have let it pass
    assert r.metrics["forward"] == "agree" and r.metrics["torch"] == "agree"


def test_a_case_whose_torch_lacks_the_dtype_falls_back_to_the_model(monkeypatch):
    case = next(c for c in get_op("relu").samples() if c.dtype == "f16")

    def refuses(*tensors, **params):
        if tensors[0].dtype.is_floating_point and tensors[0].dtype.itemsize == 2:
            raise RuntimeError('"relu" not implemented for \'Half\'')
        return get_op("relu").torch(*tensors, **params)
    monkeypatch.setattr(type(case), "torch_fn", property(lambda self: refuses))
    r = check_sample(dataclasses.replace(case))
    assert r.status == "pass", r.message
    assert r.metrics["precision_ref"] == "model" and r.metrics["torch"] == "agree"


# --- the rounding bias ----------------------------------------------------------------------
HALF = {"f16": np.float16, "bf16": precision.DTYPES["bf16"]}


def _rounded(truth, dtype, toward_zero=False):
    """`truth` rounded to `dtype`: to nearest even (numpy, ml_dtypes), or toward zero."""
    wide = truth.astype(HALF[dtype]).astype(np.float64)
    if toward_zero:                   # one step back where it rounded away from zero (the
        below = precision.ulps_at(wide * (1 - 2.0 ** -30), dtype)   # spacing just below)
        wide = np.where(np.abs(wide) > np.abs(truth), wide - np.sign(wide) * below, wide)
    return wide


def test_ulps_at_is_the_spacing_of_the_dtype_at_each_value():
    t = np.array([1.0, 1.5, 2.0, 1000.0, -3.0, 2.0 ** -20])
    assert np.array_equal(precision.ulps_at(t, "f16"),
                          [2 ** -10, 2 ** -10, 2 ** -9, 0.5, 2 ** -9, 2 ** -24])
    assert np.array_equal(precision.ulps_at(t[:5], "bf16"),
                          [2 ** -7, 2 ** -7, 2 ** -6, 4.0, 2 ** -6])
    for dtype, np_type in HALF.items():
        x = np.random.default_rng(0).uniform(-50, 50, 200).astype(np_type)
        up = np.nextafter(x, np_type(np.inf)) if dtype == "f16" else None
        if up is not None:
            nonneg = x >= 0
            assert np.array_equal(precision.ulps_at(x.astype(np.float64), dtype)[nonneg],
                                  (up.astype(np.float64) - x.astype(np.float64))[nonneg])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("seed", range(5))
def test_rounding_to_nearest_is_unbiased_and_truncation_is_not(dtype, seed):
    truth = np.random.default_rng(seed).uniform(-4, 4, 60)
    mean, bar = precision.bias(_rounded(truth, dtype), truth, dtype)
    assert abs(mean) <= bar
    mean, bar = precision.bias(_rounded(truth, dtype, toward_zero=True), truth, dtype)
    assert mean < -0.3 and abs(mean) > bar


def test_the_bias_counts_distinct_inexact_elements_within_an_ulp():
    truth = np.linspace(1.0, 2.0, 40) + 1e-4
    low = truth - 5e-4                             # all about half a float16 ulp low
    # one value broadcast 40 times is one rounding event: too few for a verdict
    assert precision.bias(np.full(40, low[0]), np.full(40, truth[0]), "f16") is None
    # exact elements and elements off by more than an ulp (float32 met cancellation) left out
    assert precision.bias(truth, truth, "f16") is None
    assert precision.bias(truth + 1.0, truth, "f16") is None
    mean, _ = precision.bias(low, truth, "f16")
    assert mean == pytest.approx(np.mean(-5e-4 / precision.ulps_at(truth, "f16")))


# few distinct values, so that pairs repeat, signed zeros among them
_PAIR_VALUES = st.sampled_from([-2.0, -1.0, -0.0, 0.0, 0.5, 1.0, 1.5, 3.0, 1e-300, 1e300])


@given(hnp.arrays(np.float64, st.integers(0, 60), elements=_PAIR_VALUES),
       hnp.arrays(np.float64, st.integers(0, 60), elements=_PAIR_VALUES))
def test_the_distinct_pairs_are_numpys_unique_columns(t, v):
    """bias's dedup (one complex sort) gives what np.unique(..., axis=1) gives, in its order."""
    n = min(t.size, v.size)
    t, v = t[:n], v[:n]
    got_t, got_v = precision._distinct_pairs(t, v)
    want = np.unique(np.stack([t, v]), axis=1) if n else np.zeros((2, 0))
    assert np.array_equal(np.stack([got_t, got_v]), want)


def test_a_biased_output_fails_the_verdict_and_the_row_says_so():
    truth = np.random.default_rng(1).uniform(0.5, 1.0, 64)
    good = precision.judge("output", _rounded(truth, "bf16"), truth, 2 ** -9, "bf16",
                           "torch bf16", rounded_once=True)
    bad = precision.judge("output", _rounded(truth, "bf16", toward_zero=True), truth,
                          2 ** -9, "bf16", "torch bf16", rounded_once=True)
    assert good.ok and good.bias is not None
    assert bad.ratio <= precision.PRECISION_RATIO and not bad.ok      # the ratio cannot see it
    verdict = precision.worst_of([good, bad], "bf16")
    assert not verdict.ok and "biased toward zero" in verdict.problem
    assert verdict.metrics()["bias"] == pytest.approx(bad.bias, abs=1e-3)
    # a reference as biased as the engine widens what is allowed
    same = precision.judge("output", _rounded(truth, "bf16", toward_zero=True), truth,
                           2 ** -9, "bf16", "torch bf16",
                           ref_value=_rounded(truth, "bf16", toward_zero=True),
                           rounded_once=True)
    assert same.ok
    # float32, or a result not stored by one kernel: no bias judged
    assert precision.judge("output", truth, truth, 0.0, "f32", "torch f32",
                           rounded_once=True).bias is None
    assert precision.judge("output", _rounded(truth, "bf16", toward_zero=True), truth,
                           2 ** -9, "bf16", "torch bf16").bias is None


def test_only_one_kernels_output_has_its_bias_judged():
    exp = next(c for c in get_op("exp").samples() if c.dtype == "bf16" and
               np.prod(c.inputs[0].shape) >= 32)
    mean = next(c for c in get_op("mean").samples() if c.dtype == "bf16")   # composite
    assert "bias" in check_sample(exp).metrics
    assert "bias" not in check_sample(mean).metrics


# `gradcheck --all --random 200 --seed 3`: a float16 input rounded onto hardswish's kink at 3
KINKED = Sample(op="hardswish", inputs=(InputSpec(
    name="x", shape=(3, 4, 1, 4), kind="away_from_zero", low=0.16533333333333336, high=8.0,
    slice=((0, 3, 1), (0, 4, 1), (0, 1, 1), (1, 5, 1)), show_range=True),), dtype="f16")


def test_the_precision_verdict_leaves_the_numerical_checks_kinks_out():
    """At a kink the derivative jumps: the fixed checks leave it out, and so does the
    precision verdict (it failed this case, 0.43 off at x = 3, before); a 1% error
    elsewhere still fails it."""
    assert 3.0 in np.abs(KINKED.generate_inputs()[0])
    row = check_sample(KINKED)
    assert row.status == "pass" and row.metrics["kinks"] == 1, row.message
    with scaled("hardswish", 1.01)():
        row = check_sample(KINKED)
    assert row.status == "fail" and row.message.startswith("precision:")
