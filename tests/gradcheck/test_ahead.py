"""Compiling ahead (checkkit.ahead): once a run compiles, a helper process runs the run's
last jobs, block by block from the end, until it meets the run, and reports its
compilations to the run's progress line; a run that compiles nothing starts none; a helper
stops where the cache is warm, and runs nothing when its plan is not the run's. Worker
processes (an isolated engine's) report their compilations to the run's line too."""

from __future__ import annotations

import contextlib
import io
import os
import types

import numba.core.event as numba_event
import pytest

from checkkit import ahead
from checkkit.ahead import Ahead, blocks, compiling_ahead, environment_problem, helper_count
from checkkit.compiling import EVENT, Reporter, compile_progress, watch_jobs
from checkkit.jobs import Job
from checkkit.loading import AdapterSpec
from checkkit.worker import Worker
from tests.gradcheck.ahead_jobs import MarkingRequest, fire, marks


def run(request, jobs=None, helpers=1, **options):
    """The request's jobs run in order in this process, compiling ahead with `helpers`
    (any number of jobs left starts them); the run waits after its first block until the
    helpers have stopped by themselves, so that what they ran does not depend on the
    machine's load. (its rows, the listener, the jobs each process ran, the helpers' exit
    codes, what was shown)."""
    jobs = request.plan().jobs if jobs is None else jobs
    stream = io.StringIO()
    with compile_progress("marking", "lines", stream) as listener:
        watch_jobs(jobs, listener)
        with compiling_ahead(request, jobs, listener, helpers=helpers, min_jobs=0,
                             **options) as run_ahead:
            first = blocks(jobs)[0]
            rows = [row for job in jobs[:first.stop] for row in job.run()]
            for proc in run_ahead.procs:
                proc.join(120)
            codes = [proc.exitcode for proc in run_ahead.procs]
            rows += [row for job in jobs[first.stop:] for row in job.run()]
    return rows, listener, marks(request.log), codes, stream.getvalue()


def test_blocks_are_runs_of_one_subject():
    jobs = [Job(name, list, {"op": name[:1]}) for name in ("r1", "r2", "s1", "r3")]
    assert blocks(jobs) == [range(0, 2), range(2, 3), range(3, 4)]
    assert blocks([]) == []


def test_a_helper_runs_blocks_ahead_of_the_run_leaving_it_the_next(tmp_path):
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid())
    rows, listener, by_pid, codes, shown = run(request)
    assert rows == list(range(30))                   # the run's own rows, all of them
    assert by_pid.pop(os.getpid()) == list(range(30))  # the run ran every job itself
    assert codes == [0]
    # the run finished block 0: the helper leaves it block 1 and takes the second block
    # not taken after it, each in order, until none is left
    assert list(by_pid.values()) == [[i for b in (15, 20, 25, 10) for i in range(b, b + 5)]]
    assert ahead.GAP == 1
    assert listener.ahead == 20 and listener.count == 30 + 20
    assert shown.splitlines()[-1].startswith("marking: compiled 50 kernels in ")
    assert "20 of them ahead of the run in helper processes" in shown


class _Array(list):
    def get_lock(self):
        return contextlib.nullcontext()


def test_a_helper_leaves_the_rest_of_a_block_the_run_has_reached(tmp_path):
    request = MarkingRequest(str(tmp_path / "marks"), -1)
    jobs = request.plan().jobs
    position, claimed = types.SimpleNamespace(value=12), _Array([0] * 6)
    reporter = Reporter(None, "")                # counts the jobs' compilations

    def caught_up(inner=jobs[22].run):       # the run gets to job 22 meanwhile
        position.value = 22
        return inner()
    jobs[22].run = caught_up
    with numba_event.install_listener(EVENT, reporter):
        ahead._run_blocks(jobs, position, claimed, reporter, os.getppid())
    # the run is in block 2: block 3 left to it, block 4 taken until the run got there,
    # then block 5, the one block left ahead of the run
    assert marks(request.log)[os.getpid()] == [20, 21, 22, 25, 26, 27, 28, 29]
    assert claimed == [0, 0, 0, 0, 1, 1] and reporter.subject == "op5"
    open(request.log, "w").close()
    position.value, claimed[:] = 4, [0] * 6
    ahead._run_blocks(jobs, position, claimed, reporter, -1)
    assert marks(request.log) == {}               # the run's process is gone: nothing


