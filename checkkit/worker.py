"""Run an engine in a worker process, so that an engine which kills its process (a C
assertion's abort, a segfault, os._exit) or hangs costs one case, not the sweep.

A `Worker` is a persistent child process that rebuilds the adapter from its AdapterSpec
(specs travel, live adapters do not) and answers calls on it. Children come from the
forkserver (or spawn) start method, never fork: numba's and torch's threads may be alive in
the parent. When the child dies, or a call outlives its timeout, the call raises
WorkerCrash, whose message names the signal or exit status, the tail of what the child wrote
to its standard error (an assertion's text: `GGML_ASSERT(...) failed`) and the innermost
Python frame it was in (checkkit.crash_report); the next call starts a fresh child.

`checkkit.isolated.IsolatedAdapter(adapter)` is the adapter, with `vjp` run in such a
worker; gradcheck wraps every adapter whose `isolated` is set in one (and our own engine
with `--isolate`, gradcheck.engine_under_test).

A worker given `environ` (variables that must hold before anything reads them: numba's
NUMBA_BOUNDSCHECK and NUMBA_CACHE_DIR, read once when numba is imported) is started by
spawn, a fresh interpreter, never by the forkserver, which imported numba and the engine
under this process's environment; it sets them first, then imports PRELOAD itself, and
refuses to serve (an AdapterError) when numba was imported before they were set or a
variable no longer holds once the adapter is built (the engine replaced an unwritable
NUMBA_CACHE_DIR): a bounds-checked worker must never run unchecked machine code.

Whatever the adapter raises in the child, SystemExit, KeyboardInterrupt and BaseExceptions
of its own included, is answered as an error (RemoteError, an error row), and the child
goes on. The child ignores SIGINT: a Ctrl-C at the terminal reaches the whole process
group, and the parent, which stops on it, ends the child (at once when a call is under
way); so a KeyboardInterrupt in the child is always the adapter's own. Its warnings are
written in one line (`warning: Category: message`), as crash rows quote its stderr.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import warnings

from checkkit.crash_report import exit_description, innermost_frame, stderr_tail
from checkkit.loading import AdapterError
from checkkit.raised import raised_message

DEFAULT_CASE_TIMEOUT = 120.0   # seconds a call may take before it counts as a hang
START_TIMEOUT = 120.0          # seconds a fresh worker may take to import and build its adapter
# imported once by the forkserver, so that a restarted worker starts at fork speed; with the
# module of the spec's maker (the tool's adapters: gradcheck.adapters), which _preload adds.
# A worker imports them itself where the forkserver did not (spawn; a module added after
# the forkserver started)
PRELOAD = ["checkkit.worker", "engine.samples"]


class WorkerCrash(Exception):
    """The worker died or hung while running a call; the message says how."""


class RemoteError(Exception):
    """The adapter raised in the worker; the message is "TypeName: message"."""


def _preload(spec) -> list[str]:
    """PRELOAD and the module of the spec's maker."""
    maker = getattr(spec, "maker", "").partition(":")[0]
    return PRELOAD + ([maker] if maker else [])


def _context(spec, environ=None):
    """The forkserver (spawn where there is none, or for a worker given `environ`: see the
    module doc)."""
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods and not environ:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_preload(spec))
        return ctx
    return multiprocessing.get_context("spawn")


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """warnings.formatwarning for the child: `warning: Category: message`, one line."""
    return f"warning: {category.__name__}: {' '.join(str(message).split())}\n"


def _serve(conn, spec, stderr_path: str, fault_path: str, sys_path: list[str],
           environ: dict[str, str] | None = None, preload: tuple[str, ...] = (),
           compile_log: tuple[str | None, str] = (None, "")) -> None:
    """The worker's loop: set `environ`, import `preload`, build the adapter, then answer
    (method, args) until told to stop. `sys_path` is the parent's (the forkserver's may be
    older); `compile_log`: the parent's log of compilations and its tag
    (checkkit.compiling.report_compiles: the forkserver's environment may be older). Its
    standard error (fd 2, written by C code too) goes to `stderr_path`, Python
    tracebacks of fatal signals and of SIGUSR1 (sent before a hang is killed) to
    `fault_path`. Anything the adapter raises is answered (see the module doc)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.formatwarning = _one_line_warning
    sys.path[:] = sys_path
    fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    fault = open(fault_path, "w")  # noqa: SIM115 (open until the process ends)
    faulthandler.enable(fault)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, fault)
    try:
        problem = _set_environ(environ or {})
        if problem is None:
            from checkkit.compiling import report_compiles
            report_compiles(*compile_log)
            for module in preload:       # imported by the forkserver already, not by spawn
                importlib.import_module(module)
            adapter = spec.build()
            problem = _changed(environ or {})
    except BaseException as exc:        # SIGINT is ignored: never the user's Ctrl-C here
        problem = _answer_text(exc)
    if problem is not None:
        conn.send(("setup", problem))
        return
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        except BaseException as exc:     # a case that does not unpickle here
            conn.send(("error", f"cannot receive the call: {_answer_text(exc)}"))
            continue
        if message[0] == "stop":
            return
        method, args = message
        try:
            answer = ("ok", getattr(adapter, method)(*args))
        except BaseException as exc:
            answer = ("error", _answer_text(exc))
        try:
            conn.send(answer)
        except BaseException as exc:   # an answer that does not pickle
            conn.send(("error", f"cannot send the answer: {_answer_text(exc)}"))


def _set_environ(environ: dict[str, str]) -> str | None:
    """Set `environ` in this process; the problem when numba was imported before its
    variables could take effect (None: set)."""
    late = sorted(k for k in environ if k.startswith("NUMBA_"))
    if late and "numba" in sys.modules:
        return (f"numba was imported before {', '.join(late)} could be set (the worker "
                "must be started by spawn)")
    os.environ.update(environ)
    return None


def _changed(environ: dict[str, str]) -> str | None:
    """The variables of `environ` that no longer hold, as a problem (None: all hold)."""
    changed = [f"{k}={os.environ.get(k)!r} (set to {v!r})" for k, v in environ.items()
               if os.environ.get(k) != v]
    return f"the worker's environment changed while it started: {', '.join(changed)}" \
        if changed else None


def _answer_text(exc: BaseException) -> str:
    """What the child answers for an exception: 'TypeName: message' for an Exception
    (as raised_message), 'adapter raised TypeName: message' for anything else."""
    if isinstance(exc, Exception):
        try:
            return f"{type(exc).__name__}: {exc}"
        except BaseException:   # noqa: BLE001  (a __str__ that raises)
            pass
    return raised_message(exc)


@contextlib.contextmanager
def main_left_alone():
    """While starting a child: the parent's __main__ hidden from multiprocessing, which
    would otherwise run it again in the child. The worker needs nothing from it, and a
    script without a __name__ guard, <stdin> or a notebook would fail there or recurse."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__.pop(k) for k in ("__file__",) if k in main.__dict__}
    spec = main.__dict__.get("__spec__")
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)
        main.__spec__ = spec


