"""The console scripts' entry points (`gradcheck`, `optcheck`, `mnist-train`, `mnist-eval`,
`mnist-regress`): the standard library only, until the command line itself is imported
inside a try.

Importing a command line loads the engine, numba and torch, which takes a while; a Ctrl-C
then, before its `main` runs, would print a KeyboardInterrupt traceback and kill the process
by SIGINT. Here it prints one line and exits 130, as `main` does for a Ctrl-C while it runs.
Warnings of the engine's own (a setting it fell back from, engine.backends.cpu.environment)
print as one line; bad GRADVERIFY_* settings are left to the command line, which refuses
them in one line of its own.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

EXIT_INTERRUPTED = 130          # as gradcheck.interrupted.EXIT_INTERRUPTED (not imported)


def _one_line_warnings(tool: str) -> None:
    """The engine's warnings as `tool: warning: MESSAGE`; others as Python prints them."""
    python_format = warnings.formatwarning

    def formatwarning(message, category, filename, lineno, line=None):
        if category.__module__.split(".")[0] == "engine":
            return f"{tool}: warning: {message}\n"
        return python_format(message, category, filename, lineno, line)

    warnings.formatwarning = formatwarning
    warnings.filterwarnings("ignore", message="GRADVERIFY_(THREADS|PARALLEL) must")


def launch(tool: str, main: Callable[[], int]) -> None:
    """Run `main` (which imports its command line and runs it) and exit with its status;
    a Ctrl-C at any point, imports included: one line on stderr and exit 130."""
    try:
        _one_line_warnings(tool)
        code = main()
    except KeyboardInterrupt:
        print(f"{tool}: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
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
    launch("mnist", main)


def mnist_eval() -> None:
    """The `mnist-eval` console script."""
    def main():
        from mnist_target.cli import eval_main
        return eval_main()
    launch("mnist", main)


def mnist_regress() -> None:
    """The `mnist-regress` console script."""
    def main():
        from mnist_target.cli import regress_main
        return regress_main()
    launch("mnist", main)
