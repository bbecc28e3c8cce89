"""Shared by the invariant family's tests: numpy step kernels with at most one bug each,
put in place of the engine's CPU step kernels, and the checks that fail on a short run."""

from __future__ import annotations

import contextlib
import math

import numpy as np

from engine.registry import OPS
from optcheck.invariants import run

MUTANT_STEPS = 20


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


def failing(optimizer, dtype, checks):
    """The checks among `checks` that fail in a run of MUTANT_STEPS steps (every row must
    pass or fail, none error)."""
    rows = run(optimizer, dtype, steps=MUTANT_STEPS, checks=checks)
    assert all(r.status in ("pass", "fail") for r in rows), [r.message for r in rows]
    return {r.labels["check"] for r in rows if not r.ok}
