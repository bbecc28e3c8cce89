"""Results as one self-contained HTML page a person can read at 5,000 rows.

The page, top to bottom: the title, the counts per status, the run's meta; a sticky bar
with the filter box, the status selector and open/close-all; the summary grid (one row per
section, one column per value of a second label: gradcheck's op x dtype, optcheck's
optimizer x family; each cell coloured by its worst status and linking to its section,
GRID_ROWS rows to a table, side by side); the failures (every fail, error and crash row,
FAILURES_LISTED at most, with its message and repro command, linking to the row); the skip
reasons, grouped; the error plots (reports.html_plots, each point linking to its row); then
one collapsible section (<details>) per op, open where something in it failed, its rows in
few columns (case, the grid's column label where the case string does not say it, status,
the error metrics, message); a click on a row shows every other column.

A cell's worst status ranks crash, fail, error, vacuous, pass, unsupported, skip: skipped
and unsupported cases colour a cell only where nothing in it ran.

No external assets: the CSS and script are inline (reports.html_assets), the plots are
hand-written SVG, the other columns sit in one JSON block the script reads. Every string
from a result is escaped (html.escape; in the JSON block "<", ">" and "&" as \\u escapes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from reports.html_assets import CSS, SCRIPT
from reports.html_plots import STATUS_COLOURS, error_plot_svg
from reports.html_plots import escape as _e
from reports.record import STATUS_WORDS, STATUSES, summarize
from reports.table import columns, format_value

__all__ = ["STATUS_COLOURS", "error_plot_svg", "grid_labels", "render_html"]

# (section label, grid column label) pairs, the first whose section label the results
# carry wins: gradcheck's ops x dtypes, optcheck's optimizers x check families.
GRID_LABELS = (("op", "dtype"), ("optimizer", "family"))
# A cell's colour: the first of these among its statuses.
WORST_FIRST = ("crash", "fail", "error", "vacuous", "pass", "unsupported", "skip")
PROBLEMS = ("fail", "error", "crash")
GRID_ROWS = 40   # the grid's rows per table; more tables sit side by side
# The failures listed in full at the top; beyond that many (a broken engine, an injected
# bug) the list would take the browser seconds to lay out, and the rest are a selector away.
FAILURES_LISTED = 1000
_SHORT = {"pass": "pass", "fail": "fail", "error": "error", "crash": "crash", "skip": "skip",
          "unsupported": "unsup", "vacuous": "vacuous"}


def grid_labels(results) -> tuple[str | None, str | None]:
    """(section label, column label) for `results`: the first of GRID_LABELS whose section
    label some result has (its column label None where no result has it), else (None,
    None): one section, one column."""
    label_keys, _ = columns(results)
    for group, across in GRID_LABELS:
        if group in label_keys:
            return group, across if across in label_keys else None
    return None, None


def worst(statuses) -> str:
    """The status a set of statuses is coloured by (WORST_FIRST)."""
    return next(s for s in WORST_FIRST if s in statuses)


def _label(r, key) -> str:
    return "" if key is None else format_value(r.labels.get(key))


def _counts_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {STATUS_WORDS[s]}" for s in STATUSES if (n := counts.get(s)))


def _badges(counts: Mapping[str, int]) -> str:
    return "".join(f'<span class="badge {s}">{counts[s]} {_SHORT[s]}</span>'
                   for s in STATUSES if counts.get(s))


class _Page:
    """The results cut into sections and grid cells once, rendered part by part."""

    def __init__(self, results, group: str | None, across: str | None):
        self.results = results
        self.group, self.across = group, across
        self.sections: dict[str, list[int]] = {}
        self.cells: dict[tuple[str, str], dict[str, int]] = {}
        column_values: dict[str, None] = {}
        for i, r in enumerate(results):
            g, c = _label(r, group) or "(all)", _label(r, across)
            self.sections.setdefault(g, []).append(i)
            column_values[c] = None
            cell = self.cells.setdefault((g, c), {})
            cell[r.status] = cell.get(r.status, 0) + 1
        self.section_no = {g: k for k, g in enumerate(self.sections)}
        self.grid_columns = list(column_values)
        self.show_across = across is not None and any(
            _label(r, across) not in r.name for r in results)
        label_keys, metric_keys = columns(results)
        self.key_metrics = [k for k in metric_keys if k.endswith("_err")][:2]
        shown = {across} if self.show_across else set()
        self.other = ([("label", k) for k in label_keys if k not in shown]
                      + [("metric", k) for k in metric_keys if k not in self.key_metrics])

    def section_of(self, i: int) -> int:
        return self.section_no[_label(self.results[i], self.group) or "(all)"]

    def grid(self) -> str:
        """The summary grid, cut into side-by-side tables of GRID_ROWS rows."""
        if not self.results:
            return ""
        head = "".join(f"<th>{_e(c or 'all')}</th>" for c in self.grid_columns)
        head = f"<thead><tr><th>{_e(self.group or 'cases')}</th>{head}</tr></thead>"
        rows = [self._grid_row(g, k) for g, k in self.section_no.items()]
        tables = "".join(f'<table class="grid">{head}<tbody>{"".join(rows[j:j + GRID_ROWS])}'
                         "</tbody></table>" for j in range(0, len(rows), GRID_ROWS))
        return ('<section id="grid"><h2>Summary</h2><p class="legend">Each cell: its cases '
                '(passed/all where some did not pass) and the others by status, coloured by '
                'the worst (crash, fail, error, vacuous, pass, unsupported, skip); a click '
                f'opens its section.</p><div class="grids">{tables}</div></section>\n')

    def _grid_row(self, g: str, k: int) -> str:
        cells = []
        for c in self.grid_columns:
            counts = self.cells.get((g, c))
            if not counts:
                cells.append('<td class="w-none">&ndash;</td>')
                continue
            total, passed = sum(counts.values()), counts.get("pass", 0)
            problems = any(s in counts for s in PROBLEMS)
            text = f"{passed}/{total}" if problems else str(total)
            notes = " ".join(f"{counts[s]} {_SHORT[s]}" for s in STATUSES
                             if s != "pass" and counts.get(s))
            small = f"<small>{_e(notes)}</small>" if notes else ""
            cells.append(f'<td class="w-{worst(counts)}" title="{_e(_counts_text(counts))}">'
                         f'<a href="#g{k}">{text}{small}</a></td>')
        return (f'<tr data-sect="{k}"><th><a href="#g{k}">{_e(g)}</a></th>{"".join(cells)}'
                "</tr>\n")

    def failures(self) -> str:
        bad = [i for i, r in enumerate(self.results) if r.status in PROBLEMS]
        if not bad:
            return ('<section id="failures"><h2>Failures</h2><p>No case failed, erred or '
                    'crashed.</p></section>\n') if self.results else ""
        across = f"<th>{_e(self.across)}</th>" if self.show_across else ""
        out = [f'<section id="failures"><h2>Failures ({len(bad)})</h2><table class="fails">'
               f"<thead><tr><th>case</th>{across}<th>status</th><th>message</th>"
               "<th>reproduce</th></tr></thead><tbody>\n"]
        for i in bad[:FAILURES_LISTED]:
            r = self.results[i]
            repro = r.metrics.get("repro")
            cell = f"<code>{_e(repro)}</code>" if repro else ""
            a = f"<td>{_e(_label(r, self.across))}</td>" if self.show_across else ""
            out.append(f'<tr class="frow s-{r.status}" data-i="{i}"><td><a href="#r{i}">'
                       f'{_e(r.name)}</a></td>{a}<td class="status status-{r.status}">'
                       f'{r.status.upper()}</td>'
                       f'<td class="msg">{_e(r.message)}</td><td>{cell}</td></tr>\n')
        out.append("</tbody></table>")
        if len(bad) > FAILURES_LISTED:
            out.append(f'<p class="legend">and {len(bad) - FAILURES_LISTED} more, in their '
                       'sections: the status selector\'s "failed, errors and crashes" shows '
                       "only them; a click on a row shows its repro command.</p>")
        out.append("</section>\n")
        return "".join(out)

    def skip_reasons(self) -> str:
        reasons: dict[tuple[str, str], int] = {}
        for r in self.results:
            if r.status in ("skip", "unsupported"):
                key = (r.status, r.message or "(no reason given)")
                reasons[key] = reasons.get(key, 0) + 1
        if not reasons:
            return ""
        items = "".join(f'<li><span class="badge {s}">{n} {_SHORT[s]}</span>{_e(m)}</li>'
                        for (s, m), n in sorted(reasons.items(), key=lambda kv: -kv[1]))
        return (f'<section id="skips"><h2>Skipped and unsupported, by reason</h2><ul>{items}'
                "</ul></section>\n")

    def sections_html(self) -> str:
        across = f"<th>{_e(self.across)}</th>" if self.show_across else ""
        metric_heads = "".join(f"<th>{_e(k)}</th>" for k in self.key_metrics)
        head = (f"<thead><tr><th>case</th>{across}<th>status</th>{metric_heads}"
                "<th>message</th></tr></thead>")
        out = ['<section id="cases"><h2>Cases</h2>\n']
        for g, rows in self.sections.items():
            k = self.section_no[g]
            counts: dict[str, int] = {}
            for i in rows:
                s = self.results[i].status
                counts[s] = counts.get(s, 0) + 1
            is_open = " open" if any(s in counts for s in PROBLEMS) else ""
            out.append(f'<details class="sect" id="g{k}" data-sect="{k}"{is_open}><summary>'
                       f'{_e(g)} <span class="n">({len(rows)})</span> {_badges(counts)}'
                       f'</summary><table class="rows">{head}<tbody>\n')
            out += [self._row(i) for i in rows]
            out.append("</tbody></table></details>\n")
        out.append("</section>\n")
        return "".join(out)

    def _row(self, i: int) -> str:
        # closing </td> and </tr> left out, as HTML allows: a sixth of the rows' bytes
        r = self.results[i]
        cells = [f"<td>{_e(r.name)}"]
        if self.show_across:
            cells.append(f"<td>{_e(_label(r, self.across))}")
        cells.append(f'<td class="status status-{r.status}">{r.status.upper()}')
        cells += [f"<td>{_e(format_value(r.metrics.get(m)))}" for m in self.key_metrics]
        cells.append(f"<td>{_e(r.message)}")
        return f'<tr id="r{i}" class="row s-{r.status}">{"".join(cells)}\n'

    def number_css(self) -> str:
        """Right-aligned monospace for the metric columns of the sections' tables."""
        first = 3 + self.show_across
        return "".join(f"table.rows td:nth-child({first + j}) {{ text-align: right; "
                       "font-family: monospace; }\n" for j in range(len(self.key_metrics)))

    def data_json(self) -> str:
        """The other columns of every row, as a JSON text safe inside <script>:
        {"cols": names, "codes": {column: its distinct values}, "rows": [[value, ...]]},
        a column with few distinct values (an op, a dtype) holding indices into its codes;
        "" and trailing empty values left out."""
        table = [[format_value((r.labels if kind == "label" else r.metrics).get(key))
                  for kind, key in self.other] for r in self.results]
        codes: dict[int, list[str]] = {}
        for k in range(len(self.other)):
            distinct = {row[k] for row in table} - {""}
            if distinct and len(distinct) * 8 <= len(table):
                codes[k] = sorted(distinct)
        index = {k: {v: j for j, v in enumerate(values)} for k, values in codes.items()}
        rows = []
        for row in table:
            out = [None if v == "" else index[k][v] if k in index else v
                   for k, v in enumerate(row)]
            while out and out[-1] is None:
                out.pop()
            rows.append(out)
        text = json.dumps({"cols": [key for _, key in self.other], "codes": codes,
                           "rows": rows}, ensure_ascii=False, separators=(",", ":"))
        return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _meta_html(meta: Mapping) -> str:
    rows = []
    for k, v in meta.items():
        text = " ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
        rows.append(f"<dt>{_e(k)}</dt><dd>{_e(text)}</dd>")
    return f'<dl class="meta">{"".join(rows)}</dl>\n' if rows else ""


