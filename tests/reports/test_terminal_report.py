"""The plain report's views: by default the summary per group folded to what did not pass,
every failing row in full with its repro, the skip reasons grouped and the totals; the
summary alone; every row. A sweep of 120 ops that all pass fits in a few lines."""

from __future__ import annotations

import re

import pytest

from reports.output import render
from reports.record import Result
from reports.table import Terminal, summary_line
from reports.terminal_report import (
    EXAMPLES,
    FOLD_ABOVE,
    REASONS,
    default_show,
    group_summary,
    reason_list,
    render_compact,
)

ANSI = re.compile(r"\x1b\[[0-9;]*m")
REPRO = "gradcheck --inject scale:1.01 --op relu -k 'relu(type=f32,x=[10])'"
LONG = ("pool_2d(type=f64,x=[2,3,6,5],kernel=[1,1],mode=max,padding=[0,0],stride=[1,2],"
        "cotangent=expanded)")


def row(name, status="pass", op="relu", message="", **metrics):
    return Result("gradcheck", name, status, {"max_rel_err": 1e-12, "kinks": 0, **metrics},
                  message, {"op": op, "backend": "cpu", "dtype": "f64"})


def all_passing(ops=120, per_op=46) -> list[Result]:
    return [row(f"op{i}(type=f64,x=[{j}])", op=f"op{i}") for i in range(ops)
            for j in range(per_op)]


def test_a_sweep_that_all_passes_is_a_few_lines_on_a_terminal():
    text = render(all_passing(), "plain", "gradcheck", terminal=Terminal(100, True))
    assert text.splitlines() == ["120 ops: all passed (--show all lists every row)", "",
                                 "5520 passed"]


def test_the_default_shows_only_the_groups_that_did_not_all_pass():
    rows = all_passing(ops=FOLD_ABOVE + 3, per_op=3)
    rows[4] = row(LONG, "fail", "op1", "numerical: off\nworst x[1]", repro=REPRO)
    rows[7] = row("op2(type=f64,x=[1])", "skip", "op2", "no gradient: integer output")
    lines = render_compact(rows, "gradcheck", terminal=Terminal(60)).splitlines()
    assert lines[:5] == ["op   passed  failed  errors  skipped  kinks",
                         "---  ------  ------  ------  -------  -----",
                         "op1       2       1       0        0      0",
                         "op2       2       0       0        1      0",
                         f"{FOLD_ABOVE + 1} other ops: all passed (--show all lists "
                         "every row)"]
    failures = lines[lines.index("failures (1):"):]
    assert failures[1:6] == ["", f"FAIL {LONG}", "  numerical: off", "  worst x[1]",
                             f"  reproduce: {REPRO}"]
    skipped = lines[lines.index("skipped (1), by reason:"):]
    assert skipped[1:3] == ["  1  no gradient: integer output", "     op2(type=f64,x=[1])"]
    assert lines[-1] == f"{3 * (FOLD_ABOVE + 3) - 2} passed, 1 failed, 1 skipped"


def test_every_failing_row_is_listed_however_many():
    rows = [row(f"relu(type=f32,x=[{i}])", "fail", message="off", repro=f"gradcheck {i}")
            for i in range(200)]
    text = render_compact(rows, "gradcheck", terminal=Terminal(80))
    assert text.count("\nFAIL relu(") == 200 and text.count("  reproduce: gradcheck ") == 200


def test_skip_reasons_are_grouped_most_frequent_first_with_a_few_cases():
    rows = [row(f"a{i}", "skip", message="no gradient") for i in range(5)]
    rows += [row("b", "skip", message="tiny case\nsecond line")]
    rows += [row(f"c{i}", "unsupported", message=f"reason {i}") for i in range(REASONS + 2)]
    text = reason_list(rows)
    lines = text.splitlines()
    assert lines[:6] == ["skipped (6), by reason:", "  5  no gradient",
                         *(f"     a{i}" for i in range(EXAMPLES)), "     … and 2 more"]
    assert lines[6:8] == ["  1  tiny case", "     b"]
    assert "unsupported (10), by reason:" in lines
    assert lines[-1] == "  … and 2 more reasons (2 rows; --show all lists every row)"
    assert reason_list([row("x")]) == ""


def test_vacuous_rows_are_listed_in_full_under_strict_else_by_reason():
    rows = [row("a"), row("z(type=f64)", "vacuous", message="zero reference gradient",
                          repro="gradcheck --op z")]
    plain = render_compact(rows, "gradcheck")
    assert "vacuous (1), by reason:\n  1  zero reference gradient\n     z(type=f64)" in plain
    strict = render_compact(rows, "gradcheck", strict=True)
    assert "vacuous (1): these checks could not have failed\n\nVACUOUS z(type=f64)\n" \
           "  zero reference gradient\n  reproduce: gradcheck --op z" in strict
    assert "by reason" not in strict


def test_summary_shows_every_group_and_all_shows_every_row():
    rows = all_passing(ops=3, per_op=2)
    summary = render_compact(rows, "gradcheck", show="summary").splitlines()
    assert [line.split()[0] for line in summary[2:5]] == ["op0", "op1", "op2"]
    assert summary[-1] == summary_line(rows) == "6 passed"
    every = render_compact(rows, "gradcheck", show="all")
    assert all(r.name in every for r in rows) and "op2" in every.split("\n\n")[1]
    with pytest.raises(ValueError, match="show must be one of"):
        render_compact(rows, "gradcheck", show="some")


def test_a_summary_of_a_few_groups_keeps_every_row():
    rows = all_passing(ops=FOLD_ABOVE, per_op=2)
    lines = render_compact(rows, "gradcheck").splitlines()
    assert [x.split()[:2] for x in lines[2:2 + FOLD_ABOVE]] == [[f"op{i}", "2"]
                                                               for i in range(FOLD_ABOVE)]
    assert "all passed" not in "\n".join(lines)


def test_the_folded_summary_of_a_single_group_and_no_groups():
    rows = all_passing(ops=1, per_op=2)
    assert group_summary(rows, "op", fold=True) == \
        "1 op: all passed (--show all lists every row)"
    assert group_summary(rows, None) == "" and group_summary(rows, "family") == ""
    fams = [Result("optcheck", "adam: x", "pass", labels={"family": f})
            for f in ("torch", "closed-form")]
    assert group_summary(fams, "family", fold=True).startswith("2 families: all passed")


def test_tools_whose_every_row_matters_show_them_all_by_default():
    mnist = [Result("mnist", "fc, engine: test accuracy", "pass", {"measured": 0.98},
                    labels={"arch": "mnist-fc"})]
    assert default_show(mnist) == "all" and default_show([], "gradcheck-coverage") == "all"
    assert default_show(all_passing(1, 1)) == "failures" and default_show([], "mine") == \
        "failures"
    assert "fc, engine: test accuracy" in render_compact(mnist)


def test_colour_only_on_a_colour_terminal():
    rows = [row("a", "fail", message="off")]
    coloured = render_compact(rows, "gradcheck", terminal=Terminal(80, True))
    assert "\x1b[31mFAIL\x1b[0m a" in coloured
    assert ANSI.sub("", coloured) == render_compact(rows, "gradcheck", terminal=Terminal(80))
