"""`gradcheck-report` (also `gradcheck report`): several engines' result files merged into
one scoreboard (reports.scoreboard).

    gradcheck --engine engine --format json --output ours.json
    gradcheck --engine torch --format json --output torch.json
    gradcheck-report ours.json torch.json                    # the table on the terminal
    gradcheck-report ours.json torch.json --output board.html

The format follows --output's extension (.html, .md, .txt; another one is plain text), or
--format; both given and disagreeing is a usage error. Exit status: 0 when no merged row
failed, erred or crashed, 1 when one did, 2 for bad input (a missing or unreadable file,
not JSON, another schema, over --max-mib (default reports.scoreboard.MAX_BYTES) or the
files over four times that together) or an output that cannot be written, each said in one
line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

from checkkit.usage import ArgumentParser, one_line
from reports.output import OutputError, report_format, write_atomic
from reports.record import exit_status
from reports.scoreboard import MAX_BYTES, ScoreboardError, merge, read_results, render_board

FORMATS = ("plain", "github", "html")


def build_parser(prog: str = "gradcheck-report") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog,
        description="Merge gradcheck result files (--format json) of several engines into "
                    "one scoreboard: op x engine, the counts per status, the failing rows.")
    p.add_argument("files", nargs="+", metavar="RESULTS.json",
                   help="result files written by gradcheck --format json (each at most "
                        "--max-mib)")
    p.add_argument("--format", choices=FORMATS,
                   help="plain (a terminal table), github (Markdown) or html (one page); "
                        "default: from --output's extension, else plain")
    p.add_argument("--max-mib", type=_positive, default=MAX_BYTES // 2**20, metavar="N",
                   help=f"refuse a file over N MiB, and files over 4 N MiB together "
                        f"(default {MAX_BYTES // 2**20}; a gradcheck --all file is about 4)")
    p.add_argument("--output", metavar="FILE",
                   help="write the scoreboard to FILE (atomically; .html, .md or .txt) "
                        "instead of standard output")
    return p


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return n


def too_big_together(paths, limit: int) -> str | None:
    """Why `paths` together are too much to read (their sizes add up to over `limit`
    bytes), or None; a path that cannot be looked at is left to read_results to name."""
    total = 0
    for path in paths:
        try:
            total += max(os.stat(path).st_size, 0)
        except (OSError, ValueError):
            continue
    if total > limit:
        return f"the files hold {total} bytes together, more than {limit} (--max-mib)"
    return None


def format_of(fmt: str | None, output: str | None) -> tuple[str | None, str | None]:
    """(format, None), or (None, the usage problem) for --format and --output: the format
    every tool infers (reports.output.report_format), refused where it is not a
    scoreboard's (.json, .xml)."""
    try:
        inferred = report_format(fmt, output)
    except ValueError as exc:
        return None, str(exc)
    if inferred not in FORMATS:
        ext = os.path.splitext(output)[1].lower()
        return None, (f"--output {output}: a scoreboard is written as .html, .md or .txt, "
                      f"not {ext}")
    return inferred, None


def main(argv=None, prog: str = "gradcheck-report") -> int:
    """Run the command line on `argv` (default sys.argv[1:]); the exit status."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    fmt, problem = format_of(args.format, args.output)
    if problem:
        parser.error(problem)
    limit = args.max_mib * 2**20
    problem = too_big_together(args.files, 4 * limit)
    if problem:
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    try:
        sources = [read_results(path, limit) for path in args.files]
    except ScoreboardError as exc:
        print(f"{prog}: {one_line(str(exc))}", file=sys.stderr)
        return 2
    rows = merge(sources)
    text = render_board(rows, sources, fmt, {"argv": list(sys.argv[1:] if argv is None
                                                         else argv)})
    if args.output is None:
        sys.stdout.write(text)
        return exit_status(rows)
    try:
        write_atomic(args.output, text)
    except OutputError as exc:
        print(f"{prog}: {one_line(str(exc))}", file=sys.stderr)
        return 2
    files = f"{len(sources)} file{'s' if len(sources) > 1 else ''}"
    print(f"{prog}: wrote {args.output} ({len(rows)} rows from {files})", file=sys.stderr)
    return exit_status(rows)
