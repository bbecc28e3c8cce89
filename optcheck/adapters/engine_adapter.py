"""Our engine's optimizers as an optimizer adapter (optcheck.adapters.base): the
EngineStepper of optcheck.harness, on one backend.

The engine has no param groups: an optimizer owns its parameters and one set of
hyperparameters, and a model with several groups builds one optimizer per group. That is
what `grouped_stepper` does, so the groups' cases check what a user of the engine runs.
"""

from __future__ import annotations

from optcheck.harness import EngineStepper


class _Groups:
    """One EngineStepper per group, stepped together; snapshots and saves merged."""

    def __init__(self, steppers: list):
        self.steppers = steppers

    def step(self, grads: dict) -> None:
        for s in self.steppers:
            s.step({k: grads[k] for k in s.params})

    def snapshot(self) -> dict:
        return {k: v for s in self.steppers for k, v in s.snapshot().items()}

    def save(self) -> list:
        return [s.save() for s in self.steppers]

    def restore(self, saved: list) -> None:
        for s, one in zip(self.steppers, saved, strict=True):
            s.restore(one)


class EngineOptimizer:
    """The engine's SGD, Adam and AdamW on `backend`; every flag and dtype."""

    name = "engine"

    def __init__(self, backend: str = "cpu"):
        self.backend = backend

    def describe(self) -> str:
        import engine
        return engine.describe(self.backend)

    def unsupported(self, optimizer, dtype, hp, flags) -> str | None:
        return None

    def stepper(self, optimizer, init, hp, flags, dtype):
        return EngineStepper(optimizer, init, hp, flags, dtype, self.backend)

    def grouped_stepper(self, optimizer, groups):
        return _Groups([EngineStepper(optimizer, g.init, g.hp, g.flags, g.dtype, self.backend)
                        for g in groups])
