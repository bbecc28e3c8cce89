"""The invariant family: every invariant holds for the engine's optimizers, its rows follow
the contract and say what they claim, and the numpy kernels without a bug (the control of
the mutants in test_training_loop_invariants and test_step_invariants) pass."""

from __future__ import annotations

import re

import pytest

from engine.registry import OPS
from optcheck.invariants import INVARIANTS, run
from tests.optcheck.invariant_mutants import MUTANT_STEPS, failing, mutant_kernels

CHECKS = tuple(INVARIANTS)


@pytest.mark.parametrize("dtype", ["f64", "f32"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_every_invariant_holds(optimizer, dtype):
    rows = run(optimizer, dtype)
    assert [r.labels["check"] for r in rows] == list(CHECKS)
    bad = [f"{r.labels['check']}: {r.status} {r.message}" for r in rows if not r.ok]
    assert not bad, bad
    for r in rows:
        assert r.labels["family"] == "invariant" and r.labels["dtype"] == dtype
        assert re.fullmatch(r"[a-z0-9_]+", r.labels["check"])
        assert "\n" not in r.name and r.name.startswith(f"{optimizer}: {r.labels['check']}(")
        assert r.metrics["max_abs_err"] is not None


def test_rows_say_what_they_claim():
    rows = {r.labels["check"]: r for r in run("adam", "f64", steps=MUTANT_STEPS)}
    assert "holds up to eps" in rows["gradient_scale"].name
    sgd_scale = run("sgd", "f64", steps=MUTANT_STEPS, checks=("gradient_scale",))[0]
    assert "c*g with lr == g with c*lr" in sgd_scale.name
    adamw = run("adamw", "f64", steps=MUTANT_STEPS, checks=("weight_decay_l2",))[0]
    assert adamw.metrics["l2_form_diff"] > 1e-3   # decoupled decay is visibly not L2
    assert rows["determinism"].metrics["seed_diff"] > 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        run("rmsprop")
    with pytest.raises(ValueError, match="dtype"):
        run("sgd", "f16")
    with pytest.raises(ValueError, match="steps must be >= 2, got 1"):
        run("sgd", steps=1)
    with pytest.raises(ValueError, match="unknown check"):
        run("sgd", checks=("no_such_check",))


@pytest.mark.parametrize("dtype", ["f64", "f32"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_the_numpy_kernels_without_a_bug_pass(optimizer, dtype):
    """The control for the kernel mutants: their failures come from the bug alone."""
    with mutant_kernels(None):
        assert failing(optimizer, dtype, CHECKS) == set()


def test_a_crashing_kernel_gives_error_rows_not_a_crash(monkeypatch):
    def broken(out, ins, **kw):
        raise RuntimeError("kernel exploded")
    monkeypatch.setitem(OPS["adam_step"].kernels, "cpu", broken)
    rows = run("adam", "f64", steps=MUTANT_STEPS)
    assert [r.labels["check"] for r in rows] == list(CHECKS)
    assert {r.status for r in rows} == {"error"}
    assert all("RuntimeError in op adam_step's kernel broken" in r.message
               and r.message.endswith("kernel exploded") for r in rows)
