"""Ctrl-C in the middle of a sweep, with the rows finished before it.

The runners (gradcheck.runner, optcheck.runner) turn a KeyboardInterrupt into an
Interrupted that carries the results finished so far, so that a command line can still
write them (`--output`) before it exits 130. It is a KeyboardInterrupt: code that does
not know it stops as it would on Ctrl-C.
"""

from __future__ import annotations

import sys

from reports.output import OutputError, render, write_atomic

EXIT_INTERRUPTED = 130          # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep; `results`: the rows finished before it, in order."""

    def __init__(self, results=()):
        super().__init__()
        self.results = list(results)


def interrupted_with(done, exc: KeyboardInterrupt) -> Interrupted:
    """The Interrupted to raise for `exc` after the rows `done`: an Interrupted from deeper
    down adds its own finished rows after them."""
    return Interrupted([*done, *getattr(exc, "results", ())])


def report_interrupted(tool: str, exc: KeyboardInterrupt, fmt: str, output=None,
                       meta=None, group_by: str | None = None, verbose: bool = False) -> int:
    """What a command line does on Ctrl-C: the rows finished so far (an Interrupted's)
    written to `output` when given, one line on stderr saying so, and EXIT_INTERRUPTED.
    A sweep stopped before any row finished leaves `output` as it was."""
    done = list(getattr(exc, "results", ()))
    if not output:
        print(f"{tool}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not done:
        print(f"{tool}: interrupted before any row finished; {output} left as it was",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        write_atomic(output, render(done, fmt, tool, {**(meta or {}), "interrupted": True},
                                    None, group_by, verbose=verbose))
    except OutputError as error:
        print(f"{tool}: interrupted; {error}", file=sys.stderr)
        return EXIT_INTERRUPTED
    rows = f"{len(done)} row{'s' * (len(done) != 1)}"
    print(f"{tool}: interrupted; wrote the {rows} finished so far to {output}",
          file=sys.stderr)
    return EXIT_INTERRUPTED
