"""Each failure mode is caught and named: wrong gradient, NaN, kinks, torch disagreement."""

from __future__ import annotations

import numpy as np
import pytest

from engine.registry import OPS
from engine.samples import InputSpec, Sample
from gradcheck.check import check_sample


def relu_case(dtype="f64", **spec):
    return Sample.make("relu", [InputSpec("x", (3, 4), **spec)], dtype)


def test_correct_op_passes_three_ways():
    r = check_sample(relu_case(kind="away_from_zero", low=0.1, high=2.0))
    assert r.status == "pass", r.message
    assert r.metrics["torch"] == "agree" and r.metrics["kinks"] == 0
    assert r.labels == {"op": "relu", "backend": "cpu", "dtype": "f64", "mode": "full",
                        "tier": "fast"}


def test_wrong_gradient_is_named_backprop():
    r = check_sample(relu_case(kind="away_from_zero", low=0.1, high=2.0), inject="scale:1.01")
    assert r.status == "fail"
    assert "backprop of x is off" in r.message and "numerical and torch agree" in r.message


def test_nan_in_backprop_fails(monkeypatch):
    real = OPS["relu_back"].kernels["cpu"]

    def nan_kernel(out, ins, **params):
        real(out, ins, **params)
        out.reshape(-1)[0] = np.nan
    monkeypatch.setitem(OPS["relu_back"].kernels, "cpu", nan_kernel)
    r = check_sample(relu_case(kind="away_from_zero", low=0.1, high=2.0))
    assert r.status == "fail" and "NaN/Inf" in r.message


def test_kink_dominated_case_is_reported():
    # every input on relu's kink at 0 (inputs merely near it, |x| <= 1e-5, are not: the
    # finite-difference step shrinks with the inputs' magnitude, gradcheck.numeric.step_for)
    r = check_sample(relu_case(kind="uniform", low=0.0, high=0.0))
    assert r.status == "fail"
    assert r.metrics["kinks"] == 12 and "kinks" in r.message
    assert "sample generator" in r.message


def test_kinks_are_neither_pass_nor_fail():
    # a few elements on the kink among many smooth ones: counted, not judged
    s = Sample.make("abs", [InputSpec("x", (40,), "away_from_zero", 0.1, 1.0)], "f64")
    arrays = s.generate_inputs()
    arrays[0][:3] = 0.0
    case = _FixedInputs(s, arrays)
    r = check_sample(case)
    assert r.status == "pass", r.message
    assert r.metrics["kinks"] == 3 and r.metrics["checked"] == 37


def test_torch_disagreement_is_named_torch(monkeypatch):
    monkeypatch.setattr(OPS["relu"], "torch", lambda x: x.relu() * 1.01)
    r = check_sample(relu_case(kind="away_from_zero", low=0.1, high=2.0))
    assert r.status == "fail" and r.metrics["torch"] == "off"
    assert "torch disagrees with backprop and numerical" in r.message


def test_forward_mismatch_with_torch_is_named(monkeypatch):
    monkeypatch.setattr(OPS["exp"], "torch", lambda x: x.exp() + 1.0)
    r = check_sample(Sample.make("exp", [InputSpec("x", (5,))], "f64"))
    assert r.status == "fail" and "forward output differs from torch" in r.message


def test_fast_mode_checks_projections_and_catches_bugs():
    s = Sample.make("mul", [InputSpec("a", (30, 40)), InputSpec("b", (40,))], "f64")
    good = check_sample(s, mode="fast")
    assert good.status == "pass" and good.labels["mode"] == "fast"
    assert 0 < good.metrics["checked_fraction"] < 0.01
    bad = check_sample(s, mode="fast", inject="scale:1.01")
    assert bad.status == "fail"


def test_auto_mode_picks_fast_for_large_cases():
    s = Sample.make("exp", [InputSpec("x", (60, 60))], "f64")
    assert check_sample(s).labels["mode"] == "fast"


def test_crashing_kernel_is_an_error_row(monkeypatch):
    def boom(out, ins, **params):
        raise RuntimeError("kernel exploded")
    monkeypatch.setitem(OPS["exp"].kernels, "cpu", boom)
    r = check_sample(Sample.make("exp", [InputSpec("x", (5,))], "f64"))
    assert r.status == "error" and "kernel exploded" in r.message


class _FixedInputs:
    """A sample whose inputs are given, not generated (same interface as Sample)."""

    def __init__(self, sample, arrays):
        self._s, self._arrays = sample, arrays

    def generate_inputs(self):
        return [a.copy() for a in self._arrays]

    def promoted(self, dtype="f64"):
        return _FixedInputs(self._s.promoted(dtype), self._arrays)

    def __getattr__(self, name):
        return getattr(self._s, name)

    def __str__(self):
        return str(self._s)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_determinism_failure_is_reported(monkeypatch, dtype):
    real = OPS["relu_back"].kernels["cpu"]
    calls = []

    def flaky(out, ins, **params):
        real(out, ins, **params)
        calls.append(1)
        if len(calls) == 2:
            out.reshape(-1)[0] += out.dtype.type(1e-3)
    monkeypatch.setitem(OPS["relu_back"].kernels, "cpu", flaky)
    r = check_sample(relu_case(dtype, kind="away_from_zero", low=0.1, high=2.0))
    assert r.status == "fail" and "determinism" in r.message
