"""The compact plain report: each tool's few columns, fitted to a terminal's width (cases
shortened in the middle), a summary per group, the failures in full; every column with
verbose, in files and pipes nothing shortened, colour only on a terminal."""

from __future__ import annotations

import io
import re
import sys

import pytest

from reports.output import emit, render
from reports.record import Result
from reports.table import (
    NO_TERMINAL,
    Terminal,
    compact_columns,
    fit_widths,
    group_summary,
    render_compact,
    render_grouped,
    render_table,
    shorten_middle,
    summary_line,
)

LONG = ("pool_2d(type=f64,x=[2,3,6,5],kernel=[1,1],mode=max,padding=[0,0],stride=[1,2],"
        "cotangent=expanded)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def grad_row(name, status="pass", op="pool_2d", kinks=0, rel=1e-12, torch="agree",
             message="", backend="cpu", **metrics):
    """A row as gradcheck makes it: its labels and every metric of a judged case."""
    return Result("gradcheck", name, status,
                  {"checked": 180, "checked_fraction": 1.0, "kinks": kinks, "max_abs_err": rel,
                   "max_rel_err": rel, "worst": "x[0, 1, 1, 0]: num 0.570878, bp 0.570878",
                   "forward": "agree", "torch": torch, "seconds": 0.02, **metrics},
                  message, {"op": op, "backend": backend, "dtype": "f64", "mode": "full",
                            "tier": "fast"})


REPRO = "gradcheck --inject scale:1.01 --op relu -k 'relu(type=f32,x=[10])'"
MESSAGE = ("numerical: backprop of x is off (7/10 elements), numerical and torch agree, "
           "worst x[7]: num 1.07434, bp 1.08508")


def sweep() -> list[Result]:
    return [grad_row(LONG), grad_row(LONG.replace("expanded", "sliced"), kinks=3),
            grad_row("relu(type=f32,x=[10])", "fail", "relu", rel=0.01, torch="off",
                     message=MESSAGE, repro=REPRO),
            Result("gradcheck", "conv_2d(type=f32)", "error", {}, "ShapeError: bad\nline 2",
                   {"op": "conv_2d", "backend": "cpu"})]


def visible(text: str) -> list[str]:
    return ANSI.sub("", text).splitlines()


def test_shorten_middle_keeps_both_ends():
    assert shorten_middle("abcdefghij", 10) == "abcdefghij"
    assert shorten_middle("abcdefghij", 7) == "abc…hij"
    assert shorten_middle("abcdefghij", 6) == "abc…ij"
    assert shorten_middle("abcdefghij", 7, "...") == "ab...ij"
    assert shorten_middle("abcdefghij", 1) == "a"


def test_fit_widths_the_first_column_gives_way_then_the_widest_other():
    assert fit_widths([50, 6, 8], [20, 6, 6], None) == [50, 6, 8]
    assert fit_widths([50, 6, 8], [20, 6, 6], 100) == [50, 6, 8]
    assert fit_widths([50, 6, 8], [20, 6, 6], 40) == [22, 6, 8]      # 22 + 2 + 6 + 2 + 8
    assert fit_widths([50, 6, 10], [20, 6, 6], 38) == [20, 6, 8]
    assert fit_widths([50, 6, 10], [20, 6, 6], 10) == [20, 6, 6]     # all at their floors


def test_gradcheck_rows_show_status_error_kinks_and_agreements():
    rows = sweep()
    assert compact_columns(rows) == ["status", "max_rel_err", "kinks", "forward", "torch"]
    cuda = [*rows, grad_row("relu(type=f32,x=[3])", backend="cuda", vs_cpu="agree")]
    assert compact_columns(cuda) == ["backend", "status", "max_rel_err", "kinks", "forward",
                                     "torch", "vs_cpu"]


