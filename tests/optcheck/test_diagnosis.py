"""optcheck.diagnosis: the update pieces compose to the correct rules, every known variant
injected as a buggy optimizer is named by the reference family's failing row, the correct
rule and an unrelated bug are not, and the diagnosis is fast and never breaks a row."""

from __future__ import annotations

import numpy as np
import pytest

from optcheck import reference
from optcheck.adapters.numpy_adapter import NumpyUpdate
from optcheck.api import check_optimizer
from optcheck.diagnosis import (
    ADAM_DEMO,
    SGD_DEMO,
    VARIANTS,
    Diagnosis,
    Setting,
    applicable,
    diagnose,
    numpy_update,
)
from optcheck.numpy_optimizers import NUMPY_OPTIMIZERS
from optcheck.selftest import power, run_diagnosis_self_test, run_self_test
from optcheck.torch_trajectories import Scenario, initial_params, objective_grad, scenarios
from optcheck.update_pieces import Chain, Layout, run_chain
from tests.optcheck import numpy_adamw

RULES = ("sgd", "adam", "adamw")
ASKED_FOR = {
    "eps inside sqrt", "no bias correction", "bias correction on m only",
    "bias correction on v only", "bias correction applied to eps",
    "coupled (L2) decay instead of decoupled", "decoupled decay instead of L2",
    "decay not multiplied by lr", "decay applied twice", "step counter starting at 0",
    "step counter advancing per parameter", "Nesterov missing", "dampening ignored",
    "dampening applied on the first step", "AMSGrad keeping the maximum of m",
    "AMSGrad keeping the maximum of the corrected v", "momentum buffer started at zero",
    "state kept in bf16", "state kept in f16", "f32 state for f64 parameters",
    "duplicated bias correction", "decay applied to already-updated parameters",
}


def _grads_along(rule, scenario, steps=100, seed=0):
    """The gradients of the float64 numpy optimizer's own trajectory, and its snapshots."""
    init, offsets = initial_params(seed, "f64")
    init_fn, update_fn = NUMPY_OPTIMIZERS[rule]
    params = {k: v.copy() for k, v in init.items()}
    states = {k: init_fn(p, scenario.hp, scenario.flags) for k, p in params.items()}
    sign = -1.0 if scenario.flags.get("maximize") else 1.0
    grads, snaps = [], []
    for _ in range(steps):
        grad = objective_grad(params, offsets, sign)
        snap = {}
        for k in params:
            params[k], states[k] = update_fn(params[k], grad[k], states[k], scenario.hp,
                                             scenario.flags)
            snap[k] = params[k]
            snap.update({f"{k}.{s}": v for s, v in states[k].items()})
        grads.append(grad)
        snaps.append(snap)
    return init, grads, snaps


def _scaled_err(got, want):
    return float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))


def _split(flat):
    return ({k: v for k, v in flat.items() if not isinstance(v, bool)},
            {k: v for k, v in flat.items() if isinstance(v, bool)})


def _trace(chain, rule, flat, dtype="f64", steps=100):
    """The reference family's trace of `chain` run as a numpy update at flat settings."""
    hp, flags = _split(flat)
    trace = reference.Trace()
    adapter = NumpyUpdate(*numpy_update(chain, rule), rule)
    reference.follow(adapter, rule, Scenario("t", hp, flags), dtype, steps, 0, trace)
    return hp, flags, trace


# --------------------------------------------------------------------------- the pieces

@pytest.mark.parametrize("rule", RULES)
def test_the_pieces_compose_to_the_numpy_optimizers_over_the_grid(rule):
    for scenario in scenarios(rule, 100):
        init, grads, want = _grads_along(rule, scenario)
        got = run_chain(Chain.of(rule), init, grads, scenario.hp, scenario.flags)
        for (params, state), snap in zip(got, want, strict=True):
            for k, p in params.items():
                assert _scaled_err(p, snap[k]) < 1e-13, (str(scenario), k)
                for name, value in state.items():
                    if name != "count":
                        assert _scaled_err(value[k], snap[f"{k}.{name}"]) < 1e-13, \
                            (str(scenario), k, name)


def test_a_chain_refuses_a_slot_its_rule_lacks():
    with pytest.raises(ValueError, match="sgd has no slot denominator"):
        Chain.of("sgd", denominator=())


def test_layout_round_trips():
    params = {"a": np.arange(6.0).reshape(2, 3), "b": np.array(7.0), "c": np.ones(2)}
    layout = Layout.of(params)
    flat = layout.flat(params)
    assert flat.shape == (9,) and list(layout.segment) == [0] * 6 + [1] + [2] * 2
    assert all(np.array_equal(v, params[k]) for k, v in layout.split(flat).items())


