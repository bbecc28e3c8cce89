"""Several engines' result files (JSON, schema gradverify.results/1) merged into one
scoreboard: op x engine, with the counts per status in each cell and the failing rows.

    sources = [read_results(p) for p in ("ours.json", "torch.json")]
    rows = merge(sources)                    # every row labelled with its engine
    text = render_board(rows, sources, "plain")   # or "github", "html"

The engine of a file: the "engine" label its rows share (gradcheck writes one for every
engine but ours), else the first word of its meta "engine" ("engine 0.1.0 (cpu backend)"
is "engine"), else "unknown". Two files of the same engine are told apart by their file
names: "engine (ours.json)", "engine (injected.json)" (their whole paths where those are
the same too).

A file is read only when it is a regular file of at most MAX_BYTES (a FIFO, a device or a
bigger file is refused before a byte is parsed), so a crafted one cannot make the merge hang
or eat memory; anything but a results document is a ScoreboardError naming the file.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import stat
from collections.abc import Mapping

from tabulate import tabulate

from reports.html_report import PROBLEMS, render_html
from reports.json_report import SchemaError, load_json
from reports.record import STATUSES, Result

# A full `gradcheck --all` document is about 4 MB; the cap leaves it room to grow eightfold.
MAX_BYTES = 32 * 2**20
# The failing rows the text scoreboard lists before it says how many more there are.
TEXT_FAILURES = 40
_SHORT = {"pass": "pass", "fail": "fail", "error": "error", "crash": "crash", "skip": "skip",
          "unsupported": "unsup", "vacuous": "vacuous"}
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class ScoreboardError(ValueError):
    """A result file that cannot be merged; the message names it and says why."""


@dataclasses.dataclass
class Source:
    """One result file: its path as given, its document, its engine (as found, then as
    shown on the board) and its rows."""

    path: str
    doc: dict
    engine: str
    rows: list[Result]
    name: str = ""


def _read_capped(path: str, limit: int) -> bytes:
    # O_NONBLOCK: opening a FIFO with no writer would otherwise wait for one forever
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ScoreboardError(f"{path}: not a regular file")
        if st.st_size > limit:
            raise ScoreboardError(f"{path}: {st.st_size} bytes, more than the "
                                  f"{limit} a results file may have")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:   # it grew while being read
            raise ScoreboardError(f"{path}: more than the {limit} bytes a results file "
                                  "may have")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_results(path, limit: int = MAX_BYTES) -> Source:
    """The result file at `path`, checked (reports.json_report.load_json) and turned back
    into Result rows; ScoreboardError naming the file when it is missing, unreadable, not
    a regular file, over `limit` bytes, not UTF-8 JSON or not a results document."""
    path = os.fspath(path)
    try:
        data = _read_capped(path, limit)
    except OSError as exc:
        reason = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
        raise ScoreboardError(f"{path}: {reason}") from exc
    try:
        text = data.decode("utf-8")
        doc = load_json(text)
    except UnicodeDecodeError as exc:
        raise ScoreboardError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except RecursionError as exc:
        raise ScoreboardError(f"{path}: not a results document: nested too deeply") from exc
    except SchemaError as exc:
        raise ScoreboardError(f"{path}: {' '.join(str(exc).split())}") from exc
    rows = rows_of(doc)
    return Source(path, doc, engine_of(doc, rows), rows)


def _value(v):
    return _NON_FINITE.get(v, v) if isinstance(v, str) else v


def rows_of(doc: Mapping) -> list[Result]:
    """The Result rows of a loaded results document: its "columns" say which flattened
    keys are labels and which are metrics; "NaN" and "Infinity" metrics are floats again."""
    cols = doc.get("columns", {})
    label_keys = [k for k in cols.get("labels", []) if isinstance(k, str)]
    metric_keys = [k for k in cols.get("metrics", []) if isinstance(k, str)]
    tool = str(doc.get("tool", ""))
    rows = []
    for obj in doc["results"]:
        labels = {k: obj[k] for k in label_keys if k in obj}
        metrics = {k: _value(obj[k]) for k in metric_keys if k in obj}
        rows.append(Result(tool, obj["case"], obj["status"], metrics, obj["message"], labels))
    return rows


def engine_of(doc: Mapping, rows: list[Result]) -> str:
    """The engine a file's rows ran on (module docstring)."""
    named = {str(r.labels["engine"]) for r in rows if "engine" in r.labels}
    if len(named) == 1 and all("engine" in r.labels for r in rows):
        return named.pop()
    words = str(doc.get("meta", {}).get("engine", "")).split()
    return words[0] if words else "unknown"


