"""ggml's test-opt toy model: every row holds on the engine, and a kernel that steps twice as
far is caught."""

from __future__ import annotations

import pytest

from engine.registry import OPS
from optcheck.closed_form_toy import toy_cases

CHECKS = ["toy_forward", "toy_epoch", "toy_split"] + ["toy_accumulation"] * 4


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_every_toy_row_holds(optimizer, dtype):
    cases = toy_cases(optimizer, dtype, "cpu")
    assert [check for check, _, _ in cases] == CHECKS
    for check, case, compare in cases:
        assert case.startswith(f"{check}(w0=3,x=0..5,") and " " not in case
        comparison = compare()
        assert comparison.ok and comparison.compared > 0, (case, comparison.describe())


def test_a_doubled_step_is_caught(monkeypatch):
    original = OPS["sgd_step"].kernels["cpu"]

    def doubled(out, ins, **flags):
        before = out.copy()
        original(out, ins, **flags)
        out += out - before

    monkeypatch.setitem(OPS["sgd_step"].kernels, "cpu", doubled)
    verdicts = {case: compare().ok for _, case, compare in toy_cases("sgd", "f64", "cpu")}
    assert verdicts.pop("toy_forward(w0=3,x=0..5,loss=sum,batch=1)")   # no step taken
    assert not any(verdicts.values()), verdicts