# --------------------------------------------------------------------------- the library

def test_the_library_has_every_variant_asked_for_each_applying_at_its_demo():
    assert ASKED_FOR <= set(VARIANTS)
    for v in VARIANTS.values():
        assert set(v.rules) <= set(RULES) and v.rules, v.name
        rule, flat = v.demo
        hp, flags = _split(flat)
        assert rule in v.rules and v in applicable(rule, Setting(hp, flags)), v.name
        if v.same_as:
            assert VARIANTS[v.same_as].same_as == v.name


@pytest.mark.parametrize("rule", RULES)
def test_a_variant_that_does_not_apply_is_a_no_op_there(rule):
    """`applies` is false only where the variant's updates are the correct rule's."""
    for scenario in scenarios(rule, 100):
        setting = Setting(scenario.hp, scenario.flags, "f64", 4)
        init, grads, _ = _grads_along(rule, scenario, steps=30)
        right = run_chain(Chain.of(rule), init, grads, scenario.hp, scenario.flags)
        for v in VARIANTS.values():
            if rule not in v.rules or v.applies(setting):
                continue
            got = run_chain(v.chain(rule), init, grads, scenario.hp, scenario.flags)
            for (params, _), (want, _) in zip(got, right, strict=True):
                for k in params:
                    assert _scaled_err(params[k], want[k]) < 1e-13, (v.name, str(scenario))


def test_a_no_op_variant_is_no_candidate():
    no_damping = Setting({**_split(SGD_DEMO)[0], "dampening": 0.0}, _split(SGD_DEMO)[1])
    names = {v.name for v in applicable("sgd", no_damping)}
    assert "dampening ignored" not in names and "dampening applied on the first step" \
        not in names
    assert "f32 state for f64 parameters" not in {
        v.name for v in applicable("adam", Setting(*_split(ADAM_DEMO), dtype="f32"))}


# --------------------------------------------------------------------------- naming

@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_injected_is_named(name):
    rows = run_diagnosis_self_test(variants=[name])
    control, row = rows
    assert control.status == "pass", control.message
    assert row.status == "pass", row.message
    assert name in row.metrics["diagnosis"].split(" or ")
    if VARIANTS[name].same_as:
        assert "identical updates at every setting" in row.message


@pytest.mark.parametrize("name", ["eps inside sqrt", "coupled (L2) decay instead of decoupled",
                                  "dampening ignored", "step counter starting at 0",
                                  "AMSGrad keeping the maximum of the corrected v"])
def test_variants_are_named_in_float32_too(name):
    rows = run_diagnosis_self_test("f32", variants=[name])
    assert all(r.status == "pass" for r in rows), [r.message for r in rows]


def test_the_nan_of_a_counter_from_0_is_matched():
    v = VARIANTS["step counter starting at 0"]
    hp, flags, trace = _trace(v.chain("adam"), "adam", ADAM_DEMO)
    assert np.isnan(trace.observed[0]["w0"])
    found = diagnose("adam", hp, flags, "f64", trace.init, trace.grads, trace.observed)
    assert found.match and found.best == v.name and found.best_err == 0
    assert found.correct_err == np.inf


@pytest.mark.parametrize("rule", RULES)
def test_the_correct_rule_is_not_diagnosed_as_a_variant(rule):
    flat = SGD_DEMO if rule == "sgd" else ADAM_DEMO
    hp, flags, trace = _trace(Chain.of(rule), rule, flat)
    found = diagnose(rule, hp, flags, "f64", trace.init, trace.grads, trace.observed)
    assert not found.match and found.named == ()
    assert found.correct_err <= found.threshold
    assert found.message.startswith("matches no known variant")
    rows = reference.run(rule, "f64", steps=30,
                         adapter=NumpyUpdate(*numpy_update(Chain.of(rule), rule), rule))
    assert all(r.status == "pass" and "diagnosis" not in r.metrics for r in rows)


def _lr_times_1_5(params, grads, state, step, hparams):
    return numpy_adamw.update(params, grads, state, step, {**hparams,
                                                           "lr": 1.5 * hparams["lr"]})


def test_an_unrelated_bug_matches_no_known_variant():
    row = reference.user_row(NumpyUpdate(numpy_adamw.init, _lr_times_1_5, "adamw"), "adamw",
                             *_split(ADAM_DEMO), "f64")
    assert row.status == "fail"
    assert "matches no known variant (closest: `" in row.message
    assert row.metrics["diagnosis"] == "none"


