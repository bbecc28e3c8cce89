"""Focused tests of out_prod (ggml's OUT_PROD, out[..., n, m] = sum_k a[..., k, m]
b[..., k, n]): values and gradients against numpy's einsum, ggml's layout of the operands,
batch broadcasting of a, and the clear errors of malformed builds. The registry's samples
run against torch in tests/engine/ops/test_ops.py."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import ops
from engine.errors import DTypeError, ShapeError
from tests.engine.ops.op_harness import evaluate, loss_weights, weighted_grads

RNG = np.random.default_rng(20261204)


def _sum_to(arr, shape):
    """arr summed over the axes along which an array of `shape` broadcasts to it."""
    lead = arr.ndim - len(shape)
    arr = arr.sum(axis=tuple(range(lead)))
    return arr.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)


@pytest.mark.parametrize("a_shape,b_shape", [((4, 5), (4, 3)), ((1, 6), (1, 2)),
                                             ((2, 3, 4), (2, 3, 5)), ((3, 4), (2, 3, 5)),
                                             ((1, 3, 2), (4, 3, 3))])
def test_out_prod_is_the_sum_of_outer_products_and_its_gradients(a_shape, b_shape):
    a = RNG.uniform(-1, 1, a_shape)
    b = RNG.uniform(-1, 1, b_shape)
    out = evaluate(ops.out_prod, a, b)
    want = np.einsum("...km,...kn->...nm", np.broadcast_to(a, b.shape[:-2] + a.shape[-2:]), b)
    assert out.shape == b.shape[:-2] + (b.shape[-1], a.shape[-1])
    np.testing.assert_allclose(out, want, rtol=1e-12)
    w = loss_weights(out.shape)
    da, db = weighted_grads(ops.out_prod, [a, b], w)
    # d/da[k, m] = sum_n b[k, n] w[n, m] (summed over a's broadcast batch), d/db = a w^T
    np.testing.assert_allclose(da, _sum_to(np.einsum("...kn,...nm->...km", b, w), a.shape),
                               rtol=1e-10)
    np.testing.assert_allclose(db, np.einsum("...km,...nm->...kn", a, w), rtol=1e-10)


def test_out_prod_of_a_single_row_is_the_outer_product():
    a, b = RNG.uniform(-1, 1, (1, 4)), RNG.uniform(-1, 1, (1, 3))
    np.testing.assert_allclose(evaluate(ops.out_prod, a, b), np.outer(b[0], a[0]),
                               rtol=1e-12)


@pytest.mark.parametrize("a_shape,b_shape,match", [
    ((4, 5), (3, 2), "must share K, got 4 and 3"),
    ((2, 3, 4), (3, 3, 5), r"batch axes \[2\] must broadcast to b's \[3\]"),
    ((2, 2, 3, 4), (2, 3, 5), r"batch axes \[2, 2\] must broadcast"),
    ((4,), (4, 3), r"needs a \(\.\.\., K, M\)")])
def test_out_prod_refuses_malformed_shapes(a_shape, b_shape, match):
    a = engine.input_tensor(a_shape, np.float32)
    b = engine.input_tensor(b_shape, np.float32)
    with pytest.raises(ShapeError, match=f"out_prod: .*{match}"):
        ops.out_prod(a, b)


def test_out_prod_refuses_mixed_dtypes():
    with pytest.raises(DTypeError, match="out_prod: needs two float inputs of one dtype"):
        ops.out_prod(engine.input_tensor((2, 3), np.float32),
                     engine.input_tensor((2, 3), np.float64))
