"""Known bugs injected into backward rules, to show that gradcheck catches them.

A check that cannot fail is a defect: `gradcheck --inject scale` must report failures.
Mutations patch the registry's backward rules of the ops a case is made of, only while
its backward graph is built, and restore them afterwards.
"""

from __future__ import annotations

import contextlib

from engine.registry import OPS


def _scaled(backward, factor):
    def mutated(g, out, *srcs, **params):
        from engine.ops import scale
        return tuple(None if sg is None else scale(sg, factor)
                     for sg in backward(g, out, *srcs, **params))
    return mutated


MUTATIONS = {
    "scale": (_scaled, 1.01, "every input gradient of the op multiplied by FACTOR "
                             "(default 1.01)"),
}


def parse(spec: str) -> tuple[str, float]:
    """'scale' or 'scale:1.05' -> ('scale', 1.05); ValueError on anything else."""
    name, _, arg = spec.partition(":")
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r}; known: {', '.join(MUTATIONS)}")
    try:
        value = float(arg) if arg else MUTATIONS[name][1]
    except ValueError:
        raise ValueError(f"mutation {name}: {arg!r} is not a number") from None
    return name, value


@contextlib.contextmanager
def injected(spec: str | None, op_names):
    """Within the block, the backward rules of `op_names` carry the mutation `spec`."""
    if not spec:
        yield
        return
    name, value = parse(spec)
    make = MUTATIONS[name][0]
    saved = {}
    try:
        for op_name in set(op_names):
            op = OPS[op_name]
            if op.backward is not None:
                saved[op_name] = op.backward
                op.backward = make(op.backward, value)
        yield
    finally:
        for op_name, backward in saved.items():
            OPS[op_name].backward = backward
