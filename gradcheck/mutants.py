"""The self-test's mutants, as gradcheck runs them: the registered ones, and the control.

The mutants themselves (known bugs, each patched into the registry for one check, to prove
gradcheck's power) are declared beside their ops, at the end of each op module of
engine/ops, and registered in engine.mutation, which holds the `Mutant` record, KINDS,
TIERS, the patches (engine.mutation.patches) and the kernel-bug makers several ops share
(engine.mutation.kernels); its module doc says what a mutant's fields mean. Importing
engine.ops loads every op module, so every mutant is registered.

This module is the consumer side: `MUTANTS`, every registered mutant by name (in
engine.mutation.mutants()'s order: by declaring module, then declaration), for
gradcheck.selftest and `gradcheck --inject NAME` (gradcheck.injection); and CONTROL, the
machinery with no bug, which must not be flagged (gradcheck.selftest).
"""

from __future__ import annotations

import engine.ops  # noqa: F401  (loads every op module: their mutants register)
from engine.mutation import KINDS, TIERS, Mutant, mutants
from engine.mutation.patches import all_of, chunks_replaced, kernel_replaced, prepare_replaced
from engine.registry import get_op
from engine.scale_cases import SIDE

__all__ = ["CONTROL", "KINDS", "MUTANTS", "TIERS", "Mutant", "identity"]

MUTANTS: dict[str, Mutant] = {m.name: m for m in mutants()}


def identity(real):
    """The control's change: none (the real kernel, preparation or chunking, wrapped)."""
    def same(*args, **kwargs):
        return real(*args, **kwargs)
    same.__name__ = getattr(real, "__name__", "same")
    return same


def _control_fast_cases(dtype):
    """The registry's first two fast-tier cases of sum, sub and get_rows."""
    return [s for op in ("sum", "sub", "get_rows")
            for s in [c for c in get_op(op).samples() if c.dtype == dtype][:2]]


CONTROL = Mutant(
    "control_no_bug", ("sub", "get_rows"),
    "the kernel-swapping machinery with no bug: sum's and mul's preparations, sub's and "
    "mul's chunkings and get_rows_back's kernel each replaced by an identity wrapper of "
    "the real one (every scale case's loss is a sum of a product)",
    lambda: all_of(lambda: prepare_replaced("sum", identity),
                   lambda: prepare_replaced("mul", identity),
                   lambda: chunks_replaced("mul", identity),
                   lambda: chunks_replaced("sub", identity),
                   lambda: kernel_replaced("get_rows_back", identity)),
    where=lambda case: case.op != "sub" or case.inputs[1].shape == (1, SIDE),
    extra=_control_fast_cases, tier="scale", max_cases=1, kind="control", control=True)
