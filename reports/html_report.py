"""Results as one self-contained HTML page: summary, plots of the errors, results table.

No external assets: the CSS, the sorting script (click a column header) and the plots
(hand-written SVG) are inline. Every string from a result is escaped with html.escape.

Plots: one per metric whose key ends in "_err" (gradcheck's max_abs_err and max_rel_err),
with one point per case on a log scale, coloured by status. Zero errors sit on a band
below the axis labelled "0", NaN and Inf on a band above it labelled "NaN/Inf".
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from numbers import Real

import numpy as np

from reports.record import STATUS_WORDS, STATUSES, summarize
from reports.table import columns, format_value

STATUS_COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "error": "#e65100",
                  "crash": "#6a1b9a", "skip": "#757575", "unsupported": "#5c6bc0",
                  "vacuous": "#f9a825"}
# Sorting by status puts the worst first.
_STATUS_RANK = {"crash": 0, "fail": 1, "error": 2, "vacuous": 3, "unsupported": 4, "skip": 5,
                "pass": 6}

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #212121; }
h1 { font-size: 1.4em; margin: 0 0 .5em; }
.summary span { display: inline-block; padding: .15em .6em; margin-right: .4em;
  border-radius: .8em; color: #fff; font-weight: 600; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .1em 1em;
  color: #555; font-size: .9em; }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; font-family: monospace; }
figure { display: inline-block; margin: .5em 1em .5em 0; }
figcaption { font-size: .9em; color: #555; }
table { border-collapse: collapse; margin-top: 1em; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f5f5f5; cursor: pointer; user-select: none; white-space: nowrap; }
th::after { content: " \\2195"; color: #aaa; }
th.asc::after { content: " \\2191"; color: #333; }
th.desc::after { content: " \\2193"; color: #333; }
td.num { text-align: right; font-family: monospace; }
td.case { font-family: monospace; }
td.message { white-space: pre-wrap; max-width: 50em; }
td.status { font-weight: 700; color: #fff; text-align: center; }
""" + "".join(f"td.status-{s} {{ background: {c}; }}\n.summary .{s} {{ background: {c}; }}\n"
              f"tr.row-{s} td.case {{ border-left: 4px solid {c}; }}\n"
              for s, c in STATUS_COLOURS.items())

_SORT_SCRIPT = """
document.querySelectorAll("table.results th").forEach(function (th, col) {
  th.addEventListener("click", function () {
    var tbody = th.closest("table").tBodies[0];
    var desc = th.classList.contains("asc");
    th.parentNode.querySelectorAll("th").forEach(function (h) {
      h.classList.remove("asc", "desc"); });
    th.classList.add(desc ? "desc" : "asc");
    var key = function (tr) {
      var td = tr.cells[col]; var s = td.getAttribute("data-sort");
      return s === null ? td.textContent : s; };
    var rows = Array.prototype.slice.call(tbody.rows);
    rows.sort(function (a, b) {
      var x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return desc ? -c : c; });
    rows.forEach(function (tr) { tbody.appendChild(tr); });
  });
});
"""


def _e(v) -> str:
    return html.escape(str(v), quote=True)


