"""The gradcheck CLI: verdicts, exit codes, injected bugs caught."""

from __future__ import annotations

import pytest

from gradcheck.cli import main
from tests.gradcheck.user_adapter import adapter_source, write_module


def test_relu_passes(capsys):
    assert main(["--op", "relu", "--no-progress", "--show", "all"]) == 0
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
    assert main(["--op", "relu", "--inject", "flip"]) == 2
    assert capsys.readouterr().err.startswith("gradcheck: unknown mutation 'flip'")


def test_list(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("pool_2d", "conv_2d", "cross_entropy_loss", "argmax", "im2col_back"):
        assert name in out
    # which dtypes each op's cases come in
    cast = next(line for line in out.splitlines() if line.startswith("cast "))
    assert "f16,bf16,f32,f64" in cast


def test_filter_and_dtype(capsys):
    assert main(["--op", "sum", "--dtype", "f64", "-k", "x=[3,4]", "--no-progress",
                 "--show", "all"]) == 0
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
    from tests.cli_helpers import assert_unwritable_output_refused
    assert_unwritable_output_refused(main, ["--op", "relu"], tmp_path, capsys)


def test_empty_output_is_a_usage_error_not_stdout(capsys):
    from tests.cli_helpers import assert_empty_output_refused
    assert_empty_output_refused(main, ["--op", "relu"], capsys, "gradcheck")


def test_existing_output_survives_a_failed_run(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("previous")
    assert main(["--op", "nope", "--output", str(path)]) == 2
    assert path.read_text() == "previous"


@pytest.mark.parametrize("argv", [["--op", "relu", "--random", "-3"],
                                  ["--op", "relu", "--random", "many"],
                                  ["--op", "relu", "--backend", "tpu"]])
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
                 "--no-progress", "--show", "all"]) == 0
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
                 "--no-progress", "--verbose"]) == 1
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
    ["--engine", "torch", "--op", "relu", "--inject", "relu_grad_scaled"],
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
    assert "applies to" in err or "--case-timeout must be" in err or \
        "a named mutant patches our engine" in err


def test_random_cases_run_in_another_engine(capsys):
    assert main(["--engine", "torch", "--op", "relu", "--random", "3", "--seed", "0",
                 "-k", "no-sample", "--no-progress", "--show", "all"]) == 0
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


# --- bad input: one line on stderr, exit 2, never a traceback ------------------------------

