"""Plain-text and Markdown tables of results (tabulate).

The full table (render_table, --verbose): the case name, the labels (first-seen order over
all results), the metrics (first-seen order), the status (upper case) and, when any result
has one, the message. The compact one (compact_table, `--show all`): the few columns of each
tool that a person reads (COMPACT), fitted to a terminal's width by wrapping the case and,
where that is not enough, leaving out the last columns; never by cutting a cell. The plain
report around it is reports.terminal_report's.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from numbers import Integral, Real

import numpy as np
from tabulate import tabulate

from reports.record import STATUS_WORDS

# Our table formats and the tabulate style each one uses.
TABLE_STYLES = {"plain": "simple", "github": "github"}
FORMATS = tuple(TABLE_STYLES)
# "simple" is the former name of "plain" (the tabulate style); still accepted.
_ALIASES = {"simple": "plain"}


def format_value(v) -> str:
    """A compact cell: floats to 3 significant digits, None as empty, sequences as [a,b]."""
    if v is None:
        return ""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, Integral):
        return str(int(v))
    if isinstance(v, Real):
        v = float(v)
        return str(v) if not math.isfinite(v) else f"{v:.3g}"
    if isinstance(v, (list, tuple, np.ndarray)):
        return "[" + ",".join(format_value(x) for x in v) + "]"
    return str(v)


def columns(results) -> tuple[list[str], list[str]]:
    """(label keys, metric keys), each in first-seen order over `results`."""
    labels: dict[str, None] = {}
    metrics: dict[str, None] = {}
    for r in results:
        labels.update(dict.fromkeys(r.labels))
        metrics.update(dict.fromkeys(r.metrics))
    return list(labels), list(metrics)


def _markdown_cell(text: str) -> str:
    """A Markdown table cell: pipes escaped, line breaks as spaces."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", " ")


def render_table(results, fmt: str = "plain") -> str:
    """One row per result; `fmt` is "plain" (tabulate's "simple" style) or "github"
    (a Markdown table, with pipes in cells escaped)."""
    fmt = _ALIASES.get(fmt, fmt)
    if fmt not in TABLE_STYLES:
        raise ValueError(f"table format must be one of {FORMATS}, got {fmt!r}")
    results = list(results)
    label_keys, metric_keys = columns(results)
    has_msg = any(r.message for r in results)
    headers = ["case", *label_keys, *metric_keys, "status"] + (["message"] if has_msg else [])
    rows = []
    for r in results:
        row = [r.name, *(format_value(r.labels.get(k)) for k in label_keys),
               *(format_value(r.metrics.get(k)) for k in metric_keys), r.status.upper()]
        rows.append(row + ([r.message] if has_msg else []))
    if fmt == "github":
        headers = [_markdown_cell(h) for h in headers]
        rows = [[_markdown_cell(str(c)) for c in row] for row in rows]
    return tabulate(rows, headers=headers, tablefmt=TABLE_STYLES[fmt], disable_numparse=True)


