"""The plain report a person reads (on a terminal, in a pipe or in a text file): what
matters first, every row only on request.

Views (SHOWS, the command lines' `--show`):

- "failures", most tools' default: the summary per group (the tool's COMPACT group, e.g.
  one row per op), folded, when it has more than FOLD_ABOVE groups, to the groups with
  anything but a pass and one line for the rest; then every failed, erred or crashed
  row in full (status, case, message, repro command), and under `strict` every vacuous
  one; then the skipped, unsupported (and, without `strict`, vacuous) rows grouped by
  reason, a few cases each; then the totals.
- "summary": the summary per group, every group, then the totals.
- "all" (the default of tools whose every row is worth reading, COMPACT's `show`): every
  row in the compact columns (reports.table.compact_table), then what "failures" shows,
  the summary unfolded.

Nothing is ever cut: on a narrow terminal a case wraps and the last columns are left out
(a line names them and says how to see them).
"""

from __future__ import annotations

from reports.record import STATUS_WORDS
from reports.table import (
    NO_TERMINAL,
    Fitted,
    Terminal,
    compact_spec,
    compact_table,
    fit_table,
    format_value,
    paint,
    summary_line,
)

SHOWS = ("failures", "summary", "all")
EXAMPLES = 3        # cases shown per skip reason
REASONS = 8         # reasons shown per status; the rest counted in one line
FOLD_ABOVE = 12     # the default view folds a summary of more groups than this (--all's
#                     ~100 ops); a few ops (`--op pool_2d`) keep their rows
# the counted columns of a summary per group: its word, the statuses it counts
_COUNTED = {"passed": "pass", "failed": "fail", "errors": "error", "crashed": "crash",
            "skipped": "skip", "unsupported": "unsupported", "vacuous": "vacuous"}
# the statuses listed by reason, and the rows listed in full, with and without strict
_BY_REASON = ("skip", "unsupported", "vacuous")


def default_show(results, tool: str = "") -> str:
    """The view a plain report of `results` shows unless told: the tool's COMPACT `show`,
    else "failures"."""
    spec = compact_spec(results, tool)
    return spec.show if spec else "failures"


def _plural(word: str) -> str:
    return word[:-1] + "ies" if word.endswith("y") else word + "s"


def group_summary(results, key: str | None, terminal: Terminal = NO_TERMINAL,
                  fold: bool = False) -> str:
    """A row per value of label `key` (first-seen order): passed, failed and errors counts,
    crashed, skipped, unsupported and vacuous where any, and the kinks (summed) where rows
    have them. `fold`: only the groups with a row that did not pass, and one line counting
    the others. Empty when `key` is None or no result has that label."""
    if key is None or not any(key in r.labels for r in results):
        return ""
    groups: dict[str, list] = {}
    for r in results:
        groups.setdefault(format_value(r.labels.get(key)), []).append(r)
    words = [w for w, status in _COUNTED.items()
             if w in ("passed", "failed", "errors") or any(r.status == status
                                                           for r in results)]
    kinks = any("kinks" in r.metrics for r in results)
    shown = {v: rs for v, rs in groups.items()
             if not fold or any(r.status != "pass" for r in rs)}
    passed = len(groups) - len(shown)
    rest = (f"{passed} {'other ' if shown else ''}"
            f"{_plural(key) if passed != 1 else key}: all passed (--show all lists every row)"
            if passed and fold else "")
    if not shown:
        return rest
    rows = []
    for value, rs in shown.items():
        row = [value, *(str(sum(r.status == _COUNTED[w] for r in rs)) for w in words)]
        if kinks:
            row.append(str(sum(int(r.metrics.get("kinks") or 0) for r in rs)))
        rows.append(row)
    headers = [key, *words] + (["kinks"] if kinks else [])
    table = _with_dropped(fit_table(headers, rows, terminal, right=True))
    return table + (f"\n{rest}" if rest else "")


def _groups(results, key: str | None) -> int:
    """How many values label `key` takes over `results`."""
    return len({format_value(r.labels.get(key)) for r in results}) if key else 0


