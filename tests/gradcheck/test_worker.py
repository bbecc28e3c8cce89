"""Engines run in worker processes: a case that kills or hangs its worker is a crash row
with the signal, the engine's last words and a repro command, and the sweep goes on."""

from __future__ import annotations

import os

import pytest

from checkkit.crash_report import collapse_repeats, exit_description, stderr_tail
from checkkit.isolated import IsolatedAdapter
from checkkit.worker import Worker, WorkerCrash
from engine.registry import get_op
from gradcheck.adapters import AdapterError, AdapterSpec, get_adapter
from gradcheck.check import check_sample
from gradcheck.runner import run_checks, select_samples
from tests.gradcheck.abort_adapter import ASSERT_TEXT, CRASH_CASE, AbortAdapter, RaisingAdapter

MODULE = "tests.gradcheck.abort_adapter"


def relu_f64():
    cases = select_samples(["relu"], "f64")
    assert CRASH_CASE in map(str, cases) and str(cases[-1]) != CRASH_CASE
    return cases


@pytest.mark.parametrize("adapter, words", [
    ("AbortAdapter", ["worker killed by SIGABRT (signal 6) while running vjp",
                      f"stderr: {ASSERT_TEXT}", "in die"]),
    ("SegfaultAdapter", ["worker killed by SIGSEGV (signal 11)", "in string_at"]),
    ("ExitAdapter", ["worker exited with status 3 while running vjp"]),
    ("HangAdapter", ["timed out after 1.5 s while running vjp (killed)", "in die"]),
])
def test_a_dying_case_is_a_crash_row_and_the_sweep_goes_on(adapter, words):
    engine = get_adapter(f"{MODULE}:{adapter}")
    with IsolatedAdapter(engine, timeout=1.5) as isolated:
        results = run_checks(relu_f64(), engine=isolated, use_torch=False)
        assert isolated.worker.starts == 2          # one worker, one restart after the crash
    by_case = {r.name: r for r in results}
    crash = by_case.pop(CRASH_CASE)
    # every other case of relu in f64 (its samples and cotangent cases) passes
    assert [r.status for r in by_case.values()] == ["pass"] * (len(relu_f64()) - 1)
    assert crash.status == "crash" and not crash.ok
    repro = f"gradcheck --engine {MODULE}:{adapter} --op relu -k '{CRASH_CASE}'"
    assert crash.metrics["repro"] == repro
    assert crash.message.startswith("crash: ") and crash.message.endswith(f"reproduce: {repro}")
    for w in words:
        assert w in crash.message


def test_run_checks_isolates_an_isolated_adapter_itself():
    results = run_checks(relu_f64()[:2], engine=AbortAdapter(), use_torch=False)
    assert [r.status for r in results] == ["pass", "crash"]
    assert results[1].labels["engine"] == "abort"


def test_check_sample_alone_isolates_too_but_names_no_repro():
    (case,) = [s for s in get_op("relu").samples() if str(s) == CRASH_CASE]
    r = check_sample(case, adapter=AbortAdapter(), use_torch=False)
    assert r.status == "crash" and "SIGABRT" in r.message and "repro" not in r.metrics


def test_an_exception_in_the_worker_is_an_error_row_not_a_crash():
    cases = relu_f64()
    with IsolatedAdapter(RaisingAdapter()) as isolated:
        results = run_checks(cases, engine=isolated, use_torch=False)
        assert isolated.worker.starts == 1
    r = next(r for r in results if r.name == CRASH_CASE)
    assert r.status == "error" and r.message == "error: RuntimeError: engine refused the case"
    assert r.metrics["repro"].startswith(f"gradcheck --engine {MODULE}:RaisingAdapter")


def test_an_adapter_that_cannot_be_built_in_the_worker_is_an_adapter_error():
    with Worker(AdapterSpec("no_such_module:Adapter")) as worker, \
            pytest.raises(AdapterError, match="in the worker process: .*cannot import no_such"):
        worker.start()


def test_worker_call_after_a_crash_starts_a_fresh_worker():
    (case,) = [s for s in get_op("relu").samples() if str(s) == CRASH_CASE]
    with Worker(AdapterSpec(f"{MODULE}:ExitAdapter")) as worker:
        assert worker.call("describe").startswith("ExitAdapter")
        with pytest.raises(WorkerCrash, match="exited with status 3"):
            worker.call("vjp", case, case.generate_inputs(), 1.0)
        assert worker.call("unsupported", case) is None and worker.starts == 2
    with pytest.raises(ValueError, match="positive"):
        Worker(AdapterSpec("engine"), timeout=0)


def test_exit_descriptions():
    assert exit_description(-6) == "killed by SIGABRT (signal 6)"
    assert exit_description(2) == "exited with status 2"
    assert exit_description(None) == "did not exit"


class TwoThreadsAbortAdapter(AbortAdapter):
    """Two threads failing the same assertion at once: its text twice, then abort()."""

    def die(self) -> None:
        os.write(2, f"{ASSERT_TEXT}\n{ASSERT_TEXT}\n".encode())
        os.abort()


def test_collapse_repeats_keeps_each_line_once_with_its_count():
    assert collapse_repeats(["a failed", "a failed", "b", "a failed", "c"]) == \
        ["a failed (x3)", "b", "c"]
    assert collapse_repeats(["x", "y"]) == ["x", "y"] and collapse_repeats([]) == []


def test_stderr_tail_collapses_repeated_lines(tmp_path):
    path = tmp_path / "stderr.log"
    path.write_text("earlier\n" + "ggml.c:1: GGML_ASSERT(x) failed\n" * 2 + "\n  done \n")
    assert stderr_tail(str(path), len("earlier\n")) == "ggml.c:1: GGML_ASSERT(x) failed (x2) | done"


def test_an_assertion_printed_by_two_threads_is_named_once():
    (case,) = [s for s in get_op("relu").samples() if str(s) == CRASH_CASE]
    r = check_sample(case, adapter=TwoThreadsAbortAdapter(), use_torch=False)
    assert r.status == "crash"
    assert f"stderr: {ASSERT_TEXT} (x2);" in r.message and r.message.count(ASSERT_TEXT) == 1
