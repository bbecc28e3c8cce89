"""Focused tests of matmul, softmax, log_softmax, cross_entropy_loss and argmax: numerics at
the edges (large logits, one-hot labels, ties), strided inputs, determinism, finite-difference
checks of every backward in float64, and the errors of malformed builds."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

import engine
from engine import ops
from engine.errors import DTypeError, ShapeError
from tests.engine.ops.op_harness import evaluate


def _value_and_grads(build, arrays, w):
    """Engine value of sum(build(*params) * w), its gradients, and a function re-evaluating
    the loss at other inputs (the same graph, for finite differences)."""
    leaves = [engine.param(a.shape, a.dtype) for a in arrays]
    out = build(*leaves)
    wt = engine.constant(w, out.dtype)
    loss = ops.sum(ops.mul(out, wt)).set_loss()
    graph = engine.Graph([loss])
    grads = graph.build_backward(loss)

    def loss_at(*values):
        for t, a in zip(leaves, values, strict=True):
            t.set(a)
        graph.compute()
        return loss.item()

    value = loss_at(*arrays)
    return value, [grads[t].numpy() for t in leaves], loss_at


def _finite_differences(loss_at, arrays, h=1e-5):
    """Central differences of loss_at w.r.t. every element of every array (float64)."""
    out = []
    for k, a in enumerate(arrays):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[k][idx] += h
            minus[k][idx] -= h
            g[idx] = (loss_at(*plus) - loss_at(*minus)) / (2 * h)
        out.append(g)
    return out


def _probs(rng, shape):
    z = np.exp(rng.normal(size=shape))
    return z / z.sum(-1, keepdims=True)


# --- backward against finite differences (float64) ----------------------------------------------
FD_CASES = {
    "matmul": (lambda a, b: ops.matmul(a, b), [(2, 1, 3, 4), (5, 4, 2)]),
    "matmul_transposed": (lambda a, b: ops.matmul(ops.transpose(a), b), [(4, 3), (4, 2)]),
    "softmax": (lambda x: ops.softmax(x, scale=1.7), [(3, 5)]),
    "softmax_permuted": (lambda x: ops.permute(ops.softmax(ops.permute(x, (1, 0))), (1, 0)),
                         [(4, 3)]),
    "log_softmax": (lambda x: ops.log_softmax(x), [(2, 2, 4)]),
}


@pytest.mark.parametrize("case", sorted(FD_CASES))
def test_backward_matches_finite_differences(case):
    build, shapes = FD_CASES[case]
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=s) for s in shapes]
    out_shape = evaluate(build, *arrays).shape
    w = rng.uniform(0.5, 1.5, out_shape) * rng.choice([-1.0, 1.0], out_shape)
    _, grads, loss_at = _value_and_grads(build, arrays, w)
    for got, want in zip(grads, _finite_differences(loss_at, arrays), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_cross_entropy_backward_matches_finite_differences():
    rng = np.random.default_rng(1)
    logits, labels = rng.normal(size=(5, 4)) * 2, _probs(rng, (5, 4))
    x = engine.param(logits.shape, "f64")
    y = engine.input_tensor(labels.shape, "f64")
    loss = ops.cross_entropy_loss(x, y).set_loss()
    graph = engine.Graph([loss])
    grads = graph.build_backward(loss)
    y.set(labels)

    def loss_at(v):
        x.set(v)
        graph.compute()
        return loss.item()

    loss_at(logits)
    got = grads[x].numpy()
    (want,) = _finite_differences(loss_at, [logits])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


# --- softmax, log_softmax ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_softmax_of_large_values_is_finite(dtype):
    big = 3e38 if dtype == "f32" else 1e300
    x = np.array([[big, big / 2, -big], [1e4, 1e4 + 1, 0.0], [-1e4, -1e4, -1e4]],
                 dtype=engine.tensor.as_dtype(dtype))
    got = evaluate(ops.softmax, x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(got, torch.tensor(x).softmax(-1).numpy(), rtol=1e-6, atol=1e-7)
    got_log = evaluate(ops.log_softmax, x[1:])
    assert np.isfinite(got_log).all()
    np.testing.assert_allclose(got_log, torch.tensor(x[1:]).log_softmax(-1).numpy(),
                               rtol=1e-6)


def test_softmax_negative_scale_large_values():
    x = np.array([[1e3, -1e3, 0.0]])
    got = evaluate(lambda t: ops.softmax(t, scale=-2.0), x)
    np.testing.assert_allclose(got, [[0.0, 1.0, 0.0]], atol=1e-300)


def test_softmax_of_permuted_input_inserts_cont():
    x = engine.input_tensor((3, 4), "f64")
    y = ops.softmax(ops.transpose(x))
    assert y.srcs[0].op == "cont"
    value = np.arange(12.0).reshape(3, 4) / 7
    x.set(value)
    (got,) = engine.compute(y)
    np.testing.assert_allclose(got, torch.tensor(value.T).softmax(-1).numpy(), rtol=1e-12)


# --- cross_entropy_loss -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_one_hot_equals_torch_class_targets(dtype):
    rng = np.random.default_rng(2)
    logits = (rng.normal(size=(9, 6)) * 4).astype(dtype)
    classes = rng.integers(0, 6, 9)
    one_hot = np.eye(6, dtype=dtype)[classes]
    got = evaluate(ops.cross_entropy_loss, logits, one_hot)
    want = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(classes))
    assert got.shape == ()
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6 if dtype == np.float32 else 1e-12)


def test_cross_entropy_large_logits_finite():
    logits = np.array([[1e4, 0.0, -1e4], [50.0, 50.0, 50.0]])
    labels = np.array([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    got = evaluate(ops.cross_entropy_loss, logits, labels)
    np.testing.assert_allclose(got, np.log(3.0) / 2, rtol=1e-12)


def test_cross_entropy_deterministic_across_thread_counts():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(1003, 10)).astype(np.float32)   # more rows than chunks
    labels = _probs(rng, (1003, 10)).astype(np.float32)
    before = numba.get_num_threads()
    try:
        results = []
        for n in sorted({1, before}):
            numba.set_num_threads(n)
            results += [evaluate(ops.cross_entropy_loss, logits, labels) for _ in range(2)]
    finally:
        numba.set_num_threads(before)
    assert len({r.tobytes() for r in results}) == 1
    x64 = logits.astype(np.float64)
    lse = np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1)) + x64.max(-1)
    want = (labels * (lse[:, None] - x64)).sum(-1).mean()
    np.testing.assert_allclose(results[0], want, rtol=1e-6)


def test_cross_entropy_gradient_for_labels_that_do_not_sum_to_1():
    """The backward is the loss's gradient g (softmax t - labels) / N, t the row's label
    sum, not softmax - labels: rows summing to 0.7, 1 and 1.3 (torch's float64 autograd of
    its cross_entropy on the same values is the truth; 16-bit labels, whose roundings leave
    t off 1, are tests/engine/test_wide_gradients.py's cross_entropy cases)."""
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(5, 7))
    labels = _probs(rng, (5, 7)) * np.array([0.7, 1.0, 1.3, 0.7, 1.3])[:, None]
    x = engine.param(logits.shape, logits.dtype)
    y = engine.input_tensor(labels.shape, labels.dtype)
    x.set(logits)
    y.set(labels)
    loss = ops.cross_entropy_loss(x, y).set_loss()
    graph = engine.Graph([loss])
    grads = graph.build_backward(loss)
    graph.compute()
    lt = torch.tensor(logits, requires_grad=True)
    torch.nn.functional.cross_entropy(lt, torch.tensor(labels)).backward()
    np.testing.assert_allclose(grads[x].numpy(), lt.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_cross_entropy_labels_get_no_gradient():
    logits = engine.param((3, 4), "f64")
    labels = engine.param((3, 4), "f64")
    loss = ops.cross_entropy_loss(logits, labels).set_loss()
    grads = engine.Graph([loss]).build_backward(loss)
    assert logits in grads and labels not in grads


# --- argmax -------------------------------------------------------------------------------------
def test_argmax_first_index_wins_on_ties():
    x = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0], [0.0, np.nan, 1.0, np.nan]],
                 dtype=np.float32)
    got = evaluate(ops.argmax, x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [1, 0, 1])
    np.testing.assert_array_equal(got, np.argmax(x, -1))


