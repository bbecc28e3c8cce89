"""The engine a gradcheck run checks, with what every case run in it shares.

    EngineUnderTest()                                  ours on the CPU backend
    EngineUnderTest(backends=("cpu", "cuda"), inject="relu_grad_scaled")
    EngineUnderTest(get_adapter("ggml"), case_timeout=60)

Our engine runs each case on every backend asked for (an EngineAdapter per backend, with
the mutation `inject` in place); another engine is one adapter. An adapter with `isolated`
set (ggml: C code that may abort) runs in one worker process (checkkit.isolated), started at
the first case, kept across cases and restarted after a crash; `case_timeout` is the seconds
one engine call may take there. Closing the engine (or leaving it as a context manager)
stops the worker.

The request (gradcheck.request) makes one of these; run_checks and generated_results take
one, or a bare adapter, which they wrap and close themselves.
"""

from __future__ import annotations

from checkkit.isolated import IsolatedAdapter
from checkkit.worker import DEFAULT_CASE_TIMEOUT
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.injection import ScaledAdapter, injected_factor


class EngineUnderTest:
    """`adapter` (None: ours on each of `backends`, with `inject`), run as the module doc
    says; another engine's adapter takes a factor mutation (`scale:F`) as `inject`, its
    answers scaled (gradcheck.injection.ScaledAdapter). ValueError when a named mutant or
    other backends are given with another engine's adapter."""

    def __init__(self, adapter=None, backends=("cpu",), inject: str | None = None,
                 case_timeout: float = DEFAULT_CASE_TIMEOUT):
        if adapter is not None and ((inject and injected_factor(inject) is None)
                                    or tuple(backends) != ("cpu",)):
            raise ValueError("named mutants and backends apply to our engine only, not to "
                             f"engine {adapter.name!r}")
        self.adapter, self.backends, self.inject = adapter, tuple(backends), inject
        self.case_timeout = case_timeout
        self._running = None

    @classmethod
    def of(cls, engine) -> tuple[EngineUnderTest, bool]:
        """`engine` as an EngineUnderTest (None: ours on the CPU; an adapter: that engine),
        and whether it was made here (and so is the caller's to close)."""
        if isinstance(engine, EngineUnderTest):
            return engine, False
        return cls(engine), True

    @property
    def ours(self) -> bool:
        return self.adapter is None

    def running(self):
        """The adapter that runs cases: an isolated one's worker proxy (started here, kept),
        else the adapter itself; None for ours (see on_backend)."""
        if self.adapter is None or not self.adapter.isolated or \
                isinstance(self.adapter, IsolatedAdapter):
            return self._scaled(self.adapter)
        if self._running is None:
            self._running = IsolatedAdapter(self.adapter, self.case_timeout)
        return self._scaled(self._running)

    def _scaled(self, adapter):
        """`adapter`, with another engine's factor mutation (`inject`) around it."""
        factor = injected_factor(self.inject)
        if adapter is None or factor is None:
            return adapter
        return ScaledAdapter(adapter, factor)

    def on_backend(self, backend: str = "cpu"):
        """The adapter that runs a case on `backend`: ours there, with the mutation in place,
        or the one engine (running())."""
        if self.adapter is None:
            return EngineAdapter(backend, self.inject)
        return self.running()

    def pairs(self) -> list[tuple[object, object]]:
        """(running adapter, local adapter) per engine a case runs in: ours on each backend,
        or the one engine; the local one names the engine in repro commands."""
        if self.adapter is None:
            return [(a, a) for a in (EngineAdapter(b, self.inject) for b in self.backends)]
        return [(self.running(), self.adapter)]

    def describe(self) -> str:
        """The engine under test, for the report's metadata: the adapter's description, or
        ours on each backend."""
        if self.adapter is not None:
            return self.adapter.describe()
        return ", ".join(EngineAdapter(b).describe() for b in self.backends)

    def close(self) -> None:
        if self._running is not None:
            self._running.close()
            self._running = None

    def __enter__(self) -> EngineUnderTest:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
