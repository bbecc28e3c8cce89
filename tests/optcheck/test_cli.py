"""The optcheck command line: selection, hyperparameter validation, formats, exit codes."""

from __future__ import annotations

import json

import pytest

from optcheck.cli import main


def test_closed_form_family_passes_and_prints_a_table_per_family(capsys):
    assert main(["--opt", "sgd", "--family", "closed-form", "--dtype", "f64",
                 "--no-progress", "--steps", "20"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("closed-form (")
    assert "constant_gradient" in out and "toy" in out and "FAIL" not in out


@pytest.mark.parametrize("argv, word", [
    (["--opt", "adam", "--lr", "-0.1"], "lr must be >= 0"),
    (["--opt", "adam", "--betas", "0.9,1.0"], "beta2 must lie in [0, 1)"),
    (["--opt", "adamw", "--eps=-1e-8"], "eps must be >= 0"),
    (["--opt", "sgd", "--nesterov"], "nesterov needs momentum > 0"),
    (["--opt", "sgd", "--betas", "0.9,0.99"], "sgd takes no --betas"),
])
def test_bad_hyperparameters_exit_2_with_a_clear_message(argv, word, capsys):
    assert main(argv + ["--no-progress"]) == 2
    assert word in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--opt", "lion"], [], ["--opt", "adam", "--steps", "0"],
                                  ["--opt", "adam", "--betas", "0.9"]])
def test_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_json_output_is_written_atomically_with_the_documented_columns(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["--opt", "adamw", "--family", "closed-form", "--dtype", "f32", "--steps",
                 "10", "--format", "json", "--output", str(path), "--no-progress"]) == 0
    doc = json.loads(path.read_text())
    assert doc["tool"] == "optcheck" and doc["summary"]["failed"] == 0
    row = doc["results"][0]
    for key in ("optimizer", "check", "backend", "dtype", "status", "max_abs_err"):
        assert key in row, key
    assert not [p for p in tmp_path.iterdir() if p.name != "r.json"]


def test_unwritable_output_is_refused_before_running(tmp_path, capsys):
    assert main(["--opt", "adam", "--output", str(tmp_path / "no" / "r.json")]) == 2
    assert "cannot write" in capsys.readouterr().err
