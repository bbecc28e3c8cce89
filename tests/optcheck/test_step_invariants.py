"""The step invariants (checkpoint_resume, checkpoint_resume_schedule, gradient_scale,
weight_decay_l2, schedule_no_replan) each see the bugs they should see: kernel mutants put
in place of the CPU step kernels, and mutants of the checkpoint loader and of stepping."""

from __future__ import annotations

import numpy as np
import pytest

from engine.optim.optimizers import Optimizer
from optcheck import step_invariants
from optcheck.invariants import run
from tests.optcheck.invariant_mutants import MUTANT_STEPS
from tests.optcheck.mutant_cases import (
    assert_kernel_mutant_caught,
    assert_patched_mutant_caught,
    kernel_mutants,
    patched_mutants,
)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_checkpoint_resumes_a_schedule(optimizer):
    """The checkpoint keeps the base lr, not the step's scheduled one (found by this row:
    a resumed schedule used to be scaled twice)."""
    (row,) = run(optimizer, "f64", steps=MUTANT_STEPS, checks=("checkpoint_resume_schedule",))
    assert row.ok, row.message


KERNEL_MUTANTS = [   # (bug, optimizer, the invariant that must catch it)
    ("own_step_counter", "sgd", "checkpoint_resume"),
    ("own_step_counter", "adam", "checkpoint_resume"),
    ("own_step_counter", "adamw", "checkpoint_resume"),
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


@kernel_mutants(KERNEL_MUTANTS)
def test_kernel_mutant_is_caught(bug, optimizer, check, dtype):
    assert_kernel_mutant_caught(bug, optimizer, check, dtype)


# --- mutants of the checkpoint loader and of stepping ---------------------------------------

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
        except step_invariants.GGUFFormatError:   # falls back to the weights alone
            return original(path, params, None, arch)
    return load_checkpoint


STEPPING_MUTANTS = {   # name -> (object, attribute, replacement from the original, check)
    "step_replans": (Optimizer, "step", _replanning_step, "schedule_no_replan"),
    "load_loses_step": (Optimizer, "load_state_arrays", _loses_step_counters,
                        "checkpoint_resume"),
    "loader_lenient": (step_invariants, "load_checkpoint", _lenient_loader,
                       "checkpoint_resume"),
}


@patched_mutants(STEPPING_MUTANTS)
def test_stepping_mutant_is_caught(name, optimizer, monkeypatch):
    assert_patched_mutant_caught(STEPPING_MUTANTS, name, optimizer, monkeypatch)


def test_loader_mutant_is_named_in_the_message(monkeypatch):
    monkeypatch.setattr(step_invariants, "load_checkpoint",
                        _lenient_loader(step_invariants.load_checkpoint))
    (row,) = run("adam", "f64", steps=MUTANT_STEPS, checks=("checkpoint_resume",))
    assert "loading into adam with amsgrad=False was accepted" in row.message
    assert "loading into adamw was accepted" in row.message
