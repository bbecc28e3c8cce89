"""Plain-text and Markdown tables of results (tabulate).

The full table (render_table, --verbose): the case name, the labels (first-seen order over
all results), the metrics (first-seen order), the status (upper case) and, when any result
has one, the message. The compact one (render_compact, a plain report by default): the few
columns of each tool that a person reads (COMPACT), fitted to a terminal's width, then a
summary per group, the failures in full and the summary line.
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
    """A tool's compact table: its columns after the case, and the label whose values each
    get a summary row (None: no summary per group)."""

    columns: tuple[Column, ...]
    group: str | None = None


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
                                            "failed", "crashed", "unsupported")),
    "optcheck": CompactSpec(_cols("family~", "dtype~", "backend~", "status", "max_rel_err?",
                                  "ratio?", "first_step?"), "family"),
    "optcheck-selftest": CompactSpec(_cols("status", "rows?", "failed_rows?", "caught_by?")),
    "mnist": CompactSpec(_cols("status", "measured?", "torch?", "bar?", "floor?", "mean?",
                               "sd?"), "arch"),
}
SEPARATOR = 2        # spaces between columns (tabulate's "plain" and "simple" styles)
MIN_CASE = 20        # the case column is shortened to no fewer characters, then the others
MIN_CELL = 6
ELLIPSIS = "…"
COLORS = {"pass": "32", "fail": "31", "error": "31;1", "crash": "35;1", "skip": "33",
          "unsupported": "33", "vacuous": "33;1"}


@dataclasses.dataclass(frozen=True)
class Terminal:
    """Where a plain report goes: `width` to fit (None: a file or pipe, nothing shortened),
    `color` for the statuses, and the `ellipsis` of a shortened cell."""

    width: int | None = None
    color: bool = False
    ellipsis: str = ELLIPSIS

    @classmethod
    def of(cls, stream) -> Terminal:
        """`stream`'s terminal: its width and colour (unless NO_COLOR is set, no-color.org)
        when it is a tty; a plain Terminal() for a file or pipe."""
        if not (hasattr(stream, "isatty") and stream.isatty()):
            return cls()
        try:
            ELLIPSIS.encode(getattr(stream, "encoding", None) or "ascii")
            ellipsis = ELLIPSIS
        except (UnicodeError, LookupError):
            ellipsis = "..."
        return cls(shutil.get_terminal_size().columns, not os.environ.get("NO_COLOR"),
                   ellipsis)


# A file or a pipe: nothing shortened, no colour.
NO_TERMINAL = Terminal()


def shorten_middle(text: str, width: int, ellipsis: str = ELLIPSIS) -> str:
    """`text` cut to `width` characters by replacing its middle with `ellipsis`, so that both
    ends of a case name (op and last parameters) stay readable."""
    if len(text) <= width:
        return text
    if width <= len(ellipsis):
        return text[:width]
    keep = width - len(ellipsis)
    head = (keep + 1) // 2
    return text[:head] + ellipsis + text[len(text) - (keep - head):]


def fit_widths(natural: list[int], floors: list[int], width: int | None) -> list[int]:
    """Column widths within `width` (separators included): the first column gives up what
    is needed down to its floor, then the widest of the others, one character at a time.
    None, or a table that fits: `natural` unchanged. May stay wider when all are at floor."""
    widths = list(natural)
    if width is None:
        return widths
    over = sum(widths) + SEPARATOR * (len(widths) - 1) - width
    if over <= 0:
        return widths
    cut = min(over, widths[0] - floors[0])
    widths[0] -= max(cut, 0)
    over -= max(cut, 0)
    while over > 0:
        shrinkable = [i for i in range(1, len(widths)) if widths[i] > floors[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
        over -= 1
    return widths


def _fitted(headers: list[str], rows: list[list[str]], terminal: Terminal,
            first_floor: int = MIN_CASE, right: bool = False,
            statuses: tuple[int, list[str]] | None = None) -> str:
    """A table in the look of tabulate's "simple" style, cells shortened to fit
    terminal.width; headers never shortened nor padded (tabulate's "simple" pads them by
    two, which a narrow terminal cannot spare). `right`: columns after the first aligned
    right. `statuses` (column, status per row): cells coloured after shortening,
    never shortened."""
    natural = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    floors = [min(n, max(len(h), first_floor if i == 0 else MIN_CELL))
              for i, (n, h) in enumerate(zip(natural, headers, strict=True))]
    if statuses is not None:
        col, per_row = statuses
        floors[col] = natural[col]          # a status is never shortened
    widths = fit_widths(natural, floors, terminal.width)
    rows = [[shorten_middle(c, w, terminal.ellipsis) for c, w in zip(row, widths, strict=True)]
            for row in rows]
    if statuses is not None:
        for row, status in zip(rows, per_row, strict=True):
            row[col] = _paint(status, row[col], terminal)
    align = ["left"] + ["right" if right else "left"] * (len(headers) - 1)
    text = tabulate([headers, ["-" * w for w in widths], *rows], tablefmt="plain",
                    colalign=align, disable_numparse=True)
    return "\n".join(line.rstrip() for line in text.split("\n"))


def _paint(status: str, text: str, terminal: Terminal) -> str:
    return f"\x1b[{COLORS[status]}m{text}\x1b[0m" if terminal.color else text


def _value(r, key: str):
    return r.labels[key] if key in r.labels else r.metrics.get(key)


def compact_columns(results, tool: str = "") -> list[str]:
    """The compact table's keys after "case" for `results` (the first result's tool, else
    `tool`); a tool without a COMPACT entry shows its labels, metrics and status."""
    name = results[0].tool if results else tool
    spec = COMPACT.get(name)
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


def compact_table(results, tool: str = "", terminal: Terminal = NO_TERMINAL) -> str:
    """One row per result, the compact columns (compact_columns), fitted to the terminal;
    statuses coloured when it says so."""
    keys = compact_columns(results, tool)
    rows = [[r.name, *(_cell(r, k) for k in keys)] for r in results]
    statuses = ((keys.index("status") + 1, [r.status for r in results])
                if "status" in keys else None)
    return _fitted(["case", *keys], rows, terminal, statuses=statuses)


def group_summary(results, key: str | None, terminal: Terminal = NO_TERMINAL) -> str:
    """A row per value of label `key` (first-seen order): passed, failed and errors counts,
    crashed, skipped and unsupported where any, and the kinks (summed) where rows have
    them. Empty when `key` is None or no result has that label."""
    if key is None or not any(key in r.labels for r in results):
        return ""
    groups: dict[str, list] = {}
    for r in results:
        groups.setdefault(format_value(r.labels.get(key)), []).append(r)
    counted = {"passed": ("pass",), "failed": ("fail",), "errors": ("error",),
               "crashed": ("crash",), "skipped": ("skip",), "unsupported": ("unsupported",),
               "vacuous": ("vacuous",)}
    words = [w for w, statuses in counted.items()
             if w in ("passed", "failed", "errors") or any(r.status in statuses
                                                           for r in results)]
    kinks = any("kinks" in r.metrics for r in results)
    rows = []
    for value, rs in groups.items():
        row = [value, *(str(sum(r.status in counted[w] for r in rs)) for w in words)]
        if kinks:
            row.append(str(sum(int(r.metrics.get("kinks") or 0) for r in rs)))
        rows.append(row)
    headers = [key, *words] + (["kinks"] if kinks else [])
    return _fitted(headers, rows, terminal, first_floor=MIN_CELL, right=True)


def failure_list(results, terminal: Terminal = NO_TERMINAL) -> str:
    """Every failed, erred or crashed result: its status and case, then its message and its
    repro command (metrics["repro"]) in full, indented; then, as such, every vacuous one
    (a check that could not have failed). Empty when there are none."""
    failed = [r for r in results if not r.ok]
    vacuous = [r for r in results if r.status == "vacuous"]
    parts = [_listed(f"failures ({len(failed)}):", failed, terminal) if failed else "",
             _listed(f"vacuous ({len(vacuous)}): these checks could not have failed",
                     vacuous, terminal) if vacuous else ""]
    return "\n\n".join(p for p in parts if p)


def _listed(title: str, rows, terminal: Terminal) -> str:
    lines = [title]
    for r in rows:
        lines += ["", f"{_paint(r.status, r.status.upper(), terminal)} {r.name}"]
        lines += [f"  {line}" for line in r.message.splitlines() if line.strip()]
        repro = r.metrics.get("repro")
        if repro and repro not in r.message:
            lines.append(f"  reproduce: {repro}")
    return "\n".join(lines)


def render_compact(results, tool: str = "", group_by: str | None = None,
                   terminal: Terminal = NO_TERMINAL) -> str:
    """The plain report a person reads: the compact table, a summary per group (label
    `group_by`, default the tool's COMPACT group), the failures, then the summary line."""
    results = list(results)
    if not results:
        return summary_line(results)
    spec = COMPACT.get(results[0].tool or tool)
    key = group_by or (spec.group if spec else None)
    parts = [compact_table(results, tool, terminal), group_summary(results, key, terminal),
             failure_list(results, terminal), summary_line(results)]
    return "\n\n".join(p for p in parts if p)
