"""The compact table (`--show all`): each tool's few columns, fitted to a terminal's width by
wrapping the case and leaving out the last columns, never by cutting a cell; every column
with verbose; in files and pipes nothing wrapped; colour only on a terminal. The report
around it (summary, failures, skip reasons) is tested in test_terminal_report."""

from __future__ import annotations

import io
import re
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reports.output import emit, render
from reports.record import Result
from reports.table import (
    INDENT,
    NO_TERMINAL,
    Terminal,
    compact_columns,
    compact_table,
    fit_table,
    render_grouped,
    render_table,
    summary_line,
    wrap_cell,
)
from reports.terminal_report import render_compact

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


def unwrapped(lines: list[str]) -> str:
    return "".join(line.removeprefix(INDENT) for line in lines)


def test_a_case_wraps_after_commas_and_brackets_and_loses_nothing():
    assert wrap_cell("abc", 10) == ["abc"]
    lines = wrap_cell(LONG, 40)
    assert lines == ["pool_2d(type=f64,x=[2,3,6,5],", "  kernel=[1,1],mode=max,padding=[0,0],",
                     "  stride=[1,2],cotangent=expanded)"]
    assert unwrapped(lines) == LONG


@given(st.text(alphabet="ab,([])=", max_size=80), st.integers(3, 50))
def test_wrapping_keeps_every_character_within_the_width(text, width):
    lines = wrap_cell(text, width)
    assert unwrapped(lines) == text
    assert all(len(line) <= width for line in lines)


def test_fit_table_leaves_out_the_last_columns_first_and_never_status():
    headers = ["case", "status", "max_rel_err", "kinks", "torch"]
    rows = [[LONG, "PASS", "1e-12", "0", "agree"]]
    wide = fit_table(headers, rows, Terminal(200))
    assert wide.dropped == () and LONG in wide.text
    narrow = fit_table(headers, rows, Terminal(50), statuses=(1, ["pass"]))
    assert narrow.dropped == ("kinks", "torch")
    lines = narrow.text.splitlines()
    assert lines[0].split() == ["case", "status", "max_rel_err"]
    assert all(len(line) <= 50 for line in lines)
    assert unwrapped([line.split("  PASS")[0].rstrip() for line in lines[2:]]) == LONG
    tiny = fit_table(headers, rows, Terminal(10), statuses=(1, ["pass"]))
    assert tiny.dropped == ("kinks", "torch") and "PASS" in tiny.text
    assert unwrapped([line.split("  PASS")[0].rstrip() for line in
                      tiny.text.splitlines()[2:]]) == LONG


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
    assert "kind      passed" in render_compact(grad_self, show="summary")
    opt_self = [Result("optcheck-selftest", "adam_eps: eps outside", "pass",
                       {"rows": 30, "failed_rows": 4, "caught_by": "torch (4)"}, "caught",
                       {"optimizer": "adam", "backend": "cpu", "dtype": "f64"})]
    assert compact_columns(opt_self) == ["status", "rows", "failed_rows", "caught_by"]
    other = [Result("mine", "a", "pass", {"x": 1}, labels={"k": "v"})]
    assert compact_columns(other) == ["k", "x", "status"]


def test_every_row_fits_the_terminal_with_its_case_wrapped_never_cut():
    text = render(sweep(), "plain", "gradcheck", terminal=Terminal(width=100), show="all")
    lines = visible(text)
    table = lines[:lines.index("")]
    assert table[0].split() == ["case", "status", "max_rel_err", "kinks", "forward", "torch"]
    assert all(len(line) <= 100 for line in table)
    assert table[2].startswith("pool_2d(type=f64,x=[2,3,6,5],kernel=[1,1],mode=max,")
    assert table[2].split()[1:] == ["PASS", "1e-12", "0", "agree", "agree"]
    assert unwrapped([table[2].split()[0], table[3].rstrip()]) == LONG
    assert "…" not in text and "checked_fraction" not in text and "x[0, 1, 1, 0]" not in text


def test_a_narrow_terminal_leaves_out_columns_and_says_which():
    text = render(sweep(), "plain", "gradcheck", terminal=Terminal(width=60), show="all")
    lines = visible(text)
    assert lines[0].split() == ["case", "status", "max_rel_err", "kinks"]
    footer = ("(left out to fit: forward, torch; a wider terminal, a pipe or --output FILE "
              "shows them)")
    assert lines[lines.index("") - 1] == footer
    assert all(len(line) <= 60 for line in lines[:lines.index("") - 1])


def test_an_empty_report_and_a_tool_without_groups():
    assert render_compact([], "gradcheck") == "no cases"
    rows = [Result("mine", f"c{i}", "pass", {"x": i}) for i in range(3)]
    assert render_compact(rows, show="all").splitlines()[0].split() == ["case", "x", "status"]
    assert render_compact(rows) == "3 passed"


def test_files_and_pipes_get_the_compact_columns_unwrapped():
    text = render(sweep(), "plain", "gradcheck", show="all")
    assert LONG in text and "…" not in text and "\x1b[" not in text
    assert text.splitlines()[0].split()[1:] == ["status", "max_rel_err", "kinks", "forward",
                                                "torch"]
    assert compact_table(sweep(), "gradcheck").dropped == ()


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
    plain = render(sweep(), "plain", "gradcheck", terminal=Terminal(width=80), show="all")
    coloured = render(sweep(), "plain", "gradcheck", terminal=Terminal(80, True), show="all")
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
    assert Terminal.of(FakeTty()) == Terminal(77, True)
    monkeypatch.setenv("NO_COLOR", "1")
    assert Terminal.of(FakeTty("ascii")) == Terminal(77, False)


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
    assert emit(sweep(), tool="gradcheck", show="all") == 1
    shown = tty.getvalue()
    assert "\x1b[32mPASS" in shown and LONG not in shown
    assert max(len(line) for line in visible(shown)[:5]) <= 70
    path = tmp_path / "r.txt"
    assert emit(sweep(), tool="gradcheck", output=path, show="all") == 1
    text = path.read_text()
    assert text == render(sweep(), "plain", "gradcheck", show="all") and LONG in text
    assert "\x1b[" not in text and "checked_fraction" not in text
    assert emit(sweep(), tool="gradcheck", output=path, verbose=True) == 1
    assert "checked_fraction" in path.read_text()


def test_emit_echo_plain_fits_the_terminal(tty_stdout, tmp_path):
    path = tmp_path / "r.json"
    tty = tty_stdout()
    emit(sweep(), tool="gradcheck", fmt="json", output=path, echo_plain=True, show="all")
    assert '"checked_fraction"' in path.read_text()
    shown = visible(tty.getvalue())
    assert shown[0].split()[0] == "case" and max(len(line) for line in shown[:5]) <= 70
