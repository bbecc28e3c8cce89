"""The console scripts' entry points (`gradcheck`, `optcheck`, `mnist-train`, `mnist-eval`,
`mnist-regress`): the standard library only, until the command line itself is imported
inside a try.

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
row quotes (gradcheck.worker); the forkserver that starts it imports only our modules, with
the environment this process already settled (NUMBA_CACHE_DIR), so it has none to print.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

from gradcheck.interrupted import exit_status, signal_of, signal_word, sigterm_interrupts
from gradcheck.usage import warning_line  # both: the standard library only


def _one_line_warnings(tool: str) -> None:
    """Every warning from now on as warning_line(tool, ...) on stderr."""
    def formatwarning(message, category, filename, lineno, line=None):
        return warning_line(tool, message, category) + "\n"

    warnings.formatwarning = formatwarning
    warnings.filterwarnings("ignore", message="GRADVERIFY_(THREADS|PARALLEL) must")


def launch(tool: str, main: Callable[[], int]) -> None:
    """Run `main` (which imports its command line and runs it) and exit with its status;
    a Ctrl-C at any point, imports included: one line on stderr and exit 130; SIGTERM the
    same with 143 (gradcheck.interrupted; the command lines that sweep install their own
    handler while they run, which writes the finished rows first)."""
    try:
        with sigterm_interrupts():
            _one_line_warnings(tool)
            code = main()
    except KeyboardInterrupt as exc:
        print(f"{tool}: {signal_word(signal_of(exc))}", file=sys.stderr)
        code = exit_status(exc)
    sys.exit(code)


def gradcheck() -> None:
    """The `gradcheck` console script."""
    def main():
        from gradcheck.cli import main
        return main()
    launch("gradcheck", main)


def optcheck() -> None:
    """The `optcheck` console script."""
    def main():
        from optcheck.cli import main
        return main()
    launch("optcheck", main)


def mnist_train() -> None:
    """The `mnist-train` console script."""
    def main():
        from mnist_target.cli import train_main
        return train_main()
    launch("mnist-train", main)


def mnist_eval() -> None:
    """The `mnist-eval` console script."""
    def main():
        from mnist_target.cli import eval_main
        return eval_main()
    launch("mnist-eval", main)


def mnist_regress() -> None:
    """The `mnist-regress` console script."""
    def main():
        from mnist_target.cli import regress_main
        return regress_main()
    launch("mnist-regress", main)
