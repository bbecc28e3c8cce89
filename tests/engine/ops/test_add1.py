"""Focused tests of add1 (x plus a one-element tensor, ggml's ADD1): values and gradients
against numpy on shapes of every rank pairing, and the clear errors of malformed builds.
The registry's samples run against torch in tests/engine/ops/test_ops.py."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import ops
from engine.errors import DTypeError, ShapeError
from tests.engine.ops.op_harness import evaluate, loss_weights, weighted_grads

RNG = np.random.default_rng(20261203)


@pytest.mark.parametrize("x_shape,c_shape", [((3, 4), ()), ((5,), (1, 1, 1)),
                                             ((2, 3, 4), (1,)), ((), (1, 1))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add1_adds_the_one_element_and_gives_sum_of_g_to_c(x_shape, c_shape, dtype):
    x = RNG.uniform(-1, 1, x_shape).astype(dtype)
    c = RNG.uniform(-1, 1, c_shape).astype(dtype)
    out = evaluate(ops.add1, x, c)
    assert out.shape == x.shape and out.dtype == dtype
    np.testing.assert_allclose(out, x + c.reshape(()), rtol=1e-6)
    w = loss_weights(x.shape)
    dx, dc = weighted_grads(ops.add1, [x, c], w)
    np.testing.assert_allclose(dx, w.astype(dtype), rtol=1e-6)
    assert dc.shape == c.shape
    np.testing.assert_allclose(dc.reshape(()), w.sum(), rtol=1e-5)


@pytest.mark.parametrize("c_shape", [(2,), (1, 3), (2, 1, 1), (0,)])
def test_add1_refuses_a_c_of_more_or_fewer_than_one_element(c_shape):
    x = engine.input_tensor((3, 4), np.float32)
    c = engine.input_tensor(c_shape, np.float32)
    with pytest.raises(ShapeError, match=r"add1: c must hold exactly one element.*\[3, 4\]"):
        ops.add1(x, c)


def test_add1_refuses_mixed_or_integer_dtypes():
    x = engine.input_tensor((3,), np.float32)
    with pytest.raises(DTypeError, match="add1: dtypes differ"):
        ops.add1(x, engine.input_tensor((1,), np.float64))
    with pytest.raises(DTypeError, match="add1: needs float inputs"):
        ops.add1(x, engine.input_tensor((1,), np.int32))
