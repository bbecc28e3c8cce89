"""`--inject`: a known bug put into our engine (a backward rule or a kernel), to see it caught.

A check that cannot fail is a defect: `gradcheck --inject scale` must report failures.
An injection spec is one of:

- `scale[:FACTOR]` (FACTOR_MUTATIONS): the backward rules of the ops a case is made of,
  every input gradient multiplied by FACTOR (default 1.01);
- the name of a mutant of `gradcheck.mutants.MUTANTS` (e.g. `softmax_back_no_subtraction`,
  declared beside its op and registered in engine.mutation):
  that one documented bug in its op, whatever the case is made of.

Both are in place only within `injected(...)` and restored afterwards, even on error (see
engine.mutation.patches). A mutant that changes a kernel must be in place when the plan is made
(graph.compute), not only while the backward graph is built.
"""

from __future__ import annotations

import contextlib

from engine.mutation.patches import backward_replaced, scaled_backward
from engine.registry import OPS
from gradcheck.mutants import MUTANTS

# name -> (make(real_backward, factor), default factor, description): mutations of every op
# of a case, taking a FACTOR
FACTOR_MUTATIONS = {
    "scale": (scaled_backward, 1.01, "every input gradient of the op multiplied by FACTOR "
                                     "(default 1.01)"),
}


def parse(spec: str) -> tuple[str, float | None]:
    """'scale' or 'scale:1.05' -> ('scale', 1.05); a mutant's name -> (name, None);
    ValueError on anything else."""
    name, colon, arg = spec.partition(":")
    if name in MUTANTS:
        if colon:
            raise ValueError(f"mutant {name} takes no argument, got {arg!r}")
        return name, None
    if name not in FACTOR_MUTATIONS:
        raise ValueError(f"unknown mutation {name!r}; known: "
                         f"{', '.join([*FACTOR_MUTATIONS, *MUTANTS])}")
    try:
        value = float(arg) if arg else FACTOR_MUTATIONS[name][1]
    except ValueError:
        raise ValueError(f"mutation {name}: {arg!r} is not a number") from None
    return name, value


def injected_factor(spec: str | None) -> float | None:
    """The factor of a factor mutation (`scale:F` -> F), None for none or a named mutant."""
    if not spec:
        return None
    name, value = parse(spec)
    return value if name in FACTOR_MUTATIONS else None


def describe_injections() -> str:
    """What --inject accepts, for the CLI's help: each factor mutation, then the mutants."""
    text = "; ".join(f"{k}: {v[2]}" for k, v in FACTOR_MUTATIONS.items())
    return text + "; or a self-test mutant: " + ", ".join(MUTANTS)


@contextlib.contextmanager
def injected(spec: str | None, op_names):
    """Within the block, the mutation `spec` is in place: `scale[:F]` in the backward rules
    of `op_names`, a named mutant in its own op (`op_names` unused)."""
    if not spec:
        yield
        return
    name, value = parse(spec)
    if name in MUTANTS:
        with MUTANTS[name].patch():
            yield
        return
    make = FACTOR_MUTATIONS[name][0]
    with contextlib.ExitStack() as stack:
        for op_name in sorted(set(op_names)):
            if OPS[op_name].backward is not None:
                stack.enter_context(backward_replaced(
                    op_name, lambda real: make(real, value)))
        yield
