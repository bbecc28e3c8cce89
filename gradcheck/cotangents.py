"""The registry's cotangent cases: each op's backward fed a strided upstream gradient.

A backward pass receives the gradient of its op's output from whatever consumes that
output, in whatever layout that consumer's backward produces: ggml's MNIST CNN flattens
with cont(permute(pool_2d(x))), so pool_2d's backward gets a permuted gradient; a sum over
an axis hands a stride-0 one. A backward kernel that reads its incoming gradient as if it
were contiguous is right on every case whose loss weights the output directly, and wrong in
training. So for each op and dtype, the registry sample whose float output has the most axes
longer than 1 (two at least) is also checked with cotangent "permuted", "expanded" and
"sliced" (engine.samples): same inputs and weights, only the layout the engine receives
differs.
"""

from __future__ import annotations

import dataclasses

from engine.samples import Sample
from engine.tensor import is_float

LAYOUTS = ("permuted", "expanded", "sliced")


def _output(case: Sample):
    """The case's output tensor, built symbolically on its inputs (nothing is computed; no
    loss graph: its shape and dtype are all that is asked)."""
    from gradcheck.adapters.engine_adapter import case_leaves
    return case.build(*case_leaves(case, case.generate_inputs(), as_params=False))


def cotangent_cases(samples, null: tuple[str, ...] = ()) -> list[Sample]:
    """The cotangent variants of `samples` (one op's registry samples): for each dtype, the
    sample whose float output has the most axes longer than 1 (at least two; the first of
    equals), once per layout of LAYOUTS; a layout in `null` (the op's null_cotangents,
    in whose weights its VJP vanishes) is replaced by its twin along the first axis
    ("expanded_first"), where a check could fail."""
    best: dict[str, tuple[int, Sample]] = {}
    for case in samples:
        if case.cotangent != "contiguous":
            continue
        y = _output(case)
        long_axes = sum(d > 1 for d in y.shape)
        if is_float(y.dtype) and long_axes >= 2 and \
                long_axes > best.get(case.dtype, (1, None))[0]:
            best[case.dtype] = (long_axes, case)
    layouts = [f"{layout}_first" if layout in null else layout for layout in LAYOUTS]
    return [dataclasses.replace(case, cotangent=layout)
            for _, case in best.values() for layout in layouts]


def registry_cases(op) -> list[Sample]:
    """An op's registry samples followed by their cotangent variants (an OpDef with
    samples, see engine.registry); an op without a gradient has none (a dedicated backward
    op's own upstream gradient is an input, whose layouts are its samples')."""
    samples = list(op.samples()) if op.samples else []
    return samples + (cotangent_cases(samples, op.null_cotangents)
                      if op.differentiable else [])


TIERS = ("fast", "scale", "all")


def tier_cases(op, tier: str = "fast") -> list:
    """An op's cases of `tier`: "fast", its registry samples with their cotangent variants
    (registry_cases); "scale", its scale cases (OpDef.scale); "all", both."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS}, got {tier!r}")
    cases = registry_cases(op) if tier in ("fast", "all") else []
    if tier in ("scale", "all") and op.scale is not None:
        cases += list(op.scale())
    return cases