def test_the_reference_familys_failing_row_carries_the_diagnosis():
    rows = check_optimizer(numpy_adamw.init, numpy_adamw.update_eps_inside_sqrt, "adamw",
                           dtypes=("f64",))
    failed = [r for r in rows if r.labels["family"] == "reference" and not r.ok]
    assert failed
    for r in failed:
        assert "from the float64 reference; matches `eps inside sqrt` to " in r.message
        assert r.metrics["diagnosis"] == "eps inside sqrt"
    passed = [r for r in rows if r.labels["family"] == "reference" and r.ok]
    assert all("diagnosis" not in r.metrics for r in passed)


def test_a_failing_diagnosis_is_in_the_message_not_raised(monkeypatch):
    import optcheck.diagnosis

    def broken(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(optcheck.diagnosis, "diagnose", broken)
    row = reference.user_row(NumpyUpdate(numpy_adamw.init, numpy_adamw.update_eps_inside_sqrt,
                                         "adamw"), "adamw", *_split(ADAM_DEMO), "f64", steps=5)
    assert row.status == "fail"
    assert row.message.endswith("diagnosis failed: RuntimeError: boom")
    assert row.metrics["diagnosis"] == "failed"


def test_the_diagnosis_names_the_variant_among_the_most_candidates():
    """4 tensors x 100 steps, at settings where the most variants apply (AdamW with decay,
    amsgrad and maximize: 21 candidates). How long it takes is a figure of
    bench/bench_optcheck.py (target under 1 s), not of a test on a shared machine."""
    flat = {**ADAM_DEMO, "amsgrad": True, "maximize": True}
    hp, flags, trace = _trace(VARIANTS["eps inside sqrt"].chain("adamw"), "adamw", flat)
    assert len(trace.observed) == 100 and len(trace.init) == 4
    found = diagnose("adamw", hp, flags, "f64", trace.init, trace.grads, trace.observed)
    assert found.best == "eps inside sqrt" and found.candidates >= 20


def test_the_message_forms():
    named = Diagnosis("eps inside sqrt", 3e-9, "no bias correction", 2e-2, 1e-2, 1e-8, 100,
                      True)
    assert named.message == ("matches `eps inside sqrt` to 3e-9 over 100 steps (next best: "
                             "`no bias correction`, 2e-2)")
    none = Diagnosis("eps inside sqrt", 0.4, "no bias correction", 0.5, 0.3, 1e-10, 100,
                     False)
    assert none.message.startswith("matches no known variant (closest: `eps inside sqrt`, "
                                   "4e-1")
    assert Diagnosis(None, np.inf, None, np.inf, 1.0, 1e-10, 100, False).message == \
        "matches no known variant (none applies at these settings)"


def test_the_self_test_runs_the_diagnosis_rows_beside_the_mutants():
    results = run_self_test(families=("reference",), steps=10, mutants=[], diagnosis=True)
    diagnosis_rows = [r for r in results if r.name.startswith("diagnosis: ")]
    assert len(diagnosis_rows) == len(VARIANTS) + len(RULES)
    assert all(r.status == "pass" for r in results), [r.message for r in results if not r.ok]
    assert power(results) == (0, 0)
    quiet = run_self_test(families=("closed-form",), steps=5, mutants=[], diagnosis=True)
    assert not any(r.name.startswith("diagnosis") for r in quiet)


# the self-test's kernel mutants (an implementation of their own, in the engine) and the
# variant each is
MUTANT_VARIANTS = {"bias_correction_dropped": "no bias correction",
                   "eps_inside_sqrt": "eps inside sqrt",
                   "decay_coupled": "coupled (L2) decay instead of decoupled",
                   "nesterov_term_missing": "Nesterov missing",
                   "dampening_ignored": "dampening ignored",
                   "amsgrad_max_not_kept": "AMSGrad maximum not kept"}


@pytest.mark.parametrize("mutant", list(MUTANT_VARIANTS))
def test_the_engines_kernel_mutants_are_diagnosed(mutant):
    from optcheck.mutants import MUTANTS, mutated
    with mutated(MUTANTS[mutant]):
        rows = reference.run(MUTANTS[mutant].optimizers[-1], "f64", steps=50)
    failed = [r for r in rows if not r.ok]
    assert failed
    assert {r.metrics["diagnosis"] for r in failed} == {MUTANT_VARIANTS[mutant]}, \
        [r.message for r in failed]
