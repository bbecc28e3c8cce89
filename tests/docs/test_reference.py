"""The generated reference (docs/hooks/reference.py) agrees with the tools it describes,
and the site builds with `mkdocs build --strict`."""

from __future__ import annotations

import importlib.util
import pathlib
import pkgutil
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.console_scripts import declared_scripts
from tests.docs.reference_hook import load

ROOT = pathlib.Path(__file__).resolve().parents[2]
reference = load()


def listed_table(text: str) -> list[dict[str, str]]:
    """The rows of a table as tabulate prints it (a header line, a line of dashes whose
    runs give the columns, then the rows), as dicts keyed by the headers."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line) <= {"-", " "} and "-" in line)
    spans, start = [], None
    for i, char in enumerate(lines[rule] + " "):
        if char == "-" and start is None:
            start = i
        elif char != "-" and start is not None:
            spans.append((start, i))
            start = None
    spans[-1] = (spans[-1][0], None)          # the last column runs to the line's end

    def cells(line):
        return [line[a:b].strip() for a, b in spans]
    headers = cells(lines[rule - 1])
    return [dict(zip(headers, cells(line), strict=True)) for line in lines[rule + 1:]
            if line.strip()]


@pytest.fixture(scope="module")
def gradcheck_list() -> list[dict[str, str]]:
    """The rows `gradcheck --list` prints, read from the console script's output."""
    done = subprocess.run([str(pathlib.Path(sys.executable).with_name("gradcheck")),
                           "--list"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return listed_table(done.stdout)


def test_the_ops_table_agrees_with_gradcheck_list(gradcheck_list):
    rows, _ = reference.ops_table()
    assert [r["op"] for r in rows] == [r["op"] for r in gradcheck_list]
    for ours, listed in zip(rows, gradcheck_list, strict=True):
        assert str(ours["cases"]) == listed["cases"], ours["op"]
        assert str(ours["fast"] or "") == listed["in --all"], ours["op"]
        assert str(ours["scale"] or "") == listed["scale"], ours["op"]
        assert ours["kind"] == listed["kind"], ours["op"]
        assert ours["dtypes"] == listed["dtypes"], ours["op"]


def test_the_ops_page_has_a_row_per_op_with_its_counts(gradcheck_list):
    page = reference.ops_page()
    rows, _ = reference.ops_table()
    for row in rows:
        cases, gradients = [x for x in page.splitlines()
                            if x.startswith(f"| `{row['op']}` |")]
        assert f" {row['cases']:,} | {_count(row['fast'])} | {_count(row['scale'])} |" \
            in cases
        assert reference.cell(row["description"]) in gradients
    total = sum(r["fast"] or 0 for r in rows)
    assert f"**{total:,} fast cases**" in page


def _count(n) -> str:
    return "" if n is None else f"{n:,}"


def test_the_fast_counts_are_the_cases_gradcheck_all_runs():
    """`fast` is what `gradcheck --all` selects for the op (gradcheck.runner's selection),
    `scale` what `--tier scale` does; an op that --all leaves out has none."""
    from gradcheck.request import GradcheckRequest
    from gradcheck.runner import select_samples
    rows, _ = reference.ops_table()
    by_op = {r["op"]: r for r in rows}
    names = GradcheckRequest().op_names()        # no --op: every op, as --all
    assert {n for n, r in by_op.items() if r["fast"] is not None} == set(names)
    for name in names:
        assert by_op[name]["fast"] == len(select_samples([name])), name
        assert by_op[name]["scale"] == len(select_samples([name], tier="scale")), name


def test_our_engine_runs_every_fast_case():
    rows, unknown = reference.ops_table()
    assert "engine" not in unknown
    for row in rows:
        if row["fast"] is not None:
            assert row["engines"]["engine"] == row["fast"], row["op"]


def test_every_built_in_engine_has_a_column_or_a_reason():
    from gradcheck.adapters import ENGINES
    assert set(reference.ENGINES) | set(reference.NOT_IN_TABLE) == set(ENGINES)
    assert not set(reference.ENGINES) & set(reference.NOT_IN_TABLE)


def test_an_engine_that_cannot_be_made_is_said_unknown(monkeypatch):
    hook = load()
    monkeypatch.setattr(hook, "ENGINES", (*hook.ENGINES, "no_such_engine"))
    page = hook.ops_page()
    assert "**no\\_such\\_engine**: not known when this site was built" in page
    relu = next(x for x in page.splitlines() if x.startswith("| `relu` |"))
    assert relu.rstrip(" |").split(" | ")[-1] == "?"


def test_the_cli_page_has_every_console_script_and_option():
    page = reference.cli_page()
    assert set(reference.PARSERS) == set(declared_scripts())
    for script, make in reference.PARSERS.items():
        assert f"\n## {script}\n" in page
        for action in make()._actions:
            for option in action.option_strings:
                assert f"`{option}`" in page or f"`{option} " in page, (script, option)


def test_the_api_page_names_objects_that_exist():
    for _, objects in reference.API:
        for path in objects:
            assert pkgutil.resolve_name(path) is not None, path
    assert "::: gradcheck.api" in reference.api_page()


@given(st.text(max_size=60))
def test_a_cell_is_one_markdown_table_cell(text):
    """Whatever a description or a reason holds, it renders as one cell, and its text
    survives."""
    markdown = pytest.importorskip("markdown")
    html = markdown.markdown(f"| a |\n|---|\n| {reference.cell(text)} |",
                             extensions=["tables"])
    assert html.count("<td") == 1
    assert "<em>" not in html and "<code>" not in html and "<a " not in html


def test_mkdocs_build_strict(tmp_path):
    """The site builds with no warning (every internal link resolves, every mkdocstrings
    object is found), and the generated pages are in it."""
    if importlib.util.find_spec("mkdocs") is None or \
            importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs and mkdocstrings are not installed (the docs extra; "
                    "tox -e docs builds the site)")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(site)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=_env())
    assert done.returncode == 0, done.stderr[-4000:]
    ops = (site / "reference" / "ops" / "index.html").read_text(encoding="utf-8")
    assert "pool_2d" in ops and "softmax" in ops
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "--op" in cli
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "check_torch" in api and "assert_numpy" in api
    assert not (site / "hooks").exists()


def _env():
    import os
    return {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
