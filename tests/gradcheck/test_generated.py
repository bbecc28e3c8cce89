"""Generated cases in any engine: a crash is a failure that hypothesis shrinks (the worker
restarts, the parent lives on), cases the engine cannot run are assumed away and counted,
shrinking is bounded, and the repro command names the engine."""

from __future__ import annotations

import os
import shlex

import pytest

from checkkit.isolated import IsolatedAdapter
from gradcheck.adapters import get_adapter
from gradcheck.cli import main
from gradcheck.engine_under_test import EngineUnderTest
from gradcheck.generated import generated_results
from tests.gradcheck.abort_adapter import ASSERT_TEXT, AbortAdapter, WrongAdapter, relu_vjp

MODULE = "tests.gradcheck.test_generated"


class WideAbortAdapter(AbortAdapter):
    """relu in numpy, f32 cases only; aborts on any input with an axis of 3 or more."""

    name = "wide-abort"

    def unsupported(self, case) -> str | None:
        if case.dtype != "f32":
            return "wide-abort computes in f32 only"
        return super().unsupported(case)

    def vjp(self, case, arrays, weights):
        if any(d >= 3 for d in case.inputs[0].shape):
            self.die()
        return relu_vjp(arrays, weights)


class FlakyAbortAdapter(WideAbortAdapter):
    """Aborts on wide inputs half of the time, at random (like an out-of-bounds write)."""

    def vjp(self, case, arrays, weights):
        if any(d >= 3 for d in case.inputs[0].shape) and os.urandom(1)[0] < 128:
            self.die()
        return relu_vjp(arrays, weights)


def repro_of(row) -> list[str]:
    return shlex.split(row.message.split("reproduce: ", 1)[1])


def test_a_crashing_case_is_shrunk_in_restarted_workers():
    engine = get_adapter(f"{MODULE}:WideAbortAdapter")
    with IsolatedAdapter(engine) as isolated:
        rows = generated_results("relu", 20, 0, engine=isolated, use_torch=False)
        restarts = isolated.worker.starts - 1
    *drawn, minimal, summary = rows
    assert restarts >= 2          # the first crash, and at least one while shrinking
    assert minimal.status == "crash" and minimal.labels["generated"] == "minimal"
    assert str(minimal.name) == "relu(type=f32,x=[3]away_from_zero[0.1,2])"
    assert minimal.metrics["shrink_checks"] > 0
    assert "SIGABRT" in minimal.message and ASSERT_TEXT in minimal.message
    words = repro_of(minimal)
    assert words[:4] == ["gradcheck", "--engine", f"{MODULE}:WideAbortAdapter", "--repro"]
    assert minimal.message.endswith(f"; reproduce: {minimal.metrics['repro']}")
    assert minimal.metrics["repro"].startswith(f'gradcheck --engine {MODULE}:WideAbortAdapter '
                                               '--repro "Sample(op=\'relu\'')
    assert [r.status for r in drawn[:-1]] == ["pass"] * (len(drawn) - 1)
    assert drawn[-1].status == "crash" and "generated" not in drawn[-1].labels
    assert "reproduce" not in drawn[-1].message and "repro" in drawn[-1].metrics
    assert summary.status == "unsupported" and summary.labels["generated"] == "unsupported"
    assert "f32 only" in summary.message and summary.metrics["unsupported_draws"] > 0


def test_the_repro_of_a_generated_crash_reruns_it(capsys):
    rows = generated_results("relu", 20, 0, engine=get_adapter(f"{MODULE}:WideAbortAdapter"),
                             use_torch=False)
    minimal = next(r for r in rows if r.labels.get("generated") == "minimal")
    assert main(repro_of(minimal)[1:] + ["--no-progress", "--no-torch"]) == 1
    assert "CRASH" in capsys.readouterr().out


def test_a_run_with_no_case_the_engine_can_run_is_one_unsupported_row():
    rows = generated_results("relu", 5, 0, "f64", engine=get_adapter(f"{MODULE}:WideAbortAdapter"))
    assert [(r.name, r.status) for r in rows] == [("relu(generated)", "unsupported")]
    assert rows[0].metrics["checked_draws"] == 0


def test_shrinking_stops_at_its_budget():
    rows = generated_results("relu", 20, 0, engine=get_adapter(f"{MODULE}:WideAbortAdapter"),
                             use_torch=False, shrink_checks=0)
    *drawn, minimal, _ = rows
    assert minimal.name == drawn[-1].name and minimal is not drawn[-1]
    assert "shrinking stopped at its budget (0 cases" in minimal.message
    assert minimal.metrics["shrink_checks"] == 0


def test_a_flaky_crash_does_not_confuse_hypothesis():
    """Each case is checked once: hypothesis never sees a case crash, then pass."""
    rows = generated_results("relu", 20, 1, engine=get_adapter(f"{MODULE}:FlakyAbortAdapter"),
                             use_torch=False)
    minimal = [r for r in rows if r.labels.get("generated") == "minimal"]
    assert all(r.status == "crash" for r in minimal)


def test_a_wrong_engine_in_process_names_itself_in_the_repro():
    rows = generated_results("relu", 5, 0, "f64", engine=WrongAdapter(), use_torch=False)
    minimal = rows[-1]
    assert minimal.status == "fail" and minimal.labels["engine"] == "wrong"
    assert repro_of(minimal)[:3] == ["gradcheck", "--engine",
                                     "tests.gradcheck.abort_adapter:WrongAdapter"]


def test_inject_and_backend_are_our_engines():
    with pytest.raises(ValueError, match="our engine only"):
        EngineUnderTest(WrongAdapter(), inject="relu_grad_scaled")
    with pytest.raises(ValueError, match="our engine only"):
        EngineUnderTest(WrongAdapter(), backends=("cuda",))
    # a factor mutation reaches another engine: its answers scaled (gradcheck.injection)
    assert EngineUnderTest(WrongAdapter(), inject="scale:1.01").running().factor == 1.01
