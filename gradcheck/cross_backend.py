"""`vs_cpu`: an engine's answer on another backend against the same engine's on the CPU.

On a backend other than the CPU (an adapter whose `backend` is not "cpu" and that offers
`on_cpu()`), the case runs again on the CPU twin, on the same inputs and weights, and the
forward output and every checked gradient are held to each other in the case's tolerance
(integer outputs: equal). The float64 reference and its numerical gradients run on the CPU
whatever the backend; this comparison is cross-backend consistency on top of them.
"""

from __future__ import annotations

import numpy as np

from engine.tensor import is_float
from gradcheck.backprop import engine_vjp
from gradcheck.numeric import compare


def compares_with_cpu(adapter) -> bool:
    """Whether `adapter` runs off the CPU and has a CPU twin to be compared with."""
    return getattr(adapter, "backend", "cpu") != "cpu" and hasattr(adapter, "on_cpu")


def cpu_differences(case, pairs) -> list[str]:
    """What of `pairs` ((what, this backend's array, the CPU's)) differs beyond the case's
    tolerance, e.g. 'grad x (3/12, max abs err 0.01)'; empty when all agree."""
    off = []
    for what, got, want in pairs:
        if not is_float(np.asarray(got).dtype):
            if not np.array_equal(got, want):
                off.append(what)
            continue
        cmp = compare(np.asarray(got), np.asarray(want), case.precision)
        if not cmp.ok or cmp.nonfinite:
            off.append(f"{what} ({cmp.failures}/{cmp.checked}, max abs err {cmp.max_abs:.3g})")
    return off


def versus_cpu(case, arrays, weights, adapter, out, backprop,
               settle=None) -> tuple[str, ...]:
    """`adapter`'s forward output `out` and gradients `backprop` (None where not checked)
    against its CPU twin's on the same inputs: what differs (see cpu_differences).
    `settle`: applied to both float outputs first (gradcheck.reference.settled: the
    output's constant infinities)."""
    cpu_out, cpu_grads, _ = engine_vjp(adapter.on_cpu(), case, arrays, weights, out.shape)
    if settle is not None and is_float(np.asarray(out).dtype):
        out, cpu_out = settle(out), settle(cpu_out)
    pairs = [("forward", out, cpu_out)] + [
        (f"grad {spec.name}", g, c) for spec, g, c in zip(case.inputs, backprop, cpu_grads,
                                                          strict=True) if g is not None]
    return tuple(cpu_differences(case, pairs))
