"""The engine a gradcheck run checks, with what every case run in it shares.

    EngineUnderTest()                                  ours on the CPU backend
    EngineUnderTest(backends=("cpu", "cuda"), inject="relu_grad_scaled")
    EngineUnderTest(isolate=True)                      ours, every case in a worker process
    EngineUnderTest(boundscheck=True)                  ... its kernels bounds-checked there
    EngineUnderTest(get_adapter("ggml"), case_timeout=60)

Our engine runs each case on every backend asked for (an EngineAdapter per backend, with
the mutation `inject` in place); another engine is one adapter.

Isolation. A case run in a worker process (checkkit.worker) cannot take the run down with
it: a segfault, an abort or a corrupted heap there is a `crash` row naming the case, the
report is written, and the next case starts a fresh worker. An adapter with `isolated` set
(ggml: C code that may abort) always runs there; `isolate` decides for the rest:
- None (the default): our engine's scale-tier cases in the worker, its fast-tier cases in
  this process (a small case costs less than the round trip; the scale tier's threads,
  chunks and fast paths are where an out-of-bounds write hides), another engine here;
- True: every case of every engine in the worker;
- False: our engine in this process, its scale tier too.
gradcheck's self-test isolates its mutants too (gradcheck.selftest).

Our engine's worker is one process for every backend, mutation and self-test mutant: each
call of an IsolatedEngine names them (EngineAdapter.answered) and brings back the fast
paths the engine took, counted in this process's recordings (engine.backends.cpu.paths) as
if taken here, so a scale row's `paths` read the same. The float64 references stay in
this process.

`boundscheck`: our engine's worker compiles its CPU kernels with numba's bounds checks
(NUMBA_BOUNDSCHECK=1; every case isolated), so that an out-of-bounds index is an
IndexError, an `error` row naming the op, the node and the kernel (engine.executor), where
unchecked code corrupts memory, silently or fatally. numba's disk cache does not key
machine code by boundscheck: its index key is the signature, the target and the bytecode
(numba 0.68.1: a checked process loads unchecked code from a shared cache, and an
unchecked one checked code). So the worker caches apart, in boundscheck_cache_dir(), and
is started by spawn with both variables set before numba loads, refusing to serve if
either did not hold (checkkit.worker). The first bounds-checked run compiles every kernel
it uses again: minutes (boundscheck_note).

`case_timeout` is the seconds one engine call may take in a worker. Closing the engine (or
leaving it as a context manager) stops its workers.

The request (gradcheck.request) makes one of these; run_checks and generated_results take
one, or a bare adapter, which they wrap and close themselves.
"""

from __future__ import annotations

import copy
import os

from checkkit.cache import numba_cache_dir
from checkkit.isolated import IsolatedAdapter
from checkkit.worker import DEFAULT_CASE_TIMEOUT, Worker
from engine.backends.cpu import paths
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.injection import ScaledAdapter, injected_factor


def boundscheck_cache_dir(environ=None) -> str:
    """Where a bounds-checked worker caches its kernels: `boundscheck` under the one numba
    root (checkkit.cache.numba_cache_dir: NUMBA_CACHE_DIR, which the engine sets on import,
    else <cache>/numba; numba names its own subdirectories after source directories and a
    hash: no clash)."""
    return str(numba_cache_dir(environ) / "boundscheck")


def boundscheck_environ() -> dict[str, str]:
    """The variables of a bounds-checked worker (module doc)."""
    return {"NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": boundscheck_cache_dir()}


def boundscheck_note() -> str:
    """What a bounds-checked run says before it starts: where its kernels are cached, and
    that the first run with that cache compiles them all again."""
    where = boundscheck_cache_dir()
    first = not os.path.isdir(where) or not os.listdir(where)
    return ("--boundscheck: our engine's CPU kernels compiled with numba's bounds checks, "
            f"in a worker process, cached in {where}" +
            (": the first bounds-checked run compiles every kernel it uses again, which "
             "takes minutes" if first else ""))


class IsolatedEngine(IsolatedAdapter):
    """Our engine `local` (an EngineAdapter: its backend and mutation) run in `worker`,
    which our engine's every variant shares (module doc), with the self-test's mutant
    called `mutant` in place there. Offers what the checks call on our engine: vjp,
    vjp_runs, forward, jvp, hvp, with_threads and on_cpu."""

    def __init__(self, local: EngineAdapter, worker: Worker, mutant: str | None = None):
        self.mutant = mutant
        super().__init__(local, worker=worker)

    def _call(self, method: str, *args):
        """`method(*args)` of our engine in the worker (EngineAdapter.answered); the fast
        paths it took there are counted in this process's recordings."""
        answer, taken = super()._call("answered", self.local.backend, self.local.inject,
                                      self.mutant, method, args, doing=method)
        for path, count in taken.items():
            for _ in range(count):
                paths.taken(path)
        return answer

    def forward(self, case, arrays):
        return self._call("forward", case, arrays)

    def vjp_runs(self, case, arrays, weights, runs: int):
        return self._call("vjp_runs", case, arrays, weights, runs)

    def on_cpu(self) -> IsolatedEngine:
        """The same engine on the CPU, in the same worker (the `vs_cpu` column's)."""
        return IsolatedEngine(self.local.on_cpu(), self.worker, self.mutant)


