"""What an engine's adapter raised, told apart from the user's own Ctrl-C.

An adapter is someone else's code, and may raise anything: an Exception, but also
SystemExit (a library calling sys.exit), GeneratorExit, KeyboardInterrupt or a
BaseException subclass of its own. gradcheck makes each of them an error row (a usage error
while the adapter is loaded, gradcheck.adapters.get_adapter) and goes on. One keeps its
meaning: the user's Ctrl-C, SIGINT delivered to this process (and SIGTERM where a Python
handler turns it into an exception, checkkit.interrupted), which stops the run.

A KeyboardInterrupt looks the same whether Python's SIGINT handler raised it or adapter code
did. `SignalWatch` tells them apart: while one is open, every signal among SIGINT and SIGTERM
that Python handles (a Python-level handler, such as the default SIGINT one, is installed)
is counted before its handler runs, and an exception raised inside that is not an Exception
is the user's interruption exactly when such a signal arrived meanwhile (`reraise`). A
signal that Python does not handle (ignored, or left to the system) raises nothing, and a
thread other than the main one never runs a handler: what is raised there is the code's.
A worker process of an isolated adapter (checkkit.worker) ignores SIGINT (the parent, which
receives the same Ctrl-C, ends it), so that every KeyboardInterrupt there is the adapter's.

What this cannot tell: an adapter that sends SIGINT to this process (os.kill,
_thread.interrupt_main) is taken for the user; an adapter that catches the signal's
KeyboardInterrupt and raises an Exception instead makes an error row.
"""

from __future__ import annotations

import signal
import threading

# the signals watched (SIGTERM only where a Python handler turns it into an exception)
WATCHED = (signal.SIGINT, signal.SIGTERM)

_arrived = 0                      # watched signals received while a watch was open
_previous: dict[int, object] = {}  # the handlers the outermost watch wrapped


def described(exc: BaseException) -> str:
    """'TypeName: message' of an exception, on one line; `SystemExit (sys.exit(CODE))`."""
    if isinstance(exc, SystemExit):
        return f"SystemExit (sys.exit({exc.code!r}))"
    try:
        text = " ".join(str(exc).split())
    except BaseException:      # noqa: BLE001  (a __str__ of the adapter's that raises)
        text = "(its message cannot be shown)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _counting(signum, frame):
    """The watch's handler: count the signal, then run the handler it wrapped."""
    global _arrived
    _arrived += 1
    previous = _previous.get(signum)
    if callable(previous):
        return previous(signum, frame)
    raise KeyboardInterrupt            # not reached: only Python handlers are wrapped


class SignalWatch:
    """A context manager: while open, watched signals are counted (see the module doc).

        with SignalWatch() as watch:
            try:
                adapter.vjp(...)
            except BaseException as exc:
                watch.reraise(exc)      # the user's Ctrl-C goes on up
                row = error row

    Watches nest (the outermost installs the handlers, and puts the previous ones back on
    leaving unless someone replaced them meanwhile); outside the main thread a watch
    installs nothing."""

    def __init__(self):
        self._installed: list[int] = []
        self._seen = 0

    def __enter__(self) -> SignalWatch:
        self._seen = _arrived
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in WATCHED:
            try:
                current = signal.getsignal(signum)
                if current is _counting or not callable(current):
                    continue
                _previous[signum] = current
                signal.signal(signum, _counting)
            except (ValueError, OSError):   # not settable here
                continue
            self._installed.append(signum)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum in self._installed:
            try:
                if signal.getsignal(signum) is _counting:
                    signal.signal(signum, _previous[signum])
            except (ValueError, OSError):
                pass
            _previous.pop(signum, None)
        self._installed = []

    @property
    def signalled(self) -> bool:
        """Whether a watched signal arrived since this watch opened."""
        return _arrived != self._seen

    def is_interruption(self, exc: BaseException) -> bool:
        """Whether `exc` stops the run: not an Exception, and a watched signal arrived
        since the watch opened (the user's Ctrl-C, or SIGTERM)."""
        return not isinstance(exc, Exception) and self.signalled

    def reraise(self, exc: BaseException) -> None:
        """Raise `exc` again when it is the user's interruption (is_interruption); else
        return, and the caller reports it."""
        if self.is_interruption(exc):
            raise exc


def raised_message(exc: BaseException) -> str:
    """How an error row names what adapter code raised: an Exception as 'TypeName:
    message', anything else (SystemExit, KeyboardInterrupt, GeneratorExit, a BaseException
    of the adapter's) as 'adapter raised TypeName: message'."""
    if isinstance(exc, Exception):
        return described(exc)
    return f"adapter raised {described(exc)}"
