"""The invariant family: every invariant holds for the engine's optimizers, and each sees the
bugs it should see (kernel mutants put in place of the CPU step kernels, and mutants of the
training loop, checkpoint loader and optimizer stepping)."""

from __future__ import annotations

import contextlib
import math
import re

import numpy as np
import pytest

from engine.backends.cpu import CpuBackend
from engine.optim.optimizers import Optimizer
from engine.registry import OPS
from engine.train import Trainer
from optcheck import invariants
from optcheck.invariants import INVARIANTS, run

CHECKS = tuple(INVARIANTS)
MUTANT_STEPS = 20


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


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_checkpoint_resumes_a_schedule(optimizer):
    """The checkpoint keeps the base lr, not the step's scheduled one (found by this row:
    a resumed schedule used to be scaled twice)."""
    (row,) = run(optimizer, "f64", steps=MUTANT_STEPS, checks=("checkpoint_resume_schedule",))
    assert row.ok, row.message


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


# --- numpy step kernels with one bug each ----------------------------------------------------

def _address(a) -> int:
    return a.__array_interface__["data"][0]


class _Kernels:
    """Numpy versions of the engine's step kernels (engine/backends/cpu/optim.py), in the
    parameter's dtype, with at most one bug. Per-buffer memory (own step counter, cached
    hyperparameters) lives here, keyed by the parameter buffer's address."""

    def __init__(self, bug: str | None = None):
        self.bug, self.counts, self.cached_hp = bug, {}, {}
        self.rng = np.random.default_rng()   # unseeded, for the "noise" bug

    def _step_and_hp(self, out, step, hp):
        step[0] += 1
        t = step[0]
        if self.bug == "own_step_counter":   # ignores the counter a checkpoint restores
            t = self.counts[_address(out)] = self.counts.get(_address(out), 0) + 1
        if self.bug == "hp_cached":          # reads the hyperparameters of its first call
            hp = self.cached_hp.setdefault(_address(out), hp.copy())
        return float(t), [float(x) for x in hp]

    def _finish(self, out):
        if self.bug == "noise":
            out *= out.dtype.type(1) + out.dtype.type(1e-6) * self.rng.standard_normal(out.shape)

    def sgd(self, out, ins, nesterov=False, maximize=False):
        g, step, hp, buf = ins[1], ins[2], ins[3], ins[4]
        t, (lr, mu, dampening, wd) = self._step_and_hp(out, step, hp)
        f = out.dtype.type
        d = -g if maximize else g.copy()
        if wd and self.bug != "decay_after_momentum":
            d = d + f(wd) * out
        if mu:
            keep = 1.0 if self.bug == "dampening_ignored" else 1.0 - dampening
            buf[...] = d if t == 1 else buf * f(mu) + f(keep) * d
            nesterov = nesterov and self.bug != "nesterov_term_missing"
            d = d + f(mu) * buf if nesterov else buf.copy()
        if wd and self.bug == "decay_after_momentum":
            d = d + f(wd) * out
        out += f(-lr) * d
        self._finish(out)

    def adam(self, out, ins, amsgrad=False, maximize=False, decoupled=False):
        g, step, hp, m, v = ins[1], ins[2], ins[3], ins[4], ins[5]
        t, (lr, b1, b2, eps, wd) = self._step_and_hp(out, step, hp)
        f = out.dtype.type
        d = -g if maximize else g.copy()
        decoupled = decoupled != (self.bug in ("decay_coupled", "decay_decoupled"))
        if wd and decoupled:
            out *= f(1.0 - lr * wd)
        elif wd:
            d = d + f(wd) * out
        m += f(1.0 - b1) * (d - m)
        v[...] = v * f(b2) + f(1.0 - b2) * d * d
        second = v
        if amsgrad:
            second = ins[6]
            if self.bug == "amsgrad_max_not_kept":
                second[...] = v
            else:
                np.maximum(second, v, out=second)
        bc1, bc2 = (1.0, 1.0) if self.bug == "bias_correction_dropped" else \
            (1.0 - b1**t, 1.0 - b2**t)
        if self.bug == "eps_inside_sqrt":
            denom = np.sqrt(second / f(bc2) + f(eps))
        else:
            denom = np.sqrt(second) / f(math.sqrt(bc2)) + f(eps)
        out += f(-lr / bc1) * (m / denom)
        self._finish(out)

    def install(self):
        return {"sgd_step": self.sgd,
                "adam_step": lambda out, ins, **kw: self.adam(out, ins, decoupled=False, **kw),
                "adamw_step": lambda out, ins, **kw: self.adam(out, ins, decoupled=True, **kw)}


@contextlib.contextmanager
def mutant_kernels(bug):
    saved = {name: OPS[name].kernels["cpu"] for name in ("sgd_step", "adam_step", "adamw_step")}
    try:
        for name, kernel in _Kernels(bug).install().items():
            OPS[name].kernels["cpu"] = kernel
        yield
    finally:
        for name, kernel in saved.items():
            OPS[name].kernels["cpu"] = kernel


def _failing(optimizer, dtype, checks):
    rows = run(optimizer, dtype, steps=MUTANT_STEPS, checks=checks)
    assert all(r.status in ("pass", "fail") for r in rows), [r.message for r in rows]
    return {r.labels["check"] for r in rows if not r.ok}