def summary_line(results) -> str:
    """E.g. "12 passed, 1 failed, 2 skipped"; "no cases" when there are none."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    parts = [f"{counts[s]} {w}" for s, w in STATUS_WORDS.items() if s in counts]
    return ", ".join(parts) if parts else "no cases"


def render_grouped(results, fmt: str = "plain", key: str = "family") -> str:
    """One table per value of label `key` (first-seen order), each titled with its own
    summary line (a Markdown heading in "github"), then one summary line of all."""
    groups: dict[str, list] = {}
    for r in results:
        groups.setdefault(r.labels.get(key, ""), []).append(r)
    parts = []
    for value, rows in groups.items():
        title = f"{value} ({summary_line(rows)})" if value else summary_line(rows)
        parts.append(("## " if fmt == "github" else "") + title + "\n\n" +
                     render_table(rows, fmt))
    return "\n\n".join(parts) + "\n\n" + summary_line(results)


# --- the compact table ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Column:
    """A compact table's column: a label or metric `key` (labels first), or "status".
    `show`: "always"; "present" when any row has a value; "varies" when rows differ in it."""

    key: str
    show: str = "always"


@dataclasses.dataclass(frozen=True)
class CompactSpec:
    """A tool's compact table: its columns after the case, the label whose values each get
    a summary row (None: no summary per group), and the view a plain report shows by
    default (reports.terminal_report.SHOWS: "failures", or "all" for a tool whose every
    row is worth reading)."""

    columns: tuple[Column, ...]
    group: str | None = None
    show: str = "failures"


def _cols(*keys: str) -> tuple[Column, ...]:
    """Columns from keys; "key?" is shown when present, "key~" when it varies."""
    show = {"?": "present", "~": "varies"}
    return tuple(Column(k[:-1], show[k[-1]]) if k[-1] in show else Column(k) for k in keys)


# Per tool (Result.tool): what a person needs to read a row; the rest is in --verbose.
COMPACT = {
    "gradcheck": CompactSpec(_cols("engine~", "backend~", "status", "max_rel_err", "ratio?",
                                   "kinks?", "forward?", "torch?", "vs_cpu?"), "op"),
    "gradcheck-selftest": CompactSpec(_cols("kind~", "tier~", "status", "cases?", "caught?",
                                            "fixed?", "precision?", "check?"), "kind"),
    "gradcheck-coverage": CompactSpec(_cols("checked_by", "status", "cases", "passed",
                                            "failed", "crashed", "unsupported"), show="all"),
    "optcheck": CompactSpec(_cols("family~", "dtype~", "backend~", "status", "max_rel_err?",
                                  "ratio?", "first_step?"), "family"),
    "optcheck-selftest": CompactSpec(_cols("status", "rows?", "failed_rows?", "caught_by?")),
    "mnist": CompactSpec(_cols("status", "measured?", "torch?", "bar?", "floor?", "mean?",
                               "sd?"), "arch", show="all"),
}
SEPARATOR = 2        # spaces between columns (tabulate's "plain" and "simple" styles)
MIN_CASE = 20        # the case column wraps to no fewer characters; columns go first
INDENT = "  "        # a wrapped cell's continuation lines
COLORS = {"pass": "32", "fail": "31", "error": "31;1", "crash": "35;1", "skip": "33",
          "unsupported": "33", "vacuous": "33;1"}


@dataclasses.dataclass(frozen=True)
class Terminal:
    """Where a plain report goes: `width` to fit (None: a file or pipe, every column on one
    line per row) and `color` for the statuses."""

    width: int | None = None
    color: bool = False

    @classmethod
    def of(cls, stream) -> Terminal:
        """`stream`'s terminal: its width and colour (unless NO_COLOR is set, no-color.org)
        when it is a tty; a plain Terminal() for a file or pipe."""
        if not (hasattr(stream, "isatty") and stream.isatty()):
            return cls()
        return cls(shutil.get_terminal_size().columns, not os.environ.get("NO_COLOR"))


# A file or a pipe: nothing wrapped or left out, no colour.
NO_TERMINAL = Terminal()

def _break_points(text: str) -> list[str]:
    """`text` in pieces that end after an opening parenthesis or after a comma outside
    square brackets (`pool_2d(`, `x=[2,3,6,5],`, `mode=max,`): where a case may wrap."""
    pieces, start, depth = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "[") - (c == "]")
        if c == "(" or (c == "," and depth <= 0):
            pieces.append(text[start:i + 1])
            start = i + 1
    return [*pieces, text[start:]] if start < len(text) else pieces


def wrap_cell(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, broken after a parenthesis or a comma
    outside square brackets where it can (else anywhere); every line after the first opens
    with INDENT. Nothing is lost: the lines without their indent join back into `text`."""
    if len(text) <= width:
        return [text]
    lines: list[str] = []
    line = ""
    for token in _break_points(text):
        room = width - (len(INDENT) if lines else 0)
        if line and len(line) + len(token) > room:
            lines.append(line)
            line = ""
            room = width - len(INDENT)
        line += token
        while len(line) > room > 0:
            lines.append(line[:room])
            line = line[room:]
            room = width - len(INDENT)
    lines.append(line)
    return [lines[0], *(INDENT + rest for rest in lines[1:] if rest)]


