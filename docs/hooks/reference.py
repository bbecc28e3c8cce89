"""The documentation's reference pages, generated from the code at every build.

An MkDocs hook (mkdocs.yml, `hooks:`): when MkDocs collects the pages, `on_files` adds
three pages that exist in no file of the repository:

- `reference/ops.md`: the ops table, from the rows `gradcheck --list` prints
  (gradcheck.runner.list_rows), the cases of each tier (gradcheck.cotangents.tier_cases,
  what `gradcheck --all` and `--tier scale` run) and, per engine under test, how many of
  an op's fast cases its adapter runs (its `unsupported(case)` is None) rather than
  reporting them unsupported;
- `reference/cli.md`: every console script's options, from its argparse parser
  (the build_parser functions the scripts parse with);
- `reference/api.md`: mkdocstrings directives for the Python API, whose docstrings
  mkdocstrings renders.

The functions that make them are plain functions of this module, so that the test suite
(tests/docs/test_reference.py) checks what they produce against the tools themselves. This
file is a script (as bench/'s are), not a package module: it imports from every layer.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from unittest import mock

# the engines of the table's columns, in this order: gradcheck.adapters.ENGINES' names
# but NOT_IN_TABLE's
ENGINES = ("engine", "torch", "ggml", "jax", "tinygrad")
NOT_IN_TABLE = {"numpy": "its adapter runs a user's forward/VJP pair, not the registry's ops"}
ENGINE_TITLES = {"engine": "ours"}

# the API reference: (section title, objects mkdocstrings documents, by dotted path)
API = (
    ("gradcheck: checking your own function", ("gradcheck.api",)),
    ("gradcheck: engine adapters", ("gradcheck.adapters.base.Adapter",
                                    "gradcheck.adapters.base.VJP",
                                    "gradcheck.adapters.base.JVP",
                                    "gradcheck.adapters.get_adapter")),
    ("optcheck: checking your own optimizer", ("optcheck.api",)),
    ("optcheck: optimizer adapters", ("optcheck.adapters.base.OptimizerAdapter",
                                      "optcheck.adapters.base.Stepper",
                                      "optcheck.adapters.base.Group")),
    ("reports: the result record", ("reports.record.Result",
                                    "reports.record.summarize",
                                    "reports.record.exit_status")),
)

PAGES = ("reference/ops.md", "reference/cli.md", "reference/api.md")


# --- the ops table ---------------------------------------------------------------------------

def engine_support(engine: str, op_cases: dict[str, list]) -> dict[str, int] | str:
    """How many of each op's cases (`op_cases`: op name -> cases) the adapter of `engine`
    runs: those its `unsupported(case)` declines are not counted. A str instead when the
    adapter cannot be made here (its package is not installed, its library not found): the
    reason, for the table to say why it does not know."""
    from gradcheck.adapters import AdapterError, get_adapter
    try:
        adapter = get_adapter(engine)
    except AdapterError as exc:
        return str(exc)
    try:
        return {op: sum(adapter.unsupported(case) is None for case in cases)
                for op, cases in op_cases.items()}
    finally:
        close = getattr(adapter, "close", None)
        if callable(close):
            close()


@functools.cache
def ops_table() -> tuple[list[dict], dict[str, str]]:
    """The ops table's rows and the engines whose support is not known here (engine ->
    why). Each row: `gradcheck --list`'s row (gradcheck.runner.list_rows: op, kind,
    backward, cases, dtypes, ...), plus `fast` and `scale`, the number of cases of each
    tier that `gradcheck --all` (`--tier scale`) runs for the op (None for an op that
    `--all` leaves out), and `engines`: engine -> number of the fast cases its adapter
    runs (absent where unknown)."""
    from engine.registry import all_ops
    from gradcheck.cotangents import tier_cases
    from gradcheck.runner import checkable_ops, list_rows
    ops = all_ops()
    checked = set(checkable_ops())
    fast = {name: tier_cases(ops[name], "fast") for name in ops if name in checked}
    unknown: dict[str, str] = {}
    support: dict[str, dict[str, int]] = {}
    for engine in ENGINES:
        found = engine_support(engine, fast)
        if isinstance(found, str):
            unknown[engine] = found
        else:
            support[engine] = found
    rows = []
    for row in list_rows():
        name = row["op"]
        row = dict(row)
        row["fast"] = len(fast[name]) if name in checked else None
        row["scale"] = len(tier_cases(ops[name], "scale")) if name in checked else None
        row["engines"] = {engine: counts[name] for engine, counts in support.items()
                          if name in counts}
        rows.append(row)
    return rows, unknown


def cell(text) -> str:
    """`text` as one Markdown table cell: no line breaks, no character that Markdown
    would read as markup (pipes, emphasis, links, HTML)."""
    text = " ".join(str(text).split())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for char in "\\`*_[]|#":
        text = text.replace(char, "\\" + char)
    return text


def _count(n) -> str:
    return "" if n is None else f"{n:,}"


def ops_page() -> str:
    """The Markdown of reference/ops.md."""
    rows, unknown = ops_table()
    fast_total = sum(r["fast"] or 0 for r in rows)
    scale_total = sum(r["scale"] or 0 for r in rows)
    checked = sum(r["fast"] is not None for r in rows)
    titles = [cell(ENGINE_TITLES.get(e, e)) for e in ENGINES]
    lines = [
        "---", "hide:", "  - toc", "---", "",     # Material: the tables take the width
        "# Ops",
        "",
        "Generated from the registry when this site was built (nothing here is typed by "
        "hand). The same rows print with `gradcheck --list`.",
        "",
        f"- **{len(rows)} ops**; `gradcheck --all` checks {checked} of them: "
        f"**{fast_total:,} fast cases** (the default tier, every case in every dtype "
        f"it has, with its cotangent-layout variants) and **{scale_total:,} scale "
        f"cases** with `--tier scale`.",
        "- **cases**: the registry's sample cases, as `gradcheck --list` counts them; "
        "**fast** adds the cotangent variants (the upstream gradient permuted, "
        "expanded, sliced) that `gradcheck --all` runs too; **scale**: `--tier scale`. "
        "An empty fast column: `--all` leaves the op out (an optimizer step, checked by "
        "optcheck, or a dedicated backward op with nothing to check it against).",
        "- **backward**: `yes`, a backward rule; `no (why)`; a composite op is "
        "differentiated through its parts; a dedicated backward op is checked against "
        "its forward op's VJP. **order 2**: whether our engine differentiates the "
        "backward graph (`--ad fwd`, `--order 2`).",
        f"- **{', '.join(titles)}**: how many of the op's fast cases the engine's adapter "
        "runs (`gradcheck --engine NAME --op OP`); the others it reports `unsupported`, "
        "with the reason (no such op, no float64, no strided views, ...). The numpy "
        "engine checks a forward/VJP pair of yours rather than the registry's ops, and "
        "`--engine module:attribute` your own adapter: neither has a column.",
    ]
    for engine, why in unknown.items():
        lines.append(f"- **{cell(ENGINE_TITLES.get(engine, engine))}**: not known when this site "
                     f"was built: {cell(why)}")
    lines += ["", "## Cases and engines", "",
              "| op | cases | fast | scale | " + " | ".join(titles) + " |",
              "|---|--:|--:|--:|" + "--:|" * len(titles)]
    for r in rows:
        engines = [(_count(r["engines"][e]) if e in r["engines"] else
                    ("" if r["fast"] is None else "?")) for e in ENGINES]
        lines.append("| " + " | ".join([
            f"`{r['op']}`", _count(r["cases"]), _count(r["fast"]), _count(r["scale"]),
            *engines]) + " |")
    lines += ["", "## Kinds, dtypes and gradients", "",
              "| op | kind | dtypes | backward | order 2 | description |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| " + " | ".join([
            f"`{r['op']}`", cell(r["kind"]), cell(r["dtypes"].replace(",", ", ")),
            cell(r["backward"]), cell(r["order 2"]), cell(r["description"])]) + " |")
    return "\n".join(lines) + "\n"


# --- the command lines -----------------------------------------------------------------------

def _mnist(name: str) -> Callable[[], argparse.ArgumentParser]:
    def parser():
        from mnist_target.cli import build_command_parser
        return build_command_parser(name)
    return parser


def _gradcheck() -> argparse.ArgumentParser:
    from gradcheck.cli import build_parser
    return build_parser()


def _optcheck() -> argparse.ArgumentParser:
    from optcheck.cli import build_parser
    return build_parser()


def _gradcheck_report() -> argparse.ArgumentParser:
    from gradcheck.report_cli import build_parser
    return build_parser()


# console script (pyproject's [project.scripts]) -> the parser it parses its arguments with
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "gradcheck": _gradcheck,
    "optcheck": _optcheck,
    "gradcheck-report": _gradcheck_report,
    "mnist-train": _mnist("train"),
    "mnist-eval": _mnist("eval"),
    "mnist-regress": _mnist("regress"),
}


def _help(action: argparse.Action, prog: str) -> str:
    """An option's help text with argparse's %(...)s fields filled in, as --help shows it."""
    if not action.help:
        return ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    return action.help % params


def _argument(action: argparse.Action) -> str:
    """What an option takes: its metavar, or its choices, or nothing for a flag."""
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper()


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return ""
    return f" (default: `{action.default}`)"


def options_list(parser: argparse.ArgumentParser) -> list[str]:
    """Markdown lines: every option and positional argument of `parser`, grouped as its
    --help groups them, as a definition list: the option with what it takes, then its
    help text and default."""
    lines = []
    for group in parser._action_groups:       # argparse keeps the --help groups only here
        actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
        if not actions:
            continue
        lines += ["", f"**{cell(group.title)}**"]
        for action in actions:
            argument = _argument(action)
            names = ", ".join(f"`{s}{' ' + argument if argument else ''}`"
                              for s in action.option_strings) or f"`{action.dest}`"
            lines += ["", names, f":   {cell(_help(action, parser.prog))}{_default(action)}"]
    return lines


def cli_page() -> str:
    """The Markdown of reference/cli.md: per console script, its usage line, description,
    options table and epilog, from its parser."""
    lines = ["# Command lines", "",
             "Generated from each tool's argument parser when this site was built: the "
             "same text as `TOOL --help`."]
    for script, make in PARSERS.items():
        parser = make()
        with mock.patch.dict(os.environ, {"COLUMNS": "80"}):
            usage = parser.format_usage().strip()
        lines += ["", f"## {script}", "", "```text", usage, "```", ""]
        if parser.description:
            lines.append(cell(parser.description))
        lines += options_list(parser)
        if parser.epilog:
            lines += ["", cell(parser.epilog)]
    return "\n".join(lines) + "\n"


# --- the Python API --------------------------------------------------------------------------

def api_page() -> str:
    """The Markdown of reference/api.md: mkdocstrings directives, one per documented
    object (API), which mkdocstrings fills from the docstrings."""
    lines = ["# Python API", "",
             "Rendered from the docstrings by mkdocstrings when this site was built."]
    for title, objects in API:
        lines += ["", f"## {title}", ""]
        for path in objects:
            lines += [f"::: {path}", ""]
    return "\n".join(lines) + "\n"


GENERATORS = {"reference/ops.md": ops_page, "reference/cli.md": cli_page,
              "reference/api.md": api_page}


# --- the MkDocs hook ---------------------------------------------------------------------------

def on_files(files, config):
    """MkDocs' files event: adds the generated pages (GENERATORS) to the site's files."""
    from mkdocs.structure.files import File
    for path, make in GENERATORS.items():
        files.append(File.generated(config, path, content=make()))
    return files
