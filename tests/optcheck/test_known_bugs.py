"""optcheck's known-bugs family and the adapter invariants (optcheck.known_bugs,
optcheck.adapter_invariants): each case passes a correct optimizer and fails the bug it was
made from, injected into a numpy update or an adapter as an engine writer would write it."""

from __future__ import annotations

import numpy as np
import pytest

from optcheck import adapter_invariants, known_bugs
from optcheck.adapters import get_adapter
from optcheck.adapters.numpy_adapter import NumpyUpdate
from optcheck.adapters.torch_adapter import TorchForLoop
from optcheck.runner import run_family
from tests.optcheck import numpy_adamw

pytest.importorskip("torch")


def _adamw(update, name="buggy"):
    return NumpyUpdate(numpy_adamw.init, update, "adamw", name)


def _status(rows, check):
    [row] = [r for r in rows if r.labels["check"] == check]
    return row


def _hp(hparams):
    return hparams["lr"], *hparams["betas"], hparams["eps"], hparams["weight_decay"]


def adamw_state_in(dtype):
    """AdamW keeping its moments in `dtype` whatever the parameters' (f32 state for f64
    parameters)."""
    def update(params, grads, state, step, hparams):
        lr, b1, b2, eps, wd = _hp(hparams)
        out, new = {}, {}
        for k, p in params.items():
            g = grads[k].astype(dtype)
            m = (b1 * state[k]["exp_avg"] + (1 - b1) * g).astype(dtype)
            v = (b2 * state[k]["exp_avg_sq"] + (1 - b2) * g * g).astype(dtype)
            step_ = (m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps)
            out[k] = (p - (lr * step_ + lr * wd * p)).astype(p.dtype)
            new[k] = {"exp_avg": m, "exp_avg_sq": v}
        return out, new
    return update


def adamw_counter_from_zero(params, grads, state, step, hparams):
    """The step counter starting at 0 (tracel-ai/burn#630): 1 - beta^0 = 0 at step 1."""
    return numpy_adamw.update(params, grads, state, step - 1, hparams)


def adamw_beta2_for_m(params, grads, state, step, hparams):
    """m averaged with beta2, and corrected with it: step 1 is m_hat = g whatever the
    coefficient, so a one-step test passes it (optax#1715's kind)."""
    b1, b2 = hparams["betas"]
    return numpy_adamw.update(params, grads, state, step, {**hparams, "betas": (b2, b2)})


def adamw_eps_in_param_dtype(params, grads, state, step, hparams):
    """eps stored in the parameter's dtype: 1e-8 is 0 in float16 (optax#1755)."""
    dtype = next(iter(params.values())).dtype
    return numpy_adamw.update(params, grads, state, step,
                              {**hparams, "eps": float(np.asarray(hparams["eps"], dtype))})


_CALLS = {"n": 0}


def adamw_counting_in_a_global(params, grads, state, step, hparams):
    """The step count kept outside the state (a closure or a global): a restored optimizer
    starts its bias corrections over."""
    _CALLS["n"] += 1
    return numpy_adamw.update(params, grads, state, _CALLS["n"], hparams)


def adamw_eps_hard_coded(params, grads, state, step, hparams):
    """eps fixed at 1e-8 whatever the settings say."""
    return numpy_adamw.update(params, grads, state, step, {**hparams, "eps": 1e-8})


def adamw_decay_without_lr(params, grads, state, step, hparams):
    """The decay p * (1 - wd), not multiplied by lr."""
    wd = hparams["weight_decay"]
    decayed = {k: (p - wd * p).astype(p.dtype) for k, p in params.items()}
    return numpy_adamw.update(decayed, grads, state, step, {**hparams, "weight_decay": 0.0})


def adamw_noisy(params, grads, state, step, hparams):
    """A nondeterministic reduction, as a race leaves it: a last-bit wobble."""
    new, state = numpy_adamw.update(params, grads, state, step, hparams)
    rng = np.random.default_rng()
    return {k: (v * (1 + 1e-7 * rng.standard_normal(v.shape))).astype(v.dtype)
            for k, v in new.items()}, state


class FirstGroupSettings(TorchForLoop):
    """torch.optim whose param groups all take the first group's settings (a per-group bug:
    the settings read once, not per group)."""

    def grouped_stepper(self, optimizer, groups):
        first = groups[0]
        return super().grouped_stepper(
            optimizer, [type(g)(g.init, first.hp, first.flags, g.dtype) for g in groups])


# ------------------------------------------------------------------------ correct ones pass

