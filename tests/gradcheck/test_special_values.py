"""Propagation cases (NaN and infinite inputs) and correct rounding: each check fails the
bug it is there for, and passes the engine as it is."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from engine.mutation.patches import kernel_replaced
from engine.registry import get_op
from engine.samples import InputSpec, Sample
from gradcheck.check import check_case, check_sample
from gradcheck.precision import correctly_rounded, rounds_once

BF16 = np.dtype(ml_dtypes.bfloat16)


def _special(op, dtype):
    return next(c for c in get_op(op).samples() if c.special and c.dtype == dtype)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64"])
def test_every_binary_op_has_a_propagation_case_that_passes(op, dtype):
    case = _special(op, dtype)
    arrays = case.generate_inputs()
    assert np.isnan(arrays[0]).any() and np.isinf(arrays[0]).any()
    row = check_sample(case)
    assert row.status == "pass", row.message
    assert row.labels["check"] == "propagation" and "forward alone" in row.message
    assert row.metrics["reference"] == "torch f64"


def _nan_to_zero(real):
    """add's kernel written as `x > y ? ... `: a comparison that is false for NaN."""
    def kernel(out, ins, **params):
        real(out, ins, **params)
        out[np.isnan(out)] = 0
    return kernel


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_a_kernel_that_drops_nans_fails_its_propagation_case(dtype):
    with kernel_replaced("add", _nan_to_zero):
        row = check_sample(_special("add", dtype))
    assert row.status == "fail"
    assert "propagation:" in row.message and "finite where NaN" in row.message


def test_derivative_rows_of_a_propagation_case_say_why_they_skip():
    rows = check_case(_special("mul", "f32"), "both", 2)
    assert [r.status for r in rows] == ["pass", "skip", "skip"]
    assert all("propagation case" in r.message for r in rows[1:])


def test_correct_rounding_sees_ties_flushes_nans_and_truncation():
    exact = np.array([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 2.0 ** -20, np.nan, -np.inf, 0.3])
    right = exact.astype(np.float16)
    assert correctly_rounded("out", right, exact, "f16").wrong == 0
    wrong = right.copy()
    wrong[0] = np.float16(1 + 2.0 ** -10)          # the tie rounded away from even
    r = correctly_rounded("out", wrong, exact, "f16")
    assert r.wrong == 1 and r.first[0] == (0,) and "not correctly rounded" in r.problem
    flushed = right.copy()
    flushed[2] = 0                                  # a subnormal flushed
    assert correctly_rounded("out", flushed, exact, "f16").wrong == 1
    unquiet = right.copy()
    unquiet[3] = np.inf                             # a NaN stored as an infinity
    assert correctly_rounded("out", unquiet, exact, "f16").wrong == 1
    # 0.3 is inexact in float32: a 16-bit engine rounds twice there, so it is not judged
    other = right.copy()
    other[5] = np.nextafter(other[5], np.float16(1))
    assert correctly_rounded("out", other, exact, "f16").wrong == 0
    bf = np.array([1 + 2.0 ** -8, 2.0 ** -130]).astype(BF16)   # bfloat16: its tie and a subnormal
    assert correctly_rounded("out", bf, np.array([1 + 2.0 ** -8, 2.0 ** -130]), "bf16").wrong == 0


def test_which_cases_round_once():
    tiny = next(c for c in get_op("mul").samples() if c.dtype == "f16" and
                c.inputs[0].kind == "away_from_zero")
    assert rounds_once(tiny)
    assert rounds_once(next(c for c in get_op("mul").samples() if c.dtype == "f32"))
    assert not rounds_once(next(c for c in get_op("add").samples() if c.dtype == "f32"))
    assert not rounds_once(next(c for c in get_op("div").samples() if c.dtype == "f16"))
    assert not rounds_once(next(c for c in get_op("exp").samples() if c.dtype == "f16"))


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_tiny_cases_are_judged_not_vacuous(op, dtype):
    case = next(c for c in get_op(op).samples() if c.dtype == dtype and
                c.inputs[0].kind == "away_from_zero" and c.inputs[0].show_range)
    row = check_sample(case)
    assert row.status == "pass", row.message


def test_our_relu_keeps_ggmls_nan_rule_not_torchs():
    """relu(NaN) is 0 in ggml (`x > 0 ? x : 0`) and in our engine, NaN in torch: relu has
    no propagation case, and this test records the difference."""
    from gradcheck.adapters.engine_adapter import EngineAdapter
    case = Sample.make("relu", [InputSpec("x", (3,), "uniform", -1.0, 1.0)], "f32")
    out = EngineAdapter().forward(case, [np.array([np.nan, 1.0, -1.0], np.float32)])
    assert out.tolist() == [0.0, 1.0, 0.0]
