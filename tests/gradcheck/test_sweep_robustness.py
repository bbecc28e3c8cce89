"""A distributed run (`gradcheck --workers N`, `optcheck --workers N`, `pytest --gradcheck
-n N`) is as hermetic and as interruptible as a serial one.

- Nothing lying in the user's working directory runs: a conftest.py, a pytest.ini or
  pyproject.toml that would add options, a plugin named by PYTEST_PLUGINS, a module that
  shadows one the workers import (xdist starts them with `python -c`, which puts their
  working directory first on sys.path).
- Ctrl-C (SIGINT to the process group, as a terminal sends it) and SIGTERM (to the command
  alone, as a job scheduler sends it) end the run with 130 and 143, one line, the rows
  finished so far written and marked interrupted (JSON `meta.interrupted`, JUnit's
  `interrupted` property), and no worker process left behind.

Each test runs the command in a subprocess of its own session, in a directory of its own,
as a user would, with the console script (whose sys.path does not hold the working
directory: `python -m` would put it there on purpose).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
STRIPPED_ENV = ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
                "PYTEST_XDIST_TESTRUNUID", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_PLUGINS")
SMALL_CLI = ["--op", "relu", "--dtype", "f64", "--no-torch", "--no-progress"]

# what a hostile checkout holds: each file, if anything runs it, leaves a marker file
PLANTED = {
    "conftest.py": "open('ran-conftest', 'w').close()\n",
    "pytest.py": "open('ran-pytest-shadow', 'w').close()\n",
    "evil_plugin.py": "open('ran-plugin', 'w').close()\n",
    "pytest.ini": "[pytest]\naddopts = --definitely-not-an-option\n",
    "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '--definitely-not-an-option'\n",
    "tox.ini": "[pytest]\naddopts = --definitely-not-an-option\n",
}

# an engine (ours) whose VJP, after a worker's first three cases, marks the worker as busy
# (a file named after its pid) and sleeps: a run that is certainly mid-way when signalled
SLOW_ADAPTER = """
import os, time
from gradcheck.adapters import AdapterSpec
from gradcheck.adapters.engine_adapter import EngineAdapter

HERE = os.path.dirname(os.path.abspath(__file__))


class Slow(EngineAdapter):
    name = "slow"
    calls = 0

    def __init__(self):
        super().__init__("cpu")

    @property
    def spec(self):
        return AdapterSpec.of("slow_adapter:Slow", {})

    def describe(self):
        return "slow engine"

    def vjp_runs(self, case, arrays, weights, runs):
        Slow.calls += 1
        if Slow.calls > 3:
            open(os.path.join(HERE, f"busy-{os.getpid()}"), "w").close()
            time.sleep(600)
        return super().vjp_runs(case, arrays, weights, runs)
