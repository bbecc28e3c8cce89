"""The HTML report's error plots: hand-written inline SVG, no library, no network.

One plot per metric whose key ends in "_err" (gradcheck's max_abs_err and max_rel_err),
one point per case on a log scale, coloured by status, in the order of the results (the
report's row ids r0, r1, ... follow the same order). Zero errors sit on a band below the
axis labelled "0", NaN and Inf on a band above it labelled "NaN/Inf".

Each point leads to its row. Up to TITLED_POINTS points are circles linking to their row
(`<a href="#rI">`) with a tooltip naming the case: every point of a small run, else the
failing, erring and crashing ones; the others are drawn as one path per status, which at
5,000 points is a tenth of the bytes, and the page's script finds the row of a click on
the plot from its x coordinate (the svg's data-left, data-width and data-n: point i sits at
left + (i + 1/2) width / n).
"""

from __future__ import annotations

import html
import math
from numbers import Real

import numpy as np

from reports.table import format_value

STATUS_COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "error": "#e65100",
                  "crash": "#6a1b9a", "skip": "#757575", "unsupported": "#5c6bc0",
                  "vacuous": "#f9a825"}
TITLED_POINTS = 600
PROBLEM_STATUSES = ("fail", "error", "crash")


def escape(v) -> str:
    """`v` as text safe inside HTML and SVG, attribute values included."""
    return html.escape(str(v), quote=True)


def number(v) -> float | None:
    """A real number as float (NaN and Inf included); None for anything else."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, Real):
        return None
    return float(v)


def error_plot_svg(results, metric: str) -> str | None:
    """An inline SVG of `metric` per case on a log scale, each point a link to its row
    (#r<index in results>); None when no case has a number."""
    results = list(results)
    points = [(i, r, number(r.metrics.get(metric))) for i, r in enumerate(results)]
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

    def cx_of(i: int) -> float:
        return left + (i + 0.5) * width / n

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" '
             f'viewBox="0 0 {total_w} {total_h}" role="img" class="plot" '
             f'data-left="{left}" data-width="{width}" data-n="{n}" '
             f'aria-label="{escape(metric)} per case, log scale">',
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
                 f'text-anchor="middle">case (run order), {n} in all; a point links to its '
                 f'row</text>')
    # Up to TITLED_POINTS points are linked, titled circles: every point where there are
    # that few, else the problems where those are that few. The rest are one path per
    # status (a dot is "M x y h0" under a round line cap).
    linked = points if len(points) <= TITLED_POINTS else \
        [p for p in points if p[1].status in PROBLEM_STATUSES]
    if len(linked) > TITLED_POINTS:
        linked = []
    plain: dict[str, list[str]] = {}
    is_linked = {i for i, _, _ in linked}
    for i, r, x in points:
        if i not in is_linked:
            plain.setdefault(r.status, []).append(f"M{cx_of(i):.1f} {y_of(x):.1f}h0")
    for status, dots in plain.items():
        parts.append(f'<path d="{"".join(dots)}" stroke="{STATUS_COLOURS[status]}" '
                     f'stroke-width="6" stroke-linecap="round" fill="none"/>')
    parts += [_point(i, r, x, metric, cx_of(i), y_of(x)) for i, r, x in linked]
    parts.append("</svg>")
    return "".join(parts)


def _point(i: int, r, x: float, metric: str, cx: float, cy: float) -> str:
    """One point linked to its row #r<i>, with a tooltip naming its case; hollow for a
    zero or non-finite error."""
    colour = STATUS_COLOURS[r.status]
    fill = "none" if x == 0 or not math.isfinite(x) else colour
    value = format_value(r.metrics.get(metric))
    return (f'<a href="#r{i}"><circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{fill}" '
            f'stroke="{colour}" stroke-width="1.5"><title>{escape(r.name)}: {escape(metric)} '
            f'= {escape(value)} ({escape(r.status)})</title></circle></a>')