def _one_line_usage_error(argv, capsys) -> str:
    """main(argv)'s one stderr line, asserting exit 2, nothing on stdout, no traceback."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith("gradcheck: ") and not captured.out
    return lines[0]


RELU_X = "Sample(op='relu', inputs=(InputSpec(name='x', shape={shape}),){rest})"


BAD_REPROS = [
    ("", "--repro: empty case: expected Sample(op='NAME', inputs="),
    ("   ", "--repro: empty case"),
    ("Sample(op='relu', inputs=5)", "Sample field 'inputs' must be a tuple of InputSpec(...), "
                                    "got 5"),
    ("Sample(op='relu', inputs=__import__('os'))", "only Sample(...) and InputSpec(...) may be "
                                                   "called, not __import__(...)"),
    ("not a case", "not Python syntax"),
    ("1x", "not Python syntax"),
    ("-" * 50_000 + "1", "at most 10000 are read"),
    ("-" * 9_000 + "1", "nested too deeply"),
    ("(" * 5_000 + ")" * 5_000, "too many nested parentheses"),
    ("Sample(op='relu')", "Sample needs inputs"),
    ("Sample(op='pool3d', inputs=())", "unknown op 'pool3d'"),
    (RELU_X.format(shape="(4,)", rest=", dtype='i32'"),
     "relu: dtype 'i32' is not one gradcheck runs; known: f16, bf16, f32, f64"),
    (RELU_X.format(shape="(-4,)", rest=""),
     "InputSpec field 'shape' must be a tuple of whole numbers >= 0, got (-4,)"),
    (RELU_X.format(shape="(10**9,)", rest=""), "'10 ** 9' is not a literal"),
    (RELU_X.format(shape="(1000000000, 1000)", rest=""),
     "relu: the inputs hold 1000000000000 elements; at most 67108864 are checked"),
    ("Sample(op='relu', inputs=(InputSpec(name='x', shape=(4,)), InputSpec(name='y', "
     "shape=(4,))))", "relu takes 1 input (x), got 2"),
    (RELU_X.format(shape="(4,)", rest=", foo=1"), "Sample has no field 'foo'"),
    ("Sample(op='pool_2d', inputs=(InputSpec(name='x', shape=(1, 1, 4, 4)),), params=(("
     "'kernel', (0, 0)), ('mode', 'max'), ('padding', (0, 0)), ('stride', (1, 1))))",
     "pool_2d refuses this case: pool_2d: kernel must be positive, got [0, 0]"),
    ("Sample(op='repeat', inputs=(InputSpec(name='x', shape=(1,)),), params=(('shape', "
     "(100000, 100000)),))", "repeat: the output would hold 10000000000 elements"),
]


@pytest.mark.parametrize("text, words", BAD_REPROS, ids=[w[:40] for _, w in BAD_REPROS])
def test_a_bad_repro_is_one_clear_usage_line(text, words, capsys):
    line = _one_line_usage_error([f"--repro={text}", "--no-progress"], capsys)
    assert words in line and "<ast." not in line and "0x" not in line


@pytest.mark.parametrize("body, words", [
    ("def broken(:\n", "importing gv_bad_0 raised SyntaxError: "),
    ("raise RuntimeError('no GPU here')\n", "importing gv_bad_1 raised RuntimeError: no GPU here"),
    ("1 / 0\n", "importing gv_bad_2 raised ZeroDivisionError: division by zero"),
    ("import sys\nsys.exit(3)\n", "importing gv_bad_3 raised SystemExit (sys.exit(3))"),
    (adapter_source(init="raise OSError('no device')"), "cannot be set up: OSError: no device"),
    (adapter_source(init="raise SystemExit(4)"), "cannot be set up: SystemExit (sys.exit(4))"),
    (adapter_source(describe="raise KeyError('version')"), "describe() raised KeyError: 'version'"),
    ("def __getattr__(name):\n    raise RuntimeError('lazy load failed')\n",
     "getting 'A' from gv_bad_7 raised RuntimeError: lazy load failed"),
])
def test_a_broken_user_adapter_is_one_usage_line(body, words, tmp_path, monkeypatch,
                                                 capsys, request):
    index = request.node.callspec.indices["body"]
    engine = write_module(tmp_path, monkeypatch, f"gv_bad_{index}", body)
    line = _one_line_usage_error(["--engine", engine, "--op", "relu", "--no-progress"],
                                 capsys)
    assert f"engine '{engine}'" in line and words in line


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1e3"])
def test_a_bad_thread_setting_is_one_usage_line(value, monkeypatch, capsys):
    monkeypatch.setenv("GRADVERIFY_THREADS", value)
    line = _one_line_usage_error(["--op", "relu", "--no-progress"], capsys)
    assert line == (
        f"gradcheck: GRADVERIFY_THREADS must be a whole number in [1, 512], got {value!r}")


def test_a_bad_parallel_setting_is_one_usage_line(monkeypatch, capsys):
    monkeypatch.setenv("GRADVERIFY_PARALLEL", "sometimes")
    assert "GRADVERIFY_PARALLEL must be 1 or 0" in _one_line_usage_error(["--list"], capsys)


@pytest.mark.parametrize("value", ["many", "-1", "65"])
def test_a_bad_compile_ahead_setting_is_one_usage_line(value, monkeypatch, capsys):
    monkeypatch.setenv("GRADVERIFY_COMPILE_AHEAD", value)
    line = _one_line_usage_error(["--op", "relu", "--no-progress"], capsys)
    assert line == (f"gradcheck: GRADVERIFY_COMPILE_AHEAD must be a number of helper "
                    f"processes in [0, 64] (0 or off: none), got {value!r}")


def test_a_bad_share_setting_is_one_usage_line(monkeypatch, capsys):
    monkeypatch.setenv("GRADVERIFY_SHARE", "2")
    line = _one_line_usage_error(["--op", "relu", "--no-progress"], capsys)
    assert line == ("gradcheck: GRADVERIFY_SHARE must be auto (the default), 0/off (no "
                    "sharing helper) or 1/on (whatever the load), got '2'")


def test_a_ggml_lib_that_is_a_file_says_so(tmp_path, capsys):
    path = tmp_path / "libggml-base.so"
    path.write_text("not a directory")
    line = _one_line_usage_error(["--engine", "ggml", "--ggml-lib", str(path), "--op",
                                  "relu"], capsys)
    assert f"--ggml-lib {path} is a file, not a directory" in line
    assert "does not exist" not in line


def test_a_ggml_lib_directory_without_ggml_says_what_it_lacks(tmp_path, capsys):
    line = _one_line_usage_error(["--engine", "ggml", "--ggml-lib", str(tmp_path), "--op",
                                  "relu"], capsys)
    assert "lacks libggml-base.so and libggml-cpu.so" in line


def test_a_missing_ggml_lib_directory_says_it_does_not_exist(tmp_path, capsys):
    line = _one_line_usage_error(["--engine", "ggml", "--ggml-lib", str(tmp_path / "no"),
                                  "--op", "relu"], capsys)
    assert "does not exist" in line


# --- Ctrl-C: one line, exit 130, the finished rows kept ------------------------------------

def _interrupt_after(monkeypatch, n: int):
    """Ctrl-C (a KeyboardInterrupt) in the check of the (n+1)-th case."""
    import gradcheck.runner as runner
    from tests.cli_helpers import interrupt_after
    interrupt_after(monkeypatch, runner, "check_case", n)


def test_ctrl_c_in_a_sweep_writes_the_finished_rows_and_exits_130(tmp_path, monkeypatch,
                                                                  capsys):
    from reports import load_json
    path = tmp_path / "r.json"
    _interrupt_after(monkeypatch, 2)
    assert main(["--op", "relu", "--format", "json", "--output", str(path),
                 "--no-progress"]) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"gradcheck: interrupted; wrote the 2 rows finished so far to {path}"
    doc = load_json(path.read_text())
    assert len(doc["results"]) == 2 and doc["meta"]["interrupted"] is True


def test_ctrl_c_before_any_row_leaves_the_output_as_it_was(tmp_path, monkeypatch, capsys):
    path = tmp_path / "r.txt"
    path.write_text("previous")
    _interrupt_after(monkeypatch, 0)
    assert main(["--op", "relu", "--output", str(path), "--no-progress"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"gradcheck: interrupted before any row finished; {path} left as it was")
    assert path.read_text() == "previous"


def test_ctrl_c_in_generated_cases_keeps_the_registry_rows(tmp_path, monkeypatch, capsys):
    import gradcheck.generated as generated
    import gradcheck.runner as runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(generated, "generated_results", interrupted)
    path = tmp_path / "r.json"
    assert main(["--op", "relu", "--dtype", "f64", "-k", "x=[3,4]", "--random", "3",
                 "--format", "json", "--output", str(path), "--no-progress"]) == 130
    from reports import load_json
    registry_rows = len(runner.select_samples(["relu"], "f64", "x=[3,4]"))
    assert f"wrote the {registry_rows} rows finished so far" in capsys.readouterr().err
    assert len(load_json(path.read_text())["results"]) == registry_rows


def test_ctrl_c_anywhere_else_is_one_line(monkeypatch, capsys):
    from gradcheck.request import GradcheckRequest

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(GradcheckRequest, "make_adapter", interrupted)
    assert main(["--op", "relu"]) == 130
    assert capsys.readouterr().err == "gradcheck: interrupted\n"
