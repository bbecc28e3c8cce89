"""An adapter whose `vjp` runs in a worker process (checkkit.worker), for engines that may
abort or hang: a dead or hung worker is a WorkerCrash, which gradcheck reports as a
`crash` row, and the next case starts a fresh worker. Whatever the adapter raises there
(sys.exit and KeyboardInterrupt included) is a RemoteError, an `error` row.
"""

from __future__ import annotations

from checkkit.loading import AdapterError, Unsupported, spec_of
from checkkit.worker import DEFAULT_CASE_TIMEOUT, RemoteError, Worker, WorkerCrash

# optional methods of the adapter that run in the worker when it has them (gradcheck's
# forward mode and second order)
REMOTE_METHODS = ("jvp", "hvp")


class IsolatedAdapter:
    """`adapter` with its `vjp` (and forward_only_output, jvp and hvp) run in a Worker,
    started at once,
    so that an engine that cannot be set up there fails before any case (AdapterError);
    `describe` and `unsupported` are the local adapter's. A context manager: leaving it
    stops the worker."""

    isolated = True

    def __init__(self, adapter, timeout: float = DEFAULT_CASE_TIMEOUT):
        self.local = adapter
        self.name = adapter.name
        self.spec = spec_of(adapter)
        self.worker = Worker(self.spec, timeout)
        try:
            self.worker.start()
        except WorkerCrash as exc:
            self.worker.close()
            raise AdapterError(f"engine {self.name!r}: its worker process did not start: "
                               f"{exc}") from exc
        except BaseException:
            self.worker.close()
            raise

    def __getattr__(self, name):          # backend and other optional attributes
        if name == "local":
            raise AttributeError(name)
        value = getattr(self.local, name)
        if name in REMOTE_METHODS and callable(value):
            return self._remote(name)
        return value

    def _remote(self, method: str):
        """The adapter's `method`, called in the worker; an Unsupported raised there is
        raised here again (its reason, not an error row)."""
        def call(*args):
            try:
                return self.worker.call(method, *args)
            except RemoteError as exc:
                prefix = f"{Unsupported.__name__}: "
                if str(exc).startswith(prefix):
                    raise Unsupported(str(exc)[len(prefix):]) from None
                raise
        return call

    def describe(self) -> str:
        return self.local.describe()

    def unsupported(self, case) -> str | None:
        return self.local.unsupported(case)

    def vjp(self, case, arrays, weights):
        return self.worker.call("vjp", case, arrays, weights)

    def forward_only_output(self, variant, case, arrays):
        """The local adapter's forward_only_output (gradcheck.forward_only), in the worker."""
        return self.worker.call("forward_only_output", variant, case, arrays)

    def with_threads(self, n: int) -> _AtThreads:
        """This engine computing with `n` threads, in the same worker (the local adapter's
        `vjp_at_threads`), for the scale tier's thread counts."""
        return _AtThreads(self, n)

    def close(self) -> None:
        self.worker.close()

    def __enter__(self) -> IsolatedAdapter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _AtThreads:
    """An isolated adapter's engine at a thread count: vjp runs `vjp_at_threads` in the
    worker."""

    def __init__(self, isolated: IsolatedAdapter, n: int):
        self.isolated, self.n = isolated, n

    def vjp(self, case, arrays, weights):
        return self.isolated.worker.call("vjp_at_threads", self.n, case, arrays, weights)
