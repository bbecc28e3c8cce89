"""The executor: typed steps run by one interpreter, inside each backend's running context,
every call passing through the graph's call wrapper (the profiling hook) when it has one."""

from __future__ import annotations

import contextlib
import importlib.util
import pathlib
import sys
import threading
import time

import numpy as np
import pytest

import engine
from engine.backends.cpu import CPU
from engine.executor import AccumulateStep, CallLabel, KernelStep, ViewStep
from tests.engine.test_planner import _mlp


def _profile_mnist():
    """bench/profile_mnist.py as a module (loaded with bench/ on the path, as it runs)."""
    bench = pathlib.Path(__file__).resolve().parents[2] / "bench"
    spec = importlib.util.spec_from_file_location("profile_mnist", bench / "profile_mnist.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(bench))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(bench))
    return module


def _node_timer():
    """bench/profile_mnist.py's call wrapper maker, node_timer."""
    return _profile_mnist().node_timer


def _timer(times: dict):
    """The profiler's call wrapper: each call adds its seconds and one call to
    times[(graph, op, node, shape)] = [seconds, calls]; each label a CallLabel."""
    wrap = _node_timer()(times)

    def typed(label, call):
        assert isinstance(label, CallLabel)
        return wrap(label, call)
    return typed


def test_a_call_wrapper_times_every_call_of_the_graphs_plans():
    """Graph.call_wrapper (bench/profile_mnist.py): a graph with one times each call of its
    plan there, gradient accumulation included, and computes the same values; a graph
    without one runs its calls as they are."""
    def trained(wrap):
        x, w1, w2, loss = _mlp()
        g = engine.Graph([loss])
        g.call_wrapper = wrap
        grads = g.build_backward(loss, accumulate=True)
        g.compute()
        g.compute()
        return g, grads[w1].numpy().copy()

    times: dict = {}
    g, timed_grad = trained(_timer(times))
    ops_seen = {op for (graph, op, _, _) in times}
    assert {"matmul", "relu", "accumulate"} <= ops_seen
    assert all(graph == g.name and calls == 2 and sec >= 0
               for (graph, *_), (sec, calls) in times.items())
    _, plain_grad = trained(None)
    np.testing.assert_array_equal(timed_grad, plain_grad)


def test_the_cpu_timer_splits_caller_and_workers():
    """profile_mnist.py --cpu: each call adds its wall and CPU seconds, the caller's and the
    workers' (clocks given), and one call; the caller's CPU is spent in the call."""
    profile = _profile_mnist()
    times: dict = {}
    x, w1, w2, loss = _mlp()
    g = engine.Graph([loss])
    g.build_backward(loss)
    g.call_wrapper = profile.cpu_node_timer(times, [time.pthread_getcpuclockid(
        threading.get_ident())])          # "workers": this thread, so they match the caller
    g.compute()
    assert times
    for wall, caller, workers, calls in times.values():
        assert calls == 1 and wall >= 0 and caller >= 0
        assert workers == pytest.approx(caller, abs=1e-4)


def test_a_call_wrapper_set_after_a_run_wraps_the_next_runs():
    x, w1, w2, loss = _mlp()
    g = engine.Graph([loss])
    g.build_backward(loss)
    g.compute()
    before = loss.item()
    times: dict = {}
    g.call_wrapper = _timer(times)
    g.compute()
    assert times and all(calls == 1 for _, calls in times.values())
    g.call_wrapper = None
    g.compute()
    assert all(calls == 1 for _, calls in times.values())
    assert loss.item() == before


def test_steps_are_typed_records_with_accumulation_last():
    x, w1, w2, loss = _mlp()
    g = engine.Graph([loss])
    g.build_backward(loss, accumulate=True)
    g.compute()
    steps = g.plan.steps
    computing = [t for t in g.nodes if not t.is_leaf]
    assert [s.tensor for s in steps[:len(computing)]] == computing
    assert all(isinstance(s, (KernelStep, ViewStep)) for s in steps[:len(computing)])
    tail = steps[len(computing):]
    assert all(isinstance(s, AccumulateStep) for s in tail)
    assert {s.accumulator.name for s in tail} == {"w1.grad_acc", "w2.grad_acc"}


def test_a_plan_runs_inside_its_backends_running_context(monkeypatch):
    """The CPU backend's context (BLAS held to one thread) is entered through the backend,
    once per run, around every kernel."""
    entered = []

    @contextlib.contextmanager
    def running(ops=None):
        entered.append("in")
        assert "matmul" in ops          # told the plan's ops (BLAS is held for products)
        yield
        entered.append("out")

    monkeypatch.setattr(CPU, "running", running, raising=True)
    x, w1, w2, loss = _mlp()
    g = engine.Graph([loss])
    g.compute()
    g.compute()
    assert entered == ["in", "out", "in", "out"]


def test_held_enters_the_running_context_once_for_its_runs(monkeypatch):
    """Executor.held (gradcheck's numerical differences): the backend's context entered
    once around the block's runs, which compute what runs outside it compute; after the
    block each run enters it again."""
    entered = []

    @contextlib.contextmanager
    def running(ops=None):
        entered.append("in")
        yield
        entered.append("out")

    monkeypatch.setattr(CPU, "running", running, raising=True)
    x, w1, w2, loss = _mlp()
    g = engine.Graph([loss])
    g.compute()
    want = loss.numpy().copy()
    executor = g.plan.executor
    entered.clear()
    with executor.held():
        for _ in range(3):
            executor.run()
            np.testing.assert_array_equal(loss.numpy(), want)
    assert entered == ["in", "out"]
    executor.run()
    assert entered == ["in", "out", "in", "out"]


def test_blas_is_held_only_for_a_plan_with_a_product(monkeypatch):
    from engine.backends.cpu import threads
    held = []

    @contextlib.contextmanager
    def engine_threads():
        held.append(True)
        yield
    monkeypatch.setattr("engine.backends.cpu.engine_threads", engine_threads)
    x = engine.input_tensor((3,), "f32", name="x")
    x.set(np.ones(3, np.float32))
    engine.Graph([engine.ops.relu(x)]).compute()
    assert held == [] and threads is not None
    x, w1, w2, loss = _mlp()
    engine.Graph([loss]).compute()
    assert held == [True]