def test_no_helper_starts_while_nothing_compiles(tmp_path):
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), compiles=False,
                             delay=0.0)
    rows, listener, by_pid, codes, shown = run(request)
    assert list(by_pid) == [os.getpid()] and codes == [] and listener.count == 0
    assert shown == ""


def test_a_helper_stops_after_cpu_time_without_a_compilation(tmp_path):
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), compiles=False)
    jobs = request.plan().jobs

    def compiling_first(inner=jobs[0].run):     # the run compiles; the helper does not
        fire()
        return inner()
    jobs[0].run = compiling_first
    rows, listener, by_pid, codes, _ = run(request, jobs, quiet_seconds=0.0)
    assert rows == list(range(30)) and codes == [0]
    by_pid.pop(os.getpid())
    assert list(by_pid.values()) == [[15]] and listener.ahead == 0


def test_a_helper_whose_plan_is_not_the_runs_runs_nothing(tmp_path):
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), delay=0.1)
    jobs = request.plan().jobs
    jobs[3].name = "another(case=3)"
    rows, listener, by_pid, codes, _ = run(request, jobs)
    assert list(by_pid) == [os.getpid()] and codes == [0] and listener.ahead == 0


@pytest.mark.parametrize("value, helpers", [("", 1), ("default", 1), ("0", 0),
                                             ("off", 0), ("2", 2), (" 64 ", 64)])
def test_the_setting_says_how_many_helpers(monkeypatch, value, helpers):
    from engine.backends.cpu import environment
    monkeypatch.setattr(environment, "default_threads", lambda: 2)
    monkeypatch.setenv("GRADVERIFY_COMPILE_AHEAD", value)
    assert helper_count() == helpers and environment_problem() is None


def test_one_core_starts_no_helper(monkeypatch, tmp_path):
    from engine.backends.cpu import environment
    monkeypatch.delenv("GRADVERIFY_COMPILE_AHEAD", raising=False)
    monkeypatch.setattr(environment, "default_threads", lambda: 1)
    assert helper_count() == 0
    monkeypatch.setattr(environment, "default_threads", lambda: 64)
    assert helper_count() == ahead.MAX_HELPERS
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), delay=0.0)
    monkeypatch.setattr(environment, "default_threads", lambda: 1)
    with compile_progress("marking", None) as listener:
        jobs = request.plan().jobs
        run_ahead = Ahead(request, jobs, listener, min_jobs=0)
        for job in jobs:
            job.run()
        assert run_ahead.procs == [] and listener.count == 30
        run_ahead.close()


@pytest.mark.parametrize("block, min_jobs", [(5, 30), (30, 0)])
def test_too_few_jobs_ahead_start_no_helper(tmp_path, block, min_jobs):
    # 25 jobs in the blocks after the run's next job, fewer than 30; one op: no block after
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), block=block, delay=0.0)
    with compile_progress("marking", None) as listener:
        jobs = request.plan().jobs
        with compiling_ahead(request, jobs, listener, helpers=1,
                             min_jobs=min_jobs) as run_ahead:
            for job in jobs:
                job.run()
            assert run_ahead.procs == [] and listener.count == 30


@pytest.mark.parametrize("mode", ["lines", None])
def test_a_worker_process_reports_its_compilations(mode):
    stream = io.StringIO()
    spec = AdapterSpec("compiling", (), "tests.gradcheck.ahead_jobs:make")
    with compile_progress("gradcheck", mode, stream) as listener:
        with Worker(spec) as worker:              # started inside: it is told the log
            watch = Job("relu(type=f32)", lambda: [worker.call("vjp"), worker.call("vjp")],
                        {"op": "relu"})
            watch_jobs([watch], listener)
            assert watch.run() == ["done", "done"]
            worker.call("vjp")                    # outside a job: the kernel's module
    assert listener.count == 3 and listener.ahead == 0
    if mode:
        assert stream.getvalue().splitlines()[:2] == [
            "gradcheck: compiling kernels for relu (first run only)…",
            "gradcheck: compiling kernels for rope (first run only)…"]
    else:
        assert stream.getvalue() == ""


def test_gradchecks_helpers_run_the_same_jobs_more_cheaply():
    from checkkit.ahead import names_digest
    from gradcheck.request import GradcheckRequest
    request = GradcheckRequest(op=("relu", "softmax"), random=2)
    cheap = request.ahead()
    assert (cheap.no_torch, cheap.mode) == (True, "fast") and request.mode == "auto"
    with request.plan() as plan, cheap.plan() as cheap_plan:
        assert names_digest(plan.jobs) == names_digest(cheap_plan.jobs)
        assert len(plan.jobs) > 100
