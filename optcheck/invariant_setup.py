"""What the invariant family's two kinds of checks share (optcheck.training_loop_invariants,
optcheck.step_invariants): the settings every invariant runs with, the configuration of one
run, an invariant's outcome, and the comparison of two runs' snapshot traces.

Values are drawn from `seed`; the settings make eps matter (1e-3 against gradients down to
~0.05), dampening nonzero, and gradients shrink so AMSGrad's max is not v.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from optcheck.harness import Comparison, EngineStepper

_ADAM = {"lr": 0.02, "beta1": 0.9, "beta2": 0.99, "eps": 1e-3}
SETTINGS = {   # optimizer -> (hp, flags) of every invariant unless it says otherwise
    "sgd": ({"lr": 0.05, "momentum": 0.9, "dampening": 0.25, "weight_decay": 0.0},
            {"nesterov": False, "maximize": False}),
    "adam": ({**_ADAM, "weight_decay": 0.0}, {"amsgrad": True, "maximize": False}),
    "adamw": ({**_ADAM, "weight_decay": 0.05}, {"amsgrad": True, "maximize": False}),
}
NESTEROV = ({"lr": 0.05, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.0},
            {"nesterov": True, "maximize": False})


@dataclasses.dataclass(frozen=True)
class InvariantConfig:
    """One run of the family: the optimizer, dtype, backend, steps and seed every invariant
    of that run reads, with the values drawn from the seed."""

    optimizer: str
    dtype: str
    backend: str
    steps: int
    seed: int

    hp = property(lambda self: dict(SETTINGS[self.optimizer][0]))
    flags = property(lambda self: dict(SETTINGS[self.optimizer][1]))
    ftype = property(lambda self: np.float32 if self.dtype == "f32" else np.float64)
    batches = property(lambda self: max(2, min(12, self.steps // 8)), doc="logical batches "
                       "per epoch in the training-loop invariants")

    def init(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        return {"w0": rng.uniform(-1, 1, (3, 4)).astype(self.ftype),
                "w1": rng.uniform(-1, 1, (5,)).astype(self.ftype)}

    def gradient_sequence(self) -> list[dict[str, np.ndarray]]:
        """Fixed gradients g_t = a_t z_t + 0.1, z_t standard normal, a_t = 0.05 + 2 (0.9)^t
        shrinking (so v decreases and AMSGrad's max matters), rounded to the dtype."""
        rng = np.random.default_rng(self.seed + 7)
        shapes = {k: v.shape for k, v in self.init().items()}
        return [{k: ((0.05 + 2 * 0.9**t) * rng.standard_normal(s) + 0.1).astype(self.ftype)
                 for k, s in shapes.items()} for t in range(self.steps)]

    def stepper(self, name=None, hp=None, flags=None, init=None, schedule=None):
        """An EngineStepper of `name` (default: this run's optimizer) with its SETTINGS, or
        the hp, flags and initial parameters given."""
        name = name or self.optimizer
        return EngineStepper(name, self.init() if init is None else init,
                             SETTINGS[name][0] if hp is None else hp,
                             SETTINGS[name][1] if flags is None else flags,
                             self.dtype, self.backend, schedule)


@dataclasses.dataclass
class Outcome:
    """What an invariant found: the comparison of its runs, problems beyond it, and extra
    metrics for the row."""

    comparison: Comparison
    problems: list[str] = dataclasses.field(default_factory=list)
    metrics: dict = dataclasses.field(default_factory=dict)


def hp_text(hp: dict, flags: dict) -> str:
    """`k=v,...` of the hyperparameters, then the names of the flags that are set."""
    return ",".join([f"{k}={v:g}" for k, v in hp.items()] + [k for k, v in flags.items() if v])


def prefixed(prefix: str, snap: dict) -> dict:
    return {f"{prefix}:{k}": v for k, v in snap.items()}


def compare_traces(comparison: Comparison, label: str, got: list[dict], want: list[dict],
                   dtype: str, tol=None, first_step: int = 1) -> None:
    """Add two equally long lists of snapshots to `comparison`, step by step from
    `first_step`, every tensor named `label:<tensor>`."""
    if len(got) != len(want):
        raise RuntimeError(f"{label}: {len(got)} snapshots against {len(want)}")
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=first_step):
        comparison.add(step, prefixed(label, g), prefixed(label, w), dtype, tol=tol)