def _number(v) -> float | None:
    """A real number as float (NaN and Inf included); None for anything else."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, Real):
        return None
    return float(v)


def _sort_key(v) -> str | None:
    x = _number(v)
    if x is None:
        return None
    return repr(x) if math.isfinite(x) else ("1e999" if x > 0 else "-1e999")


def error_plot_svg(results, metric: str) -> str | None:
    """An inline SVG of `metric` per case on a log scale; None when no case has a number."""
    points = [(i, r, _number(r.metrics.get(metric))) for i, r in enumerate(results)]
    points = [(i, r, abs(x)) for i, r, x in points if x is not None]
    if not points:
        return None
    positive = [x for _, _, x in points if 0 < x < math.inf]
    lo = math.floor(math.log10(min(positive))) if positive else -1
    hi = math.ceil(math.log10(max(positive))) if positive else 0
    hi = max(hi, lo + 1)
    has_zero = any(x == 0 for _, _, x in points)
    has_bad = any(not math.isfinite(x) for _, _, x in points)
    n = len(results)
    left, right, top, height = 64, 16, 26 if has_bad else 10, 180
    width = min(max(n * 10, 320), 1100)
    bottom_y = top + height
    total_w, total_h = left + width + right, bottom_y + (44 if has_zero else 26)

    def y_of(x: float) -> float:
        if x == 0:
            return bottom_y + 16
        if not math.isfinite(x):
            return top - 14
        return bottom_y - (math.log10(x) - lo) / (hi - lo) * height

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" '
             f'viewBox="0 0 {total_w} {total_h}" role="img" '
             f'aria-label="{_e(metric)} per case, log scale">',
             f'<rect x="{left}" y="{top}" width="{width}" height="{height}" '
             f'fill="#fafafa" stroke="#bbb"/>']
    step = max(1, math.ceil((hi - lo) / 8))
    for d in range(lo, hi + 1, step):
        y = y_of(10.0 ** d)
        parts.append(f'<line x1="{left}" x2="{left + width}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#e0e0e0"/><text x="{left - 6}" y="{y + 4:.1f}" font-size="11" '
                     f'text-anchor="end">1e{d}</text>')
    for label, present, y in (("0", has_zero, bottom_y + 16), ("NaN/Inf", has_bad, top - 14)):
        if present:
            parts.append(f'<text x="{left - 6}" y="{y + 4}" font-size="11" '
                         f'text-anchor="end">{label}</text>')
    parts.append(f'<text x="{left + width / 2}" y="{total_h - 6}" font-size="11" '
                 f'text-anchor="middle">case (table order), {n} in all</text>')
    for i, r, x in points:
        cx, cy = left + (i + 0.5) * width / n, y_of(x)
        colour = STATUS_COLOURS[r.status]
        fill = "none" if x == 0 or not math.isfinite(x) else colour
        value = format_value(r.metrics.get(metric))
        parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{fill}" '
                     f'stroke="{colour}" stroke-width="1.5"><title>{_e(r.name)}: '
                     f'{_e(metric)} = {_e(value)} ({_e(r.status)})</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def _meta_html(meta: Mapping) -> str:
    rows = []
    for k, v in meta.items():
        text = " ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
        rows.append(f"<dt>{_e(k)}</dt><dd>{_e(text)}</dd>")
    return f'<dl class="meta">{"".join(rows)}</dl>\n' if rows else ""


def _table_html(results) -> str:
    label_keys, metric_keys = columns(results)
    headers = ["case", *label_keys, *metric_keys, "status", "message"]
    out = ['<table class="results"><thead><tr>',
           "".join(f"<th>{_e(h)}</th>" for h in headers), "</tr></thead><tbody>\n"]
    for r in results:
        cells = [f'<td class="case">{_e(r.name)}</td>']
        cells += [f"<td>{_e(format_value(r.labels.get(k)))}</td>" for k in label_keys]
        for k in metric_keys:
            v = r.metrics.get(k)
            key = _sort_key(v)
            sort = f' data-sort="{_e(key)}"' if key is not None else ""
            cls = ' class="num"' if key is not None else ""
            cells.append(f"<td{cls}{sort}>{_e(format_value(v))}</td>")
        cells.append(f'<td class="status status-{_e(r.status)}" '
                     f'data-sort="{_STATUS_RANK[r.status]}">{_e(r.status.upper())}</td>')
        cells.append(f'<td class="message">{_e(r.message)}</td>')
        out.append(f'<tr class="row-{_e(r.status)}">{"".join(cells)}</tr>\n')
    out.append("</tbody></table>\n")
    return "".join(out)


def render_html(results, title: str, meta: Mapping | None = None,
                figures: list[str] | None = None) -> str:
    """A self-contained HTML page of `results` under `title`; `meta` (e.g. version, argv,
    time) is listed under the summary. `figures`: extra HTML fragments (a tool's own plots)
    placed before the table, as given."""
    results = list(results)
    counts = summarize(results)
    badges = "".join(f'<span class="{s}">{counts[STATUS_WORDS[s]]} {STATUS_WORDS[s]}</span>'
                     for s in STATUSES if counts[STATUS_WORDS[s]])
    summary = f'<p class="summary">{badges or "no cases"} ({counts["total"]} in all)</p>\n'
    _, metric_keys = columns(results)
    figures = list(figures or [])
    for k in metric_keys:
        svg = error_plot_svg(results, k) if k.endswith("_err") else None
        if svg:
            figures.append(f"<figure>{svg}<figcaption>{_e(k)} per case (log scale)"
                           f"</figcaption></figure>")
    plots = f'<section class="plots">{"".join(figures)}</section>\n' if figures else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            f"<h1>{_e(title)}</h1>\n{summary}{_meta_html(meta or {})}{plots}"
            f"{_table_html(results)}<script>{_SORT_SCRIPT}</script>\n</body>\n</html>\n")