@dataclasses.dataclass(frozen=True)
class Fitted:
    """A table fitted to a terminal: its text and the headers of the columns it left out."""

    text: str
    dropped: tuple[str, ...] = ()


def fit_table(headers: list[str], rows: list[list[str]], terminal: Terminal,
              right: bool = False, statuses: tuple[int, list[str]] | None = None) -> Fitted:
    """A table in the look of tabulate's "simple" style, fitted to terminal.width: the last
    columns are left out (named in Fitted.dropped; never the first, the status column nor
    the one after it) until the first column has half the width (at least MIN_CASE, at most
    what it needs), and its cells wrap within that (wrap_cell). No cell is ever cut.
    `right`: columns after the first aligned right. `statuses` (column, status per row):
    those cells coloured."""
    status_col = statuses[0] if statuses is not None else None
    natural = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    keep = list(range(len(headers)))
    first = natural[0]
    if terminal.width is not None:
        def room():
            return terminal.width - sum(natural[i] + SEPARATOR for i in keep[1:])
        kept = {0} if status_col is None else {0, status_col, status_col + 1}
        target = min(first, max(MIN_CASE, len(headers[0]), terminal.width // 2))
        while room() < target and any(i not in kept for i in keep):
            keep.remove(next(i for i in reversed(keep) if i not in kept))
        first = min(first, max(room(), MIN_CASE, len(headers[0])))
    widths = [first, *(natural[i] for i in keep[1:])]

    def line(cells, row_index=None):
        out = []
        for n, (cell, width) in enumerate(zip(cells, widths, strict=True)):
            pad = " " * (width - len(cell))
            if row_index is not None and keep[n] == status_col and cell:
                cell = paint(statuses[1][row_index], cell, terminal)
            out.append(pad + cell if right and n else cell + pad)
        return (" " * SEPARATOR).join(out).rstrip()

    lines = [line([headers[i] for i in keep]), line(["-" * w for w in widths])]
    for n, row in enumerate(rows):
        head, *more = wrap_cell(row[0], first)
        lines.append(line([head, *(row[i] for i in keep[1:])], n))
        lines += [line([cont, *("" for _ in keep[1:])]) for cont in more]
    return Fitted("\n".join(lines),
                  tuple(headers[i] for i in range(len(headers)) if i not in keep))


def paint(status: str, text: str, terminal: Terminal) -> str:
    """`text` in the colour of `status` when `terminal` has colour."""
    return f"\x1b[{COLORS[status]}m{text}\x1b[0m" if terminal.color else text


def _value(r, key: str):
    return r.labels[key] if key in r.labels else r.metrics.get(key)


def compact_spec(results, tool: str = "") -> CompactSpec | None:
    """The COMPACT entry of `results` (the first result's tool, else `tool`), or None."""
    return COMPACT.get(results[0].tool if results else tool)


def compact_columns(results, tool: str = "") -> list[str]:
    """The compact table's keys after "case" for `results` (the first result's tool, else
    `tool`); a tool without a COMPACT entry shows its labels, metrics and status."""
    spec = compact_spec(results, tool)
    if spec is None:
        label_keys, metric_keys = columns(results)
        return [*label_keys, *metric_keys, "status"]
    keys = []
    for col in spec.columns:
        if col.show == "present" and not any(format_value(_value(r, col.key))
                                             for r in results):
            continue
        if col.show == "varies" and len({format_value(_value(r, col.key))
                                         for r in results}) < 2:
            continue
        keys.append(col.key)
    return keys


def _cell(r, key: str) -> str:
    text = r.status.upper() if key == "status" else format_value(_value(r, key))
    return " ".join(text.split("\n"))


def compact_table(results, tool: str = "", terminal: Terminal = NO_TERMINAL) -> Fitted:
    """One row per result, the compact columns (compact_columns), fitted to the terminal
    (fit_table: the case wraps, never cut); statuses coloured when it says so."""
    keys = compact_columns(results, tool)
    rows = [[r.name, *(_cell(r, k) for k in keys)] for r in results]
    statuses = ((keys.index("status") + 1, [r.status for r in results])
                if "status" in keys else None)
    return fit_table(["case", *keys], rows, terminal, statuses=statuses)
