"""optcheck's optax adapter (optcheck.adapters.optax_adapter): optax's sgd, adam and adamw
follow the float64 reference where optax means what torch.optim means; optax's AMSGrad,
which keeps the maximum of the bias-corrected second moment, is reported as the difference
it is; param groups, save/restore, the state dtypes of 16-bit parameters; a wrong mapping
fails; without optax, one line that says how to install it."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

import optcheck.adapters
from optcheck import closed_form, reference, runner
from optcheck.adapters import AdapterError, get_adapter
from optcheck.adapters.base import Group
from optcheck.cli import main
from optcheck.numpy_optimizers import NUMPY_OPTIMIZERS
from optcheck.torch_trajectories import initial_params, objective_grad

MISSING = "optax is not installed: pip install 'gradverify[optax]'"
ADAM = {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1}
ADAM_FLAGS = {"amsgrad": False, "maximize": False}
SGD = {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.1}
SGD_FLAGS = {"nesterov": False, "maximize": False}
STEPS = 30


@pytest.fixture(scope="module")
def adapter():
    pytest.importorskip("optax", reason=MISSING)
    return get_adapter("optax")


def _trajectory(stepper, init: dict, offsets: dict, steps: int) -> list[dict]:
    """`steps` steps on the objective's gradient at the stepper's own parameters, rounded to
    the parameters' dtype; every snapshot."""
    snaps, current = [], init
    for _ in range(steps):
        grads = objective_grad(current, offsets, 1.0)
        stepper.step({k: g.astype(init[k].dtype) for k, g in grads.items()})
        snaps.append(stepper.snapshot())
        current = {k: snaps[-1][k] for k in init}
    return snaps


# ------------------------------------------------------------------ the reference family

def test_describe_names_optax_and_jax_on_the_cpu(adapter):
    assert re.fullmatch(r"optax \S+ \(jax \S+, cpu\)", adapter.describe())


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("rule", ["sgd", "adam", "adamw"])
def test_optax_follows_the_reference_where_it_means_what_torch_means(adapter, rule, dtype):
    rows = reference.run(rule, dtype, steps=STEPS, adapter=adapter)
    agreeing = [r for r in rows if "amsgrad" not in r.name]
    assert agreeing and all(r.status == "pass" for r in agreeing), \
        [(r.name, r.message) for r in agreeing if r.status != "pass"]
    if rule == "sgd":   # dampening, through a schedule on optax's own count, and Nesterov
        assert any("dampening=0.5" in r.name and "momentum=0.9" in r.name for r in agreeing)
        assert any("nesterov" in r.name for r in agreeing)


def test_the_momentum_buffer_starts_as_the_gradient_with_its_decay(adapter):
    p0, g = np.array([1.0, -2.0, 3.0]), np.array([0.5, 0.25, -1.0])
    stepper = adapter.stepper("sgd", {"w0": p0}, SGD, SGD_FLAGS, "f64")
    stepper.step({"w0": g})
    snap = stepper.snapshot()
    np.testing.assert_array_equal(snap["w0.momentum_buffer"], g + SGD["weight_decay"] * p0)
    assert "w0.step" not in snap        # torch's SGD keeps no step either


def test_the_step_count_reads_as_torchs(adapter):
    init, offsets = initial_params(0, "f32")
    stepper = adapter.stepper("adamw", init, ADAM, ADAM_FLAGS, "f32")
    snaps = _trajectory(stepper, init, offsets, 3)
    assert snaps[-1]["w2.step"].shape == (1,) and snaps[-1]["w2.step"][0] == 3.0


# ------------------------------------------------------------------ AMSGrad: a finding

def _max_of_corrected_v(p0, grads, hp):
    """Adam whose AMSGrad keeps max_t of v_t / (1 - beta2^t), then divides by nothing more:
    optax.scale_by_amsgrad's rule, written out in float64 (not optax's code)."""
    b1, b2, eps, lr = hp["beta1"], hp["beta2"], hp["eps"], hp["lr"]
    p, m, v, vmax = p0.copy(), 0.0 * p0, 0.0 * p0, 0.0 * p0
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        vmax = np.maximum(vmax, v / (1 - b2 ** t))
        p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(vmax) + eps)
    return p, vmax