def merge(sources: list[Source]) -> list[Result]:
    """Every source's rows, in order, each labelled "engine" with its source's name on the
    board (set on the sources too: module docstring)."""
    seen: dict[str, int] = {}
    for s in sources:
        seen[s.engine] = seen.get(s.engine, 0) + 1
    bases: dict[str, int] = {}
    for s in sources:
        base = os.path.basename(s.path)
        bases[base] = bases.get(base, 0) + 1
    merged = []
    for s in sources:
        base = os.path.basename(s.path)
        s.name = s.engine if seen[s.engine] == 1 else \
            f"{s.engine} ({base if bases[base] == 1 else s.path})"
        for r in s.rows:
            labels = {k: v for k, v in r.labels.items() if k != "engine"}
            first = dict(list(labels.items())[:1])
            merged.append(Result(r.tool, r.name, r.status, r.metrics, r.message,
                                 {**first, "engine": s.name, **labels}))
    return merged


def _group_key(rows: list[Result]) -> str | None:
    for key in ("op", "optimizer"):
        if any(key in r.labels for r in rows):
            return key
    return None


def counts_by(rows: list[Result]) -> tuple[str | None, list[str], list[str], dict]:
    """(group label, groups in first-seen order, engines in first-seen order,
    {(group, engine): {status: count}})."""
    key = _group_key(rows)
    groups: dict[str, None] = {}
    engines: dict[str, None] = {}
    cells: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        g = str(r.labels.get(key, "(all)")) if key else "(all)"
        e = str(r.labels["engine"])
        groups[g] = None
        engines[e] = None
        cell = cells.setdefault((g, e), {})
        cell[r.status] = cell.get(r.status, 0) + 1
    return key, list(groups), list(engines), cells


def _cell(counts: Mapping[str, int] | None) -> str:
    if not counts:
        return "-"
    return ", ".join(f"{counts[s]} {_SHORT[s]}" for s in STATUSES if counts.get(s))


def _one_line(text: str, width: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def render_text(rows: list[Result], sources: list[Source], fmt: str = "plain") -> str:
    """The scoreboard as text: a table of groups (ops) x engines, each cell the counts per
    status, and a line of totals (tabulate; fmt "plain" or "github"); the files and their
    engines; then the failing rows, TEXT_FAILURES of them, each with its repro command."""
    key, groups, engines, cells = counts_by(rows)
    table = [[g, *(_cell(cells.get((g, e))) for e in engines)] for g in groups]
    totals = {}
    for (_, e), counts in cells.items():
        t = totals.setdefault(e, {})
        for s, n in counts.items():
            t[s] = t.get(s, 0) + n
    table.append(["total", *(_cell(totals.get(e)) for e in engines)])
    style = "github" if fmt == "github" else "simple"
    out = [tabulate(table, headers=[key or "cases", *engines], tablefmt=style,
                    disable_numparse=True), ""]
    bullet = "- " if fmt == "github" else ""
    for s in sources:
        meta = s.doc.get("meta", {})
        extra = f", injected {meta['injected']}" if meta.get("injected") else ""
        out.append(f"{bullet}{s.name}: {s.path} ({len(s.rows)} rows; "
                   f"{_one_line(meta.get('engine', s.engine), 100)}{extra})")
    failing = [r for r in rows if r.status in PROBLEMS]
    if failing:
        out += ["", f"failing rows ({len(failing)}):"]
        for r in failing[:TEXT_FAILURES]:
            out.append(f"{bullet}[{r.labels['engine']}] {r.status.upper()} {r.name}: "
                       f"{_one_line(r.message)}")
            if r.metrics.get("repro"):
                out.append(f"    reproduce: {r.metrics['repro']}")
        if len(failing) > TEXT_FAILURES:
            out.append(f"... and {len(failing) - TEXT_FAILURES} more (an HTML board, "
                       "--output board.html, lists every one)")
    return "\n".join(out) + "\n"


def render_board(rows: list[Result], sources: list[Source], fmt: str,
                 meta: Mapping | None = None) -> str:
    """The scoreboard in `fmt`: "plain" or "github" (render_text), or "html" (one page:
    reports.html_report with the engines as the grid's columns, the files in its meta)."""
    if fmt == "html":
        files = {f"file {s.name}": f"{s.path}: {s.doc.get('meta', {}).get('engine', '?')}"
                 for s in sources}
        key = _group_key(rows)
        return render_html(rows, "gradcheck scoreboard", {**(meta or {}), **files},
                           group_by=key, across="engine")
    if fmt in ("plain", "github"):
        return render_text(rows, sources, fmt)
    raise ValueError(f"scoreboard format must be plain, github or html, got {fmt!r}")


__all__ = ["MAX_BYTES", "ScoreboardError", "Source", "counts_by", "engine_of", "merge",
           "read_results", "render_board", "render_text", "rows_of"]
