"""The command-line options every checker has, written once: the report's format and file,
the view of the plain report, the progress bar, the columns, and `--workers N`.

    add_report_options(parser, "gradcheck", "cases")
    if refused("gradcheck", environment_problem() or settle_format(args)):
        return 2                                      # one line on stderr, exit status 2
    with compiling(args, "gradcheck") as listener, request.plan() as plan:
        rows = rows_of(request, plan, args, run_plan, "gradcheck", listener)  # or --workers N
"""

from __future__ import annotations

import argparse
import contextlib
import sys


def add_report_options(parser: argparse.ArgumentParser, tool: str, what: str) -> None:
    """--format, --output, --show, -v/--verbose, --progress/--no-progress and --workers for
    `tool`, whose units of work are `what` ("cases", "checks")."""
    from reports.output import FORMATS
    from reports.terminal_report import SHOWS
    report = parser.add_argument_group("report")
    report.add_argument("--format", choices=FORMATS,
                        help="output format (default: from --output's extension: .json json, "
                             ".html/.htm html, .xml junit, .md github, .txt plain; else plain)")
    report.add_argument("--output", metavar="FILE",
                        help="write the report to FILE (atomically) instead of standard output")
    report.add_argument("--show", choices=SHOWS,
                        help=f"what the plain report shows: failures (default): the summary "
                             f"per group (only those with anything but a pass), every failing, "
                             f"erring or crashing row with its message and repro command, the "
                             f"skip reasons grouped, the totals; summary: the summary of every "
                             f"group and the totals; all: every one of the {what} too (on a "
                             f"terminal the case wraps, never cut)")
    report.add_argument("-v", "--verbose", action="store_true",
                        help="plain report: every row with every column (--show all gives "
                             "the few columns a person reads)")
    progress = report.add_mutually_exclusive_group()
    progress.add_argument("--progress", action="store_true",
                          help="progress on stderr even when it is not a terminal: a line "
                               "per op whose kernels compile (first run only)")
    progress.add_argument("--no-progress", action="store_true",
                          help="no progress bar, no compile line")
    parser.add_argument("--workers", type=int, metavar="N",
                        help=f"run the {what} as pytest items on N local processes "
                             f"(pytest-xdist; the same report); across hosts: see pytest "
                             f"--{tool}")


def settle_format(args) -> str | None:
    """Set args.format to the report's format (reports.output.report_format: --format, else
    --output's extension, else plain); the problem in one line when --format contradicts
    the extension (None otherwise)."""
    from reports.output import report_format
    try:
        args.format = report_format(args.format, args.output)
    except ValueError as exc:
        return str(exc)
    return None


def wants_progress(args) -> bool:
    """A progress bar: on a terminal, or anywhere with --progress; never with
    --no-progress."""
    return not args.no_progress and (getattr(args, "progress", False) or sys.stderr.isatty())


def compile_mode(args) -> str | None:
    """How compilations show (checkkit.compiling): a bar on a terminal, lines with
    --progress elsewhere, nothing with --no-progress."""
    if args.no_progress:
        return None
    if sys.stderr.isatty():
        return "bar"
    return "lines" if getattr(args, "progress", False) else None


def argv_of(argv) -> list[str]:
    """The command line as the report's meta records it."""
    return list(sys.argv[1:] if argv is None else argv)


def refused(tool: str, problem: str | None) -> bool:
    """Whether `problem` (a usage problem in one line, or None) refuses the run; it is
    printed as `TOOL: PROBLEM` on stderr."""
    if problem:
        print(f"{tool}: {problem}", file=sys.stderr)
    return bool(problem)


def rows_of(request, plan, args, run_plan, tool: str = "", listener=None) -> list:
    """The rows of `request`: `run_plan(request, plan, progress)` in this process, or its
    jobs as pytest items on --workers N processes (checkkit.distributed), finished by the
    request (request.finish). numba's compilations, this process's and its workers', are
    shown as compile_mode says (checkkit.compiling), each job naming itself; `listener`:
    the CompileListener of the compile_progress the plan was made in (so that the worker
    processes it started report to it), else one of its own. A large serial run shares its
    jobs with a helper process on a second core (checkkit.share: the same rows in the same
    order, a few generated cases perhaps drawn with other values); otherwise
    one whose kernels compile starts compile-ahead helpers (checkkit.ahead)."""
    from checkkit.compiling import compile_progress, watch_jobs
    progress = wants_progress(args)
    tool = tool or plan.tool
    own = (compile_progress(tool, compile_mode(args)) if listener is None
           else contextlib.nullcontext(listener))
    with own as listener:
        if args.workers is None:
            from checkkit.ahead import compiling_ahead
            from checkkit.share import sharing
            watch_jobs(plan.jobs, listener)
            with sharing(request, plan.jobs) as shared, compiling_ahead(
                    request, plan.jobs, listener, helpers=0 if shared.helpers else None):
                return run_plan(request, plan, progress)
        from checkkit.distributed import distributed_rows  # pytest only here
        return request.finish(distributed_rows(request, args.workers, progress))


def compiling(args, tool: str):
    """The compile progress of a command line's run (checkkit.compiling.compile_progress,
    as compile_mode says), to enter before its plan is made: rows_of takes its listener."""
    from checkkit.compiling import compile_progress
    return compile_progress(tool, compile_mode(args))
