"""Known bugs of the ops (mutants), declared beside the ops, for gradcheck's self-test.

A mutant is a named, documented bug in one op: in its backward rule, or in one of its CPU
kernels (a backward op's, a forward one, its thread split, a fast path). `mutant.patch()`
puts the bug in place and restores the registry afterwards (the very same objects), even
on error (engine.mutation.patches). Kernel mutants wrap the real kernel: they call it with
wrong parameters, bounds, slices or accumulators, or call it and then corrupt its result
the way the bug would. gradcheck's self-test (gradcheck.selftest) runs every mutant and
must catch each; `gradcheck --inject NAME` puts one in place for a run.

Where they live. Each op module of engine/ops declares its own mutants at its end, with
their op-specific bug functions, and registers them here (`register`); a mutant that
involves several ops sits in the module of the op whose code it breaks. Importing
engine.ops loads every op module, so every mutant is registered (`mutants()` lists them).
This package, below engine.ops and above engine.backends, holds what several ops share:

- this module: the `Mutant` record, KINDS, TIERS, the registration table (`register`,
  `mutants`, `declared_in`), the stated reasons why a differentiable op has no mutant
  (`exempt`, `exemptions`), the shared case filters (`contiguous`, `permuted`), and the
  mutants of the 16-bit conversions every widened kernel calls (no one op's);
- engine.mutation.patches: the context managers that put a patch into the registry (a
  backward rule, a kernel, its preparation or chunking, the 16-bit machinery) and take it
  out, and `scaled`, the patch that scales an op's every gradient;
- engine.mutation.kernels: the kernel-bug makers several ops use (a strided input read as
  contiguous, a region left unwritten, a thread split's chunks cut wrong, the 16-bit
  conversions rounded or widened wrong);
- engine.mutation.attention: attention's kernel-bug makers (its mutants are declared in
  engine/ops/attention.py, which has no room for the makers under the 500-line limit).

Each mutant has a `kind` (KINDS) and a `tier`, the cheapest tier of cases that sees it:
- "fast": the registry's small samples (OpDef.samples). A mutant of a forward kernel also
  changes the float64 reference there (our engine's float64 graph runs the same kernels),
  so it is caught against torch, or by NaN where the bug leaves memory unwritten;
- "scale": the ops' scale cases (OpDef.scale, gradcheck.scale), for a bug in a fast path
  that no small case takes (a split over threads, the chunked sums, the tiled copy, the
  zero-skipping product, a big scatter). Such a bug is never taken in plain mode, which
  makes the scale tier's float64 reference, so the reference stays right.

`ops` names the ops whose cases must catch the bug; `where` keeps the cases that exercise
it (an im2col case without dilation cannot show a dilation bug); `extra` adds cases the
registry lacks.

Every differentiable op (one with a backward rule, a composite, or a dedicated backward op)
has a mutant, through its `ops` or by being the op the mutant patches, or a reason it has
none, declared in its module with `exempt(op, reason)`; tests/engine/test_mutation.py
holds the ops to that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import sys
from collections.abc import Callable

from engine.mutation import kernels
from engine.mutation.patches import half_function_replaced
from engine.registry import all_ops
from engine.samples import Sample

__all__ = ["KINDS", "TIERS", "Mutant", "contiguous", "declared_in", "exempt", "exempted_in",
           "exemptions", "mutants", "patched_ops", "permuted", "register", "unexempt",
           "unregister"]

KINDS = {
    "scaled gradient": "a gradient multiplied by a wrong factor",
    "transposed gradient": "a gradient in the wrong axis order",
    "dropped term": "a term of the gradient's formula left out",
    "wrong broadcast reduction": "a broadcast input's gradient summed over the wrong axes",
    "off-by-one window": "a pooling or im2col window (or its gradient) in the wrong cells",
    "wrong branch": "one piece of a piecewise derivative wrong",
    "chunk boundary": "a chunk of a split or chunked kernel ending one element off",
    "scatter race": "a parallel scatter-add whose threads write one element: adds lost",
    "float32 accumulator": "a sum accumulated in float32 where the kernel promises float64",
    "dropped tail": "the last elements of a row, a chunking or a sparse row not computed",
    "permuted stride": "a permuted (strided) input read in memory order, as if contiguous",
    "broadcast split": "a thread split that slices a broadcast operand with the output",
    "unwritten edge": "part of the output never written: right only on a zeroed buffer",
    "16-bit accumulator": "a sum accumulated in float16 or bfloat16 where the kernel "
                          "promises float32",
    "rounding mode": "16-bit results rounded toward zero, or ties away from zero, instead "
                     "of to nearest even",
    "subnormal flush": "16-bit subnormal results flushed to zero",
    "NaN propagation": "a NaN turned into another value (an infinity) on its way through",
    "16-bit widening": "16-bit values widened to float32 wrongly on load",
    "parameter rule": "a quantity derived from the op's parameters (YaRN's correction "
                      "range, ALiBi's slopes) wrong for some of their values",
    "wrong saved statistic": "a backward pass recomputing from a wrong saved statistic (a "
                             "log-sum-exp)",
    "control": "no bug: the patching machinery alone, which must not be flagged",
}
TIERS = ("fast", "scale")


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    ops: tuple[str, ...]                    # whose sample cases must catch it
    description: str
    patch: Callable[[], contextlib.AbstractContextManager]
    where: Callable[[Sample], bool] = lambda case: True
    extra: Callable[[str], list[Sample]] = lambda dtype: []   # cases the registry lacks
    max_cases: int = 3                      # per op and dtype, smallest first
    cotangents: bool = False                # also the op's cotangent cases (gradcheck.cotangents)
    kind: str = ""                          # one of KINDS
    tier: str = "fast"                      # TIERS: the cases it runs on (module doc)
    control: bool = False                   # no bug: passes when no case flags it
    dtypes: tuple[str, ...] | None = None   # a fast-tier mutant's dtypes (None: the run's)


# --- the registration table -------------------------------------------------------------------
_order = itertools.count()
_MUTANTS: dict[str, tuple[Mutant, str, int]] = {}   # name -> (mutant, its module, sequence)
_EXEMPT: dict[str, tuple[str, str]] = {}            # op -> (reason, the module stating it)


def _caller(depth: int = 2) -> str:
    return sys._getframe(depth).f_globals.get("__name__", "?")


def register(*mutants: Mutant, module: str | None = None) -> None:
    """Add `mutants` to the table, as declared in `module` (default: the calling module).
    A name is registered once (ValueError on a second)."""
    module = module or _caller()
    for m in mutants:
        if m.name in _MUTANTS:
            raise ValueError(f"mutant {m.name} registered twice (first in "
                             f"{_MUTANTS[m.name][1]}, again in {module})")
        _MUTANTS[m.name] = (m, module, next(_order))


def unregister(name: str) -> Mutant:
    """Take the mutant called `name` out of the table (a test's planted one) and return it."""
    return _MUTANTS.pop(name)[0]


def mutants() -> list[Mutant]:
    """Every registered mutant, in a stable order: by declaring module's name, then in the
    order each module declares them (the order engine.ops loads its modules in)."""
    return [m for m, _, _ in sorted(_MUTANTS.values(), key=lambda e: (e[1], e[2]))]


def declared_in(name: str) -> str:
    """The module that registered the mutant called `name`."""
    return _MUTANTS[name][1]


def exempt(op: str, reason: str, module: str | None = None) -> None:
    """State why differentiable op `op` has no mutant (declared in the op's module)."""
    if not reason.strip():
        raise ValueError(f"op {op}: an exemption needs a reason")
    if op in _EXEMPT:
        raise ValueError(f"op {op} exempted twice")
    _EXEMPT[op] = (reason, module or _caller())


def unexempt(op: str) -> str:
    """Take op `op`'s exemption away (a test's planted one) and return its reason."""
    return _EXEMPT.pop(op)[0]


def exemptions() -> dict[str, str]:
    """op -> the reason it has no mutant, sorted by op."""
    return {op: reason for op, (reason, _) in sorted(_EXEMPT.items())}


def exempted_in(op: str) -> str:
    """The module that stated op `op`'s exemption."""
    return _EXEMPT[op][1]


def patched_ops(mutant: Mutant) -> set[str]:
    """The registered ops whose backward rule or kernels `mutant.patch()` replaces (found by
    putting the patch in place and looking); none for a patch of the 16-bit machinery."""
    def state():
        return {name: (op.backward, dict(op.kernels)) for name, op in all_ops().items()}

    before = state()
    with mutant.patch():
        during = state()
    return {name for name, (backward, kernels) in before.items()
            if name in during and (during[name][0] is not backward
                                   or during[name][1].keys() != kernels.keys()
                                   or any(during[name][1][k] is not v
                                          for k, v in kernels.items()))}


# --- which cases exercise a bug (shared) --------------------------------------------------------
def permuted(case) -> bool:
    """Whether the case's first input is a permuted view."""
    return case.inputs[0].permute is not None


def contiguous(case) -> bool:
    """Whether the case's first input is no view (contiguous)."""
    return not case.inputs[0].is_view


def _biased_enough(case) -> bool:
    """Whether a case's output may have enough elements for the bias test (twice the 16
    inexact ones of gradcheck.precision.BIAS_MIN_ELEMENTS)."""
    return min(math.prod(spec.shape) for spec in case.inputs) >= 32


def _tiny(case) -> bool:
    """Whether a 16-bit case's inputs lie in the subnormal range of its dtype (some input's
    range below the smallest normal)."""
    smallest = 2.0 ** -14 if case.dtype == "f16" else 2.0 ** -126
    return any(0 < max(abs(s.low), abs(s.high)) < smallest for s in case.inputs)


# --- the 16-bit conversions (engine.backends.cpu.half): no one op's -----------------------------
register(
    Mutant("store_truncates", ("exp", "add", "matmul"),
           "every 16-bit result rounded toward zero on store instead of to nearest even: "
           "one ulp at most, inside every tolerance and ratio, but biased (-0.5 ulp on "
           "average), which the precision verdict's bias test sees",
           lambda: half_function_replaced("store", kernels.store_truncated),
           where=_biased_enough, dtypes=("f16", "bf16"), max_cases=1, kind="rounding mode"),
    Mutant("store_ties_away", ("add",),
           "16-bit results halfway between two 16-bit values rounded away from zero instead "
           "of to the even one: half an ulp on the ties only (a sum of two 16-bit values a "
           "binade apart is a tie half of the time), which correct rounding sees",
           lambda: half_function_replaced("store", kernels.store_ties_away),
           dtypes=("f16", "bf16"), max_cases=2, kind="rounding mode"),
    Mutant("store_flushes_subnormals", ("mul",),
           "16-bit results below the smallest normal flushed to a signed zero on store: "
           "right for every case of ordinary magnitudes, wrong where outputs or gradients "
           "are subnormal (the tiny cases)",
           lambda: half_function_replaced("store", kernels.store_flushes_subnormals),
           where=_tiny, dtypes=("f16", "bf16"), max_cases=1, kind="subnormal flush"),
    Mutant("store_nan_unquieted", ("add", "mul"),
           "a NaN stored in 16 bits without its quiet bit: an arithmetic NaN's payload is "
           "that bit alone, so it becomes an infinity (the propagation cases)",
           lambda: half_function_replaced("store", kernels.store_nan_unquieted),
           where=lambda case: case.special, dtypes=("f16", "bf16"), max_cases=1,
           kind="NaN propagation"),
    Mutant("bf16_widened_wrong_shift", ("relu", "abs", "mul"),
           "bfloat16 widened as (h >> 1) << 17 instead of h << 16: inputs whose mantissa's "
           "last bit is set read one bfloat16 ulp nearer zero (a relative 2^-8, a tenth of "
           "bfloat16's fixed tolerance); the outputs' bias shows it",
           lambda: half_function_replaced("widened_copy", kernels.bf16_widened_wrong_shift),
           where=_biased_enough, dtypes=("bf16",), max_cases=1, kind="16-bit widening"),
    Mutant("half_split_range_end", ("matmul",),
           "a 16-bit product's widening and rounding, split in ranges on the engine's "
           "threads, end each range but the last one element early: the boundary elements "
           "are never converted",
           lambda: half_function_replaced("in_ranges", kernels.split_ranges_end_early),
           where=lambda case: case.dtype in ("f16", "bf16"), tier="scale", max_cases=1,
           kind="chunk boundary"),
)