def test_other_tools_have_their_own_columns_and_unknown_ones_get_every_column():
    opt = [Result("optcheck", "adam: grid(lr=0.01)", "pass",
                  {"max_abs_err": 1e-15, "max_rel_err": 3e-14, "first_step": None, "grid": 8},
                  labels={"optimizer": "adam", "family": "torch", "check": "grid",
                          "backend": "cpu", "dtype": dt}) for dt in ("f32", "f64")]
    assert compact_columns(opt) == ["dtype", "status", "max_rel_err"]
    mnist = [Result("mnist", "fc, engine: test accuracy vs torch", "pass",
                    {"measured": 0.98, "torch": 0.981, "diff": 0.001, "bar": 0.005},
                    labels={"arch": "mnist-fc", "engine": "engine", "seed": 0,
                            "check": "conformance"})]
    assert compact_columns(mnist) == ["status", "measured", "torch", "bar"]
    grad_self = [Result("gradcheck-selftest", "relu_scale", "pass",
                        {"cases": 4, "caught": 4, "caught_in": "relu(x)", "check": "numerical",
                         "caught_by": "numerical 4", "seconds": 0.1}, "first caught by ...",
                        {"ops": "relu", "kind": kind, "tier": "fast"})
                 for kind in ("backward", "kernel")]
    assert compact_columns(grad_self) == ["kind", "status", "cases", "caught", "check"]
    assert "kind      passed" in render_compact(grad_self)
    opt_self = [Result("optcheck-selftest", "adam_eps: eps outside", "pass",
                       {"rows": 30, "failed_rows": 4, "caught_by": "torch (4)"}, "caught",
                       {"optimizer": "adam", "backend": "cpu", "dtype": "f64"})]
    assert compact_columns(opt_self) == ["status", "rows", "failed_rows", "caught_by"]
    other = [Result("mine", "a", "pass", {"x": 1}, labels={"k": "v"})]
    assert compact_columns(other) == ["k", "x", "status"]


def test_compact_report_fits_the_terminal_and_shortens_the_case_in_the_middle():
    text = render(sweep(), "plain", "gradcheck", terminal=Terminal(width=100))
    lines = visible(text)
    assert lines[0].split() == ["case", "status", "max_rel_err", "kinks", "forward", "torch"]
    table = lines[:lines.index("")]
    assert all(len(line) <= 100 for line in table) and len(table[2]) == 100
    assert table[2].startswith("pool_2d(type=f64,x=[2,3,6,5]…e=[1,2],cotangent=expanded)  PASS")
    assert "checked_fraction" not in text and "x[0, 1, 1, 0]" not in text


def test_compact_report_sums_per_op_and_lists_failures_in_full():
    text = render(sweep(), "plain", "gradcheck", terminal=Terminal(width=40))
    lines = visible(text)
    start = lines.index("op       passed  failed  errors  kinks")
    assert lines[start + 2].split() == ["pool_2d", "2", "0", "0", "3"]
    assert lines[start + 3].split() == ["relu", "0", "1", "0", "0"]
    assert lines[start + 4].split() == ["conv_2d", "0", "0", "1", "0"]
    failures = lines[lines.index("failures (2):"):]
    assert failures[1:8] == ["", "FAIL relu(type=f32,x=[10])", f"  {MESSAGE}",
                             f"  reproduce: {REPRO}", "", "ERROR conv_2d(type=f32)",
                             "  ShapeError: bad"]
    assert lines[-1] == summary_line(sweep()) == "2 passed, 1 failed, 1 errors"
    assert text.endswith("\n")


def test_group_by_gives_the_summary_per_group_and_no_failures_section_when_all_pass():
    rows = [Result("optcheck", f"adam: c{i}", "pass", {"max_rel_err": 0.0},
                   labels={"family": fam, "dtype": "f64"})
            for i, fam in enumerate(("closed-form", "torch", "torch"))]
    text = render_compact(rows, "optcheck", group_by="family")
    assert "family       passed  failed  errors\n" in text
    assert "torch             2       0       0\n" in text
    assert "failures" not in text and text.endswith("3 passed")
    assert group_summary(rows, None) == "" and group_summary(rows, "op") == ""
    assert render_compact([], "gradcheck") == "no cases"


