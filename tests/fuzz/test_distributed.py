"""The distributed run (`gradcheck --workers`, `optcheck --workers`): hermetic and
interruptible, over drawn hostile working directories and drawn signals.

- hermetic: the working directory holds a drawn set of files that must not run or apply (a
  conftest.py; pytest.ini, tox.ini, setup.cfg or pyproject.toml adding an option; modules
  that shadow what the workers import; PYTEST_PLUGINS and PYTEST_ADDOPTS naming them).
  The run must pass as in a clean directory, nothing planted may run, and the directory
  must be left exactly as it was.
- interruptible: a drawn signal (Ctrl-C to the process group, SIGINT or SIGTERM to the
  command alone) after a drawn delay, from start-up to mid-run. The command must end within
  a bound with 130 (SIGINT) or 143 (SIGTERM), at most one line on stderr after its status
  lines, no traceback; its --output either left as it was or a complete JSON document
  marked interrupted; and no process it started left running. A signal that lands while
  the interpreter itself starts (INTERPRETER_START) may end it as the signal does.

Each case is a whole command in a subprocess of its own session (workers are processes:
the bounded child of the other surfaces cannot hold them), with a time bound.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz.checks import STATUS_LINES, _fail, fuzz_settings

pytestmark = pytest.mark.fuzz

BIN = Path(sys.executable).parent
RUN_TIMEOUT = 300.0
STRIPPED_ENV = ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
                "PYTEST_XDIST_TESTRUNUID", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_PLUGINS")
RUNS = {
    "gradcheck": ["--op", "relu", "--dtype", "f64", "--no-torch", "--no-progress"],
    "optcheck": ["--opt", "sgd", "--family", "closed-form", "--dtype", "f64", "--steps", "3",
                 "--no-progress"],
}
# a longer run to stop: long enough that a drawn delay lands before, during or near its end
LONG_RUNS = {
    "gradcheck": ["--op", "relu", "--op", "softmax", "--op", "pool_2d", "--no-progress"],
    "optcheck": ["--opt", "adam", "--steps", "500", "--no-progress"],
}
# modules the workers import early (a copy in their working directory would shadow them)
SHADOWED = ("pytest", "_pytest", "xdist", "execnet", "pluggy", "numpy", "json", "random",
            "tempfile", "engine", "gradcheck", "reports", "hypothesis", "tabulate")
CONFIG_FILES = {
    "pytest.ini": "[pytest]\naddopts = {opt}\n",
    "tox.ini": "[pytest]\naddopts = {opt}\n",
    "setup.cfg": "[tool:pytest]\naddopts = {opt}\n",
    "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '{opt}'\n",
}
HOSTILE_OPTIONS = ("--definitely-not-an-option", "-p no:xdist", "--pdb", "-x --maxfail=0",
                   "--collect-only", "-p evil_plugin", "--basetemp=/")


def _env(**extra) -> dict:
    return {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV} | extra


def _marker_code(name: str) -> str:
    return f"open({name!r}, 'w').close()\n"


@st.composite
def hostile_dirs(draw):
    """{file name: text} of a hostile working directory, and extra environment."""
    files = {}
    if draw(st.booleans()):
        files["conftest.py"] = _marker_code("ran-conftest")
    for name in draw(st.sets(st.sampled_from(sorted(CONFIG_FILES)), max_size=4)):
        files[name] = CONFIG_FILES[name].format(opt=draw(st.sampled_from(HOSTILE_OPTIONS)))
    for module in draw(st.sets(st.sampled_from(SHADOWED), max_size=4)):
        files[f"{module}.py"] = _marker_code(f"ran-{module}")
    env = {}
    if draw(st.booleans()):
        files["evil_plugin.py"] = _marker_code("ran-plugin")
        env["PYTEST_PLUGINS"] = "evil_plugin"
    if draw(st.booleans()):
        env["PYTEST_ADDOPTS"] = draw(st.sampled_from(HOSTILE_OPTIONS))
    return files, env


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def _fresh(env, name: str) -> Path:
    where = Path(env.cases) / f"{name}-{time.monotonic_ns()}"
    where.mkdir()
    return where


@fuzz_settings(short=2, long=12)
@given(tool=st.sampled_from(sorted(RUNS)), hostile=hostile_dirs(),
       workers=st.integers(1, 2))
def test_hostile_working_directories(fuzz_env, tool, hostile, workers):
    files, extra = hostile
    surface = f"distributed:hermetic:{tool}"
    fuzz_env.count(surface)
    where = _fresh(fuzz_env, "hermetic")
    for name, text in files.items():
        (where / name).write_text(text)
    before = _snapshot(where)
    argv = [*RUNS[tool], "--workers", str(workers)]
    shown = (tool, argv, sorted(files), extra)
    try:
        proc = subprocess.run([str(BIN / tool), *argv], cwd=where, env=_env(**extra),
                              capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        _fail(fuzz_env, surface, f"hang: no end in {RUN_TIMEOUT} s", shown)
    if proc.returncode != 0 or "passed" not in proc.stdout:
        _fail(fuzz_env, surface, f"exit {proc.returncode}: {proc.stderr[-300:]!r}", shown)
    after = _snapshot(where)
    if after != before:
        ran = sorted(set(after) - set(before))
        _fail(fuzz_env, surface, f"the working directory changed: {ran or 'a file edited'}",
              shown)


def _children(pid: int) -> set[int]:
    """Every live descendant of `pid` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pids) -> set[int]:
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.add(pid)
        except OSError:
            pass
    return out


