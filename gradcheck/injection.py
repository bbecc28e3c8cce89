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
import dataclasses

import numpy as np

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


class ScaledAdapter:
    """Another engine's adapter with a factor mutation injected (`--inject scale:F` with
    `--engine NAME`): every gradient it answers (VJP, JVP, Hessian-vector product) is
    multiplied by F, and so is the output of a dedicated backward op and of a forward-only
    variant, which are all those rows check. The engine's own code is not changed; the
    point is the checker's: each of the engine's rows must fail (or say why it cannot).
    Wraps the running adapter (an isolated one's worker proxy included: its `forward` is
    not offered, so that a backward op runs in the worker too)."""

    isolated = False

    def __init__(self, inner, factor: float):
        self.inner, self.factor, self.name = inner, float(factor), inner.name

    def __getattr__(self, name):
        if name == "inner":
            raise AttributeError(name)
        if name == "forward" and getattr(self.inner, "isolated", False):
            raise AttributeError(name)
        value = getattr(self.inner, name)       # AttributeError where the engine lacks it
        wrap = {"forward": self._forward, "jvp": self._jvp, "hvp": self._hvp,
                "forward_only_output": self._forward_only,
                "with_threads": self._with_threads}.get(name)
        return value if wrap is None or not callable(value) else wrap

    def _scaled(self, a):
        if a is None:
            return None
        a = np.asarray(a)
        return np.asarray(np.asarray(a, np.float64) * self.factor, a.dtype)

    def _output(self, case, out):
        """A backward op's output is a gradient: scaled; any other output as it is."""
        op = OPS.get(case.op) if getattr(case, "registered", True) else None
        return self._scaled(out) if op is not None and op.kind == "backward" else out

    def vjp(self, case, arrays, weights):
        v = self.inner.vjp(case, arrays, weights)
        return dataclasses.replace(v, output=self._output(case, v.output),
                                   grads=[self._scaled(g) for g in v.grads])

    def _forward(self, case, arrays):
        return self._output(case, self.inner.forward(case, arrays))

    def _jvp(self, case, arrays, tangents):
        v = self.inner.jvp(case, arrays, tangents)
        return dataclasses.replace(v, tangent=self._scaled(v.tangent))

    def _hvp(self, case, arrays, weights, direction, *args, **kwargs):
        v = self.inner.hvp(case, arrays, weights, direction, *args, **kwargs)
        return dataclasses.replace(v, grads=[self._scaled(g) for g in v.grads])

    def _forward_only(self, variant, case, arrays):
        out, seen = self.inner.forward_only_output(variant, case, arrays)
        return self._scaled(out), seen

    def _with_threads(self, n: int):
        return ScaledAdapter(self.inner.with_threads(n), self.factor)

    def describe(self) -> str:
        return self.inner.describe()

    def unsupported(self, case):
        return self.inner.unsupported(case)