"""
SLOW = ["--engine", "slow_adapter:Slow"]


def _env(**extra) -> dict:
    return {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV} | extra


def _start(command, cwd, **extra) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=cwd, env=_env(**extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _busy_workers(cwd: Path, proc: subprocess.Popen, count: int = 2) -> list[int]:
    """The pids of the workers that sleep in Slow's VJP, once `count` of them do."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        busy = [int(p.name.removeprefix("busy-")) for p in cwd.glob("busy-*")]
        if len(busy) >= count:
            return busy
        if proc.poll() is not None:
            raise AssertionError(f"the run ended first: {proc.communicate()}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("no worker got busy in 240 s")


def _stop(proc: subprocess.Popen, how: str) -> tuple[str, str]:
    """Ctrl-C as a terminal sends it (SIGINT to the process group), or SIGTERM to the
    command alone; its output."""
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def _gone(pids) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


STATUS = {"ctrl-c": (130, "interrupted", "SIGINT"), "sigterm": (143, "terminated", "SIGTERM")}


# --- hermetic -----------------------------------------------------------------------------
@pytest.mark.parametrize("tool, args", [
    ("gradcheck", SMALL_CLI),
    ("optcheck", ["--opt", "sgd", "--family", "closed-form", "--dtype", "f64", "--steps", "3",
                  "--no-progress"]),
])
def test_workers_run_nothing_that_lies_in_the_working_directory(tmp_path, tool, args):
    for name, text in PLANTED.items():
        (tmp_path / name).write_text(text)
    proc = subprocess.run([str(BIN / tool), *args, "--workers", "2"], cwd=tmp_path,
                          env=_env(PYTEST_PLUGINS="evil_plugin",
                                   PYTEST_ADDOPTS="--definitely-not-an-option"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "passed" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PLANTED), \
        "the run left or ran something in the working directory"


def test_a_users_adapter_still_imports_from_the_working_directory(tmp_path):
    """The workers start elsewhere, but `--engine module:attr` names the user's module,
    which imports from their directory as in a serial run."""
    (tmp_path / "slow_adapter.py").write_text(SLOW_ADAPTER.replace("Slow.calls > 3",
                                                                   "False"))
    proc = subprocess.run([str(BIN / "gradcheck"), *SMALL_CLI, *SLOW, "--workers", "2"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "engine under test: slow engine" in proc.stderr and "passed" in proc.stdout


# --- interrupted --------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_stopped_distributed_run_writes_its_finished_rows(tmp_path, how):
    code, word, name = STATUS[how]
    (tmp_path / "slow_adapter.py").write_text(SLOW_ADAPTER)
    out = tmp_path / "out.json"
    out.write_text("the previous report\n")
    proc = _start([str(BIN / "gradcheck"), *SMALL_CLI, *SLOW, "--workers", "2",
                   "--format", "json", "--output", str(out)], tmp_path)
    workers = _busy_workers(tmp_path, proc)
    stdout, stderr = _stop(proc, how)
    assert proc.returncode == code, stderr
    lines = stderr.splitlines()
    assert lines[0] == "gradcheck: engine under test: slow engine"
    assert lines[1:] == [f"gradcheck: {word}; wrote the 6 rows finished so far to {out}"]
    doc = json.loads(out.read_text())
    assert doc["meta"]["interrupted"] is True and doc["meta"]["signal"] == name
    assert len(doc["results"]) == 6 and {r["status"] for r in doc["results"]} == {"pass"}
    assert _gone(workers), "a worker outlived the run"


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_stopped_plugin_run_marks_its_json_and_junit_files(tmp_path, how):
    code, word, name = STATUS[how]
    (tmp_path / "slow_adapter.py").write_text(SLOW_ADAPTER)
    out, junit = tmp_path / "out.json", tmp_path / "junit.xml"
    proc = _start([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--gradcheck",
                   "--gradcheck-op", "relu", "--gradcheck-dtype", "f64",
                   "--gradcheck-no-torch", "--gradcheck-engine", "slow_adapter:Slow",
                   "-n", "2", f"--gradcheck-json={out}", f"--junitxml={junit}"], tmp_path)
    workers = _busy_workers(tmp_path, proc)
    stdout, stderr = _stop(proc, how)
    assert proc.returncode == code, stdout + stderr
    assert f"gradcheck: {word}; wrote {out} (6 results finished before it, marked " \
           f"interrupted)" in stdout
    doc = json.loads(out.read_text())
    assert doc["meta"]["interrupted"] is True and doc["meta"]["signal"] == name
    assert len(doc["results"]) == 6
    xml = junit.read_text()
    assert '<property name="interrupted" value="true" />' in xml
    assert f'<property name="signal" value="{name}" />' in xml
    assert _gone(workers), "a worker outlived the run"


def test_sigterm_stops_a_serial_run_as_ctrl_c_does(tmp_path):
    (tmp_path / "slow_adapter.py").write_text(SLOW_ADAPTER)
    out = tmp_path / "out.json"
    proc = _start([str(BIN / "gradcheck"), *SMALL_CLI, *SLOW, "--format", "json",
                   "--output", str(out)], tmp_path)
    _busy_workers(tmp_path, proc, count=1)
    stdout, stderr = _stop(proc, "sigterm")
    assert proc.returncode == 143, stderr
    assert stderr.splitlines()[1:] == [f"gradcheck: terminated; wrote the 3 rows finished "
                                       f"so far to {out}"]
    doc = json.loads(out.read_text())
    assert doc["meta"]["interrupted"] is True and doc["meta"]["signal"] == "SIGTERM"


def test_optcheck_workers_stopped_early_exit_130_in_one_line(tmp_path):
    """optcheck's items are long family runs: stopped while its workers start, it leaves
    the previous output as it was, in one line."""
    out = tmp_path / "out.json"
    out.write_text("previous\n")
    proc = _start([str(BIN / "optcheck"), "--opt", "adam", "--steps", "2000",
                   "--no-progress", "--workers", "2", "--format", "json", "--output",
                   str(out)], tmp_path)
    time.sleep(4)
    stdout, stderr = _stop(proc, "ctrl-c")
    assert proc.returncode == 130, stderr
    assert len(stderr.splitlines()) == 1 and stderr.startswith("optcheck: interrupted"), stderr
    assert "Traceback" not in stderr
    if "left as it was" in stderr:
        assert out.read_text() == "previous\n"
    else:
        assert json.loads(out.read_text())["meta"]["interrupted"] is True

