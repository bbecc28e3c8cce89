"""The compile progress line (checkkit.compiling): numba's "numba:compile" event, fired by
hand, is counted and named after the job running (else the kernel's module); a bar on a
terminal, a line per op with --progress elsewhere, nothing with --no-progress (but
counted); a real cached kernel shows it on its first run only."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import types

import numba.core.event as numba_event
import pytest

from checkkit.compiling import compile_progress, job_subject, kernel_group, watch_jobs
from checkkit.jobs import Job
from checkkit.options import compile_mode
from tests.cli_helpers import Tty


def kernel(module: str = "engine.backends.cpu.pool_2d", name: str = "max_pool"):
    func = types.FunctionType(compile("def f(): pass", "<k>", "exec").co_consts[0], {})
    func.__module__, func.__name__ = module, name
    return types.SimpleNamespace(py_func=func)


def fire(dispatcher) -> None:
    with numba_event.trigger_event("numba:compile", data={"dispatcher": dispatcher}):
        pass


def test_compilations_are_counted_and_named_one_line_per_op():
    stream = io.StringIO()
    jobs = [Job("relu(type=f64,x=[3])", lambda: [fire(kernel()), fire(kernel())], {"op": "relu"}),
            Job("adam: torch(type=f32)", lambda: [fire(kernel())], {}),
            Job("relu(type=f32,x=[3])", lambda: [fire(kernel())], {"op": "relu"})]
    with compile_progress("gradcheck", "lines", stream) as listener:
        watch_jobs(jobs, listener)
        for job in jobs:
            job.run()
        fire(kernel())                                   # outside any job: its module
    lines = stream.getvalue().splitlines()
    assert lines[:3] == ["gradcheck: compiling kernels for relu (first run only)…",
                         "gradcheck: compiling kernels for adam (first run only)…",
                         "gradcheck: compiling kernels for pool_2d (first run only)…"]
    assert lines[3].startswith("gradcheck: compiled 5 kernels in ") and len(lines) == 4
    assert listener.count == 5 and listener.subject is None


def test_a_terminal_gets_one_bar_and_nothing_without_compilations():
    tty = Tty()
    with compile_progress("optcheck", "bar", tty):
        fire(kernel("engine.backends.cpu.optim"))
    assert "optcheck: compiling kernels for optim (first run only)" in tty.getvalue()
    assert "optcheck: compiled 1 kernels in " in tty.getvalue()
    quiet = io.StringIO()
    with compile_progress("optcheck", "bar", quiet):
        pass
    with compile_progress("optcheck", None, quiet) as listener:
        fire(kernel())
    assert quiet.getvalue() == "" and listener.count == 1     # counted, never shown


def test_names_and_modes():
    assert kernel_group(kernel("engine.backends.cpu.rope")) == "rope"
    assert job_subject(Job("adam: torch(type=f32)", list, {"optimizer": "adam"})) == "adam"
    assert job_subject(Job("softmax(generated)", list, {})) == "softmax"
    args = types.SimpleNamespace(no_progress=False, progress=False)
    assert compile_mode(args) is None                       # stderr is pytest's capture
    args.progress = True
    assert compile_mode(args) == "lines"
    args.no_progress, args.progress = True, False
    assert compile_mode(args) is None


def test_a_cached_kernel_shows_the_line_on_its_first_run_only(tmp_path):
    script = tmp_path / "kern.py"
    script.write_text(textwrap.dedent("""
        import sys
        from numba import njit
        from checkkit.compiling import compile_progress

        @njit(cache=True)
        def twice(x):
            return 2 * x

        with compile_progress("gradcheck", "lines"):
            twice(3.0)
    """))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.getcwd()}
    runs = [subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=env, timeout=300) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0]
    assert runs[0].stderr.splitlines()[0] == \
        "gradcheck: compiling kernels for twice (first run only)…"
    assert "gradcheck: compiled 1 kernels in " in runs[0].stderr
    assert runs[1].stderr == ""


@pytest.mark.slow
@pytest.mark.parametrize("where", [["--isolate"], ["--workers", "1"]])
def test_a_worker_processs_compilations_show_on_the_command_line(tmp_path, where):
    env = {**os.environ, "GRADVERIFY_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.getcwd()}
    env.pop("NUMBA_CACHE_DIR", None)
    run = subprocess.run([sys.executable, "-m", "gradcheck.cli", "--op", "neg", "--dtype",
                          "f64", "--progress", "--no-torch", *where], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    # after the case bar's text on its line (a log's --progress shows both)
    assert any(line.endswith("gradcheck: compiling kernels for neg (first run only)…")
               for line in lines)
    assert any(line.startswith("gradcheck: compiled ") for line in lines)