@pytest.mark.parametrize("dtype", ["f64", "f32"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_the_numpy_kernels_without_a_bug_pass(optimizer, dtype):
    """The control for the mutants below: their failures come from the bug alone."""
    with mutant_kernels(None):
        assert _failing(optimizer, dtype, CHECKS) == set()


KERNEL_MUTANTS = [   # (bug, optimizer, the invariant that must catch it)
    ("own_step_counter", "sgd", "checkpoint_resume"),
    ("own_step_counter", "adam", "checkpoint_resume"),
    ("own_step_counter", "adamw", "checkpoint_resume"),
    ("noise", "sgd", "determinism"),
    ("noise", "adamw", "determinism"),
    ("eps_inside_sqrt", "adam", "gradient_scale"),
    ("eps_inside_sqrt", "adamw", "gradient_scale"),
    ("decay_coupled", "adamw", "weight_decay_l2"),
    ("decay_decoupled", "adam", "weight_decay_l2"),
    ("decay_after_momentum", "sgd", "weight_decay_l2"),
    ("hp_cached", "sgd", "schedule_no_replan"),
    ("hp_cached", "adam", "schedule_no_replan"),
    ("dampening_ignored", "sgd", "schedule_no_replan"),
    ("nesterov_term_missing", "sgd", "schedule_no_replan"),
    ("bias_correction_dropped", "adam", "schedule_no_replan"),
    ("amsgrad_max_not_kept", "adamw", "schedule_no_replan"),
    ("eps_inside_sqrt", "adam", "schedule_no_replan"),
]


@pytest.mark.parametrize("dtype", ["f64", "f32"])
@pytest.mark.parametrize(("bug", "optimizer", "check"), KERNEL_MUTANTS,
                         ids=[f"{b}-{o}-{c}" for b, o, c in KERNEL_MUTANTS])
def test_kernel_mutant_is_caught(bug, optimizer, check, dtype):
    with mutant_kernels(bug):
        assert _failing(optimizer, dtype, (check,)) == {check}


# --- mutants of the training loop, the checkpoint loader and stepping ----------------------

def _overwriting_accumulate(self, dst, src):
    np.copyto(dst, src)   # forgets the earlier physical batches


def _fit_with_its_own_generator(original):
    def fit(self, *args, **kwargs):
        self.rng = np.random.default_rng(12345)   # not the trainer's seeded generator
        return original(self, *args, **kwargs)
    return fit


def _replanning_step(original):
    def step(self, backend="cpu"):
        self.graph.version += 1   # a rebuild: the next compute makes a new Plan
        return original(self, backend)
    return step


def _loses_step_counters(original):
    def load_state_arrays(self, arrays):
        original(self, {k: (np.zeros_like(v) if k.endswith(".step") else v)
                        for k, v in arrays.items()})
    return load_state_arrays


def _lenient_loader(original):
    def load_checkpoint(path, params, optimizer=None, arch=None):
        try:
            return original(path, params, optimizer, arch)
        except invariants.GGUFFormatError:   # falls back to the weights alone
            return original(path, params, None, arch)
    return load_checkpoint


LOOP_MUTANTS = {   # name -> (object, attribute, replacement from the original, check)
    "accumulate_overwrites": (CpuBackend, "accumulate", lambda _: _overwriting_accumulate,
                              "grad_accumulation"),
    "fit_unseeded_shuffle": (Trainer, "fit", _fit_with_its_own_generator, "epoch_vs_fit"),
    "fit_seed_ignored": (Trainer, "fit", _fit_with_its_own_generator, "determinism"),
    "step_replans": (Optimizer, "step", _replanning_step, "schedule_no_replan"),
    "load_loses_step": (Optimizer, "load_state_arrays", _loses_step_counters,
                        "checkpoint_resume"),
    "loader_lenient": (invariants, "load_checkpoint", _lenient_loader, "checkpoint_resume"),
}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", sorted(LOOP_MUTANTS))
def test_loop_mutant_is_caught(name, optimizer, monkeypatch):
    owner, attribute, make, check = LOOP_MUTANTS[name]
    monkeypatch.setattr(owner, attribute, make(getattr(owner, attribute)))
    assert _failing(optimizer, "f64", (check,)) == {check}


def test_loader_mutant_is_named_in_the_message(monkeypatch):
    monkeypatch.setattr(invariants, "load_checkpoint", _lenient_loader(invariants.load_checkpoint))
    (row,) = run("adam", "f64", steps=MUTANT_STEPS, checks=("checkpoint_resume",))
    assert "loading into adam with amsgrad=False was accepted" in row.message
    assert "loading into adamw was accepted" in row.message


def test_a_crashing_kernel_gives_error_rows_not_a_crash(monkeypatch):
    def broken(out, ins, **kw):
        raise RuntimeError("kernel exploded")
    monkeypatch.setitem(OPS["adam_step"].kernels, "cpu", broken)
    rows = run("adam", "f64", steps=MUTANT_STEPS)
    assert [r.labels["check"] for r in rows] == list(CHECKS)
    assert {r.status for r in rows} == {"error"}
    assert all("RuntimeError: kernel exploded" in r.message for r in rows)
