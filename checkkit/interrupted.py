"""Ctrl-C (or SIGTERM) in the middle of a sweep, with the rows finished before it.

The runners (gradcheck.runner, optcheck.runner) turn a KeyboardInterrupt into an
Interrupted that carries the results finished so far, so that a command line can still
write them (`--output`) before it exits 130. It is a KeyboardInterrupt: code that does
not know it stops as it would on Ctrl-C.

SIGTERM, whose default action ends a process on the spot with nothing written, is made to
behave the same way where a long run is under way (`sigterm_interrupts`): it raises
Terminated, a KeyboardInterrupt that remembers its signal, and the command exits 143.
Any KeyboardInterrupt may carry `signum`; one without it is Ctrl-C's (SIGINT).

The standard library only, but for report_interrupted's own import of reports: the console
scripts (gradcheck.console) use the signal half before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a sweep; `results`: the rows finished before it, in order;
    `signum`: the signal that stopped it."""

    def __init__(self, results=(), signum: int = signal.SIGINT):
        super().__init__()
        self.results = list(results)
        self.signum = int(signum)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by sigterm_interrupts' handler."""

    signum = int(signal.SIGTERM)


def signal_of(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt: its `signum`, else SIGINT (Ctrl-C)."""
    return int(getattr(exc, "signum", signal.SIGINT))


def exit_status(exc: BaseException) -> int:
    """128 + the signal, as a shell reports a command a signal stopped: 130 for Ctrl-C,
    143 for SIGTERM."""
    return 128 + signal_of(exc)


def signal_word(signum: int) -> str:
    """'interrupted' (SIGINT) or 'terminated' (SIGTERM), for the one line a tool prints."""
    return "terminated" if signum == signal.SIGTERM else "interrupted"


def interrupted_meta(signum: int) -> dict:
    """What a report's meta says of a run `signum` stopped: `interrupted` and `signal`."""
    return {"interrupted": True, "signal": signal.Signals(signum).name}


@contextlib.contextmanager
def sigterm_interrupts():
    """While the block runs, SIGTERM raises Terminated in the main thread, so that a sweep
    stops as on Ctrl-C (its finished rows written); the previous handler is put back after.
    Outside the main thread (where Python cannot set handlers) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_with(done, exc: KeyboardInterrupt) -> Interrupted:
    """The Interrupted to raise for `exc` after the rows `done`: an Interrupted from deeper
    down adds its own finished rows after them; the signal is kept."""
    return Interrupted([*done, *getattr(exc, "results", ())], signal_of(exc))


def report_interrupted(tool: str, exc: KeyboardInterrupt, fmt: str, output=None,
                       meta=None, group_by: str | None = None, verbose: bool = False) -> int:
    """What a command line does on Ctrl-C (or SIGTERM): the rows finished so far (an
    Interrupted's) written to `output` when given, marked `interrupted` (and `signal`) in
    the meta, one line on stderr saying so, and 130 (143 for SIGTERM). A sweep stopped
    before any row finished leaves `output` as it was."""
    from reports.output import OutputError, render, write_atomic
    done = list(getattr(exc, "results", ()))
    status, word = exit_status(exc), signal_word(signal_of(exc))
    if not output:
        print(f"{tool}: {word}", file=sys.stderr)
        return status
    if not done:
        print(f"{tool}: {word} before any row finished; {output} left as it was",
              file=sys.stderr)
        return status
    marked = {**(meta or {}), **interrupted_meta(signal_of(exc))}
    try:
        write_atomic(output, render(done, fmt, tool, marked, None, group_by, verbose=verbose))
    except OutputError as error:
        print(f"{tool}: {word}; {error}", file=sys.stderr)
        return status
    rows = f"{len(done)} row{'s' * (len(done) != 1)}"
    print(f"{tool}: {word}; wrote the {rows} finished so far to {output}", file=sys.stderr)
    return status