def _controls(results) -> str:
    present = [s for s in STATUSES if any(r.status == s for r in results)]
    options = "".join(f'<option value="{s}">{_e(STATUS_WORDS[s])} only</option>'
                      for s in present)
    return ('<div class="controls"><input id="filter" type="search" '
            'placeholder="filter: words in the case, status, message, labels" '
            'aria-label="filter rows"> <select id="status" aria-label="status">'
            '<option value="">every status</option><option value="problems">failed, errors '
            f'and crashes</option>{options}</select> <button type="button" id="open-all">'
            'open all</button> <button type="button" id="close-all">close all</button>'
            '<span id="shown"></span></div>\n')


def render_html(results, title: str, meta: Mapping | None = None,
                figures: list[str] | None = None, *, group_by: str | None = None,
                across: str | None = None) -> str:
    """A self-contained HTML page of `results` under `title` (module docstring). `meta`
    (e.g. version, argv, time) is listed under the summary. `figures`: extra HTML fragments
    (a tool's own plots) placed before the error plots, as given. `group_by` and `across`:
    the labels of the sections (the grid's rows) and of the grid's columns; by default
    grid_labels(results)."""
    results = list(results)
    if group_by is None:
        group_by, default_across = grid_labels(results)
        across = across if across is not None else default_across
    page = _Page(results, group_by, across)
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
    plots = (f'<section id="plots"><h2>Errors</h2>{"".join(figures)}</section>\n'
             if figures else "")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{_e(title)}</title>\n<style>{CSS}{page.number_css()}</style>\n"
            "</head>\n<body>\n"
            f"<h1>{_e(title)}</h1>\n{summary}{_meta_html(meta or {})}{_controls(results)}"
            f"{page.grid()}{page.failures()}{page.skip_reasons()}{plots}"
            f"{page.sections_html()}"
            f'<script type="application/json" id="rows-data">{page.data_json()}</script>\n'
            f"<script>{SCRIPT}</script>\n</body>\n</html>\n")
