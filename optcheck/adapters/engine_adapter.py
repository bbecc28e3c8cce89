"""Our engine's optimizers as an optimizer adapter (optcheck.adapters.base): the
EngineStepper of optcheck.harness, on one backend."""

from __future__ import annotations

from optcheck.harness import EngineStepper


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
