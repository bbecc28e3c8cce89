"""ggml's backward switch against the registry: the table, its verdicts, the command line."""

from __future__ import annotations

import importlib.util

import pytest

from engine.registry import OPS
from gradcheck.adapters.ggml import coverage
from gradcheck.adapters.ggml.coverage import BACKWARD_SWITCH, coverage_rows
from gradcheck.adapters.ggml.ops import OPS as GGML_OPS
from gradcheck.cli import main
from reports import Result

needs_ggml = pytest.mark.skipif(importlib.util.find_spec("libggml") is None,
                                reason="the libggml-python wheel is not installed")


def result(name, status, op, dtype="f32", message=""):
    return Result("gradcheck", name, status, message=message, labels={"op": op, "dtype": dtype})


def test_every_entry_of_the_switch_is_listed_once_and_checked_by_mapped_registry_ops():
    names = [name for name, _ in BACKWARD_SWITCH]
    assert len(names) == len(set(names)) == 47
    for name, ops in BACKWARD_SWITCH:
        for op in ops:
            if op in OPS:
                assert op in GGML_OPS, f"{name}: registry op {op} has no ggml translation"


def test_a_row_fails_on_any_failure_crashes_on_a_crash_and_passes_only_with_passes():
    rows = {r.name: r for r in coverage_rows([
        result("add(type=f32,a=[3])", "pass", "add"),
        result("add(type=f32,a=[4])", "fail", "add", message="backprop of b is off"),
        result("mul(type=f32,a=[3])", "pass", "mul"),
        result("mul(type=f32,a=[4])", "crash", "mul", message="SIGABRT"),
        result("div(type=f64,a=[3])", "unsupported", "div", "f64", "ggml has no float64"),
        result("sub(type=f32,a=[3])", "pass", "sub"),
    ], OPS)}
    add, mul, div, sub = (rows[f"GGML_OP_{n}"] for n in ("ADD", "MUL", "DIV", "SUB"))
    assert (add.status, add.metrics["failed"], add.metrics["passed"]) == ("fail", 1, 1)
    assert add.message == "add(type=f32,a=[4]): backprop of b is off"
    assert (mul.status, mul.metrics["crashed"]) == ("crash", 1)
    assert (div.status, div.message) == ("unsupported", "ggml has no float64")
    assert sub.status == "pass" and sub.labels["checked_by"] == "sub"
    assert rows["GGML_OP_SQRT"].message.startswith("not covered: sqrt has no cases")


def test_cast_cases_split_between_dup_and_cpy_and_sum_cases_between_sum_and_sum_rows():
    rows = {r.name: r for r in coverage_rows([
        result("cast(type=f32,x=[3,4],dtype=f32)", "pass", "cast"),
        result("cast(type=f32,x=[3,4],dtype=f16)", "fail", "cast"),
        result("sum(type=f32,x=[3,4],axis=None,keepdims=False)", "pass", "sum"),
        result("sum(type=f32,x=[3,4],axis=-1,keepdims=False)", "fail", "sum"),
    ], OPS)}
    assert rows["GGML_OP_DUP"].status == "pass" and rows["GGML_OP_CPY"].status == "fail"
    assert rows["GGML_OP_SUM"].status == "pass" and rows["GGML_OP_SUM_ROWS"].status == "fail"


def test_flash_attention_rows_count_the_forward_only_results_and_unfused_the_others():
    flash = result("attention(type=f32,q=[2,3,4]) [ggml_flash_attn_ext: forward only]",
                   "pass", "attention")
    flash.labels["check"] = "forward only"
    rows = {r.name: r for r in coverage_rows([
        result("attention(type=f32,q=[2,3,4])", "crash", "attention", message="SIGABRT"),
        flash,
        result("mlp_block(type=f32,x=[3,4])", "pass", "mlp_block"),
    ], OPS)}
    fa = rows["GGML_OP_FLASH_ATTN_EXT (forward only)"]
    unfused = rows["attention, unfused (MUL_MAT, DIAG_MASK_INF, SOFT_MAX)"]
    assert (fa.status, fa.metrics["cases"], fa.labels["checked_by"]) == ("pass", 1, "attention")
    assert (unfused.status, unfused.metrics["cases"]) == ("crash", 1)
    assert rows["llama layer: mlp_block"].status == "pass"
    assert rows["llama layer: attention_block"].message.startswith("not covered")
    assert {"attention", "attention_block", "mlp_block"} <= set(coverage.coverage_ops())


def test_an_entry_without_a_registry_op_says_it_is_not_covered(monkeypatch):
    monkeypatch.setattr(coverage, "BACKWARD_SWITCH", (("FOO", ("no_such_op",)),))
    monkeypatch.setattr(coverage, "BEYOND_SWITCH", ())
    (row,) = coverage_rows([], OPS)
    assert row.status == "unsupported" and row.message == "not covered: no registry op no_such_op"


@pytest.mark.parametrize("argv", [["--coverage"], ["--coverage", "--engine", "torch"],
                                  ["--coverage", "--engine", "ggml", "--random", "3"]])
def test_coverage_outside_ggml_or_with_random_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--no-progress"])
    assert exc.value.code == 2
    assert "--coverage" in capsys.readouterr().err


@needs_ggml
def test_coverage_runs_in_ggml_and_finds_its_add1_gradient_a_mean_not_a_sum(monkeypatch,
                                                                           capsys):
    """ggml 0.20.2's ADD1 backward gives b the mean of the gradient, not its sum (ggml.c:
    'TODO: should probably be sum instead of mean'): the row fails on b's gradient."""
    monkeypatch.setattr(coverage, "BACKWARD_SWITCH", (("ADD1", ("add1",)),
                                                      ("UNARY_SGN", ("sgn",))))
    monkeypatch.setattr(coverage, "BEYOND_SWITCH", ())
    status = main(["--engine", "ggml", "--coverage", "--no-progress", "--dtype", "f32",
                   "--no-torch", "--format", "json"])
    assert status == 1
    out = capsys.readouterr().out
    assert "\"GGML_OP_ADD1\"" in out and "worst c[0]" in out
    assert '"GGML_OP_UNARY_SGN"' in out
