"""optcheck's plain report: a summary per family by default (folded when all pass), every
check in the compact columns with --show all, the tables per family with --verbose; the
progress bar only when stderr is a terminal. The checks are a stand-in (run_plan replaced),
so these tests are fast."""

from __future__ import annotations

import pytest

import optcheck.cli
from optcheck.cli import main
from reports.record import Result
from tests.cli_helpers import assert_progress_only_on_a_terminal


@pytest.fixture
def checks(monkeypatch):
    """run_plan replaced by a row per family and dtype; the progress flags it was given."""
    calls = []

    def run_plan(request, plan, progress):
        calls.append(progress)
        return [Result("optcheck", f"adam: {family}_check(lr=0.01)", "pass",
                       {"max_abs_err": 1e-15, "max_rel_err": 2e-14, "first_step": None,
                        "steps": request.steps},
                       labels={"optimizer": "adam", "family": family, "check": "c",
                               "backend": request.backend, "dtype": dtype})
                for family in request.families() for dtype in request.dtypes()]

    monkeypatch.setattr(optcheck.cli, "run_plan", run_plan)
    return calls


def test_default_is_the_summary_per_family_when_every_family_passed(checks, capsys):
    assert main(["--opt", "adam", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["family", "passed", "failed", "errors"]
    assert [x.split()[1:] for x in lines[2:8]] == [["4", "0", "0"]] * 6
    assert lines[8:] == ["", "24 passed"]


def test_show_all_is_compact_with_a_summary_per_family(checks, capsys):
    assert main(["--opt", "adam", "--no-progress", "--show", "all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["case", "family", "dtype", "status", "max_rel_err"]
    assert "family       passed  failed  errors" in lines
    # a row per family (6) and dtype (4: f16, bf16, f32, f64)
    assert any(line.split() == ["closed-form", "4", "0", "0"] for line in lines)
    assert lines[-1] == "24 passed"


def test_verbose_gives_a_table_per_family_with_every_column(checks, capsys):
    assert main(["--opt", "adam", "--no-progress", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("closed-form (4 passed)\n\ncase ")
    assert "first_step" in out.splitlines()[2] and "steps" in out


def test_progress_only_when_stderr_is_a_terminal(checks, monkeypatch, capsys):
    assert_progress_only_on_a_terminal(main, ["--opt", "adam"], checks, monkeypatch)


def test_the_output_extension_picks_the_format(checks, tmp_path):
    path = tmp_path / "r.json"
    assert main(["--opt", "adam", "--no-progress", "--output", str(path)]) == 0
    assert path.read_text().startswith("{")
    assert main(["--opt", "adam", "--no-progress", "--output", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").read_text().startswith("## closed-form")


@pytest.mark.parametrize(("argv", "line"), [
    (["--opt", "adam", "--format", "plain", "--output", "r.xml"],
     "optcheck: --format plain contradicts --output r.xml (junit); drop one"),
    (["--opt", "adam", "--engine", "torhc"],
     "optcheck: unknown engine 'torhc'; did you mean torch? (known: engine, torch, "
     "torch-foreach, torch-fused, ggml, optax, or module:attribute naming your own adapter)"),
])
def test_refusals_in_one_line(checks, capsys, argv, line):
    assert main(argv) == 2
    assert capsys.readouterr().err == line + "\n"


def test_an_unknown_optimizer_gets_the_closest_ones(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--opt", "adan"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith(
        "optcheck: error: argument --opt: invalid choice: 'adan'; did you mean adam? (choose "
        "from sgd, adam, adamw")
