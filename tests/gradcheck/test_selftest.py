"""gradcheck's self-test: every known bug is caught, the registry comes back intact, and a
bug that changes nothing is reported as missed (so the self-test itself can fail)."""

from __future__ import annotations

import pytest

from engine.registry import all_ops
from gradcheck.check import check_sample
from gradcheck.injection import injected, parse
from gradcheck.mutants import MUTANTS, Mutant, scaled
from gradcheck.selftest import caught_by, mutant_cases, power, run_mutant, run_self_test
from reports import Result

TOOTHLESS = Mutant("relu_grad_scaled_by_1", ("relu",), "relu's gradient times 1.0: no bug",
                   scaled("relu", 1.0))


def registry_state():
    """Every op's backward rule, kernels dict and kernels, as objects."""
    return {name: (op.backward, op.kernels, dict(op.kernels)) for name, op in all_ops().items()}


def assert_same_objects(before, after):
    assert before.keys() == after.keys()
    for name, (backward, kernels, entries) in before.items():
        b2, k2, e2 = after[name]
        assert b2 is backward, f"{name}: backward rule not restored"
        assert k2 is kernels, f"{name}: kernels dict not restored"
        assert e2.keys() == entries.keys() and all(e2[k] is v for k, v in entries.items()), \
            f"{name}: a kernel was not restored"


@pytest.mark.parametrize("name", list(MUTANTS))
def test_every_mutant_is_caught(name):
    result = run_mutant(MUTANTS[name])
    assert result.status == "pass", result.message
    assert result.metrics["caught"] >= 1 and result.metrics["caught_by"]


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_patches_and_restores_the_registry(name):
    mutant = MUTANTS[name]
    before = registry_state()
    with mutant.patch():
        during = registry_state()
        assert any(during[op][:2] != before[op][:2] for op in before), "patch changed nothing"
    assert_same_objects(before, registry_state())


@pytest.mark.parametrize("name", list(MUTANTS))
def test_registry_restored_after_an_error(name):
    before = registry_state()
    with pytest.raises(RuntimeError, match="boom"), MUTANTS[name].patch():
        raise RuntimeError("boom")
    assert_same_objects(before, registry_state())


def test_toothless_mutant_is_reported_not_caught():
    result = run_mutant(TOOTHLESS)
    assert result.status == "fail"
    assert result.metrics["caught"] == 0 and result.metrics["cases"] >= 1
    assert "SURVIVED" in result.message


def test_run_self_test_one_result_per_mutant_and_power():
    results = run_self_test(mutants=[TOOTHLESS, MUTANTS["relu_grad_scaled"]])
    assert [r.name for r in results] == ["relu_grad_scaled_by_1", "relu_grad_scaled"]
    assert [r.status for r in results] == ["fail", "pass"]
    assert results[1].labels["ops"] == "relu"
    assert results[1].metrics["caught_by"].startswith("numerical")
    assert power(results) == 0.5


def test_mutant_without_cases_is_an_error():
    nothing = Mutant("never_exercised", ("relu",), "no case fits", scaled("relu", 2.0),
                     where=lambda case: False)
    result = run_mutant(nothing)
    assert result.status == "error" and "no sample case" in result.message


def test_cases_follow_where_and_extra():
    m = MUTANTS["im2col_back_ignores_dilation"]
    cases = mutant_cases(m, ("f32", "f64"), max_cases=5)
    assert cases and all(c.op in m.ops and m.where(c) for c in cases)
    assert {c.dtype for c in cases} == {"f32", "f64"}
    add_cases = [str(c) for c in mutant_cases(MUTANTS["add_broadcast_wrong_axis"])]
    assert add_cases[-1] == "add(type=f64,a=[3,3],b=[3,1])"
    relu = MUTANTS["relu_grad_scaled"]
    assert len(mutant_cases(relu)) == relu.max_cases          # smallest first, a few per op


def test_a_backward_that_ignores_its_gradients_strides_needs_the_cotangent_cases():
    """ggml's pool_2d bug as a mutant of our pool_2d_back kernel: every plain registry case
    of pool_2d lets it through; the cotangent=permuted case catches it."""
    import dataclasses
    m = MUTANTS["pool_back_reads_gradient_as_contiguous"]
    assert run_mutant(m).status == "pass"
    plain = dataclasses.replace(m, name="plain cases only", cotangents=False,
                                where=lambda case: True, max_cases=100)
    survived = run_mutant(plain)
    assert survived.status == "fail" and survived.metrics["caught"] == 0
    assert survived.metrics["cases"] >= 10


def test_caught_by_reads_the_failing_check():
    def r(status, message):
        return Result("gradcheck", "case", status, message=message)
    assert caught_by(r("pass", "")) == []
    assert caught_by(r("fail", "numerical: backprop of x is off; worst x[1]: num 1, bp 2")) \
        == ["numerical"]
    assert caught_by(r("fail", "torch: x: torch disagrees; NaN/Inf: x has 2 non-finite")) \
        == ["torch", "NaN/Inf"]
    assert caught_by(r("error", "error: ShapeError: reshape: cannot reshape")) == ["shape check"]
    assert caught_by(r("error", "error: unexpected IndexError: out of range")) == ["error"]
    assert caught_by(r("fail", "x: 3/10 off, backprop 1, numerical 2")) == ["numerical"]


def test_inject_accepts_a_mutant_name():
    assert parse("softmax_back_no_subtraction") == ("softmax_back_no_subtraction", None)
    assert parse("scale:1.05") == ("scale", 1.05)
    for bad in ("relu_grad_scaled:2", "flip", "scale:x"):
        with pytest.raises(ValueError):
            parse(bad)
    before = registry_state()
    with injected("log_softmax_drops_normaliser", ["relu"]):
        assert all_ops()["log_softmax"].backward is not before["log_softmax"][0]
    assert_same_objects(before, registry_state())


def test_check_sample_with_an_injected_mutant_fails():
    case = mutant_cases(MUTANTS["log_softmax_drops_normaliser"])[0]
    assert check_sample(case).status == "pass"
    assert check_sample(case, inject="log_softmax_drops_normaliser").status == "fail"
