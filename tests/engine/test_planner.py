"""The planner's rules: reuse by liveness, persistent buffers, stale plans never run."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import ops
from engine.planner import Plan


def _mlp(seed=0):
    rng = np.random.default_rng(seed)
    x = engine.input_tensor((8, 6), "f64", name="x")
    w1 = engine.param((6, 5), "f64", name="w1")
    w2 = engine.param((5, 3), "f64", name="w2")
    x.set(rng.normal(size=(8, 6)))
    w1.set(rng.normal(size=(6, 5)))
    w2.set(rng.normal(size=(5, 3)))
    h = ops.relu(ops.matmul(x, w1))
    y = ops.matmul(h, w2)
    loss = ops.mean(ops.sqr(y)).set_loss()
    return x, w1, w2, loss


def _chain(n=6, shape=(64, 64)):
    x = engine.input_tensor(shape, "f32", name="x")
    x.set(np.random.default_rng(0).normal(size=shape))
    t = x
    for _ in range(n):
        t = ops.exp(ops.neg(ops.sqr(t)))
    return x, ops.sum(t)


def test_intermediates_are_reused():
    _, out = _chain()
    plan = Plan(engine.Graph([out]))
    # a chain needs two live buffers at a time, whatever its length
    assert plan.arena_bytes <= 2 * 64 * 64 * 4 + 128
    assert plan.no_reuse_bytes >= 18 * 64 * 64 * 4
    assert plan.arena_bytes < plan.no_reuse_bytes


def test_reuse_gives_the_same_values_as_numpy():
    x, out = _chain(3, (5, 7))
    g = engine.Graph([out]).compute()
    t = x.numpy().astype(np.float64)
    for _ in range(3):
        t = np.exp(-t * t)
    np.testing.assert_allclose(out.numpy(), t.sum(), rtol=1e-5)
    assert g.plan.arena_bytes < g.plan.no_reuse_bytes


def test_output_never_overlaps_its_inputs():
    x = engine.input_tensor((16,), "f64", name="x")
    x.set(np.arange(16.0))
    a = ops.sqr(x)
    b = ops.add(a, ops.exp(ops.scale(a, -0.01)))   # reads a after a second node ran
    c = ops.add(b, a)
    out = ops.sum(c)
    engine.Graph([out]).compute()
    v = np.arange(16.0) ** 2
    np.testing.assert_allclose(out.numpy(), (v + np.exp(-0.01 * v) + v).sum())


def test_persistent_tensors_survive_evaluations():
    x, w1, w2, loss = _mlp()
    g = engine.Graph([loss])
    grads = g.build_backward(loss)
    w1_before = w1.numpy()
    g.compute()
    first = (loss.numpy(), grads[w1].numpy())
    g.compute()
    np.testing.assert_array_equal(loss.numpy(), first[0])
    np.testing.assert_array_equal(grads[w1].numpy(), first[1])
    np.testing.assert_array_equal(w1.numpy(), w1_before)
    # params, inputs, outputs and gradients are never placed in the arena
    persistent = {t.id for t in g.nodes if t.persistent}
    assert persistent.isdisjoint(g.plan.offsets)
    assert grads[w1].persistent and grads[w2].persistent


def test_stale_plan_raises():
    _, _, _, loss = _mlp()
    forward = engine.Graph([loss], name="forward")
    training = forward.copy(name="training")
    training.build_backward(loss)
    plan = Plan(training)
    plan.run(training)
    with pytest.raises(engine.StalePlanError, match="training"):
        plan.run(forward)


def test_plan_is_stale_after_the_graph_grows():
    _, _, _, loss = _mlp()
    g = engine.Graph([loss])
    plan = Plan(g)
    g.build_backward(loss)
    with pytest.raises(engine.StalePlanError):
        plan.run(g)
    g.compute()   # Graph.compute replans
    assert g.plan is not plan and g.plan.matches(g)


def test_ggml_failure_eval_after_training_plan():
    """ggml's scheduler, allocated for the training graph, ran it again when asked for the
    validation graph: validation loss came out too low. Here evaluating the forward graph
    after the training graph gives the loss of a fresh forward pass and moves no param."""
    x, w1, w2, loss = _mlp()
    forward = engine.Graph([loss], name="forward")
    training = forward.copy(name="training")
    training.build_backward(loss, accumulate=True)
    training.compute()
    training.compute()
    params_before = (w1.numpy(), w2.numpy())
    forward.compute()
    eval_loss = loss.item()

    x2, w1b, w2b, fresh_loss = _mlp()          # same seed: same data, a fresh graph
    engine.Graph([fresh_loss]).compute()
    assert eval_loss == fresh_loss.item()
    np.testing.assert_array_equal(w1.numpy(), params_before[0])
    np.testing.assert_array_equal(w2.numpy(), params_before[1])
    # and the accumulators hold exactly two training evaluations, none from eval
    one = engine.Graph([fresh_loss])
    g1 = one.build_backward(fresh_loss)
    one.compute()
    np.testing.assert_allclose(training.grad(w1).numpy(), 2 * g1[w1b].numpy(), rtol=1e-12)


def test_plan_reports_sizes():
    _, out = _chain()
    plan = Plan(engine.Graph([out]))
    s = plan.summary()
    assert s["arena_bytes"] == plan.arena_bytes > 0
    assert s["no_reuse_bytes"] == plan.no_reuse_bytes
    assert "arena" in repr(plan)


def test_plan_is_stale_after_a_flag_changes():
    """Flags decide which buffers are persistent: flagging an intermediate as an output
    after planning must not run the old plan (its buffer would be in the arena)."""
    x = engine.input_tensor((4,), "f64", name="x")
    x.set(np.arange(4.0))
    hidden = ops.exp(x)
    out = ops.sum(hidden)
    g = engine.Graph([out])
    plan = Plan(g)
    hidden.set_output()
    with pytest.raises(engine.StalePlanError):
        plan.run(g)
    g.compute()
    np.testing.assert_allclose(hidden.numpy(), np.exp(np.arange(4.0)))


def test_buffers_start_on_a_cache_line():
    """Every kernel output in the arena and every persistent tensor's buffer starts on a
    64-byte boundary (engine.tensor.line_aligned), whatever numpy's own allocation gives:
    odd sizes before them included, so that an offset not a multiple of 64 would show."""
    x = engine.input_tensor((3, 5), "f32", name="x")
    w = engine.param((5, 7), "f64", name="w")
    b = engine.param((1,), "f16", name="b")
    x.set(np.ones((3, 5)))
    h = ops.exp(ops.sqr(ops.cast(x, "f64")))
    y = ops.matmul(h, w)
    out = ops.add(ops.cast(y, "f16"), b).set_output()
    plan = Plan(engine.Graph([out]))
    steps = [s for s in plan.steps if getattr(s, "out", None) is not None]
    assert len(steps) >= 4
    for s in steps:
        assert s.out.ctypes.data % 64 == 0, s
    for t in (x, w, b, out):
        assert t.host_view().ctypes.data % 64 == 0, t.name