PREVIOUS = b"the previous report\n"
# a signal in the first moments, while the interpreter itself starts (before any code of
# ours, or Python's own SIGINT handler, is there: site.py, the .pth files), ends the process
# as the signal does, and CPython may print its own traceback: no program can answer it;
# after this many seconds, or with a frame of ours in the traceback, it is an error
INTERPRETER_START = 0.5
# a traceback through a module of ours: the signal reached code that must answer it
OUR_CODE = re.compile(r"(engine|gradcheck|optcheck|reports|mnist_target)/\w+\.py")


@fuzz_settings(short=2, long=16)
@given(tool=st.sampled_from(sorted(LONG_RUNS)),
       how=st.sampled_from(["ctrl-c", "sigint", "sigterm"]),
       delay=st.one_of(st.floats(0.0, 3.0), st.floats(3.0, 25.0)),
       workers=st.integers(1, 2))
@example(tool="gradcheck", how="ctrl-c", delay=12.0, workers=2)    # mid-run, every run
@example(tool="optcheck", how="sigterm", delay=10.0, workers=2)
def test_stopped_distributed_runs(fuzz_env, tool, how, delay, workers):
    surface = f"distributed:stop:{tool}"
    fuzz_env.count(surface)
    fuzz_env.count(f"{surface}:{how}")
    where = _fresh(fuzz_env, "stop")
    out = where / "out.json"
    out.write_bytes(PREVIOUS)
    argv = [*LONG_RUNS[tool], "--workers", str(workers), "--format", "json", "--output",
            str(out)]
    shown = (tool, how, round(delay, 2), argv)
    proc = subprocess.Popen([str(BIN / tool), *argv], cwd=where, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    time.sleep(delay)
    started = _children(proc.pid)
    sent = signal.SIGTERM if how == "sigterm" else signal.SIGINT
    try:
        if how == "ctrl-c":
            os.killpg(proc.pid, sent)
        else:
            proc.send_signal(sent)
    except ProcessLookupError:
        pass
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        _fail(fuzz_env, surface, "hang: no end 120 s after the signal", shown)
    rc = proc.returncode
    fuzz_env.count(f"{surface} exit {rc}")
    if delay < INTERPRETER_START and out.read_bytes() == PREVIOUS and rc != 0 \
            and not OUR_CODE.search(stderr):
        fuzz_env.count(f"{surface}: ended by the signal while Python started")
        return
    if "Traceback" in stderr:
        _fail(fuzz_env, surface, f"traceback, exit {rc}", (shown, stderr[-1200:]))
    finished = rc in (0, 1)        # the run ended before the signal came
    expected = {signal.SIGINT: 130, signal.SIGTERM: 143}[sent]
    if not finished and rc != expected:
        _fail(fuzz_env, surface, f"exit status {rc}", (shown, stderr[-500:]))
    lines = [line for line in stderr.splitlines() if line.strip()
             and not STATUS_LINES.match(line)]
    if len(lines) > 1:
        _fail(fuzz_env, surface, f"{len(lines)} stderr lines (first: {lines[0][:80]!r})",
              (shown, stderr[-800:]))
    data = out.read_bytes()
    if data != PREVIOUS:
        try:
            doc = json.loads(data)
        except ValueError:
            _fail(fuzz_env, surface, "the output is neither the old file nor a JSON document",
                  shown)
        if not finished and doc.get("meta", {}).get("interrupted") is not True:
            _fail(fuzz_env, surface, "a stopped run's output is not marked interrupted", shown)
        fuzz_env.count(f"{surface}: rows written")
    elif finished:
        _fail(fuzz_env, surface, "a finished run did not write its output", shown)
    deadline = time.monotonic() + 15
    while _alive(started) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _alive(started)
    if left:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        _fail(fuzz_env, surface, f"{len(left)} process(es) left running", shown)
