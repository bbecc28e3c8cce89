"""Constant infinities of an op's output (gradcheck.reference.constant_cells): diag_mask_inf
writes -inf above its diagonal by definition. Such cells get weight 0 and are reported as
`constant`, never as passes; every other NaN or Inf is still a failure: an engine that
writes -inf in one cell the reference has finite, a finite value where the reference has
-inf, a NaN anywhere, or a perturbation that moves a constant cell."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.samples import InputSpec, Sample
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.check import check_sample
from gradcheck.reference import Float64Reference, constant_cells, settled


def mask_case(shape=(4, 6), n_past=1, dtype="f64", **view):
    return Sample.make("diag_mask_inf", [InputSpec("x", shape, low=-3.0, high=3.0, **view)],
                       dtype, n_past=n_past)


def masked_cells(shape, n_past):
    rows, cols = shape[-2:]
    above = np.arange(cols)[None, :] > n_past + np.arange(rows)[:, None]
    return int(above.sum()) * int(np.prod(shape[:-2], dtype=int))


class Tampered(EngineAdapter):
    """Our engine, with its forward output changed after it ran: `tamper(out)` in place."""

    def __init__(self, tamper):
        super().__init__("cpu")
        self.tamper = tamper

    def vjp_runs(self, case, arrays, weights, runs):
        answers = super().vjp_runs(case, arrays, weights, runs)
        for a in answers:
            self.tamper(a.output)
        return answers


@pytest.mark.parametrize("case", [mask_case(), mask_case((2, 3, 5), 0, "f32"),
                                  mask_case((5, 4), 2, permute=(1, 0)),
                                  dataclasses.replace(mask_case((2, 4, 5), 0),
                                                      cotangent="permuted")])
def test_correct_diag_mask_inf_passes_with_its_constants_counted(case):
    r = check_sample(case)
    assert r.status == "pass", r.message
    assert r.metrics["constant"] == masked_cells(case.inputs[0].shape, case.kwargs["n_past"])
    assert r.metrics["torch"] == "agree"


def test_an_op_without_infinities_reports_no_constants():
    r = check_sample(Sample.make("diag_mask_zero", [InputSpec("x", (4, 6))], "f64", n_past=1))
    assert r.status == "pass", r.message
    assert "constant" not in r.metrics


def _set(index, value):
    def tamper(out):
        out[index] = value
    return tamper


@pytest.mark.parametrize("index,value,what", [
    ((0, 0), -np.inf, "an -inf in a cell the reference has finite"),
    ((3, 5), 0.0, "a finite value where the reference has -inf"),
    ((2, 1), np.nan, "a NaN in a kept cell"),
    ((0, 5), np.nan, "a NaN in a masked cell"),
    ((1, 1), np.inf, "+inf in a kept cell"),
])
def test_any_other_non_finite_or_moved_constant_fails(index, value, what):
    r = check_sample(mask_case(), adapter=Tampered(_set(index, value)))
    assert r.status == "fail", what
    assert "forward" in r.message


def test_nan_from_the_op_itself_still_fails():
    r = check_sample(Sample.make("log", [InputSpec("x", (3, 4), low=-2.0, high=-1.0)], "f64"))
    assert r.status == "fail"
    assert "NaN/Inf" in r.message or "nan" in r.message.lower()


class Stub(Float64Reference):
    """f(x) = x where x > 0, -inf elsewhere, in numpy."""

    def __init__(self, x):
        self.leaves = [x]
        self.output_shape = x.shape

    def set_weights(self, weights):
        self.weights = weights

    def output(self):
        x = self.leaves[0]
        return np.where(x > 0, x, -np.inf)

    def loss(self):
        return self._held_loss(self.output())


def test_a_perturbation_that_moves_a_constant_cell_makes_the_loss_nan():
    ref = Stub(np.array([1.0, -1.0, 2.0]))
    constant = constant_cells(ref.output())
    assert constant.tolist() == [False, True, False]
    ref.hold_constant(constant)
    ref.set_weights(np.array([0.5, 0.0, -1.5]))
    assert ref.loss() == 0.5 * 1.0 - 1.5 * 2.0
    ref.leaves[0][0] = 3.0                 # a kept cell moves: the loss follows
    assert ref.loss() == 0.5 * 3.0 - 1.5 * 2.0
    ref.leaves[0][1] = 0.5                 # the constant cell turns finite
    assert np.isnan(ref.loss())
    ref.leaves[0][1] = -1.0
    ref.leaves[0][2] = -2.0                # a kept cell turns -inf
    assert np.isnan(ref.loss()) or not np.isfinite(ref.loss())


def test_settled_zeroes_matching_infinities_and_flags_the_others():
    ref = np.array([-np.inf, 1.0, np.inf])
    c = constant_cells(ref)
    got = settled(np.array([-np.inf, 1.0, 5.0]), ref, c)
    assert got[0] == 0.0 and got[1] == 1.0 and np.isnan(got[2])
    assert constant_cells(np.array([1.0, np.nan])) is None    # NaN is never a constant
