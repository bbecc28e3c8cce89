"""Plain-text and Markdown tables of results (tabulate).

Columns: the case name, the labels (first-seen order over all results), the metrics
(first-seen order), the status (upper case) and, when any result has one, the message.
"""

from __future__ import annotations

import math
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
