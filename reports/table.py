"""Plain-text and Markdown tables of results (tabulate)."""

from __future__ import annotations

from tabulate import tabulate

FORMATS = ("simple", "github", "plain")


def _cell(v):
    if isinstance(v, float):
        return f"{v:.3g}"
    return v


def render_table(results, fmt: str = "simple") -> str:
    """One row per result: its name, its metrics (columns in first-seen order), its status
    and, where something went wrong, the message."""
    columns: list[str] = []
    for r in results:
        columns += [k for k in r.metrics if k not in columns]
    has_msg = any(r.message for r in results)
    headers = ["case", *columns, "status"] + (["message"] if has_msg else [])
    rows = [[r.name, *(_cell(r.metrics.get(c, "")) for c in columns), r.status.upper()]
            + ([r.message] if has_msg else []) for r in results]
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def summary_line(results) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    words = {"pass": "passed", "fail": "failed", "error": "errors", "skip": "skipped"}
    parts = [f"{counts[s]} {w}" for s, w in words.items() if s in counts]
    return ", ".join(parts) if parts else "no cases"