def test_files_and_pipes_get_the_compact_columns_unshortened():
    text = render(sweep(), "plain", "gradcheck")
    assert LONG in text and "…" not in text and "\x1b[" not in text
    assert text.splitlines()[0].split()[1:] == ["status", "max_rel_err", "kinks", "forward",
                                                "torch"]


def test_verbose_and_the_other_formats_keep_every_column():
    rows = sweep()
    assert render(rows, "plain", "gradcheck", verbose=True) == \
        render_table(rows) + "\n" + summary_line(rows) + "\n"
    assert render(rows, "plain", "gradcheck", group_by="op", verbose=True) == \
        render_grouped(rows, "plain", "op") + "\n"
    meta = {"time": "2025-01-01T00:00:00Z"}
    for fmt in ("github", "html", "json", "junit"):
        assert render(rows, fmt, "gradcheck", meta, verbose=True,
                      terminal=Terminal(40, True)) == render(rows, fmt, "gradcheck", meta)
    assert "checked_fraction" in render(rows, "github", "gradcheck")


def test_colour_marks_statuses_without_moving_the_columns():
    plain = render(sweep(), "plain", "gradcheck", terminal=Terminal(width=80))
    coloured = render(sweep(), "plain", "gradcheck", terminal=Terminal(80, True))
    assert "\x1b[32mPASS\x1b[0m" in coloured and "\x1b[31mFAIL\x1b[0m relu" in coloured
    assert ANSI.sub("", coloured) == plain and "\x1b[" not in plain


class FakeTty(io.StringIO):
    def __init__(self, encoding="utf-8"):
        super().__init__()
        self._encoding = encoding

    @property
    def encoding(self):
        return self._encoding

    def isatty(self):
        return True


def test_terminal_of_a_stream(monkeypatch):
    assert Terminal.of(io.StringIO()) == NO_TERMINAL == Terminal()
    monkeypatch.setenv("COLUMNS", "77")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert Terminal.of(FakeTty()) == Terminal(77, True, "…")
    monkeypatch.setenv("NO_COLOR", "1")
    assert Terminal.of(FakeTty("ascii")) == Terminal(77, False, "...")


@pytest.fixture
def tty_stdout(monkeypatch):
    """A function that makes stdout a 70-column colour terminal (inside the test: pytest
    puts its own capture back between fixtures and the test)."""
    def as_tty() -> FakeTty:
        monkeypatch.setenv("COLUMNS", "70")
        monkeypatch.delenv("NO_COLOR", raising=False)
        out = FakeTty()
        monkeypatch.setattr(sys, "stdout", out)
        return out
    return as_tty


def test_emit_fits_a_terminal_but_not_a_file(tty_stdout, tmp_path):
    tty = tty_stdout()
    assert emit(sweep(), tool="gradcheck") == 1
    shown = tty.getvalue()
    assert "\x1b[32mPASS" in shown and "…" in shown
    assert max(len(line) for line in visible(shown)[:5]) == 70
    path = tmp_path / "r.txt"
    assert emit(sweep(), tool="gradcheck", output=path) == 1
    text = path.read_text()
    assert text == render(sweep(), "plain", "gradcheck") and LONG in text
    assert "\x1b[" not in text and "checked_fraction" not in text
    assert emit(sweep(), tool="gradcheck", output=path, verbose=True) == 1
    assert "checked_fraction" in path.read_text()


def test_emit_echo_plain_fits_the_terminal(tty_stdout, tmp_path):
    path = tmp_path / "r.json"
    tty = tty_stdout()
    emit(sweep(), tool="gradcheck", fmt="json", output=path, echo_plain=True)
    assert '"checked_fraction"' in path.read_text()
    shown = visible(tty.getvalue())
    assert shown[0].split()[0] == "case" and max(len(line) for line in shown[:5]) == 70
