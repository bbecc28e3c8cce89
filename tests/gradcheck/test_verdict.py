"""gradcheck's verdict from comparison outcomes alone: every branch of the arbitration."""

from __future__ import annotations

import pytest

from gradcheck.numeric import Comparison
from gradcheck.verdict import (
    INTEGER_FORWARD_OFF,
    Arbitration,
    GradientOutcome,
    Outcomes,
    arbitrate,
    cpu_problem,
    forward_problem,
    judge,
    kink_problem,
    torch_forward_problem,
    worst_element,
)


def cmp(failures=0, nonfinite=0, checked=12, kinks=0, max_abs=1e-9, max_rel=1e-9,
        worst_index=(0, 3), value=0.5, expected=0.5) -> Comparison:
    return Comparison(checked, kinks, max_abs, max_rel, failures, nonfinite, worst_index,
                      value, expected)


OK, OFF = cmp(), cmp(failures=3, max_abs=0.01, max_rel=0.02, value=0.51)
WORST = "x[0, 3]: num 0.5, bp 0.51"


def grad(bn=OK, bt=OK, nt=OK, name="x", finite=True, torch=True) -> GradientOutcome:
    return GradientOutcome(name, bn, finite, bt if torch else None, nt if torch else None)


# --- the three-way arbitration of one gradient -------------------------------------------
def test_all_three_agree_passes():
    assert arbitrate(grad(), WORST) == Arbitration(None, torch_off=False)


BACKPROP_OFF = ("numerical: backprop of x is off (3/12 elements), numerical and torch agree, "
                f"worst {WORST}")
NUMERICAL_OFF = ("numerical: x: numerical gradient disagrees with backprop and torch (the "
                 "float64 reference's forward does not match the backward of the engine and "
                 "torch)")
TORCH_OFF = ("torch: x: torch disagrees with backprop and numerical (3/12 elements; forward "
             "differs from torch's, or the torch reference is wrong)")
ALL_DISAGREE = "numerical: x: backprop, numerical and torch all disagree"

# (backprop vs numerical, backprop vs torch, numerical vs torch): the problem named
DISAGREEMENTS = {
    "backprop off, numerical and torch agree": ((OFF, OFF, OK), BACKPROP_OFF),
    "numerical off, backprop and torch agree": ((OFF, OK, OK), NUMERICAL_OFF),
    "numerical off, backprop and torch agree (numerical vs torch off)": ((OFF, OK, OFF),
                                                                         NUMERICAL_OFF),
    "torch off, backprop and numerical agree": ((OK, OK, OFF), TORCH_OFF),
    "torch off, backprop and numerical agree (backprop vs torch off)": ((OK, OFF, OFF),
                                                                        TORCH_OFF),
    "all three disagree": ((OFF, OFF, OFF), ALL_DISAGREE),
    "all three disagree (backprop vs torch off alone)": ((OK, OFF, OK), ALL_DISAGREE),
}


@pytest.mark.parametrize("case", DISAGREEMENTS)
def test_a_disagreement_marks_torch_off_and_names_the_one_that_is_off(case):
    (bn, bt, nt), problem = DISAGREEMENTS[case]
    a = arbitrate(grad(bn=bn, bt=bt, nt=nt), WORST)
    assert a.torch_off
    assert a.problem == problem


def test_without_torch_backprop_vs_numerical_decides():
    assert arbitrate(grad(torch=False), WORST) == Arbitration(None)
    a = arbitrate(grad(bn=OFF, torch=False), WORST)
    assert not a.torch_off
    assert a.problem == f"numerical: x 3/12 off vs numerical, worst {WORST}"


@pytest.mark.parametrize("bn, finite", [(cmp(nonfinite=2), True), (OK, False)])
@pytest.mark.parametrize("torch", [True, False])
def test_nan_or_inf_fails_before_any_arbitration(bn, finite, torch):
    a = arbitrate(grad(bn=bn, bt=OFF, nt=OFF, finite=finite, torch=torch), WORST)
    assert a == Arbitration(f"NaN/Inf: x has {bn.nonfinite} non-finite values")


def test_worst_element_text():
    assert worst_element("x", OFF) == WORST
    assert worst_element("directions", cmp(worst_index=None)) == \
        "directions[]: num 0.5, bp 0.5"


# --- the other comparisons ---------------------------------------------------------------
def test_forward_against_the_float64_reference():
    assert forward_problem(OK) is None
    assert forward_problem(True) is None
    assert forward_problem(False) == INTEGER_FORWARD_OFF == \
        "forward: output differs from the float64 reference"
    assert forward_problem(cmp(failures=3, max_abs=0.0123, worst_index=(1,), value=2.0,
                               expected=1.5)) == \
        ("forward: output differs from the float64 reference (3/12 elements, max abs err "
         "0.0123, worst [1]: reference 1.5, engine 2)")
    assert forward_problem(cmp(nonfinite=1, max_abs=float("inf"))).startswith(
        "forward: output has NaN/Inf (0/12 elements, max abs err inf")


