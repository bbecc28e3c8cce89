"""The invariant family's mutant tests, shared: their parametrisations and the one check
each makes (the invariant that must catch the mutant fails, and no other)."""

from __future__ import annotations

import pytest

from tests.optcheck.invariant_mutants import failing, mutant_kernels


def kernel_mutants(mutants):
    """Parametrises a test over `mutants` (bug, optimizer, the invariant that must catch it)
    and the dtypes f64 and f32."""
    def parametrise(test):
        test = pytest.mark.parametrize(("bug", "optimizer", "check"), mutants,
                                       ids=[f"{b}-{o}-{c}" for b, o, c in mutants])(test)
        return pytest.mark.parametrize("dtype", ["f64", "f32"])(test)
    return parametrise


def assert_kernel_mutant_caught(bug, optimizer, check, dtype):
    with mutant_kernels(bug):
        assert failing(optimizer, dtype, (check,)) == {check}


def patched_mutants(mutants):
    """Parametrises a test over the names of `mutants` (name -> (object, attribute, its
    replacement made from the original, the invariant that must catch it)) and the
    optimizers sgd and adam."""
    def parametrise(test):
        test = pytest.mark.parametrize("name", sorted(mutants))(test)
        return pytest.mark.parametrize("optimizer", ["sgd", "adam"])(test)
    return parametrise


def assert_patched_mutant_caught(mutants, name, optimizer, monkeypatch):
    owner, attribute, make, check = mutants[name]
    monkeypatch.setattr(owner, attribute, make(getattr(owner, attribute)))
    assert failing(optimizer, "f64", (check,)) == {check}
