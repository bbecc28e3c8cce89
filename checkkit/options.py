"""The command-line options every checker has, written once: the report's format and file,
the progress bar, the columns, and `--workers N`.

    add_report_options(parser, "gradcheck", "cases")
    if refused("gradcheck", environment_problem()):   # one line on stderr, exit status 2
        return 2
    rows = rows_of(request, plan, args, run_plan)     # serially, or on --workers N
"""

from __future__ import annotations

import argparse
import sys


def add_report_options(parser: argparse.ArgumentParser, tool: str, what: str) -> None:
    """--format, --output, --no-progress, --verbose and --workers for `tool`, whose units of
    work are `what` ("cases", "checks")."""
    from reports.output import FORMATS
    parser.add_argument("--format", choices=FORMATS, default="plain",
                        help="output format (default plain)")
    parser.add_argument("--output", metavar="FILE",
                        help="write the report to FILE (atomically) instead of standard "
                             "output")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", action="store_true",
                        help="plain table: every column (default: the few a person reads, "
                             "fitted to the terminal)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help=f"run the {what} as pytest items on N local processes "
                             f"(pytest-xdist; the same report); across hosts: see pytest "
                             f"--{tool}")


def wants_progress(args) -> bool:
    """A progress bar: on a terminal, unless --no-progress."""
    return not args.no_progress and sys.stderr.isatty()


def argv_of(argv) -> list[str]:
    """The command line as the report's meta records it."""
    return list(sys.argv[1:] if argv is None else argv)


def refused(tool: str, problem: str | None) -> bool:
    """Whether `problem` (a usage problem in one line, or None) refuses the run; it is
    printed as `TOOL: PROBLEM` on stderr."""
    if problem:
        print(f"{tool}: {problem}", file=sys.stderr)
    return bool(problem)


def rows_of(request, plan, args, run_plan) -> list:
    """The rows of `request`: `run_plan(request, plan, progress)` in this process, or its
    jobs as pytest items on --workers N processes (checkkit.distributed), finished by the
    request (request.finish)."""
    progress = wants_progress(args)
    if args.workers is None:
        return run_plan(request, plan, progress)
    from checkkit.distributed import distributed_rows  # pytest only here
    return request.finish(distributed_rows(request, args.workers, progress))
