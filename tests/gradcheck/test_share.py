"""Sharing a large run's jobs (checkkit.share): a helper process takes jobs one at a time
from the end and hands their rows back; the run's rows are the same, in order, wherever
a job ran; a job that fails in the helper, or a helper whose plan is not the run's, leaves
the work to the run; only a large run where a core is idle starts one."""

from __future__ import annotations

import os
import time

import pytest

from checkkit import share
from checkkit.share import (
    HELPER,
    SENT,
    environment_problem,
    idle_cores,
    share_helpers,
    sharing,
)
from engine.backends.cpu import environment
from gradcheck.request import GradcheckRequest
from tests.gradcheck.ahead_jobs import MarkingRequest, marks


def shared_run(request, jobs=None, wait_for=1):
    """The request's jobs run in order in this process, sharing with one helper; before
    the first, the run waits (up to a minute) until the helper has sent `wait_for` jobs'
    rows, so that what the helper ran does not depend on the machine's load. (rows, the
    jobs each process ran, the Sharing.)"""
    jobs = request.plan().jobs if jobs is None else jobs
    with sharing(request, jobs, helpers=1) as shared:
        deadline = time.monotonic() + 60
        while (sum(s == SENT for s in shared.state[:]) < wait_for
               and time.monotonic() < deadline and shared.proc.is_alive()):
            time.sleep(0.05)
        rows = [row for job in jobs for row in job.run()]
    return rows, marks(request.log), shared


def test_the_run_takes_the_helpers_rows_in_their_place(tmp_path):
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), n=30, block=5,
                             compiles=False, delay=0.0, delay_elsewhere=0.2)
    rows, by_pid, shared = shared_run(request, wait_for=3)
    assert rows == list(range(30))                   # every job's rows, in order
    mine = by_pid.pop(os.getpid())
    [theirs] = by_pid.values()
    # the helper went back from the end, one job after the other; the run forward from the
    # start; at most the job where they met ran in both
    assert theirs == list(range(29, 29 - len(theirs), -1)) and len(theirs) >= 3
    assert mine == list(range(len(mine)))
    assert len(set(mine) & set(theirs)) <= 1 and set(mine) | set(theirs) == set(range(30))
    assert shared.taken >= 3 and shared.proc is None     # closed


def test_a_job_that_fails_in_the_helper_is_the_runs(tmp_path):
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), n=12, compiles=False,
                             delay=0.0, fails_elsewhere=10)
    rows, by_pid, shared = shared_run(request, wait_for=1)
    assert rows == list(range(12))
    mine = by_pid.pop(os.getpid())
    [theirs] = by_pid.values()
    assert theirs == [11, 10]                        # 10 raised there: the helper gave up
    assert mine == list(range(11)) and shared.taken == 1


def _until(predicate, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert predicate()


@pytest.mark.parametrize("busy, twice", [(0.0, 0), (share.BUSY, 1)])
def test_where_they_meet_the_run_waits_for_a_helper_that_gets_a_core(tmp_path, monkeypatch,
                                                                     busy, twice):
    # the helper sleeps 1.5 s in each job: no CPU time. Asked for none (BUSY 0), the run
    # waits for the job the helper is on; asked for BUSY of a core, it runs that job itself
    monkeypatch.setattr(share, "BUSY", busy)
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), n=6, compiles=False,
                             delay=0.0, delay_elsewhere=1.5)
    jobs = request.plan().jobs
    with sharing(request, jobs, helpers=1) as shared:
        _until(lambda: shared.state[5] == SENT and shared.state[4] == HELPER)
        rows = [row for job in jobs for row in job.run()]
    assert rows == list(range(6))
    by_pid = marks(request.log)
    mine = by_pid.pop(os.getpid())
    [theirs] = by_pid.values()
    assert theirs == [5, 4] and mine == list(range(4 + twice))
    assert (shared.taken, shared.twice) == (2 - twice, twice)


def test_a_helper_whose_plan_is_not_the_runs_runs_nothing(tmp_path):
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), n=6, compiles=False,
                             delay=0.0)
    jobs = MarkingRequest(str(tmp_path / "marks"), os.getpid(), n=7).plan().jobs
    with sharing(request, jobs, helpers=1) as shared:
        shared.proc.join(60)
        rows = [row for job in jobs for row in job.run()]
    assert rows == list(range(7)) and shared.taken == 0
    assert list(marks(request.log)) == [os.getpid()]


