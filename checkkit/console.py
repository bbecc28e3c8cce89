"""What every console script does around its command line (`gradcheck`, `optcheck`,
`mnist-train`, `mnist-eval`, `mnist-regress`: each tool's own `console` module calls
`launch`): the standard library only, until the command line itself is imported inside a
try.

Importing a command line loads the engine, numba and torch, which takes a while; a Ctrl-C
then, before its `main` runs, would print a KeyboardInterrupt traceback and kill the process
by SIGINT. Here it prints one line and exits 130, as `main` does for a Ctrl-C while it runs;
SIGTERM, whose default action would end the process with nothing said, likewise exits 143.

Every warning prints as one line opening with the command's name, from before the first
import of the engine on: `gradcheck: warning: MESSAGE`, with its category where that says
something (`gradcheck: warning: RuntimeWarning: overflow encountered in exp`; not for a
plain UserWarning, nor for the categories of our own packages, whose messages stand alone),
never Python's source path and line. Nothing is suppressed, except the SettingWarning of a
bad GRADVERIFY_* setting, which the command line refuses in one line of its own. An isolated
adapter's worker process writes its warnings in one line too, to the log whose tail a crash
row quotes (checkkit.worker); the forkserver that starts it imports only our modules, with
the environment this process already settled (NUMBA_CACHE_DIR), so it has none to print.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

from checkkit.interrupted import (
    exit_status,
    report_interrupted,
    signal_of,
    signal_word,
    sigterm_interrupts,
)
from checkkit.usage import format_warnings_as  # the standard library only


def one_line_warnings(tool: str) -> None:
    """Every warning from now on as warning_line(tool, ...) on stderr (the bad-setting one
    left to the command line, which refuses it in a line of its own)."""
    format_warnings_as(tool)
    warnings.filterwarnings("ignore", message="GRADVERIFY_(THREADS|PARALLEL) must")


def launch(tool: str, main: Callable[[], int]) -> None:
    """Run `main` (which imports its command line and runs it) and exit with its status;
    a Ctrl-C at any point, imports included: one line on stderr and exit 130; SIGTERM the
    same with 143 (checkkit.interrupted; the command lines that sweep install their own
    handler while they run, which writes the finished rows first)."""
    try:
        with sigterm_interrupts():
            one_line_warnings(tool)
            code = main()
    except KeyboardInterrupt as exc:
        print(f"{tool}: {signal_word(signal_of(exc))}", file=sys.stderr)
        code = exit_status(exc)
    sys.exit(code)


def script(tool: str, module: str, function: str = "main") -> Callable[[], None]:
    """The console script `tool`: `module.function` (its command line's main, taking no
    arguments), imported and run inside launch."""
    def run() -> None:
        def main():
            import importlib
            return getattr(importlib.import_module(module), function)()
        launch(tool, main)
    run.__doc__ = f"The `{tool}` console script."
    return run


def stoppable(tool: str, run: Callable[[], int]) -> int:
    """`run()`'s exit status, Ctrl-C (or SIGTERM, checkkit.interrupted) anywhere in it being
    one line and 130 (143): a command line's main around its work, which writes a sweep's
    finished rows itself (report_interrupted) where it has them."""
    try:
        with sigterm_interrupts():
            return run()
    except KeyboardInterrupt as exc:
        return report_interrupted(tool, exc, "plain")