class EngineUnderTest:
    """`adapter` (None: ours on each of `backends`, with `inject`), run as the module doc
    says; another engine's adapter takes a factor mutation (`scale:F`) as `inject`, its
    answers scaled (gradcheck.injection.ScaledAdapter). ValueError when a named mutant,
    other backends or `boundscheck` are given with another engine's adapter, or
    `boundscheck` with isolate False."""

    def __init__(self, adapter=None, backends=("cpu",), inject: str | None = None,
                 case_timeout: float = DEFAULT_CASE_TIMEOUT, isolate: bool | None = None,
                 boundscheck: bool = False):
        if adapter is not None and ((inject and injected_factor(inject) is None)
                                    or tuple(backends) != ("cpu",) or boundscheck):
            raise ValueError("named mutants, backends and boundscheck apply to our engine "
                             f"only, not to engine {adapter.name!r}")
        if boundscheck and isolate is False:
            raise ValueError("boundscheck runs our engine in a worker process: not with "
                             "isolate=False")
        self.adapter, self.backends, self.inject = adapter, tuple(backends), inject
        self.case_timeout = case_timeout
        self.isolate, self.boundscheck = isolate, boundscheck
        self._running = None
        self._shared: dict[str, Worker] = {}    # our engine's worker, shared with only()'s
        self._closes = True

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

    def isolates(self, case=None) -> bool:
        """Whether `case` runs in a worker process (module doc); None: a case of no tier
        (a generated one, fast)."""
        if self.adapter is not None:
            return bool(self.adapter.isolated or self.isolate)
        if self.boundscheck or self.isolate is not None:
            return bool(self.boundscheck or self.isolate)
        return getattr(case, "tier", "fast") == "scale"

    def running(self):
        """The adapter that runs another engine's cases: an isolated one's worker proxy
        (started here, kept), else the adapter itself; None for ours (see on_backend)."""
        if self.adapter is None or isinstance(self.adapter, IsolatedAdapter) or \
                not self.isolates():
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

    def on_backend(self, backend: str = "cpu", case=None):
        """The adapter that runs `case` (None: a generated case) on `backend`: ours there,
        with the mutation in place, in our worker where it isolates the case, or the one
        engine (running())."""
        if self.adapter is None:
            local = EngineAdapter(backend, self.inject)
            return IsolatedEngine(local, self.worker()) if self.isolates(case) else local
        return self.running()

    def mutated(self, mutant: str, backend: str = "cpu") -> IsolatedEngine:
        """Ours on `backend` in our worker, with the self-test's mutant called `mutant` in
        place there only: the float64 references, computed here, stay right."""
        return IsolatedEngine(EngineAdapter(backend, self.inject), self.worker(), mutant)

    def worker(self) -> Worker:
        """Our engine's worker process, made at the first call (an IsolatedEngine starts
        it), bounds-checked with `boundscheck`."""
        if "worker" not in self._shared:
            environ = boundscheck_environ() if self.boundscheck else None
            self._shared["worker"] = Worker(EngineAdapter("cpu").spec, self.case_timeout,
                                            environ)
        return self._shared["worker"]

    def pairs(self, case=None) -> list[tuple[object, object]]:
        """(running adapter, local adapter) per engine `case` runs in: ours on each
        backend (isolated or not, as isolates(case) says), or the one engine; the local
        one names the engine in repro commands."""
        if self.adapter is None:
            running = [self.on_backend(b, case) for b in self.backends]
            return [(r, r.local if isinstance(r, IsolatedEngine) else r) for r in running]
        return [(self.running(), self.adapter)]

    def only(self, backend: str) -> EngineUnderTest:
        """This engine (ours) on `backend` alone, sharing its worker: closing it stops
        nothing."""
        part = copy.copy(self)
        part.backends, part._closes = (backend,), False
        return part

    def describe(self) -> str:
        """The engine under test, for the report's metadata: the adapter's description, or
        ours on each backend."""
        if self.adapter is not None:
            return self.adapter.describe()
        return ", ".join(EngineAdapter(b).describe() for b in self.backends)

    def close(self) -> None:
        if not self._closes:
            return
        if self._running is not None:
            self._running.close()
            self._running = None
        worker = self._shared.pop("worker", None)
        if worker is not None:
            worker.close()

    def __enter__(self) -> EngineUnderTest:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
