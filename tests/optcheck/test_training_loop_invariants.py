"""The training-loop invariants (grad_accumulation, determinism, epoch_vs_fit) each see the
bugs they should see: a noisy step kernel, and mutants of the trainer's accumulation and
shuffling."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cpu import CpuBackend
from engine.train import Trainer
from tests.optcheck.invariant_mutants import failing, mutant_kernels

KERNEL_MUTANTS = [   # (bug, optimizer, the invariant that must catch it)
    ("noise", "sgd", "determinism"),
    ("noise", "adamw", "determinism"),
]


@pytest.mark.parametrize("dtype", ["f64", "f32"])
@pytest.mark.parametrize(("bug", "optimizer", "check"), KERNEL_MUTANTS,
                         ids=[f"{b}-{o}-{c}" for b, o, c in KERNEL_MUTANTS])
def test_kernel_mutant_is_caught(bug, optimizer, check, dtype):
    with mutant_kernels(bug):
        assert failing(optimizer, dtype, (check,)) == {check}


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


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", sorted(LOOP_MUTANTS))
def test_loop_mutant_is_caught(name, optimizer, monkeypatch):
    owner, attribute, make, check = LOOP_MUTANTS[name]
    monkeypatch.setattr(owner, attribute, make(getattr(owner, attribute)))
    assert failing(optimizer, "f64", (check,)) == {check}
