"""Every PASS must be able to fail: each row's power (the smallest relative error it would
flag, per input), the `vacuous` status, --strict, and the registry's rows that used to be
vacuous (a zero reference gradient, a cotangent in the VJP's null space, a tolerance that
swallowed the gradient)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.registry import get_op
from gradcheck.backprop import nonzero_problems, zero_gradient
from gradcheck.check import check_sample
from gradcheck.cotangents import registry_cases
from gradcheck.numeric import Comparison, compare
from gradcheck.verdict import VACUOUS_BEYOND, GradientOutcome, Outcomes, judge, vacuity
from reports import Result, exit_status, render_json, summarize


# --- power, from the comparisons ---------------------------------------------------------
def test_power_is_the_smallest_relative_error_that_fails():
    # f32: atol 1e-4 times max(1, max|n|), rtol 1e-3: an element of 2 allows 2e-4 + 2e-3
    c = compare([2.0, 0.5], [2.0, 0.5], "f32")
    assert c.power == pytest.approx((1e-4 * 2 + 1e-3 * 2) / 2)
    # and an error of that size just fails, just below it passes
    assert not compare([2.0 * (1 + 1.01 * c.power), 0.5], [2.0, 0.5], "f32").ok
    assert compare([2.0 * (1 + 0.99 * c.power), 0.5], [2.0, 0.5], "f32").ok


def test_a_zero_reference_has_no_power_and_an_error_estimate_weakens_it():
    assert compare([0.3, -1.0], [0.0, 0.0], "f64").power == np.inf
    sharp = compare([1.0], [1.0], "f64").power
    blurred = compare([1.0], [1.0], "f64", error=[0.05]).power
    assert blurred == pytest.approx(sharp + 0.05)


def test_kinks_give_no_power():
    assert compare([1.0, 2.0], [1.0, 2.0], "f32", kink=[False, True]).power == \
        pytest.approx(1e-4 + 1e-3)
    assert compare([1.0], [1.0], "f32", kink=[True]).power == np.inf


# --- the verdict -------------------------------------------------------------------------
def _cmp(power: float) -> Comparison:
    return Comparison(12, 0, 1e-9, 1e-9, 0, 0, (0,), 0.5, 0.5, power)


def _outcomes(power_x: float, dtype: str = "f32", **kw) -> Outcomes:
    return Outcomes(_cmp(1e-3), (GradientOutcome("x", _cmp(power_x)),
                                 GradientOutcome("w", _cmp(2e-3))), dtype=dtype, **kw)


def test_a_passing_row_that_could_not_see_a_10_percent_error_is_vacuous():
    v = judge(_outcomes(np.inf))
    assert v.status == "vacuous"
    assert "x: its reference gradient is 0 everywhere" in v.message
    assert "w:" not in v.message                 # w's power is fine
    assert judge(_outcomes(0.09)).status == "pass"
    loose = judge(_outcomes(0.3))
    assert loose.status == "vacuous" and "lets a 30% error pass" in loose.message


def test_the_16_bit_bound_is_25_percent_and_unjudged_rows_stay_pass():
    assert VACUOUS_BEYOND["bf16"] == VACUOUS_BEYOND["f16"] == 0.25
    assert judge(_outcomes(0.2, "bf16")).status == "pass"
    assert judge(_outcomes(0.3, "bf16")).status == "vacuous"
    assert judge(_outcomes(np.inf, "")).status == "pass"      # dtype "": not judged


def test_a_vacuous_row_names_the_cotangent_that_may_lie_in_the_null_space():
    v = judge(_outcomes(np.inf, cotangent="expanded"))
    assert "cotangent=expanded" in v.message and "null space" in v.message


def test_a_failure_stays_a_failure_whatever_the_power():
    bad = Comparison(12, 0, 0.1, 0.1, 3, 0, (0,), 0.6, 0.5, np.inf)
    v = judge(Outcomes(_cmp(1e-3), (GradientOutcome("x", bad),), dtype="f32"))
    assert v.status == "fail" and "vacuous" not in v.message


def test_a_zero_by_definition_gradient_is_not_vacuous_but_says_so():
    v = judge(_outcomes(np.inf, zero_by_definition="sgn is piecewise constant"))
    assert v.status == "pass"
    assert "zero by definition: sgn is piecewise constant" in v.message


def test_the_worst_power_and_its_input_are_metrics():
    v = judge(_outcomes(0.05))
    m = v.metrics(1.0)
    assert m["power"] == pytest.approx(0.05) and m["power_of"] == "x"
    assert m["power_output"] == pytest.approx(1e-3)


def test_a_tiny_output_alone_does_not_make_a_row_vacuous():
    v = judge(Outcomes(_cmp(5.0), (GradientOutcome("x", _cmp(1e-3)),), dtype="f64"))
    assert v.status == "pass" and v.metrics(1.0)["power_output"] == 5.0


def test_vacuity_says_nothing_for_an_unknown_dtype():
    assert vacuity({"x": np.inf}, "i32") is None


# --- statuses, exit codes and reports ----------------------------------------------------
def test_vacuous_counts_apart_and_fails_only_under_strict():
    rows = [Result("gradcheck", "a", "pass"), Result("gradcheck", "b", "vacuous", message="v")]
    assert summarize(rows)["vacuous"] == 1
    assert exit_status(rows) == 0 and exit_status(rows, strict=True) == 1
    doc = json.loads(render_json(rows, "gradcheck"))
    assert doc["summary"]["vacuous"] == 1


def _case(op, text):
    return next(c for c in registry_cases(get_op(op)) if str(c) == text)


# --- the registry's rows that were vacuous (issue: every PASS must be able to fail) ---------
FORMERLY_VACUOUS = [
    # clamp's first parameter set had every input outside [-0.5, 0.5]: a zero gradient
    ("clamp", "clamp(type=f32,x=[3,4],max=2.5,min=-0.5)"),
    # softmax masks of large negatives everywhere left one key per row: one-hot, zero grads
    ("softmax", "softmax(type=f32,x=[2,3,5],mask=[3,5],scale=1)"),
    # a cotangent constant along the softmax/norm axis is in the VJP's null space
    ("softmax", "softmax(type=f32,x=[2,2,3,4],mask=[3,4],scale=1,cotangent=expanded_first)"),
    ("norm", "norm(type=f32,x=[2,2,3,5],eps=0.1,cotangent=expanded_first)"),
    # tanh over [-150, 150] saturated everywhere
    ("tanh", "tanh(type=f64,x=[5,7])"),
    # relu of an expanded input whose few leaf values were all negative
    ("relu", "relu(type=bf16,x=[3,5]expand[0])"),
]


@pytest.mark.parametrize("op,text", FORMERLY_VACUOUS, ids=[t for _, t in FORMERLY_VACUOUS])
def test_the_formerly_vacuous_rows_now_can_fail(op, text):
    row = check_sample(_case(op, text))
    assert row.status == "pass", row.message
    assert row.metrics["power"] <= VACUOUS_BEYOND[row.labels["dtype"]]
    # and the injected 2x error they used to let through now fails them
    assert check_sample(_case(op, text), inject="scale:2").status == "fail"


def test_the_expanded_cotangent_of_softmax_and_norm_runs_along_the_first_axis():
    for op in ("softmax", "norm"):
        layouts = {c.cotangent for c in registry_cases(get_op(op))}
        assert "expanded_first" in layouts and "expanded" not in layouts
    assert "expanded" in {c.cotangent for c in registry_cases(get_op("rms_norm"))}


def test_a_zero_by_definition_op_checks_for_exact_zeros():
    case = registry_cases(get_op("sgn"))[1]
    row = check_sample(case)
    assert row.status == "pass" and "zero by definition" in row.message
    assert "power" not in row.metrics           # the gradient is held to exact zeros
    assert row.metrics["power_output"] < 0.1
    why = zero_gradient(case)
    assert "piecewise constant" in why and zero_gradient(registry_cases(get_op("relu"))[0]) == ""
    # a gradient of 1e-30 is no zero: no tolerance to hide in
    grads = [np.array([0.0, -0.0, 1e-30])]
    (problem,) = nonzero_problems(why, case, [0], grads)
    assert "1/3 elements that are not exactly 0" in problem
    assert nonzero_problems(why, case, [0], [np.zeros(3)]) == ()


def test_a_users_function_with_a_zero_gradient_is_vacuous():
    from gradcheck.api import check_numpy
    row = check_numpy(lambda x: np.maximum(x, 0.0), lambda g, x: [g * (x > 0)],
                      [-np.linspace(1.0, 2.0, 6)])
    assert row.status == "vacuous"
    assert "its reference gradient is 0 everywhere" in row.message


def test_cli_strict_exits_1_on_a_vacuous_row(monkeypatch, capsys):
    import gradcheck.cli as cli
    vacuous = Result("gradcheck", "relu(type=f64,x=[3])", "vacuous",
                     message="vacuous: x: its reference gradient is 0 everywhere",
                     labels={"op": "relu", "dtype": "f64"})
    monkeypatch.setattr(cli, "rows_of", lambda *a: [vacuous])
    argv = ["--op", "relu", "--dtype", "f64", "--no-progress"]
    assert cli.main(argv) == 0
    assert "vacuous (1), by reason:\n  1  vacuous: x: its reference gradient is 0 everywhere" \
        in capsys.readouterr().out
    assert cli.main([*argv, "--strict"]) == 1
    assert "vacuous (1): these checks could not have failed" in capsys.readouterr().out


# --- mixed precision: judged by what is computed ---------------------------------------------
MIXED = [c for c in registry_cases(get_op("matmul")) if ":f16" in str(c) or ":bf16" in str(c)]


def test_a_float32_product_of_16_bit_weights_is_judged_in_float32():
    from gradcheck.precision import judged_dtypes
    case = next(c for c in MIXED if str(c) == "matmul(type=f32,a:f16=[3,4],b=[4,5])")
    out, dtypes = judged_dtypes(case, np.zeros((3, 5), np.float32))
    assert (out, dtypes) == ("f32", {"a": "f16", "b": "f32"})
    # a composite's intermediates may be stored in 16 bits: its case's precision decides
    block = registry_cases(get_op("mlp_block"))[0]
    assert judged_dtypes(block, np.zeros(3, np.float32))[0] == block.precision


@pytest.mark.parametrize("case", MIXED, ids=str)
def test_the_mixed_precision_rows_catch_a_one_percent_gradient_error(case):
    assert len(MIXED) == 8
    assert check_sample(case).status == "pass"
    assert check_sample(case, inject="scale:1.01").status == "fail"


def test_a_users_softmax_is_checked_with_a_stride_0_cotangent_along_the_first_axis():
    """A cotangent constant along softmax's axis lies in its VJP's null space: the user's
    function gets the stride-0 check along the first axis instead of a vacuous one."""
    from gradcheck.api import check_numpy

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def vjp(g, x):
        y = softmax(x)
        return [y * (g - (g * y).sum(-1, keepdims=True))]
    row = check_numpy(softmax, vjp, [np.random.default_rng(0).normal(size=(3, 4))])
    assert row.status == "pass", row.message
    assert row.labels["cotangents"] == "contiguous,permuted,sliced,expanded_first"


# --- the injection reaches other engines' rows -------------------------------------------------
def test_a_factor_mutation_reaches_another_engines_rows():
    from gradcheck.request import check_ops
    rows = check_ops(["relu", "softmax_back"], dtype="f64", engine="torch", inject="scale:1.1",
                     ad="both")
    # every row fails, but a backward op's forward-mode ones: it has no gradient of its own
    assert rows and all(r.status == "fail" or (r.status == "skip" and "[fwd]" in r.name)
                        for r in rows), [(r.name, r.status) for r in rows if r.status != "fail"]


def test_a_named_mutant_is_ours_only():
    from gradcheck.request import GradcheckRequest
    problem = GradcheckRequest(op=("relu",), engine="torch", inject="relu_grad_scaled").problem()
    assert "a named mutant patches our engine" in problem
    assert GradcheckRequest(op=("relu",), engine="torch", inject="scale:2").problem() is None


def test_an_isolated_engine_scaled_keeps_its_backward_ops_in_the_worker():
    from gradcheck.injection import ScaledAdapter

    class Isolated:
        name, isolated = "x", True

        def forward(self, case, arrays):          # would run in this process: not offered
            raise AssertionError
    scaled = ScaledAdapter(Isolated(), 1.1)
    assert scaled.isolated is False and not hasattr(scaled, "forward")
    assert not hasattr(scaled, "jvp")             # the engine has none: neither has this
