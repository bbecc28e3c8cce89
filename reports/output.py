"""One entry point for every rendering, a safe way to write it to a file, and the tail that
every command line tool shares.

    text = render(results, "json", "gradcheck", meta={"argv": argv})
    write_atomic("report.json", text)
    return emit(results, tool="gradcheck", fmt="plain", output=None)   # a CLI's last line
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from reports.html_report import render_html
from reports.json_report import default_meta, render_json
from reports.junit import render_junit
from reports.record import exit_status
from reports.table import (
    NO_TERMINAL,
    Terminal,
    render_grouped,
    render_table,
    summary_line,
)
from reports.terminal_report import render_compact

FORMATS = ("plain", "github", "html", "json", "junit")
# The format a file name suggests, for tools that pick one from --output.
EXTENSION_FORMATS = {".txt": "plain", ".md": "github", ".html": "html", ".htm": "html",
                     ".json": "json", ".xml": "junit"}


class OutputError(Exception):
    """A report that could not be written; says which path and why (engine.files.WriteError,
    as reports' own type)."""

    def __init__(self, path, reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"cannot write {_shown(self.path)}: {reason}")


def _shown(path) -> str:
    # An empty path would vanish from a message, a newline would split it: quote those.
    text = os.fsdecode(path)
    return text if text.isprintable() and text else repr(text)


def format_for_path(path, default: str = "plain") -> str:
    """The format that `path`'s extension suggests (.json, .html, .xml, .md, .txt)."""
    return EXTENSION_FORMATS.get(_extension(path), default)


def _extension(path) -> str:
    return os.path.splitext(os.fsdecode(path))[1].lower()


def report_format(fmt: str | None, output=None) -> str:
    """The format of a report: `fmt` (--format) when given, else the one `output`'s
    extension names (EXTENSION_FORMATS), else plain. ValueError, in one line, when `fmt`
    contradicts a known extension: "--format plain contradicts --output r.html (html); drop
    one"."""
    if output is None:
        return fmt or "plain"
    suggested = EXTENSION_FORMATS.get(_extension(output))
    if fmt is not None and suggested is not None and fmt != suggested:
        raise ValueError(f"--format {fmt} contradicts --output {_shown(output)} "
                         f"({suggested}); drop one")
    return fmt or suggested or "plain"


def names_no_format(output) -> bool:
    """Whether `output`'s extension names no format (a plain report then, report_format)."""
    return output is not None and _extension(output) not in EXTENSION_FORMATS


def render(results, fmt: str, tool: str, meta: Mapping | None = None,
           figures: list[str] | None = None, group_by: str | None = None, *,
           verbose: bool = False, terminal: Terminal = NO_TERMINAL, show: str | None = None,
           strict: bool = False) -> str:
    """`results` in format `fmt` (one of FORMATS), as text ending with a newline.

    plain: the report a person reads (reports.terminal_report.render_compact) in view
    `show` (by default the summary per group, what failed in full, the skip reasons, the
    totals; "all": every row too, its case wrapped to fit `terminal`; `strict`: vacuous rows
    in full); with `verbose`, and always for github: every row and every column, then the
    summary line (github: a blank line between, so Markdown does not read the summary as a
    row). html: a page titled "<tool> report".
    json: the results document. junit: one testsuite named after the tool.
    `meta` (e.g. {"argv": [...]}) is added to the default version and time for html, json
    and junit; plain and github read only its "interrupted" (and "signal"): a last line
    says the run is incomplete. `figures`: extra HTML fragments for the html page (ignored
    otherwise).
    `group_by`: a label; verbose plain and github then give one table per value of it,
    compact plain a summary row per value.
    """
    results = list(results)
    if fmt in ("plain", "github"):
        text = (render_compact(results, tool, group_by, terminal, show, strict) + "\n"
                if fmt == "plain" and not verbose else _table(results, fmt, group_by))
        return text + _stopped(meta)
    full_meta = {**default_meta(), **(meta or {})}
    if fmt == "html":
        return render_html(results, f"{tool} report", full_meta, figures)
    if fmt == "json":
        return render_json(results, tool, full_meta)
    if fmt == "junit":
        return render_junit(results, tool, full_meta)
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")


def _table(results, fmt, group_by) -> str:
    if group_by:
        return render_grouped(results, fmt, group_by) + "\n"
    sep = "\n\n" if fmt == "github" else "\n"
    return render_table(results, fmt) + sep + summary_line(results) + "\n"


def _stopped(meta: Mapping | None) -> str:
    """The line that closes the text report of an interrupted run (meta "interrupted"),
    so that a kept file does not look complete; "" otherwise."""
    if not (meta or {}).get("interrupted"):
        return ""
    by = f" by {meta['signal']}" if meta.get("signal") else ""
    return f"interrupted{by}: these are the rows finished before it; the run is incomplete\n"


# The writing itself is engine.files' (the one atomic writer of every tool), imported where
# it is used: `import reports` then loads no engine (numba), only writing a file does, and
# every tool that writes a report has the engine loaded already.

def write_atomic(path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through engine.files.atomic_write, or raise OutputError
    naming the path and why (engine.files' docstring has the rules: a regular file is
    replaced atomically through a temporary file beside it and kept as it was on any
    failure; links are followed; FIFOs, character devices such as /dev/null and the
    process's own descriptors such as /dev/stdout are written straight into; directories,
    other special files and read-only files are refused; a full disk, EIO or a vanished
    directory is an OutputError too)."""
    from engine.files import WriteError
    from engine.files import write_atomic as write
    try:
        write(path, text)
    except WriteError as exc:
        raise OutputError(exc.path, exc.reason) from exc


def unwritable(path) -> str | None:
    """Why `path` cannot be written, checked before a long run (None if it can):
    engine.files.unwritable."""
    from engine.files import unwritable as why
    return why(path)


def first_unwritable(*paths) -> str | None:
    """"cannot write PATH: why" for the first of `paths` that cannot be written, or "PATH
    is given as two outputs" when two of them name the same file; None when every one can
    be written (engine.files.first_unwritable, which says more)."""
    from engine.files import first_unwritable as first
    return first(*paths)


def emit(results, *, tool: str, fmt: str = "plain", output=None, meta: Mapping | None = None,
         figures: list[str] | None = None, group_by: str | None = None,
         echo_plain: bool = False, footer: str | None = None, verbose: bool = False,
         prog: str | None = None, strict: bool = False, show: str | None = None) -> int:
    """The tail every command line tool shares: render `results` in `fmt`, write the text
    atomically to `output` (saying so on stderr) or to stdout, and return the exit status:
    0 all passed, 1 any failed, 2 when `output` cannot be written (one line on stderr).

    `echo_plain`: with an `output` in another format, also print the plain table to
    stdout. `footer`: a line printed after the report on stdout (not into a file).
    `verbose`: the plain table with every row and column; `show`: the plain report's view
    (reports.terminal_report.SHOWS; None: the tool's default). `prog`: the command's name
    that opens its messages (default `tool`; mnist-regress reports as the tool "mnist").
    `strict`: a vacuous result makes the exit status 1 too (reports.record.exit_status) and
    is listed in full. Plain text on a terminal fits its width (cases wrapped, statuses
    coloured unless NO_COLOR); in a file or a pipe nothing is wrapped or left out. Plain
    text written to a file whose extension names no format (names_no_format) says so."""
    results = list(results)
    prog = prog or tool
    views = {"group_by": group_by, "verbose": verbose, "show": show, "strict": strict}
    if output is not None:
        text = render(results, fmt, tool, meta, figures, **views)
        try:
            write_atomic(output, text)
        except OutputError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        kind = ("; plain text: its extension names no format, --format picks one"
                if fmt == "plain" and names_no_format(output) else "")
        print(f"{prog}: wrote {output} ({len(results)} results{kind})", file=sys.stderr)
        if echo_plain and fmt != "plain":
            sys.stdout.write(render(results, "plain", tool, **views,
                                    terminal=Terminal.of(sys.stdout)))
    else:
        sys.stdout.write(render(results, fmt, tool, meta, figures, **views,
                                terminal=Terminal.of(sys.stdout)))
        if footer:
            print(footer)
    return exit_status(results, strict)
