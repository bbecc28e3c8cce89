"""gradcheck's command line around its report: a terminal gets a few lines when everything
passes and every failing row with its repro; --output's extension picks the format (a
contradicting --format is refused); an unknown op, engine, mutation or choice is refused with
the closest known names. The sweep is a stand-in (run_plan replaced), so these are fast."""

from __future__ import annotations

import json
import re
import sys

import pytest

import gradcheck.cli
from checkkit.usage import close_matches, did_you_mean, unknown_name
from gradcheck.cli import main
from reports.record import Result
from tests.cli_helpers import Tty


def passing(op: str, n: int) -> list[Result]:
    return [Result("gradcheck", f"{op}(type=f64,x=[{i}])", "pass",
                   {"max_rel_err": 1e-12, "kinks": 0, "forward": "agree", "torch": "agree"},
                   labels={"op": op, "backend": "cpu", "dtype": "f64"}) for i in range(n)]


@pytest.fixture
def sweep(monkeypatch):
    """run_plan replaced: 120 ops of 46 passing cases each, then `extra` rows."""
    extra: list[Result] = []

    def run_plan(request, plan, progress=False):
        return [r for i in range(120) for r in passing(f"op{i}", 46)] + extra

    monkeypatch.setattr(gradcheck.cli, "run_plan", run_plan)
    return extra


@pytest.fixture
def terminal(monkeypatch):
    """A function that makes stdout a 100-column terminal (called inside the test: pytest
    puts its own capture back between fixtures and the test)."""
    def as_tty() -> Tty:
        monkeypatch.setenv("COLUMNS", "100")
        out = Tty()
        monkeypatch.setattr(sys, "stdout", out)
        return out
    return as_tty


def test_a_passing_sweep_is_a_few_lines_on_a_terminal(sweep, terminal):
    tty = terminal()
    assert main(["--op", "relu", "--no-progress"]) == 0
    lines = tty.getvalue().splitlines()
    assert len(lines) <= 60
    assert lines == ["120 ops: all passed (--show all lists every row)", "", "5520 passed"]


def test_every_failing_row_is_shown_with_its_repro_on_a_terminal(sweep, terminal):
    long = "pool_2d(type=f64,x=[2,3,6,5],kernel=[3,3],mode=max,padding=[1,1],stride=[2,2])"
    sweep += [Result("gradcheck", f"{long[:-1]},i={i})", "fail", {"max_rel_err": 0.1,
                     "repro": f"gradcheck --op pool_2d -k 'i={i})'"}, "numerical: off",
                     {"op": "pool_2d", "backend": "cpu", "dtype": "f64"}) for i in range(70)]
    tty = terminal()
    assert main(["--op", "relu", "--no-progress"]) == 1
    out = re.sub(r"\x1b\[[0-9;]*m", "", tty.getvalue())
    for i in range(70):
        assert f"FAIL {long[:-1]},i={i})\n  numerical: off\n  reproduce: gradcheck --op " \
               f"pool_2d -k 'i={i})'\n" in out
    assert "pool_2d       0      70       0" in out
    assert out.splitlines()[-1] == "5520 passed, 70 failed"


def test_a_pipe_gets_the_same_report_unwrapped(sweep, capsys):
    assert main(["--op", "relu", "--no-progress", "--show", "all"]) == 0
    out = capsys.readouterr().out
    assert "op119(type=f64,x=[45])  PASS" in out and "\x1b[" not in out


@pytest.mark.parametrize(("name", "start"), [("r.json", "{"), ("r.html", "<!DOCTYPE html>"),
                                             ("r.xml", "<?xml"), ("r.md", "| case"),
                                             ("r.txt", "120 ops")])
def test_the_output_extension_picks_the_format(sweep, tmp_path, capsys, name, start):
    path = tmp_path / name
    assert main(["--op", "relu", "--no-progress", "--output", str(path)]) == 0
    assert path.read_text().lstrip().startswith(start)
    if name == "r.json":
        assert len(json.loads(path.read_text())["results"]) == 5520


def test_an_unknown_extension_is_plain_and_says_so(sweep, tmp_path, capsys):
    path = tmp_path / "r.log"
    assert main(["--op", "relu", "--no-progress", "--output", str(path)]) == 0
    assert path.read_text().startswith("120 ops: all passed")
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"gradcheck: wrote {path} (5520 results; plain text: its extension names no format, "
        f"--format picks one)")


def test_a_format_that_contradicts_the_extension_is_refused(sweep, tmp_path, capsys):
    path = tmp_path / "r.html"
    assert main(["--op", "relu", "--format", "plain", "--output", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not path.exists()
    assert err == f"gradcheck: --format plain contradicts --output {path} (html); drop one\n"


@pytest.mark.parametrize(("argv", "line"), [
    (["--op", "pool2d"],
     "gradcheck: unknown op 'pool2d'; did you mean pool_2d? (gradcheck --list shows all)"),
    (["--op", "relu", "--op", "sofmax"],
     "gradcheck: unknown op 'sofmax'; did you mean softmax? (gradcheck --list shows all)"),
    (["--op", "nothing_like_it"],
     "gradcheck: unknown op 'nothing_like_it' (gradcheck --list shows all)"),
    (["--op", "relu", "--engine", "tourch"],
     "gradcheck: unknown engine 'tourch'; did you mean torch? (known: engine, torch, numpy, "
     "ggml, tinygrad, jax, or module:attribute naming your own adapter)"),
    (["--op", "relu", "--inject", "scal:1.1"],
     "gradcheck: unknown mutation 'scal'; did you mean scale? (gradcheck --help lists all)"),
    (["--op", "relu", "--dtype", "f65"],
     "gradcheck: error: argument --dtype: invalid choice: 'f65'; did you mean f16 or f64? "
     "(choose from f16, bf16, f32, f64, all) (see gradcheck --help)"),
])
def test_unknown_names_get_the_closest_known_ones(argv, line, capsys):
    with pytest.raises(SystemExit) if "--dtype" in argv else _no_exit() as exited:
        assert main(argv) == 2
    if exited is not None:
        assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err == line + "\n"


class _no_exit:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_close_matches_are_the_best_ones_only():
    assert close_matches("pool2d", ["pool_1d", "pool_2d", "abs"]) == ["pool_2d"]
    assert close_matches("conv", ["conv_2d", "abs", "conv_1d"]) == ["conv_2d", "conv_1d"]
    assert close_matches("ADAM", ["sgd", "adam", "adamw"]) == ["adam"]
    assert close_matches("zzz", ["abs"]) == [] and did_you_mean("zzz", ["abs"]) == ""
    assert did_you_mean("a", ["ab", "ac", "ad"]) == "; did you mean ab, ac or ad?"
    assert unknown_name("op", "x\ny", [], "see --list") == r"unknown op 'x\ny' (see --list)"
