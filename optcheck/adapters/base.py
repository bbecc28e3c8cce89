"""The optimizer under test, as an adapter: what optcheck needs of any implementation of
SGD, Adam or AdamW (ours, torch.optim's, a numpy update, yours).

An adapter only steps parameters. Everything else (the closed forms, the float64 reference
trajectories, tolerances, reports, exit codes) stays optcheck's. It has:

    name: str                     as given to --engine ("engine", "torch-foreach", ...)
    describe() -> str             the implementation and its version, for the report
    unsupported(optimizer, dtype, hp, flags) -> str | None
                                  why it cannot run this rule in this dtype with these
                                  settings (a flag it lacks, a dtype it does not take); the
                                  row is `unsupported` with that reason, never skipped
    stepper(optimizer, init, hp, flags, dtype) -> Stepper

`optimizer` is "sgd", "adam" or "adamw"; `init` maps parameter names (w0, w1, ...) to arrays
in the dtype ("f32", "f64", ...); `hp` holds flat hyperparameters (lr, beta1, beta2, eps,
weight_decay; or lr, momentum, dampening, weight_decay) and `flags` the flags (amsgrad,
maximize; nesterov, maximize), all as torch.optim means them. A Stepper has:

    step(grads)                   one update with these gradients (name -> array in the
                                  dtype); the first call is step 1
    snapshot() -> dict            the parameters (name -> array) and the state it exposes,
                                  named as torch.optim's state: `w0.exp_avg`,
                                  `w0.exp_avg_sq`, `w0.max_exp_avg_sq`,
                                  `w0.momentum_buffer`, `w0.step`; optcheck compares every
                                  name it is given, in float64

Optional, where the implementation has them (a combination an adapter lacks is an
`unsupported` row that says so, never a skipped one):

    grouped_stepper(optimizer, groups) -> Stepper
                                  one optimizer over several param groups (a list of Group:
                                  each its own parameters, hyperparameters, flags and
                                  dtype; parameter names are distinct across groups); its
                                  snapshot names every group's tensors as above
    Stepper.save() -> object      everything needed to resume (parameters, state, step
                                  count), as an independent copy
    Stepper.restore(saved)        on a fresh stepper made with the same arguments: continue
                                  exactly where the saved one was

An adapter whose code may abort the process sets `isolated = True` (ggml's does): optcheck
then steps it in a worker process, where an abort is a `crash` row.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

from checkkit.loading import AdapterError  # noqa: F401  (the adapter API's error, here too)

RULES = ("sgd", "adam", "adamw")


@dataclasses.dataclass(frozen=True)
class Group:
    """One param group: its parameters (name -> array in `dtype`), flat hyperparameters and
    flags (as for `stepper`) and its dtype ("f32", "f64", ...)."""

    init: dict
    hp: dict
    flags: dict
    dtype: str


@runtime_checkable
class Stepper(Protocol):
    """One optimizer over its parameters, made by `OptimizerAdapter.stepper`: `step`
    applies one update, `snapshot` shows the parameters and the state it exposes."""

    def step(self, grads: dict) -> None:
        """One update with these gradients."""

    def snapshot(self) -> dict:
        """Parameters and exposed state, by name (module doc)."""


@runtime_checkable
class OptimizerAdapter(Protocol):
    """An optimizer implementation under test (the module doc has the whole contract):
    `--engine module:Class` names one. It makes a `Stepper` per scenario, says which rules,
    dtypes and settings it cannot run (`unsupported`) and names itself (`describe`);
    everything else stays optcheck's."""

    name: str

    def describe(self) -> str:
        """The implementation and its version, e.g. 'torch 2.13.0 (foreach)'."""

    def unsupported(self, optimizer: str, dtype: str, hp: dict, flags: dict) -> str | None:
        """Why this rule, dtype and settings cannot run here (None: they can)."""

    def stepper(self, optimizer: str, init: dict, hp: dict, flags: dict,
                dtype: str) -> Stepper:
        """A fresh optimizer over parameters initialised from `init`."""