def test_amsgrad_keeps_the_maximum_of_the_corrected_v_unlike_torch(adapter):
    hp = {"lr": 0.1, "beta1": 0.8, "beta2": 0.5, "eps": 1e-8, "weight_decay": 0.0}
    flags = {"amsgrad": True, "maximize": False}
    rng = np.random.default_rng(3)
    p0 = rng.standard_normal(20)
    grads = [rng.standard_normal(20) * (0.2 if t % 3 else 2.0) for t in range(12)]
    stepper = adapter.stepper("adam", {"w0": p0}, hp, flags, "f64")
    for g in grads:
        stepper.step({"w0": g})
    got = stepper.snapshot()
    optax_rule, vmax = _max_of_corrected_v(p0, grads, hp)
    np.testing.assert_allclose(got["w0"], optax_rule, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(stepper.optax_state()["w0.nu_max"], vmax, rtol=1e-12)
    assert "w0.max_exp_avg_sq" not in got       # another quantity: not exposed under it
    init_fn, update_fn = NUMPY_OPTIMIZERS["adam"]
    torch_rule, state = p0, init_fn(p0, hp, flags)
    for g in grads:
        torch_rule, state = update_fn(torch_rule, g, state, hp, flags)
    assert np.max(np.abs(got["w0"] - torch_rule)) > 1e-3
    np.testing.assert_allclose(got["w0.exp_avg_sq"], state["exp_avg_sq"], rtol=1e-12)


@pytest.mark.parametrize("rule", ["adam", "adamw"])
def test_the_reference_family_reports_optaxs_amsgrad(adapter, rule):
    rows = [r for r in reference.run(rule, "f64", steps=STEPS, adapter=adapter)
            if "amsgrad" in r.name]
    # beta2 = 0: no bias correction, the two maxima are one; else they part at step 2
    uncorrected = [r for r in rows if "betas=(0,0)" in r.name]
    corrected = [r for r in rows if r not in uncorrected]
    assert uncorrected and all(r.status == "pass" for r in uncorrected)
    assert corrected and all(r.status == "fail" for r in corrected)
    assert all("first diverged at step 2 " in r.message for r in corrected)


# ------------------------------------------------------------------ what it cannot run

def test_unsupported_rows_say_why(adapter):
    rows = closed_form.run("sgd", "f32", steps=10, adapter=adapter)
    unsupported = [r for r in rows if r.status == "unsupported"]
    assert unsupported and all("toy" in r.name and "our engine" in r.message
                               for r in unsupported)
    assert "no float dtype" in adapter.unsupported("sgd", "i32", SGD, SGD_FLAGS)
    assert "no rule 'rmsprop'" in adapter.unsupported("rmsprop", "f32", {}, {})


# ------------------------------------------------------------------ groups, save/restore

def test_param_groups_with_their_own_settings_and_dtypes_step_as_each_alone(adapter):
    init, offsets = initial_params(0, "f64")
    first = {k: init[k].astype(np.float32) for k in ("w0", "w1")}
    second = {k: init[k] for k in ("w2", "w3")}
    other = {**ADAM, "lr": 0.03, "beta1": 0.6, "weight_decay": 0.0}
    groups = [Group(first, ADAM, ADAM_FLAGS, "f32"),
              Group(second, other, {"amsgrad": False, "maximize": True}, "f64")]
    together = adapter.grouped_stepper("adamw", groups)
    alone = [adapter.stepper("adamw", g.init, g.hp, g.flags, g.dtype) for g in groups]
    for _ in range(STEPS):
        grads = {k: np.cos(3.0 * np.asarray(v, np.float64)) + offsets[k]
                 for k, v in {**first, **second}.items()}
        together.step({k: g.astype(np.float32 if k in first else np.float64)
                       for k, g in grads.items()})
        for stepper, group in zip(alone, groups, strict=True):
            stepper.step({k: grads[k].astype(np.float32 if k in first else np.float64)
                          for k in group.init})
    got = together.snapshot()
    want = {**alone[0].snapshot(), **alone[1].snapshot()}
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert got["w0.step"][0] == got["w3.step"][0] == STEPS
    dtypes = together.state_dtypes()
    assert dtypes["w0.exp_avg"] == "float32" and dtypes["w3.exp_avg"] == "float64"


def test_save_and_restore_continue_exactly(adapter):
    init, offsets = initial_params(0, "f32")
    straight = adapter.stepper("sgd", init, SGD, SGD_FLAGS, "f32")
    whole = _trajectory(straight, init, offsets, 20)[-1]
    first = adapter.stepper("sgd", init, SGD, SGD_FLAGS, "f32")
    half = _trajectory(first, init, offsets, 10)[-1]
    saved = first.save()
    _trajectory(first, init, offsets, 5)            # the saved copy must not follow
    fresh = adapter.stepper("sgd", init, SGD, SGD_FLAGS, "f32")
    fresh.restore(saved)
    np.testing.assert_array_equal(fresh.snapshot()["w1.momentum_buffer"],
                                  half["w1.momentum_buffer"])
    current = {k: half[k].astype(np.float32) for k in init}
    resumed = _trajectory(fresh, current, offsets, 10)[-1]
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)


