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
    assert "reproduce: gradcheck --repro" in out
    command = out.split("reproduce: gradcheck --repro ", 1)[1].split("\n")[0]
    import shlex
    case_text = shlex.split(command)[0]
    assert main(["--repro", case_text, "--no-progress"]) == 0      # no bug: passes
    assert main(["--repro", case_text, "--inject", "scale:1.01", "--no-progress"]) == 1


def test_random_cases_pass_on_correct_ops(capsys):
    assert main(["--op", "relu", "--random", "4", "--seed", "1", "--no-progress"]) == 0
