"""Optimizers in the engine: construction, validation, graphs and plans, schedules, state.

Trajectories against closed forms and torch.optim are optcheck's job (tests/optcheck)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import engine
from engine import ops
from engine.errors import EngineError, HyperparameterError, ShapeError
from engine.gguf_io import GGUFFormatError
from engine.optim import SGD, Adam, AdamW, make_optimizer, schedules
from engine.optim.checkpoint import load_checkpoint, save_checkpoint
from engine.tensor import Flag, shared_leaf


def _quadratic(shape=(3, 4), dtype="f32"):
    x = engine.param(shape, dtype, name="x")
    x.set(np.linspace(-1, 1, math.prod(shape)).reshape(shape))
    loss = ops.sum(ops.sqr(x)).set_loss()
    g = engine.Graph([loss], name="train")
    g.build_backward(loss, accumulate=True)
    return x, g


@pytest.mark.parametrize("kwargs, word", [
    (dict(lr=-1e-3), "lr"), (dict(lr=float("nan")), "finite"), (dict(eps=-1.0), "eps"),
    (dict(betas=(1.0, 0.999)), "beta1"), (dict(betas=(0.9, -0.1)), "beta2"),
    (dict(betas=0.9), "pair"), (dict(weight_decay=-0.1), "weight_decay"),
    (dict(lr="fast"), "number"), (dict(amsgrad=1), "True or False")])
@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_adam_rejects_bad_hyperparameters_at_construction(cls, kwargs, word):
    x = engine.param((2,), name="x")
    with pytest.raises(HyperparameterError, match=word):
        cls([x], **kwargs)


@pytest.mark.parametrize("kwargs, word", [
    (dict(lr=-1.0), "lr"), (dict(momentum=-0.5), "momentum"), (dict(dampening=2.0), "dampen"),
    (dict(nesterov=True), "nesterov"), (dict(nesterov=True, momentum=0.9, dampening=0.1),
                                         "nesterov")])
def test_sgd_rejects_bad_hyperparameters_at_construction(kwargs, word):
    with pytest.raises(HyperparameterError, match=word):
        SGD([engine.param((2,), name="x")], **kwargs)


def test_unknown_optimizer_and_keyword_are_clear_errors():
    x = engine.param((2,), name="x")
    with pytest.raises(HyperparameterError, match="unknown optimizer 'lion'.*sgd, adam, adamw"):
        make_optimizer("lion", [x])
    with pytest.raises(HyperparameterError, match="sgd"):
        make_optimizer("sgd", [x], betas=(0.9, 0.99))


def test_set_validates_and_changes_no_plan():
    x, g = _quadratic()
    opt = AdamW(g, lr=0.1)
    g.compute()
    opt.step()
    plan = opt.graph.plan
    opt.set(lr=0.05, weight_decay=0.2)
    assert opt.hparams["lr"] == 0.05 and opt.hparams["weight_decay"] == 0.2
    opt.step()
    assert opt.graph.plan is plan
    with pytest.raises(HyperparameterError, match="beta2"):
        opt.set(beta2=1.5)
    with pytest.raises(HyperparameterError, match="unknown hyperparameter"):
        opt.set(momentum=0.9)
    assert opt.hparams["beta2"] == 0.999   # a refused set changes nothing


def test_optimizer_graph_reads_only_persistent_tensors_and_keeps_its_own_plan():
    x, g = _quadratic()
    opt = SGD(g, lr=0.1, momentum=0.9)
    for t in opt.graph.nodes:
        assert t.persistent, t
        if t.is_leaf and t.shares is not None:
            assert t.shares is g.grad(x)
    g.compute()
    train_plan = g.plan
    opt.step()
    g.compute()
    assert g.plan is train_plan and opt.graph.plan is not train_plan
    assert opt.state[x]["momentum_buffer"].flags & Flag.STATE


def test_step_updates_params_in_place_from_accumulated_gradients():
    x, g = _quadratic(dtype="f64")
    x0 = x.numpy()
    opt = SGD(g, lr=0.25)
    g.compute()
    g.compute()           # two physical batches accumulate: gradient 2 * 2x
    opt.step()
    np.testing.assert_allclose(x.numpy(), x0 - 0.25 * 4 * x0, rtol=1e-15)
    assert opt.step_count == 1


def test_shared_leaf_of_an_intermediate_is_refused():
    x = engine.param((2,), name="x")
    y = ops.relu(x)
    with pytest.raises(EngineError, match="intermediate"):
        shared_leaf(y)


def test_step_op_checks_its_sources():
    x = engine.param((2, 3), name="x")
    grad = engine.input_tensor((3, 2), name="g")
    step = engine.Tensor((1,), "f64", flags=Flag.STATE)
    hp = engine.input_tensor((4,), "f64")
    buf = engine.Tensor((2, 3), "f32", flags=Flag.STATE)
    with pytest.raises(ShapeError, match="sgd_step.*must match"):
        ops.sgd_step(x, grad, step, hp, buf)
    with pytest.raises(ShapeError, match="hyperparameters.*\\[4\\]"):
        ops.sgd_step(x, engine.input_tensor((2, 3)), step, engine.input_tensor((5,), "f64"),
                     buf)


def test_optimizer_needs_params_with_unique_names_and_a_backward_graph():
    with pytest.raises(EngineError, match="no parameters"):
        Adam([])
    a, b = engine.param((1,), name="w"), engine.param((1,), name="w")
    with pytest.raises(EngineError, match="unique"):
        Adam([a, b])
    x = engine.param((2,), name="x")
    with pytest.raises(EngineError, match="no backward pass"):
        Adam(engine.Graph([ops.sum(x)]))
    with pytest.raises(EngineError, match="not a float param"):
        Adam([engine.input_tensor((2,), name="i")])


@pytest.mark.parametrize("schedule, want", [
    (schedules.step_decay(3, 0.5), [1, 1, 1, 0.5, 0.5, 0.5, 0.25]),
    (schedules.linear_warmup(4, 0.2), [0.2, 0.4, 0.6, 0.8, 1.0, 1.0]),
    (schedules.cosine(4, 0.1), [1.0, 0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2,
                                0.55, 0.1 + 0.9 * (1 + math.cos(3 * math.pi / 4)) / 2, 0.1]),
])
def test_schedules_follow_their_closed_forms(schedule, want):
    np.testing.assert_allclose([schedule(t) for t in range(len(want))], want, rtol=1e-14)


def test_schedule_drives_the_learning_rate_of_each_step():
    x = engine.param((1,), "f64", name="x")
    opt = SGD([x], lr=1.0, schedule=schedules.step_decay(1, 0.5))
    for _ in range(4):
        opt.grads[x].set([1.0])
        opt.step()
    assert x.item() == -(1 + 0.5 + 0.25 + 0.125)


@pytest.mark.parametrize("bad", [lambda: schedules.cosine(0), lambda: schedules.step_decay(2, 1.5),
                                 lambda: schedules.linear_warmup(3, 0.0),
                                 lambda: schedules.warmup_cosine(5, 5)])
def test_bad_schedules_are_refused(bad):
    with pytest.raises(HyperparameterError):
        bad()


def test_checkpoint_resumes_bit_for_bit(tmp_path):
    def run(opt, x, n):
        for i in range(n):
            opt.grads[x].set(np.sin(x.numpy() * (i + 1)))
            opt.step()

    x = engine.param((5,), name="x")
    x.set(np.arange(5.0))
    opt = AdamW([x], lr=0.1, amsgrad=True)
    run(opt, x, 3)
    path = tmp_path / "ckpt.gguf"
    save_checkpoint(path, [x], opt)
    run(opt, x, 4)
    y = engine.param((5,), name="x")
    opt2 = AdamW([y], lr=0.7, amsgrad=True)
    load_checkpoint(path, [y], opt2)
    assert opt2.hparams["lr"] == 0.1 and opt2.step_count == 3
    run(opt2, y, 4)
    assert np.array_equal(x.numpy(), y.numpy())
    for k, v in opt.state_arrays().items():
        assert np.array_equal(v, opt2.state_arrays()[k]), k


def test_checkpoint_refuses_another_optimizer_and_loads_params_alone(tmp_path):
    x = engine.param((3,), name="x")
    x.set([1, 2, 3])
    path = tmp_path / "c.gguf"
    save_checkpoint(path, [x], SGD([x], momentum=0.9))
    with pytest.raises(GGUFFormatError, match="'sgd', not 'adam'"):
        load_checkpoint(path, [x], Adam([x]))
    y = engine.param((3,), name="x")
    load_checkpoint(path, [y])
    assert np.array_equal(y.numpy(), [1, 2, 3])
    z = engine.param((4,), name="x")
    with pytest.raises(GGUFFormatError, match="shape"):
        load_checkpoint(path, [z])
