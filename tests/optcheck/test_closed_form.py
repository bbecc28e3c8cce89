"""The closed-form family passes on the engine and catches mutated optimizer kernels.

Mutants replace an op's CPU kernel by a plain numpy update with one deliberate bug (the
kernel contract: `kernel(out, ins, **flags)`, `out` the parameter's buffer, ins = param,
grad, step, hp, *state, updated in place). The same numpy update without a bug is the
control: it must pass, so that a caught mutant is caught for its bug alone.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest

from engine.registry import OPS
from optcheck import closed_form
from optcheck.closed_form import FAMILY, Scenario

OPTIMIZERS = ("sgd", "adam", "adamw")
DTYPES = ("f32", "f64")


def sgd_numpy(ignore_dampening=False, drop_nesterov=False):
    """torch.optim.SGD's update in numpy (float64 arithmetic), optionally with a bug."""
    def kernel(out, ins, nesterov=False, maximize=False):
        g, step, hp, buf = ins[1], ins[2], ins[3], ins[4]
        step[0] += 1.0
        lr, mu, tau, wd = hp
        p = out.astype(np.float64)
        d = (-g if maximize else g).astype(np.float64) + wd * p
        if mu != 0.0:
            keep = 1.0 if ignore_dampening else 1.0 - tau
            b = d if step[0] == 1.0 else mu * buf + keep * d
            buf[...] = b
            d = d + mu * b if (nesterov and not drop_nesterov) else b
        out[...] = p - lr * d
    return kernel


def adam_numpy(decoupled, bias_correction=True, eps_inside_sqrt=False, decay_as_l2=False,
               keep_max=True):
    """torch.optim.Adam / AdamW's update in numpy (float64 arithmetic), optionally with a bug."""
    def kernel(out, ins, amsgrad=False, maximize=False):
        g, step, hp, m, v = ins[1], ins[2], ins[3], ins[4], ins[5]
        step[0] += 1.0
        t = step[0]
        lr, b1, b2, eps, wd = hp
        p = out.astype(np.float64)
        d = (-g if maximize else g).astype(np.float64)
        if decoupled and not decay_as_l2:
            p = p * (1.0 - lr * wd)
        else:
            d = d + wd * p
        m[...] = b1 * m + (1.0 - b1) * d
        v[...] = b2 * v + (1.0 - b2) * d * d
        vv = v.astype(np.float64)
        if amsgrad:
            vmax = ins[6]
            vmax[...] = np.maximum(vmax, v) if keep_max else v
            vv = vmax.astype(np.float64)
        bc1, bc2 = (1.0 - b1 ** t, 1.0 - b2 ** t) if bias_correction else (1.0, 1.0)
        if eps_inside_sqrt:
            denom = np.sqrt(vv / bc2 + eps)
        else:
            denom = np.sqrt(vv) / np.sqrt(bc2) + eps
        out[...] = p - lr / bc1 * m.astype(np.float64) / denom
    return kernel


@contextlib.contextmanager
def cpu_kernels(**kernels):
    """Replace OPS[op].kernels['cpu'] for each op=kernel given; restore on exit."""
    saved = {op: OPS[op].kernels["cpu"] for op in kernels}
    try:
        for op, k in kernels.items():
            OPS[op].kernels["cpu"] = k
        yield
    finally:
        for op, k in saved.items():
            OPS[op].kernels["cpu"] = k


def failed_checks(rows) -> set[str]:
    return {r.labels["check"] for r in rows if r.status != "pass"}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_scenario_passes_on_the_engine(optimizer, dtype):
    rows = closed_form.run(optimizer, dtype)
    bad = [f"{r.name}: {r.status} {r.message}" for r in rows if r.status != "pass"]
    assert not bad
    checks = {r.labels["check"] for r in rows}
    assert {"constant_gradient", "zero_gradient", "lr_zero", "maximize", "toy_forward",
            "toy_epoch", "toy_split", "toy_accumulation"} <= checks
    assert ({"momentum", "quadratic", "constant_gradient_decay"} if optimizer == "sgd"
            else {"gradient_then_zero"}) <= checks
    assert sum(r.labels["check"] == "toy_accumulation" for r in rows) == 4


