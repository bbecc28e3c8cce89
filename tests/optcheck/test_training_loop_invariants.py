"""The training-loop invariants (grad_accumulation, determinism, epoch_vs_fit) each see the
bugs they should see: a noisy step kernel, and mutants of the trainer's accumulation and
shuffling."""

from __future__ import annotations

import numpy as np

from engine.backends.cpu import CpuBackend
from engine.train import Trainer
from tests.optcheck.mutant_cases import (
    assert_kernel_mutant_caught,
    assert_patched_mutant_caught,
    kernel_mutants,
    patched_mutants,
)

KERNEL_MUTANTS = [   # (bug, optimizer, the invariant that must catch it)
    ("noise", "sgd", "determinism"),
    ("noise", "adamw", "determinism"),
]


@kernel_mutants(KERNEL_MUTANTS)
def test_kernel_mutant_is_caught(bug, optimizer, check, dtype):
    assert_kernel_mutant_caught(bug, optimizer, check, dtype)


def _overwriting_accumulate(self, dst, src):
    np.copyto(dst, src)   # forgets the earlier physical batches


def _fit_with_its_own_generator(original):
    def fit(self, *args, **kwargs):
        self.rng = np.random.default_rng(12345)   # not the trainer's seeded generator
        return original(self, *args, **kwargs)
    return fit


LOOP_MUTANTS = {   # name -> (object, attribute, replacement from the original, check)
    "accumulate_overwrites": (CpuBackend, "accumulate", lambda _: _overwriting_accumulate,
                              "grad_accumulation"),
    "fit_unseeded_shuffle": (Trainer, "fit", _fit_with_its_own_generator, "epoch_vs_fit"),
    "fit_seed_ignored": (Trainer, "fit", _fit_with_its_own_generator, "determinism"),
}


@patched_mutants(LOOP_MUTANTS)
def test_loop_mutant_is_caught(name, optimizer, monkeypatch):
    assert_patched_mutant_caught(LOOP_MUTANTS, name, optimizer, monkeypatch)
