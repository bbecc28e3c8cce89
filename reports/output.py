"""One entry point for every rendering, a safe way to write it to a file, and the tail that
every command line tool shares.

    text = render(results, "json", "gradcheck", meta={"argv": argv})
    write_atomic("report.json", text)
    return emit(results, tool="gradcheck", fmt="plain", output=None)   # a CLI's last line
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Mapping

from reports.html_report import render_html
from reports.json_report import default_meta, render_json
from reports.junit import render_junit
from reports.record import exit_status
from reports.table import render_grouped, render_table, summary_line

FORMATS = ("plain", "github", "html", "json", "junit")
# The format a file name suggests, for tools that pick one from --output.
EXTENSION_FORMATS = {".txt": "plain", ".md": "github", ".html": "html", ".htm": "html",
                     ".json": "json", ".xml": "junit"}


class OutputError(Exception):
    """A report that could not be written; says which path and why."""

    def __init__(self, path, reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"cannot write {self.path}: {reason}")


def format_for_path(path, default: str = "plain") -> str:
    """The format that `path`'s extension suggests (.json, .html, .xml, .md, .txt)."""
    return EXTENSION_FORMATS.get(os.path.splitext(os.fspath(path))[1].lower(), default)


def render(results, fmt: str, tool: str, meta: Mapping | None = None,
           figures: list[str] | None = None, group_by: str | None = None) -> str:
    """`results` in format `fmt` (one of FORMATS), as text ending with a newline.

    plain and github: the table, then the summary line (github: a blank line between, so
    Markdown does not read the summary as a row). html: a page titled "<tool> report".
    json: the results document. junit: one testsuite named after the tool.
    `meta` (e.g. {"argv": [...]}) is added to the default version and time for html, json
    and junit. `figures`: extra HTML fragments for the html page (ignored otherwise).
    `group_by`: a label; plain and github then give one table per value of it.
    """
    results = list(results)
    if fmt in ("plain", "github") and group_by:
        return render_grouped(results, fmt, group_by) + "\n"
    if fmt in ("plain", "github"):
        sep = "\n\n" if fmt == "github" else "\n"
        return render_table(results, fmt) + sep + summary_line(results) + "\n"
    full_meta = {**default_meta(), **(meta or {})}
    if fmt == "html":
        return render_html(results, f"{tool} report", full_meta, figures)
    if fmt == "json":
        return render_json(results, tool, full_meta)
    if fmt == "junit":
        return render_junit(results, tool, full_meta)
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")


def _umask() -> int:
    # os.umask can only be read by setting it; put it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a temporary file in the same directory and
    os.replace: readers see the old file or the new one, never half of one, and on any
    failure the old file is left as it was. Raises OutputError naming the path and why."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise OutputError(path, "it is a directory")
    if not os.path.isdir(directory):
        raise OutputError(path, f"directory {directory} does not exist")
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        mode = 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                   dir=directory)
    except OSError as exc:
        raise OutputError(path, exc.strerror or str(exc)) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(path, exc.strerror or str(exc)) from exc
        if isinstance(exc, UnicodeError):
            raise OutputError(path, f"text is not valid UTF-8: {exc}") from exc
        raise


def unwritable(path: str) -> str | None:
    """Why `path` cannot be written, checked before a long run (None if it can)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "it is a directory"
    if not os.path.isdir(folder):
        return f"no directory {folder}"
    if not os.access(folder, os.W_OK):
        return f"directory {folder} is not writable"
    return None


def first_unwritable(*paths) -> str | None:
    """"cannot write PATH: why" for the first of `paths` (None entries skipped) that cannot
    be written, checked before a long run; None when every one can."""
    for path in paths:
        if path:
            problem = unwritable(path)
            if problem:
                return f"cannot write {path}: {problem}"
    return None


def emit(results, *, tool: str, fmt: str = "plain", output=None, meta: Mapping | None = None,
         figures: list[str] | None = None, group_by: str | None = None,
         echo_plain: bool = False, footer: str | None = None) -> int:
    """The tail every command line tool shares: render `results` in `fmt`, write the text
    atomically to `output` (saying so on stderr) or to stdout, and return the exit status:
    0 all passed, 1 any failed, 2 when `output` cannot be written (one line on stderr).

    `echo_plain`: with an `output` in another format, also print the plain table to
    stdout. `footer`: a line printed after the report on stdout (not into a file)."""
    results = list(results)
    text = render(results, fmt, tool, meta, figures, group_by)
    if output:
        try:
            write_atomic(output, text)
        except OutputError as exc:
            print(f"{tool}: {exc}", file=sys.stderr)
            return 2
        print(f"{tool}: wrote {output} ({len(results)} results)", file=sys.stderr)
        if echo_plain and fmt != "plain":
            sys.stdout.write(render(results, "plain", tool, group_by=group_by))
    else:
        sys.stdout.write(text)
        if footer:
            print(footer)
    return exit_status(results)