class Worker:
    """A persistent worker process for the adapter that `spec` builds; `timeout`: seconds
    each call may take; `environ`: variables the child sets before it imports anything of
    ours (module doc). Use as a context manager, or call close()."""

    def __init__(self, spec, timeout: float = DEFAULT_CASE_TIMEOUT,
                 environ: dict[str, str] | None = None):
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        self.spec, self.timeout = spec, float(timeout)
        self.environ = dict(environ or {})
        self._dir = tempfile.mkdtemp(prefix="gradcheck-worker-")
        self._stderr = os.path.join(self._dir, "stderr.log")
        self._fault = os.path.join(self._dir, "fault.log")
        self._proc = self._conn = None
        self._calling = False      # a call's answer is awaited (left by Ctrl-C: kill at once)
        self.starts = 0

    def start(self) -> None:
        """Start the child (if none is alive) and wait until its adapter is built. Raises
        AdapterError when the adapter cannot be built there, WorkerCrash when the child
        dies or does not answer within START_TIMEOUT."""
        if self._proc is not None and self._proc.is_alive():
            return
        self._reap()
        ctx = _context(self.spec, self.environ)
        parent, child = ctx.Pipe()
        from checkkit.compiling import LOG_VARIABLE, process_tag
        args = (child, self.spec, self._stderr, self._fault, list(sys.path), self.environ,
                tuple(_preload(self.spec)), (os.environ.get(LOG_VARIABLE), process_tag()))
        proc = ctx.Process(target=_serve, args=args,
                           name=f"gradcheck-worker-{self.spec.name}", daemon=True)
        offset = self._size()
        with main_left_alone():
            proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        self.starts += 1
        kind, value = self._receive(START_TIMEOUT, offset, "starting the worker")
        if kind == "setup":
            self._reap()
            raise AdapterError(f"engine {self.spec.name!r} in the worker process: {value}")

    def call(self, method: str, *args, doing: str | None = None):
        """adapter.method(*args) in the child; its return value, or RemoteError when it
        raised, or WorkerCrash when the child died or hung (the next call restarts it),
        saying it was running `doing` (default: `method`)."""
        self.start()
        offset = self._size()
        self._calling = True
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._conn.send((method, args))    # a dead child is found by _receive
        kind, value = self._receive(self.timeout, offset, f"running {doing or method}")
        self._calling = False
        if kind == "error":
            raise RemoteError(value)
        return value

    def _receive(self, timeout: float, offset: int, doing: str):
        conn, proc = self._conn, self._proc
        try:
            ready = conn.poll(timeout)
            if ready:
                return conn.recv()
        except (EOFError, OSError):
            ready = True
        if not ready:
            if hasattr(signal, "SIGUSR1"):
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGUSR1)   # faulthandler: where it hangs
                time.sleep(0.2)
            self._reap()
            what = f"timed out after {timeout:g} s while {doing} (killed)"
        else:
            proc.join(5.0)
            code = proc.exitcode
            self._reap()
            what = f"worker {exit_description(code)} while {doing}"
        return self._crash(what, offset)

    def _crash(self, what: str, offset: int):
        parts = [what]
        tail = stderr_tail(self._stderr, offset)
        if tail:
            parts.append(f"stderr: {tail}")
        frame = innermost_frame(self._fault)
        if frame:
            parts.append(f"at {frame}")
        raise WorkerCrash("; ".join(parts))

    def _size(self) -> int:
        try:
            return os.path.getsize(self._stderr)
        except OSError:
            return 0

    def _reap(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        self._calling = False
        if conn is not None:
            conn.close()
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join(5.0)

    def close(self) -> None:
        """Stop the child and remove its log files. A child still running a call (the
        caller left it on Ctrl-C) is killed at once."""
        if self._proc is not None and self._proc.is_alive() and not self._calling:
            with contextlib.suppress(OSError, ValueError):
                self._conn.send(("stop",))
            self._proc.join(2.0)
        self._reap()
        for path in (self._stderr, self._fault):
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