def test_argmax_of_vector_is_0d_and_of_permuted_input():
    assert evaluate(ops.argmax, np.array([0.5, 2.0, -1.0])).shape == ()
    x = engine.input_tensor((3, 2), "f64")
    y = ops.argmax(ops.transpose(x))
    x.set([[0.0, 9.0], [4.0, 1.0], [2.0, 3.0]])
    np.testing.assert_array_equal(engine.compute(y)[0], [1, 0])


def test_argmax_has_no_gradient_through_it():
    x = engine.param((2, 3), "f64")
    assert engine.get_op("argmax").no_grad
    assert ops.argmax(x).dtype == np.int32


# --- matmul ---------------------------------------------------------------------------------------
def test_matmul_operator_and_transposed_operand_match_numpy():
    rng = np.random.default_rng(4)
    a_val, b_val = rng.normal(size=(2, 5, 3)), rng.normal(size=(4, 5))
    a = engine.input_tensor(a_val.shape, "f64")
    b = engine.input_tensor(b_val.shape, "f64")
    out = ops.transpose(a) @ ops.transpose(b)
    a.set(a_val)
    b.set(b_val)
    np.testing.assert_allclose(engine.compute(out)[0],
                               np.swapaxes(a_val, -1, -2) @ b_val.T, rtol=1e-12)