def test_rows_follow_the_contract():
    rows = closed_form.run("adamw", "f32", steps=5, seed=3)
    assert len({r.name for r in rows}) == len(rows)
    for r in rows:
        assert r.tool == "optcheck"
        assert r.labels == {"optimizer": "adamw", "family": FAMILY, "check": r.labels["check"],
                            "backend": "cpu", "dtype": "f32"}
        assert re.fullmatch(r"[a-z][a-z0-9_]*", r.labels["check"])
        assert r.name.startswith(f"adamw: {r.labels['check']}(") and "\n" not in r.name
        assert "max_abs_err" in r.metrics


def test_same_seed_same_rows():
    a = closed_form.run("sgd", "f64", steps=4, seed=1)
    b = closed_form.run("sgd", "f64", steps=4, seed=1)
    assert [r.to_dict() for r in a] == [r.to_dict() for r in b]


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_control_kernels_pass(dtype):
    """The mutants' numpy update without a bug passes: their failures come from the bug."""
    with cpu_kernels(sgd_step=sgd_numpy(), adam_step=adam_numpy(False),
                     adamw_step=adam_numpy(True)):
        for optimizer in OPTIMIZERS:
            rows = closed_form.run(optimizer, dtype)
            assert not failed_checks(rows), [r.message for r in rows if r.status != "pass"]


MUTANTS = {
    # name: (optimizer, {op: kernel}, a check that must fail)
    "adam bias correction dropped": (
        "adam", {"adam_step": adam_numpy(False, bias_correction=False)}, "constant_gradient"),
    "adamw bias correction dropped": (
        "adamw", {"adamw_step": adam_numpy(True, bias_correction=False)}, "constant_gradient"),
    "adam eps inside the sqrt": (
        "adam", {"adam_step": adam_numpy(False, eps_inside_sqrt=True)}, "constant_gradient"),
    "adamw eps inside the sqrt": (
        "adamw", {"adamw_step": adam_numpy(True, eps_inside_sqrt=True)}, "constant_gradient"),
    "adamw decay coupled as L2": (
        "adamw", {"adamw_step": adam_numpy(True, decay_as_l2=True)}, "constant_gradient_decay"),
    "sgd dampening ignored": ("sgd", {"sgd_step": sgd_numpy(ignore_dampening=True)}, "momentum"),
    "sgd nesterov term missing": (
        "sgd", {"sgd_step": sgd_numpy(drop_nesterov=True)}, "momentum"),
    "adam amsgrad max not kept": (
        "adam", {"adam_step": adam_numpy(False, keep_max=False)}, "gradient_then_zero"),
    "adamw amsgrad max not kept": (
        "adamw", {"adamw_step": adam_numpy(True, keep_max=False)}, "gradient_then_zero"),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_mutant_is_caught(mutant, dtype):
    optimizer, kernels, check = MUTANTS[mutant]
    with cpu_kernels(**kernels):
        rows = closed_form.run(optimizer, dtype)
    assert check in failed_checks(rows)
    assert all(r.status in ("pass", "fail") for r in rows)


def test_a_kernel_that_raises_gives_error_rows():
    def broken(out, ins, **flags):
        raise RuntimeError("kernel exploded")

    with cpu_kernels(adam_step=broken):
        rows = closed_form.run("adam", "f64", steps=3)
    errors = [r for r in rows if r.status == "error"]
    assert errors and all("RuntimeError in op adam_step's kernel broken" in r.message
               and r.message.endswith("kernel exploded") for r in errors)
    assert {r.labels["check"] for r in rows if r.status == "pass"} == {"toy_forward"}


def test_a_scenario_that_raises_is_one_error_row(monkeypatch):
    def boom():
        raise ValueError("no closed form here")

    real = closed_form.scenarios

    def with_broken(*args):
        return [Scenario("broken", "broken(lr=1)", boom), *real(*args)]

    monkeypatch.setattr(closed_form, "scenarios", with_broken)
    rows = closed_form.run("sgd", "f64", steps=3)
    assert rows[0].status == "error" and rows[0].labels["check"] == "broken"
    assert rows[0].message == "ValueError: no closed form here"
    assert all(r.status == "pass" for r in rows[1:])


@pytest.mark.parametrize("kwargs, match", [
    (dict(optimizer="rmsprop"), "unknown optimizer 'rmsprop'"),
    (dict(optimizer="sgd", dtype="f16"), "dtype must be one of"),
    (dict(optimizer="sgd", steps=1), "steps must be >= 2"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        closed_form.run(**kwargs)
