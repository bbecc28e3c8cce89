"""optcheck's self-test: every kernel mutant is caught, the bug-free control is not."""

from __future__ import annotations

import numpy as np

import engine
from engine.optim import schedules
from engine.registry import get_op
from optcheck.mutants import CONTROL, MUTANTS, mutated
from optcheck.selftest import power, run_self_test


def test_every_mutant_is_caught_and_the_control_passes():
    results = run_self_test(steps=30)
    by_name = {r.name.split(":")[0]: r for r in results}
    controls = {CONTROL.name} | {f"control_{m.dtype}" for m in MUTANTS.values() if m.dtype}
    assert controls == {"control", "control_bf16", "control_f16"}
    assert set(by_name) == controls | set(MUTANTS)
    for name, r in by_name.items():
        assert r.status == "pass", (name, r.message)
        if name not in controls:
            assert r.metrics["caught_by"], name
        if MUTANTS.get(name) is not None and MUTANTS[name].dtype:
            assert r.labels["dtype"] == MUTANTS[name].dtype
            assert r.metrics["caught_by"].startswith("precision"), name
    assert power(results) == (len(MUTANTS), len(MUTANTS))


def test_a_toothless_mutant_is_reported_as_missed():
    from optcheck.mutants import Mutant
    toothless = Mutant("toothless", "the correct kernel under another name",
                       {"sgd_step": get_op("sgd_step").kernels["cpu"]}, ("sgd",))
    MUTANTS["toothless"] = toothless
    try:
        results = run_self_test(families=("closed-form",), steps=10)
    finally:
        del MUTANTS["toothless"]
    row = next(r for r in results if r.name.startswith("toothless"))
    assert row.status == "fail" and "MISSED" in row.message


def test_mutated_restores_the_kernels():
    before = {name: dict(get_op(name).kernels) for name in ("sgd_step", "adam_step",
                                                             "adamw_step")}
    w = engine.param((3,), "f64", name="w")
    with mutated(MUTANTS["dampening_ignored"]):
        assert get_op("sgd_step").kernels["cpu"] is not before["sgd_step"]["cpu"]
    assert {name: dict(get_op(name).kernels) for name in before} == before
    opt = engine.optim.SGD([w], lr=1.0)
    opt.grads[w].set([1.0, 2.0, 3.0])
    opt.step()
    assert np.array_equal(w.numpy(), [-1.0, -2.0, -3.0])


SCHEDULE_MUTANTS = [name for name, m in MUTANTS.items() if m.schedules]


def test_schedule_mutants_are_caught_by_the_torch_rows_alone():
    """A warmup whose second phase is not shifted: the engine's other families compare it
    with itself and pass; the torch family's SequentialLR row fails, from the milestone on."""
    assert {"warmup_cosine_unshifted", "warmup_step_unshifted"} <= set(SCHEDULE_MUTANTS)
    results = run_self_test(families=("closed-form", "torch", "invariant"), steps=20,
                            mutants=SCHEDULE_MUTANTS)
    by_name = {r.name.split(":")[0]: r for r in results}
    assert by_name[CONTROL.name].status == "pass", by_name[CONTROL.name].message
    for name in SCHEDULE_MUTANTS:
        row = by_name[name]
        assert row.status == "pass" and row.metrics["caught_by"] == "torch (1)", row.message
        schedule = next(iter(MUTANTS[name].schedules))
        assert f"schedule_{schedule}(" in row.message and "first diverged at step 6" in \
            row.message, row.message      # 20 steps: a warmup of 5, the milestone at step 6


def test_mutated_restores_the_schedules():
    schedule = schedules.warmup_cosine(2, 6)
    before = [schedule(t) for t in range(8)]
    with mutated(MUTANTS["warmup_cosine_unshifted"]):
        assert [schedule(t) for t in range(8)] != before
        assert schedule(0) == before[0] and schedule(2) == schedules.cosine(4, 0.0)(2)
    assert [schedule(t) for t in range(8)] == before
    assert schedules.WarmupCosine.__call__ is not MUTANTS[
        "warmup_cosine_unshifted"].schedules["warmup_cosine"]
