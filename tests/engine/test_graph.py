"""Graph building, broadcasting gradients, gradient accumulation and reset."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import engine
from engine import ops


def test_forward_is_topological_and_deduplicated():
    x = engine.input_tensor((3,), "f64")
    a = ops.exp(x)
    b = ops.add(a, a)
    c = ops.mul(b, a)
    g = engine.Graph([c, b])
    ids = [t.id for t in g.nodes]
    assert len(ids) == len(set(ids)) == 4
    pos = {t.id: i for i, t in enumerate(g.nodes)}
    for t in g.nodes:
        for s in t.srcs:
            assert pos[s.id] < pos[t.id]


def test_backward_is_appended_to_the_same_graph():
    x = engine.param((3,), "f64", name="x")
    loss = ops.sum(ops.exp(x))
    g = engine.Graph([loss])
    n = len(g.nodes)
    forward_nodes = list(g.nodes)
    grads = g.build_backward(loss)
    assert g.nodes[:n] == forward_nodes and len(g.nodes) > n
    assert grads[x] in g.nodes


def test_gradients_for_params_only():
    x = engine.input_tensor((3,), "f64", name="x")
    w = engine.param((3,), "f64", name="w")
    loss = ops.sum(ops.mul(x, w))
    grads = engine.Graph([loss]).build_backward(loss)
    assert set(grads) == {w}


def test_no_param_is_an_error():
    x = engine.input_tensor((3,), "f64")
    with pytest.raises(engine.EngineError, match="no param"):
        engine.Graph([ops.sum(x)]).build_backward(ops.sum(x))


@st.composite
def broadcast_pair(draw):
    out = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    def operand():
        nd = draw(st.integers(0, len(out)))
        dims = out[len(out) - nd:]
        return tuple(d if draw(st.booleans()) else 1 for d in dims)
    return operand(), operand()


@given(broadcast_pair(), st.sampled_from(["add", "sub", "mul", "div"]))
def test_broadcast_gradients_match_torch(shapes, name):
    sa, sb = shapes
    rng = np.random.default_rng(0)
    av, bv = rng.uniform(0.5, 2, sa), rng.uniform(0.5, 2, sb)
    a, b = engine.param(sa, "f64", name="a"), engine.param(sb, "f64", name="b")
    out = getattr(ops, name)(a, b)
    w = rng.normal(size=out.shape)
    loss = ops.sum(ops.mul(out, engine.constant(w, "f64")))
    g = engine.Graph([loss])
    grads = g.build_backward(loss)
    a.set(av)
    b.set(bv)
    g.compute()
    ta = torch.tensor(av, requires_grad=True)
    tb = torch.tensor(bv, requires_grad=True)
    tout = {"add": ta + tb, "sub": ta - tb, "mul": ta * tb, "div": ta / tb}[name]
    (tout * torch.tensor(w)).sum().backward()
    assert grads[a].shape == sa and grads[b].shape == sb
    np.testing.assert_allclose(grads[a].numpy(), ta.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads[b].numpy(), tb.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_gradient_accumulation_and_reset():
    w = engine.param((4,), "f64", name="w")
    x = engine.input_tensor((4,), "f64", name="x")
    loss = ops.sum(ops.sqr(ops.mul(w, x))).set_loss()
    g = engine.Graph([loss])
    accs = g.build_backward(loss, accumulate=True)
    w.set([1.0, 2.0, 3.0, 4.0])
    expected = np.zeros(4)
    for batch in ([1.0, 1.0, 1.0, 1.0], [0.5, -1.0, 2.0, 0.0], [3.0, 0.0, 1.0, 1.0]):
        x.set(batch)
        g.compute()
        expected += 2 * w.numpy() * np.square(batch)
        np.testing.assert_allclose(accs[w].numpy(), expected, rtol=1e-14)
    g.reset()
    np.testing.assert_array_equal(accs[w].numpy(), 0)
    np.testing.assert_array_equal(g.loss_grad.numpy(), 1)
    g.compute()
    np.testing.assert_allclose(accs[w].numpy(), 2 * w.numpy() * np.square([3.0, 0, 1, 1]))


def test_loss_grad_seed_scales_gradients():
    w = engine.param((2,), "f64", name="w")
    loss = ops.sum(ops.sqr(w))
    g = engine.Graph([loss])
    grads = g.build_backward(loss)
    w.set([1.0, -2.0])
    g.loss_grad.set(3.0)
    g.compute()
    np.testing.assert_allclose(grads[w].numpy(), 3 * 2 * np.array([1.0, -2.0]))


def test_without_accumulation_each_evaluation_is_fresh():
    w = engine.param((3,), "f64", name="w")
    loss = ops.sum(ops.sqr(w))
    g = engine.Graph([loss])
    grads = g.build_backward(loss)
    w.set([1.0, 2.0, 3.0])
    g.compute()
    g.compute()
    np.testing.assert_allclose(grads[w].numpy(), [2.0, 4.0, 6.0])


def test_param_used_twice_sums_its_gradients():
    w = engine.param((3,), "f64", name="w")
    loss = ops.sum(ops.add(ops.mul(w, w), ops.exp(w)))
    g = engine.Graph([loss])
    grads = g.build_backward(loss)
    w.set([0.1, 0.2, 0.3])
    g.compute()
    v = np.array([0.1, 0.2, 0.3])
    np.testing.assert_allclose(grads[w].numpy(), 2 * v + np.exp(v), rtol=1e-14)


@pytest.mark.parametrize("x_transposed", [False, True])
def test_weight_used_transposed_gets_its_gradient_as_a_product(x_transposed):
    """x @ W^T (ggml's layout of a linear layer): W's gradient is computed as g^T @ x, in
    W's layout, not as a copy of the transposed (x^T @ g); x may itself be a transposed
    view. The gradient is torch's."""
    rng = np.random.default_rng(3)
    xv, wv = rng.normal(size=(5, 4)), rng.normal(size=(3, 4))
    x = engine.param((4, 5) if x_transposed else (5, 4), "f64", name="x")
    w = engine.param((3, 4), "f64", name="w")
    xin = ops.transpose(x) if x_transposed else x
    y = ops.matmul(xin, ops.transpose(w))
    loss = ops.sum(ops.mul(y, y))
    g = engine.Graph([loss])
    grads = g.build_backward(loss)
    assert grads[w].op == "matmul" and grads[x].op in ("matmul", "cont")
    x.set(xv.T if x_transposed else xv)
    w.set(wv)
    g.compute()
    xt, wt = torch.tensor(xv, requires_grad=True), torch.tensor(wv, requires_grad=True)
    ((xt @ wt.T) ** 2).sum().backward()
    np.testing.assert_allclose(grads[w].numpy(), wt.grad.numpy(), rtol=1e-12)
    want_x = xt.grad.numpy().T if x_transposed else xt.grad.numpy()
    np.testing.assert_allclose(grads[x].numpy(), want_x, rtol=1e-12)
