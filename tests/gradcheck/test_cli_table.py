"""gradcheck's plain report: the summary per op, the failures and the totals by default;
every case in the compact columns with --show all, every column with --verbose, unwrapped
in a file; the progress bar only when stderr is a terminal. The sweep is a
stand-in (run_plan replaced), so these tests say what the command line prints, fast."""

from __future__ import annotations

import pytest

import gradcheck.cli
from gradcheck.cli import main
from reports.record import Result
from tests.cli_helpers import assert_progress_only_on_a_terminal

CASE = ("pool_2d(type=f64,x=[2,3,6,5],kernel=[1,1],mode=max,padding=[0,0],stride=[1,2],"
        "cotangent=expanded)")
REPRO = "gradcheck --op pool_2d -k 'pool_2d(type=f64,x=[1])'"


@pytest.fixture
def sweep(monkeypatch):
    """run_plan replaced by two rows (one failing); the progress flags it was given."""
    calls = []

    def run_plan(request, plan, progress=False):
        calls.append(progress)
        metrics = {"checked": 180, "checked_fraction": 1.0, "kinks": 2, "max_abs_err": 1e-12,
                   "max_rel_err": 2e-12, "worst": "x[0]: num 1, bp 1", "forward": "agree",
                   "torch": "agree", "seconds": 0.02}
        labels = {"op": "pool_2d", "backend": "cpu", "dtype": "f64", "mode": "full",
                  "tier": "fast"}
        return [Result("gradcheck", CASE, "pass", metrics, labels=labels),
                Result("gradcheck", "pool_2d(type=f64,x=[1])", "fail",
                       {**metrics, "torch": "off", "repro": REPRO}, "torch: off", labels)]

    monkeypatch.setattr(gradcheck.cli, "run_plan", run_plan)
    return calls


def test_default_is_a_summary_per_op_and_the_failures(sweep, capsys):
    assert main(["--op", "pool_2d", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("op       passed  failed  errors  kinks\n")
    assert CASE not in out and "\x1b[" not in out
    assert f"FAIL pool_2d(type=f64,x=[1])\n  torch: off\n  reproduce: {REPRO}\n" in out
    assert out.splitlines()[-1] == "1 passed, 1 failed"


def test_show_all_is_compact_with_a_summary_per_op_and_the_failures(sweep, capsys):
    for flags in (["--show", "all"], ["--show=all"]):
        assert main(["--op", "pool_2d", "--no-progress", *flags]) == 1
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert lines[0].split() == ["case", "status", "max_rel_err", "kinks", "forward",
                                    "torch"]
        assert CASE in out and "checked_fraction" not in out and "\x1b[" not in out
    assert "op       passed  failed  errors  kinks\n" in out
    assert "pool_2d       1       1       0      4\n" in out
    assert f"FAIL pool_2d(type=f64,x=[1])\n  torch: off\n  reproduce: {REPRO}\n" in out
    assert lines[-1] == "1 passed, 1 failed"


def test_verbose_gives_every_row_and_column(sweep, capsys):
    for flag in ("--verbose", "-v"):
        assert main(["--op", "pool_2d", "--no-progress", flag]) == 1
        out = capsys.readouterr().out
        header = out.splitlines()[0].split()
        assert header[:7] == ["case", "op", "backend", "dtype", "mode", "tier", "checked"]
        assert "checked_fraction" in header and "repro" in header and CASE in out


def test_a_text_file_gets_the_compact_columns_unwrapped(sweep, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    path = tmp_path / "report.txt"
    assert main(["--op", "pool_2d", "--no-progress", "--output", str(path), "--show",
                 "all"]) == 1
    text = path.read_text()
    assert CASE in text and "checked_fraction" not in text and "\x1b[" not in text
    assert main(["--op", "pool_2d", "--no-progress", "--output", str(path), "--verbose"]) == 1
    assert "checked_fraction" in path.read_text()


def test_progress_only_when_stderr_is_a_terminal(sweep, monkeypatch, capsys):
    assert_progress_only_on_a_terminal(main, ["--op", "pool_2d"], sweep, monkeypatch)
