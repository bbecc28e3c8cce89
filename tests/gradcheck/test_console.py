"""The console scripts' entry points (each tool's console module, around
checkkit.console.launch), run as the scripts run them: in a process of their own, for what
only a process shows (imports, signals, the environment)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.console_scripts import script_call

# patches gradcheck.runner.check_case: the first case runs, then "CASE-DONE" is printed and
# the second case sleeps (a slow case to press Ctrl-C in)
SLOW_SECOND_CASE = """
import sys, time
import gradcheck.runner as runner
real, calls = runner.check_case, []
def check_case(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        print("CASE-DONE", file=sys.stderr, flush=True)
        time.sleep(60)
    return real(*args, **kwargs)
runner.check_case = check_case
"""

# an import of gradcheck.cli that prints "IMPORTING" and sleeps (a slow import)
SLOW_IMPORT = """
import importlib.abc, sys, time
class Slow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "gradcheck.cli":
            print("IMPORTING", file=sys.stderr, flush=True)
            time.sleep(60)
        return None
sys.meta_path.insert(0, Slow())
"""


def _script(prelude: str, tool: str, argv) -> str:
    return prelude + textwrap.dedent(f"""
        sys.argv = [{tool!r}, *{list(argv)!r}]
        """) + script_call(tool)


def _interrupt_at(marker: str, code: str, env=None, sig=signal.SIGINT):
    """Run `code`, press Ctrl-C (send `sig`, default SIGINT) once `marker` is on its stderr;
    (status, the stderr lines after the marker)."""
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        for line in proc.stderr:
            if line.strip() == marker:
                break
        proc.send_signal(sig)
        rest = proc.stderr.read()
        status = proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.stderr.close()
    return status, rest.splitlines()


def test_ctrl_c_in_a_sweep_exits_130_with_one_line_and_the_finished_row(tmp_path):
    out = tmp_path / "r.json"
    status, err = _interrupt_at("CASE-DONE", _script(SLOW_SECOND_CASE, "gradcheck", [
        "--op", "relu", "--dtype", "f64", "--no-torch", "--no-progress", "--format", "json",
        "--output", str(out)]))
    assert status == 130
    assert err == [f"gradcheck: interrupted; wrote the 1 row finished so far to {out}"]
    doc = json.loads(out.read_text())
    assert len(doc["results"]) == 1 and doc["meta"]["interrupted"] is True


def test_ctrl_c_while_importing_exits_130_with_one_line():
    status, err = _interrupt_at("IMPORTING", _script(SLOW_IMPORT, "gradcheck", ["--list"]))
    assert (status, err) == (130, ["gradcheck: interrupted"])


@pytest.mark.parametrize("tool", ["gradcheck", "optcheck", "mnist_train"])
def test_sigterm_while_importing_exits_143_with_one_line(tool):
    """SIGTERM's default action would end the process with nothing said."""
    status, err = _interrupt_at("IMPORTING", _script(
        SLOW_IMPORT.replace("gradcheck.cli", "optcheck.cli" if tool == "optcheck" else
                            "mnist_target.cli" if tool == "mnist_train" else "gradcheck.cli"),
        tool, []), sig=signal.SIGTERM)
    assert (status, err) == (143, [f"{tool.replace('_', '-')}: terminated"])


def test_sigterm_in_a_sweep_exits_143_with_the_finished_row(tmp_path):
    out = tmp_path / "r.json"
    status, err = _interrupt_at("CASE-DONE", _script(SLOW_SECOND_CASE, "gradcheck", [
        "--op", "relu", "--dtype", "f64", "--no-torch", "--no-progress", "--format", "json",
        "--output", str(out)]), sig=signal.SIGTERM)
    assert status == 143
    assert err == [f"gradcheck: terminated; wrote the 1 row finished so far to {out}"]
    doc = json.loads(out.read_text())
    assert doc["meta"]["interrupted"] is True and doc["meta"]["signal"] == "SIGTERM"


@pytest.mark.parametrize("script, argv, tool", [("gradcheck", ["--op", "relu"], "gradcheck"),
                                                ("optcheck", ["--opt", "sgd"], "optcheck"),
                                                ("mnist_eval", ["model.gguf"], "mnist-eval")])
def test_a_bad_thread_setting_is_one_line_from_the_console_script(script, argv, tool):
    env = dict(os.environ, GRADVERIFY_THREADS="abc")
    done = subprocess.run([sys.executable, "-c", _script("import sys\n", script, argv)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == (
        f"{tool}: GRADVERIFY_THREADS must be a whole number in [1, 512], got 'abc'\n")


def test_random_cases_leave_nothing_in_the_working_directory(tmp_path):
    """hypothesis, which draws --random's cases, used to create ./.hypothesis."""
    cwd, cache = tmp_path / "work", tmp_path / "cache"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env["XDG_CACHE_HOME"] = str(cache)
    done = subprocess.run([sys.executable, "-c", _script("import sys\n", "gradcheck", [
        "--op", "relu", "--dtype", "f64", "--random", "10", "--no-torch", "--no-progress"])],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert list(cwd.iterdir()) == []
    assert (cache / "gradverify" / "hypothesis").is_dir()


def test_an_unwritable_numba_cache_is_one_warning_line_and_the_tool_runs(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(a_file / "cache"))
    done = subprocess.run([sys.executable, "-c", _script("import sys\n", "gradcheck",
                                                         ["--list"])],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "pool_2d" in done.stdout
    assert done.stderr.startswith(f"gradcheck: warning: NUMBA_CACHE_DIR '{a_file / 'cache'}' "
                                  "cannot be written; using ")
    assert len(done.stderr.splitlines()) == 1