def test_no_helper_leaves_the_jobs_as_they_are(tmp_path):
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), n=5, compiles=False)
    jobs = request.plan().jobs
    runs = [job.run for job in jobs]
    with sharing(request, jobs, helpers=0) as shared:
        assert [job.run for job in jobs] == runs and shared.proc is None


class _Large:
    def __init__(self, cases):
        self.cases = cases

    def shared_cases(self, jobs):
        return self.cases


@pytest.mark.parametrize("value, idle, cases, cores, helpers", [
    (None, 1.8, 1000, 2, 1),        # large, both cores idle
    (None, 1.8, 999, 2, 0),         # too small
    (None, 1.4, 5000, 2, 0),        # the second core busy
    (None, 1.6, 5000, 4, 1),        # two of four idle
    ("1", 0.0, 5000, 2, 1),         # on: whatever the load
    ("on", 2.0, 999, 2, 0),         # but never a small run
    ("0", 2.0, 5000, 2, 0),
    ("off", 2.0, 5000, 2, 0),
    ("auto", 2.0, 5000, 1, 0),      # one core of its own
])
def test_only_a_large_run_with_a_core_to_spare_shares(monkeypatch, value, idle, cases, cores,
                                                      helpers):
    monkeypatch.setattr(environment, "default_threads", lambda: cores)
    environ = {} if value is None else {share.VARIABLE: value}
    assert share_helpers(_Large(cases), [], environ, idle=lambda: idle) == helpers
    assert environment_problem(environ) is None
    assert share_helpers(object(), [], environ, idle=lambda: 2.0) == 0


def test_idle_cores_counts_a_busy_core_as_busy():
    idle = idle_cores(0.3)
    assert 0.0 <= idle <= (os.cpu_count() or 1) + 0.01
    deadline = time.process_time() + 0.5       # this process keeps one core busy meanwhile
    import threading
    spin = threading.Thread(target=lambda: [None for _ in iter(
        lambda: time.process_time() < deadline, False)])
    spin.start()
    busy = idle_cores(0.3)
    spin.join()
    assert busy <= (os.cpu_count() or 1) - 0.7


@pytest.mark.parametrize("value", ["2", "sometimes"])
def test_a_bad_share_setting_is_a_problem(value):
    assert environment_problem({share.VARIABLE: value}) == (
        f"GRADVERIFY_SHARE must be auto (the default), 0/off (no sharing helper) or 1/on "
        f"(whatever the load), got {value!r}")


def test_gradcheck_shares_the_cases_of_our_cpu_engine_only():
    # a job per sample case; a generated job counts its --random N cases
    jobs = ["relu(...)"] * 7 + ["relu(generated)", "add(generated)"]
    assert GradcheckRequest(op=("relu", "add"), random=200).shared_cases(jobs) == 7 + 400
    assert GradcheckRequest(op=("relu",)).shared_cases(jobs[:7]) == 7
    for options in ({"inject": "relu_grad_sign"}, {"engine": "torch"}, {"isolate": True},
                    {"backend": ("cpu", "cuda")}, {"boundscheck": True}):
        assert GradcheckRequest(op=("relu",), random=5000, **options).shared_cases(jobs) == 0
        assert GradcheckRequest(op=("relu",), **options).shared_cases(jobs * 1000) == 0
    for tier in ("scale", "all"):                # scale cases: threads and memory already
        assert GradcheckRequest(op=("relu",), tier=tier).shared_cases(jobs * 1000) == 0


def test_a_large_run_of_sample_cases_shares():
    # gradcheck --all (its 5,645 sample cases, no --random) shares where a core is idle:
    # cold, the helper compiles the kernels of the jobs it takes (checkkit.share's doc)
    request = GradcheckRequest(op=("relu", "add", "mul", "softmax", "conv_2d"))
    with request.plan() as plan:
        n = len(plan.jobs)
        assert request.shared_cases(plan.jobs) == n > 100
        with pytest.MonkeyPatch.context() as m:
            m.setattr(environment, "default_threads", lambda: 2)
            m.setattr(share, "MIN_CASES", n)
            assert share_helpers(request, plan.jobs, {share.VARIABLE: "1"}) == 1
            m.setattr(share, "MIN_CASES", n + 1)
            assert share_helpers(request, plan.jobs, {share.VARIABLE: "1"}) == 0