def _with_dropped(fitted: Fitted) -> str:
    if not fitted.dropped:
        return fitted.text
    return (f"{fitted.text}\n(left out to fit: {', '.join(fitted.dropped)}; a wider "
            f"terminal, a pipe or --output FILE shows them)")


def failure_list(results, terminal: Terminal = NO_TERMINAL, strict: bool = False) -> str:
    """Every failed, erred or crashed result: its status and case, then its message and its
    repro command (metrics["repro"]) in full, indented; then, under `strict`, every vacuous
    one (a check that could not have failed) the same way. Empty when there are none."""
    failed = [r for r in results if not r.ok]
    vacuous = [r for r in results if r.status == "vacuous"] if strict else []
    parts = [_listed(f"failures ({len(failed)}):", failed, terminal) if failed else "",
             _listed(f"vacuous ({len(vacuous)}): these checks could not have failed",
                     vacuous, terminal) if vacuous else ""]
    return "\n\n".join(p for p in parts if p)


def _listed(title: str, rows, terminal: Terminal) -> str:
    lines = [title]
    for r in rows:
        lines += ["", f"{paint(r.status, r.status.upper(), terminal)} {r.name}"]
        lines += [f"  {line}" for line in r.message.splitlines() if line.strip()]
        repro = r.metrics.get("repro")
        if repro and repro not in r.message:
            lines.append(f"  reproduce: {repro}")
    return "\n".join(lines)


def reason_list(results, strict: bool = False) -> str:
    """The skipped and unsupported results (and, without `strict`, the vacuous ones), per
    status: each reason (the message's first line) with its count and its first EXAMPLES
    cases, the most frequent reason first, at most REASONS of them. Empty when there are
    none."""
    parts = []
    for status in _BY_REASON:
        if status == "vacuous" and strict:
            continue
        rows = [r for r in results if r.status == status]
        if not rows:
            continue
        reasons: dict[str, list] = {}
        for r in rows:
            reason = next((ln.strip() for ln in r.message.splitlines() if ln.strip()),
                          "(no reason given)")
            reasons.setdefault(reason, []).append(r)
        ranked = sorted(reasons.items(), key=lambda item: -len(item[1]))
        width = len(str(len(ranked[0][1])))
        lines = [f"{STATUS_WORDS[status]} ({len(rows)}), by reason:"]
        for reason, rs in ranked[:REASONS]:
            lines.append(f"  {len(rs):>{width}}  {reason}")
            pad = " " * (width + 4)
            lines += [f"{pad}{r.name}" for r in rs[:EXAMPLES]]
            if len(rs) > EXAMPLES:
                lines.append(f"{pad}… and {len(rs) - EXAMPLES} more")
        if len(ranked) > REASONS:
            lines.append(f"  … and {len(ranked) - REASONS} more reasons "
                         f"({sum(len(rs) for _, rs in ranked[REASONS:])} rows; --show all "
                         f"lists every row)")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def render_compact(results, tool: str = "", group_by: str | None = None,
                   terminal: Terminal = NO_TERMINAL, show: str | None = None,
                   strict: bool = False) -> str:
    """The plain report a person reads, in view `show` (SHOWS; None: default_show): see the
    module doc. `group_by`: the label of the summary per group (default: the tool's COMPACT
    group). `strict`: vacuous rows are listed in full, as failures are."""
    results = list(results)
    if not results:
        return summary_line(results)
    show = show or default_show(results, tool)
    if show not in SHOWS:
        raise ValueError(f"show must be one of {SHOWS}, got {show!r}")
    spec = compact_spec(results, tool)
    key = group_by or (spec.group if spec else None)
    if show == "summary":
        parts = [group_summary(results, key, terminal)]
    else:
        table = _with_dropped(compact_table(results, tool, terminal)) if show == "all" else ""
        fold = show == "failures" and _groups(results, key) > FOLD_ABOVE
        parts = [table, group_summary(results, key, terminal, fold=fold),
                 failure_list(results, terminal, strict), reason_list(results, strict)]
    return "\n\n".join(p for p in [*parts, summary_line(results)] if p)