# ------------------------------------------------------------------ 16-bit parameters

@pytest.mark.parametrize("dtype, name", [("bf16", "bfloat16"), ("f16", "float16")])
def test_optax_keeps_the_state_of_16_bit_parameters_in_their_dtype(adapter, dtype, name):
    init, offsets = initial_params(0, "f64")
    init16 = {k: v.astype({"bf16": "bfloat16", "f16": np.float16}[dtype])
              for k, v in init.items()}
    adam = adapter.stepper("adam", init16, {**ADAM, "eps": 1e-3}, ADAM_FLAGS, dtype)
    sgd = adapter.stepper("sgd", init16, SGD, SGD_FLAGS, dtype)
    for stepper in (adam, sgd):
        snap = _trajectory(stepper, init16, offsets, 5)[-1]
        assert all(np.isfinite(v).all() for v in snap.values())
    assert adam.state_dtypes()["w1.exp_avg"] == name
    assert adam.state_dtypes()["w1.exp_avg_sq"] == name
    assert adam.state_dtypes()["w1.step"] == "int32"
    assert sgd.state_dtypes()["w1.momentum_buffer"] == name


def test_eps_below_float16s_range_divides_zero_by_zero(adapter):
    """eps = 1e-8 is added in float16, where it is 0: a zero gradient gives 0 / 0."""
    p0 = np.array([1.0, 2.0], np.float16)
    stepper = adapter.stepper("adam", {"w0": p0}, {**ADAM, "weight_decay": 0.0}, ADAM_FLAGS,
                              "f16")
    stepper.step({"w0": np.array([0.0, 1.0], np.float16)})
    got = stepper.snapshot()["w0"]
    assert np.isnan(got[0]) and np.isfinite(got[1])


# ------------------------------------------------------------------ checks can fail

def test_decay_not_multiplied_by_lr_fails_the_reference(adapter):
    import optax

    from optcheck.adapters.optax_adapter import OptaxOptimizer

    class DecayNotTimesLr(OptaxOptimizer):
        """AdamW whose decay skips the learning rate: p - lr u - wd p (a mapping bug)."""

        def transform(self, optimizer, hp, flags):
            if optimizer != "adamw":
                return super().transform(optimizer, hp, flags)
            return optax.chain(optax.scale_by_adam(hp["beta1"], hp["beta2"], hp["eps"]),
                               optax.scale_by_learning_rate(hp["lr"]),
                               optax.add_decayed_weights(-hp["weight_decay"]))

    rows = [r for r in reference.run("adamw", "f64", steps=STEPS, adapter=DecayNotTimesLr())
            if "amsgrad" not in r.name]
    decayed = [r for r in rows if "weight_decay=0.1" in r.name]
    assert decayed and all(r.status == "fail" for r in decayed)
    undecayed = [r for r in rows if re.search(r"weight_decay=0[,)]", r.name)]
    assert undecayed and all(r.status == "pass" for r in undecayed)


# ------------------------------------------------------------------ without optax

def test_without_optax_the_engine_is_one_line_saying_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optax", None)      # `import optax` raises ImportError
    monkeypatch.delitem(sys.modules, "optcheck.adapters.optax_adapter", raising=False)
    monkeypatch.delattr(optcheck.adapters, "optax_adapter", raising=False)
    monkeypatch.setattr(runner, "_ADAPTERS", {})
    with pytest.raises(AdapterError, match=re.escape("pip install 'gradverify[optax]'")):
        get_adapter("optax")
    assert main(["--engine", "optax", "--opt", "adam", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'gradverify[optax]'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("rule", ["sgd", "adamw"])
def test_maximize_is_minimizing_minus_g_bit_for_bit(adapter, rule):
    """optax has no maximize: the stepper negates the gradient before the update, so the
    closed-form family's bit-for-bit maximize rows hold on any CPU (negated inside the
    compiled update, XLA would contract multiply-adds differently)."""
    rows = closed_form.run(rule, "f64", steps=20, adapter=adapter)
    maximize = [r for r in rows if r.labels["check"] == "maximize"]
    assert maximize and all(r.status == "pass" for r in maximize), maximize