# --- errors ---------------------------------------------------------------------------------------
def _t(shape, dtype="f32"):
    return engine.input_tensor(shape, dtype)


@pytest.mark.parametrize("build, error, words", [
    (lambda: ops.matmul(_t((3,)), _t((3, 2))), ShapeError, ["matmul", "[3]", "[3, 2]"]),
    (lambda: ops.matmul(_t((3, 4)), _t((5, 2))), ShapeError, ["matmul", "[3, 4]", "[5, 2]"]),
    (lambda: ops.matmul(_t((2, 3, 4)), _t((3, 4, 2))), ShapeError, ["matmul", "[2]", "[3]"]),
    (lambda: ops.matmul(_t((3, 4)), _t((4, 2), "f64")), DTypeError, ["matmul", "float64"]),
    (lambda: ops.matmul(_t((3, 4), "i32"), _t((4, 2), "i32")), DTypeError, ["matmul"]),
    (lambda: ops.softmax(_t(())), ShapeError, ["softmax", "[]"]),
    (lambda: ops.softmax(_t((3,), "i32")), DTypeError, ["softmax", "int32"]),
    (lambda: ops.log_softmax(_t((), "f64")), ShapeError, ["log_softmax"]),
    (lambda: ops.cross_entropy_loss(_t((3, 4)), _t((3, 5))), ShapeError,
     ["cross_entropy_loss", "[3, 4]", "[3, 5]"]),
    (lambda: ops.cross_entropy_loss(_t((3, 4)), _t((3, 4), "i32")), DTypeError,
     ["cross_entropy_loss", "int32"]),
    (lambda: ops.cross_entropy_loss(_t((3, 4)), _t((3, 4), "f64")), DTypeError,
     ["cross_entropy_loss", "float64"]),
    (lambda: ops.argmax(_t((3, 0))), ShapeError, ["argmax", "[3, 0]"]),
    (lambda: ops.argmax(_t(())), ShapeError, ["argmax"]),
    (lambda: ops.softmax_back(_t((3, 4)), _t((4, 3))), ShapeError, ["softmax_back"]),
    (lambda: ops.cross_entropy_loss_back(_t((1,)), _t((3, 4)), _t((3, 4))), ShapeError,
     ["cross_entropy_loss_back", "0-d"]),
])
def test_bad_builds_raise_clear_errors(build, error, words):
    with pytest.raises(error) as info:
        build()
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_strided_input_given_directly_is_refused():
    x = ops.transpose(_t((3, 4)))
    with pytest.raises(ShapeError, match="non-contiguous"):
        engine.registry.make_node("softmax", (x,), scale=1.0)