@pytest.mark.slow
@pytest.mark.parametrize("random", [["--random", "15"], []], ids=["generated", "samples"])
def test_a_shared_gradcheck_run_reports_what_one_process_does(tmp_path, monkeypatch, random):
    # gradcheck's own jobs: the helper (started whatever the size and load) sends the last
    # job's rows (the last op's generated cases, or its last sample case) before the run
    # starts, so that the run takes them from it
    import json

    from gradcheck.cli import main
    started = share.Sharing.start

    def start_and_wait(self):
        started(self)
        _until(lambda: self.state[len(self.jobs) - 1] == SENT, 120)
    monkeypatch.setattr(share.Sharing, "start", start_and_wait)
    monkeypatch.setattr(share, "MIN_CASES", 1)
    taken = []
    close = share.Sharing.close

    def counted(self):
        taken.append(self.taken)
        close(self)
    monkeypatch.setattr(share.Sharing, "close", counted)
    reports = {}
    for value in ("0", "1"):
        monkeypatch.setenv(share.VARIABLE, value)
        out = tmp_path / f"share{value}.json"
        assert main(["--op", "relu", "--op", "mul", *random, "--no-progress",
                     "--output", str(out)]) == 0
        reports[value] = [{k: v for k, v in row.items() if k != "seconds"}
                          for row in json.loads(out.read_text())["results"]]
    assert taken and taken[-1] >= 1 and len(reports["1"]) > 30
    assert reports["0"] == reports["1"]


def test_the_progress_bar_counts_the_jobs_a_helper_has_finished(capsys):
    # after the first job the helper has handed back the last two: the bar says 3 of 5,
    # and taking them (the count falling as the run reaches them) never moves it back
    from checkkit.jobs import Job, done_elsewhere, run_jobs
    elsewhere = [0]

    def job(i):
        def run():
            elsewhere[0] = {1: 2, 2: 2, 3: 2, 4: 1, 5: 0}[i]
            return [i]
        return Job(f"job{i}", run, {})
    jobs = [job(i) for i in range(1, 6)]
    shown = []
    import tqdm
    real = tqdm.tqdm.update

    def update(self, n=1):
        real(self, n)
        shown.append(self.n)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tqdm.tqdm, "update", update)
        with done_elsewhere(jobs, lambda: elsewhere[0]):
            assert run_jobs(jobs, progress=True) == [1, 2, 3, 4, 5]
        assert shown == [3, 4, 5, 5, 5]
        shown.clear()
        assert run_jobs(jobs, progress=True) == [1, 2, 3, 4, 5]    # no helper: one a job
        assert shown == [1, 2, 3, 4, 5]


def test_a_sharing_run_counts_the_rows_handed_back_ahead_of_it(tmp_path):
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), n=8, compiles=False,
                             delay=0.0)
    jobs = request.plan().jobs
    with sharing(request, jobs, helpers=1) as shared:
        # the run not started, the helper runs every job, from the end
        _until(lambda: all(s == SENT for s in shared.state[:]))
        _until(lambda: shared.ahead_of_run() == 8)
        rows = [row for job in jobs for row in job.run()]
        assert shared.ahead_of_run() == 0 and shared.taken == 8
    assert rows == list(range(8))


def test_a_helper_ended_by_the_run_exits_through_its_exit_handlers(tmp_path):
    # close() sends SIGTERM; the helper leaves through SystemExit (exit code 0), its exit
    # handlers run, and the named semaphores it made are unlinked: killed outright (-15),
    # it had left them to the resource tracker, which warned on the terminal
    request = MarkingRequest(str(tmp_path / "marks"), os.getpid(), n=6, compiles=False,
                             delay=0.0, delay_elsewhere=30.0)
    jobs = request.plan().jobs
    with sharing(request, jobs, helpers=1) as shared:
        _until(lambda: shared.state[5] == HELPER)       # asleep in the last job
        proc = shared.proc
    assert proc.exitcode == 0
