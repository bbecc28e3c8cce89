"""The optcheck command line: selection, hyperparameter validation, formats, exit codes."""

from __future__ import annotations

import json

import pytest

from optcheck.cli import main


def test_closed_form_family_passes_and_prints_a_table_per_family(capsys):
    assert main(["--opt", "sgd", "--family", "closed-form", "--dtype", "f64",
                 "--no-progress", "--steps", "20", "--verbose"]) == 0
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


@pytest.mark.parametrize("argv, line", [
    (["--opt", "sgd", "--eps", "1e-8"], "sgd takes no --eps"),
    (["--opt", "sgd", "--amsgrad"], "sgd takes no --amsgrad"),
    (["--opt", "adam", "--dampening", "0.1"], "adam takes no --dampening"),
    (["--opt", "adamw", "--nesterov", "--momentum", "0.9"], "adamw takes no --momentum"),
    (["--opt", "sgd", "--betas", "0.9,0.99", "--eps", "1e-3"], "sgd takes no --eps"),
    (["--opt", "sgd", "--amsgrad", "--betas", "0.9,0.99"], "sgd takes no --betas"),
    (["--opt", "all", "--momentum", "0.9"], "adam takes no --momentum"),
    (["--opt", "adam", "--opt", "sgd", "--eps", "1e-3"], "sgd takes no --eps"),
    (["--opt", "adam", "--lr", "-1", "--momentum", "0.9"], "adam takes no --momentum"),
    (["--opt", "sgd", "--weight-decay=-1"], "sgd: weight_decay must be >= 0, got -1.0"),
    (["--self-test", "--betas", "0.9,0.99"], "sgd takes no --betas"),
])
def test_the_first_option_an_optimizer_does_not_take_is_named(argv, line, capsys):
    """Options are refused in a fixed order (lr, eps, weight_decay, momentum, dampening,
    betas, then the flags), before any value is validated, optimizers in the order given."""
    assert main(argv + ["--no-progress"]) == 2
    assert capsys.readouterr().err == f"optcheck: {line}\n"


def test_your_settings_add_one_row_per_dtype(capsys):
    """torch's row in float32 and float64, the precision family's in float16 and bfloat16."""
    pytest.importorskip("torch")
    assert main(["--opt", "sgd", "--family", "closed-form", "--steps", "3", "--momentum",
                 "0.9", "--nesterov", "--no-progress", "--verbose"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("sgd: user(")]
    assert len(rows) == 4 and all("PASS" in row for row in rows)
    assert sum(" precision " in row for row in rows) == 2
    assert rows[0].startswith("sgd: user(lr=0.001,momentum=0.9,dampening=0,weight_decay=0,"
                              "nesterov)")


@pytest.mark.parametrize("argv", [["--opt", "lion"], [], ["--opt", "adam", "--steps", "0"],
                                  ["--opt", "adam", "--steps", "100000000"],
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
    from tests.cli_helpers import assert_unwritable_output_refused
    assert_unwritable_output_refused(main, ["--opt", "adam"], tmp_path, capsys)


def test_empty_output_is_a_usage_error_not_stdout(capsys):
    from tests.cli_helpers import assert_empty_output_refused
    assert_empty_output_refused(main, ["--opt", "sgd"], capsys, "optcheck")


def test_steps_beyond_the_bound_say_the_bound(capsys):
    with pytest.raises(SystemExit):
        main(["--opt", "adam", "--steps", "10001"])
    assert "--steps must lie in [1, 10000], got 10001" in capsys.readouterr().err


# --- bad input: one line, exit 2; Ctrl-C: one line, exit 130 --------------------------------

@pytest.mark.parametrize("seed", ["-1", str(2**63)])
def test_a_seed_numpy_cannot_take_is_a_usage_error(seed, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--opt", "sgd", "--seed", seed])
    assert exc.value.code == 2
    assert f"--seed must lie in [0, {2**63 - 1}], got {seed}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1e3"])
def test_a_bad_thread_setting_is_one_usage_line(value, monkeypatch, capsys):
    monkeypatch.setenv("GRADVERIFY_THREADS", value)
    assert main(["--opt", "sgd", "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"optcheck: GRADVERIFY_THREADS must be a whole number in [1, 512], got {value!r}\n")


def _interrupt_after(monkeypatch, n: int):
    """Ctrl-C (a KeyboardInterrupt) in the (n+1)-th family run."""
    import optcheck.runner as runner
    from tests.cli_helpers import interrupt_after
    interrupt_after(monkeypatch, runner, "run_family", n)


def test_ctrl_c_writes_the_finished_rows_and_exits_130(tmp_path, monkeypatch, capsys):
    path = tmp_path / "r.json"
    _interrupt_after(monkeypatch, 1)
    assert main(["--opt", "sgd", "--family", "closed-form", "--steps", "3", "--format",
                 "json", "--output", str(path), "--no-progress"]) == 130
    doc = json.loads(path.read_text())
    rows = len(doc["results"])
    assert rows > 0 and doc["meta"]["interrupted"] is True
    assert capsys.readouterr().err == (
        f"optcheck: interrupted; wrote the {rows} row{'s' * (rows != 1)} finished so far to "
        f"{path}\n")


def test_ctrl_c_without_output_is_one_line(monkeypatch, capsys):
    _interrupt_after(monkeypatch, 0)
    assert main(["--opt", "sgd", "--family", "closed-form", "--no-progress"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "optcheck: interrupted\n" and not captured.out