@pytest.mark.parametrize("name", ["engine", "torch-foreach"])
@pytest.mark.parametrize("rule", ["sgd", "adam", "adamw"])
def test_the_adapter_invariants_hold_for_correct_optimizers(name, rule):
    rows = adapter_invariants.run(rule, "f32", get_adapter(name))
    assert [r.labels["check"] for r in rows] == list(adapter_invariants.CHECKS)
    assert all(r.status == "pass" for r in rows), [(r.name, r.message) for r in rows]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("rule", ["sgd", "adam", "adamw"])
def test_every_known_bug_case_passes_our_engine(rule, dtype):
    rows = known_bugs.run(rule, dtype)
    assert rows and all(r.status == "pass" for r in rows), [(r.name, r.message) for r in rows]


def test_the_hand_written_adamw_passes_the_cases_a_numpy_update_can_run():
    rows = known_bugs.run("adamw", "f32", adapter=_adamw(numpy_adamw.update, "numpy"))
    by = {r.labels["check"]: r.status for r in rows}
    assert by.pop("mixed_dtype_groups") == "unsupported"
    assert set(by.values()) == {"pass"}, rows


# ------------------------------------------------------------------------ bugs are caught

def test_decay_multiplied_on_its_own_is_lost_in_float32_and_kept_in_float64():
    adapter = _adamw(numpy_adamw.update_decay_multiplied_first)
    row = _status(known_bugs.run("adamw", "f32", adapter=adapter), "decay_rounding")
    assert row.status == "fail" and abs(row.metrics["decay_ratio"]) < 0.1
    assert "1 - lr*wd rounds to 1" in row.message
    row = _status(known_bugs.run("adamw", "f64", adapter=adapter), "decay_rounding")
    assert row.status == "pass" and row.metrics["decay_ratio"] == pytest.approx(1, abs=1e-6)


def test_torch_adamw_loses_a_small_decay_in_float32():
    row = _status(known_bugs.run("adamw", "f32", adapter=get_adapter("torch")),
                  "decay_rounding")
    assert row.status == "fail" and row.labels["engine"] == "torch"


def test_eps_rounded_to_float16_divides_zero_by_zero():
    rows = known_bugs.run("adam", "f16",
                          adapter=NumpyUpdate(numpy_adamw.init, adamw_eps_in_param_dtype,
                                              "adam", "buggy"))
    assert _status(rows, "eps_underflow").status == "fail"
    assert "NaN" in _status(rows, "eps_underflow").message


def test_a_step_counter_from_zero_is_caught_at_step_1():
    row = _status(known_bugs.run("adamw", "f32", adapter=_adamw(adamw_counter_from_zero)),
                  "step_counter")
    assert row.status == "fail" and row.metrics["first_step"] == 1


def test_a_bug_that_leaves_step_1_alone_is_named_as_such():
    row = _status(known_bugs.run("adamw", "f64", adapter=_adamw(adamw_beta2_for_m)),
                  "first_step_vs_100")
    assert row.status == "fail" and row.metrics["step1_ok"] is True
    assert "a one-step test would pass this" in row.message


def test_float32_state_for_float64_parameters_fails_the_extreme_gradients():
    rows = known_bugs.run("adamw", "f64", adapter=_adamw(adamw_state_in(np.float32)))
    assert _status(rows, "tiny_gradients").status == "fail"
    assert _status(rows, "huge_gradients").status == "fail"


def test_groups_that_share_the_first_groups_settings_are_caught():
    adapter = FirstGroupSettings()
    assert _status(known_bugs.run("adamw", "f32", adapter=adapter),
                   "mixed_dtype_groups").status == "fail"
    assert _status(adapter_invariants.run("adamw", "f32", adapter),
                   "param_groups").status == "fail"


@pytest.mark.parametrize("update, check", [
    (adamw_decay_without_lr, "lr_zero"),
    (adamw_eps_hard_coded, "gradient_scale"),
    (adamw_noisy, "determinism"),
    (adamw_counting_in_a_global, "save_restore"),
])
def test_each_invariant_catches_its_bug(update, check):
    rows = adapter_invariants.run("adamw", "f64", _adamw(update))
    assert _status(rows, check).status == "fail", _status(rows, check)
    assert _status(rows, "param_groups").status == "unsupported"


def test_through_the_runner_rows_carry_the_engine_and_ours_get_the_new_invariants():
    rows = run_family("invariant", "sgd", "f64", steps=10, engine="torch")
    assert {r.labels["check"] for r in rows} == set(adapter_invariants.CHECKS)
    assert all(r.labels["engine"] == "torch" for r in rows)
    ours = run_family("invariant", "sgd", "f64", steps=10)
    assert {"lr_zero", "param_groups"} <= {r.labels["check"] for r in ours}
    assert all("engine" not in r.labels for r in ours)