def test_forward_against_torch():
    assert torch_forward_problem(None) is None and torch_forward_problem(OK) is None
    assert torch_forward_problem(OFF) == \
        "torch: forward output differs from torch's (3/12 elements, max abs err 0.01)"


def test_kinks_fail_only_when_they_dominate():
    assert kink_problem(0, 0) is None
    assert kink_problem(6, 6) is None
    assert kink_problem(5, 7) == ("kinks: 7 of 12 checked points are kinks "
                                  "(non-differentiable); the sample generator needs fixing")
    assert kink_problem(0, 1) is not None


def test_cpu_differences():
    assert cpu_problem("cuda", ()) is None
    assert cpu_problem("cuda", ("forward", "grad x (1/4, max abs err 0.1)")) == \
        "backend: cuda differs from cpu: forward, grad x (1/4, max abs err 0.1)"


# --- the whole verdict -------------------------------------------------------------------
def test_a_clean_case_passes_with_its_numbers():
    v = judge(Outcomes(OK, (grad(),), torch_ran=True, forward_vs_torch=OK))
    assert (v.status, v.message, v.forward, v.torch, v.vs_cpu) == \
        ("pass", "", "agree", "agree", None)
    assert (v.checked, v.kinks, v.max_abs, v.max_rel) == (12, 0, 1e-9, 1e-9)
    assert v.worst == "x[0, 3]: num 0.5, bp 0.5"


def test_without_torch_the_torch_column_is_na():
    v = judge(Outcomes(OK, (grad(bn=OFF, torch=False),)))
    assert v.status == "fail" and v.torch == "n/a"


def test_problems_come_in_order_and_declined_inputs_are_noted_after():
    v = judge(Outcomes(False, (grad(bn=OFF, bt=OFF, nt=OK), grad(name="y")),
                       torch_ran=True, forward_vs_torch=OFF, differs=True, backend="cuda",
                       vs_cpu=("forward",), declined="mask: no backward"))
    kinds = [p.split(":", 1)[0] for p in v.problems]
    assert kinds == ["forward", "numerical", "torch", "determinism", "backend"]
    assert v.notes == ("declined (not checked): mask: no backward",)
    assert v.message == "; ".join(v.problems) + "; declined (not checked): mask: no backward"
    assert (v.status, v.forward, v.torch, v.vs_cpu) == ("fail", "off", "off", "off")
    assert v.checked == 24


def test_declined_inputs_alone_do_not_fail():
    v = judge(Outcomes(OK, (grad(),), torch_ran=True, declined="labels: integers"))
    assert v.status == "pass" and v.message == "declined (not checked): labels: integers"


def test_torch_forward_alone_makes_torch_off():
    v = judge(Outcomes(OK, (grad(),), torch_ran=True, forward_vs_torch=OFF))
    assert v.status == "fail" and v.torch == "off" and v.forward == "agree"


def test_nan_leaves_torch_agreeing():
    v = judge(Outcomes(OK, (grad(bn=cmp(nonfinite=1)),), torch_ran=True))
    assert v.status == "fail" and v.torch == "agree" and v.problems[0].startswith("NaN/Inf")


def test_kink_dominated_and_determinism():
    v = judge(Outcomes(OK, (grad(bn=cmp(checked=2, kinks=10)),), differs=True))
    assert [p.split(":", 1)[0] for p in v.problems] == ["kinks", "determinism"]
    assert v.problems[1] == "determinism: two backward runs gave different bits"
    assert v.kinks == 10


def test_vs_cpu_agreeing():
    v = judge(Outcomes(OK, (grad(),), backend="cuda", vs_cpu=()))
    assert v.status == "pass" and v.vs_cpu == "agree"


def test_worst_runs_over_the_gradients_and_the_message_quotes_it_so_far():
    small = cmp(failures=1, max_abs=0.001, max_rel=0.5, worst_index=(2,), value=1.0,
                expected=0.999)
    big = cmp(failures=1, max_abs=0.1, max_rel=0.01, worst_index=(4,), value=2.0,
              expected=1.9)
    v = judge(Outcomes(OK, (grad(name="a", bn=big, torch=False),
                            grad(name="b", bn=small, torch=False))))
    assert v.worst == "a[4]: num 1.9, bp 2" and v.max_abs == 0.1 and v.max_rel == 0.5
    # b's problem quotes the worst element so far, a's, as the row's `worst` column does
    assert v.problems == ("numerical: a 1/12 off vs numerical, worst a[4]: num 1.9, bp 2",
                          "numerical: b 1/12 off vs numerical, worst a[4]: num 1.9, bp 2")
