"""An adapter whose `vjp` runs in a worker process (checkkit.worker), for engines that may
abort or hang: a dead or hung worker is a WorkerCrash, which gradcheck reports as a
`crash` row, and the next case starts a fresh worker. Whatever the adapter raises there
(sys.exit and KeyboardInterrupt included) is a RemoteError, an `error` row; an Unsupported
raised there is raised here again (an `unsupported` row, as in this process).

Every call to the worker goes through one method, `_call`, which a subclass may route
differently (gradcheck.engine_under_test.IsolatedEngine: our engine's variants share one
worker, and each call brings back the fast paths it took). Only the methods that run in the
worker are offered: a local `forward` would run in this process, so it is hidden.
"""

from __future__ import annotations

import functools

from checkkit.loading import AdapterError, Unsupported, spec_of
from checkkit.worker import DEFAULT_CASE_TIMEOUT, RemoteError, Worker, WorkerCrash

# optional methods of the adapter that run in the worker when it has them (gradcheck's
# forward mode and second order)
REMOTE_METHODS = ("jvp", "hvp")


class IsolatedAdapter:
    """`adapter` with its `vjp` (and forward_only_output, jvp and hvp) run in a Worker,
    started at once, so that an engine that cannot be set up there fails before any case
    (AdapterError); `describe` and `unsupported` are the local adapter's. `worker`: a
    worker to share (started here if it never was, else restarted by the next call after
    a crash; closing this adapter leaves it running), else one of its own, made from the
    adapter's spec. A context manager: leaving it stops the worker it owns."""

    isolated = True

    def __init__(self, adapter, timeout: float = DEFAULT_CASE_TIMEOUT,
                 worker: Worker | None = None):
        self.local = adapter
        self.name = adapter.name
        self.spec = spec_of(adapter)
        self.owns_worker = worker is None
        self.worker = Worker(self.spec, timeout) if worker is None else worker
        try:
            if self.owns_worker or not self.worker.starts:
                self.worker.start()
        except WorkerCrash as exc:
            self.close()
            raise AdapterError(f"engine {self.name!r}: its worker process did not start: "
                               f"{exc}") from exc
        except BaseException:
            self.close()
            raise

    def __getattr__(self, name):          # backend and other optional attributes
        if name in ("local", "forward"):   # forward: it would run here, not in the worker
            raise AttributeError(name)
        value = getattr(self.local, name)
        if name in REMOTE_METHODS and callable(value):
            return functools.partial(self._call, name)
        return value

    def _call(self, method: str, *args, doing: str | None = None):
        """The adapter's `method(*args)`, called in the worker (a crash says it was running
        `doing`, default `method`); an Unsupported raised there is raised here again (its
        reason, not an error row)."""
        try:
            return self.worker.call(method, *args, doing=doing)
        except RemoteError as exc:
            prefix = f"{Unsupported.__name__}: "
            if str(exc).startswith(prefix):
                raise Unsupported(str(exc)[len(prefix):]) from None
            raise

    def describe(self) -> str:
        return self.local.describe()

    def unsupported(self, case) -> str | None:
        return self.local.unsupported(case)

    def vjp(self, case, arrays, weights):
        return self._call("vjp", case, arrays, weights)

    def forward_only_output(self, variant, case, arrays):
        """The local adapter's forward_only_output (gradcheck.forward_only), in the worker."""
        return self._call("forward_only_output", variant, case, arrays)

    def with_threads(self, n) -> _AtThreads:
        """This engine computing at thread setting `n`, in the same worker (the local
        adapter's `vjp_at_threads`), for the scale tier's thread counts."""
        return _AtThreads(self, n)

    def close(self) -> None:
        if self.owns_worker:
            self.worker.close()

    def __enter__(self) -> IsolatedAdapter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _AtThreads:
    """An isolated adapter's engine at a thread setting: vjp runs `vjp_at_threads` in the
    worker."""

    def __init__(self, isolated: IsolatedAdapter, n):
        self.isolated, self.n = isolated, n

    def vjp(self, case, arrays, weights):
        return self.isolated._call("vjp_at_threads", self.n, case, arrays, weights)
