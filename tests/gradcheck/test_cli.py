"""The gradcheck CLI: verdicts, exit codes, injected bugs caught."""

from __future__ import annotations

import pytest

from gradcheck.cli import main


def test_relu_passes(capsys):
    assert main(["--op", "relu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "relu(type=f32,x=[3,4])" in out and "PASS" in out and "FAIL" not in out


@pytest.mark.parametrize("op", ["relu", "sum", "div", "pool_2d", "conv_2d",
                                "cross_entropy_loss"])
def test_injected_scale_bug_is_caught(op, capsys):
    assert main(["--op", op, "--dtype", "f64", "--inject", "scale:1.01", "--no-progress"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_injected_bug_caught_in_f32_at_one_percent(capsys):
    assert main(["--op", "relu", "--dtype", "f32", "--inject", "scale:1.01",
                 "--no-progress"]) == 1


def test_unknown_op_is_a_usage_error(capsys):
    assert main(["--op", "pool3d"]) == 2
    err = capsys.readouterr().err
    assert "unknown op 'pool3d'" in err and "pool_2d" in err


def test_filter_matching_nothing_is_a_usage_error(capsys):
    assert main(["--op", "relu", "-k", "no-such-case"]) == 2


def test_bad_mutation_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--op", "relu", "--inject", "flip"])
    assert exc.value.code == 2


def test_list(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("pool_2d", "conv_2d", "cross_entropy_loss", "argmax", "im2col_back"):
        assert name in out


def test_filter_and_dtype(capsys):
    assert main(["--op", "sum", "--dtype", "f64", "-k", "x=[3,4]", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "type=f32" not in out and "x=[3,4]" in out


def test_json_report_has_the_documented_schema(tmp_path, capsys):
    from reports import load_json
    path = tmp_path / "report.json"
    assert main(["--op", "pool_2d", "-k", "kernel=[3,3]", "--format", "json",
                 "--output", str(path), "--no-progress"]) == 0
    doc = load_json(path.read_text())
    assert doc["summary"]["passed"] == doc["summary"]["total"] > 0
    for row in doc["results"]:
        for key in ("op", "case", "backend", "dtype", "status", "max_abs_err", "max_rel_err"):
            assert key in row
        assert row["op"] == "pool_2d" and row["status"] == "pass"


def test_unwritable_output_is_a_usage_error_and_runs_nothing(tmp_path, capsys):
    assert main(["--op", "relu", "--output", str(tmp_path / "no" / "dir.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_existing_output_survives_a_failed_run(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("previous")
    assert main(["--op", "nope", "--output", str(path)]) == 2
    assert path.read_text() == "previous"


@pytest.mark.parametrize("argv", [["--op", "relu", "--random", "-3"],
                                  ["--op", "relu", "--random", "many"],
                                  ["--op", "relu", "--backend", "tpu"],
                                  ["--repro", "Sample(op='relu', inputs=__import__('os'))"],
                                  ["--repro", "not a case"]])
def test_malformed_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_generated_failure_is_shrunk_and_reproducible(capsys):
    assert main(["--op", "relu", "--random", "5", "--seed", "3", "--dtype", "f64",
                 "--inject", "scale:1.01", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "reproduce: gradcheck --inject scale:1.01 --repro \"Sample(op='relu'" in out
    command = out.split("reproduce: gradcheck --inject scale:1.01 --repro ", 1)[1]
    import shlex
    case_text = shlex.split(command.split("\n")[0])[0]
    assert main(["--repro", case_text, "--no-progress"]) == 0      # no bug: passes
    assert main(["--repro", case_text, "--inject", "scale:1.01", "--no-progress"]) == 1


def test_random_cases_pass_on_correct_ops(capsys):
    assert main(["--op", "relu", "--random", "4", "--seed", "1", "--no-progress"]) == 0


# --- engines other than ours ----------------------------------------------------------

ABORT = "tests.gradcheck.abort_adapter:AbortAdapter"


def test_torch_engine_passes_and_says_what_it_ran(capsys):
    assert main(["--engine", "torch", "--op", "relu", "--op", "softmax", "--dtype", "f32",
                 "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "engine under test: torch 2." in captured.err
    assert "relu(type=f32,x=[3,4])" in captured.out and "FAIL" not in captured.out


def test_a_crashing_engine_gives_a_crash_row_with_its_repro_and_goes_on(tmp_path, capsys):
    from engine.registry import get_op
    from gradcheck.cotangents import registry_cases
    from reports import load_json
    from tests.gradcheck.abort_adapter import ASSERT_TEXT, CRASH_CASE
    path = tmp_path / "r.json"
    assert main(["--engine", ABORT, "--op", "relu", "--op", "softmax", "--dtype", "f64",
                 "--format", "json", "--output", str(path), "--no-progress"]) == 1
    doc = load_json(path.read_text())
    assert doc["meta"]["engine"].startswith("AbortAdapter")
    rows = {r["case"]: r for r in doc["results"]}
    crash = rows.pop(CRASH_CASE)
    assert crash["status"] == "crash" and "SIGABRT" in crash["message"]
    assert ASSERT_TEXT in crash["message"]
    assert crash["repro"] == f"gradcheck --engine {ABORT} --op relu -k '{CRASH_CASE}'"
    statuses = {(r["op"], r["status"]) for r in rows.values()}
    assert statuses == {("relu", "pass"), ("softmax", "unsupported")}
    relu_f64 = [c for c in registry_cases(get_op("relu")) if c.dtype == "f64"]
    assert doc["summary"]["crashed"] == 1 and doc["summary"]["passed"] == len(relu_f64) - 1
    assert all("only relu, not softmax" in r["message"] for r in rows.values()
               if r["op"] == "softmax")


def test_crash_row_in_the_table(capsys):
    from tests.gradcheck.abort_adapter import CRASH_CASE
    assert main(["--engine", ABORT, "--op", "relu", "--dtype", "f64", "-k", "x=[3,4]",
                 "--no-progress"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(CRASH_CASE))
    assert "CRASH" in row and f"gradcheck --engine {ABORT} --op relu -k" in row
    assert out.rstrip().endswith("1 crashed")


@pytest.mark.parametrize("engine, words", [
    ("tensorflow", "unknown engine 'tensorflow'"),
    ("no_such_module:Adapter", "cannot import no_such_module"),
    ("tests.gradcheck.abort_adapter:Missing", "has no attribute 'Missing'"),
])
def test_bad_engine_is_a_usage_error(engine, words, capsys):
    assert main(["--engine", engine, "--op", "relu"]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--engine", "torch", "--op", "relu", "--inject", "scale:1.01"],
    ["--engine", "torch", "--op", "relu", "--backend", "cpu"],
    ["--engine", "torch", "--self-test"],
    ["--engine", "torch", "--op", "relu", "--ggml-lib", "/tmp"],
    ["--op", "relu", "--ggml-lib", "/tmp"],
    ["--engine", ABORT, "--op", "relu", "--case-timeout", "0"],
])
def test_options_that_do_not_fit_the_engine_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "applies to" in err or "--case-timeout must be" in err


def test_random_cases_run_in_another_engine(capsys):
    assert main(["--engine", "torch", "--op", "relu", "--random", "3", "--seed", "0",
                 "-k", "no-sample", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "FAIL" not in out and "relu(type=" in out


def test_engine_repro_reruns_the_case(capsys):
    assert main(["--engine", "torch", "--repro",
                 "Sample(op='relu', inputs=(InputSpec(name='x', shape=(4,)),), dtype='f64')",
                 "--no-progress"]) == 0


@pytest.mark.parametrize("n", ["-1", "10001", "99999999999999999999999"])
def test_random_beyond_its_bounds_is_a_usage_error(n, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--op", "relu", "--random", n])
    assert exc.value.code == 2
    assert "--random must be a number of cases per op in [0, 10000]" in capsys.readouterr().err
