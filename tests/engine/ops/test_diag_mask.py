"""Focused tests of the causal masks diag_mask_inf and diag_mask_zero (engine.ops.diag_mask).

ggml's semantics element by element against a numpy formula (views, n_past 0 and > 0, wide
rows and more rows than columns), the gradient diag_mask_zero(g, n_past), the causal softmax
softmax(diag_mask_inf(x)), the threaded row split against one range (same bits), and the
errors of malformed builds. The registry samples and generated cases against torch run in
tests/engine/ops/test_ops.py and tests/engine/test_strategies.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import ops
from engine.backends.cpu import paths
from engine.errors import DTypeError, ParamError, ShapeError
from engine.ops.diag_mask import diag_mask_inf, diag_mask_zero
from gradcheck.adapters.engine_adapter import engine_thread_count
from tests.engine.ops.op_harness import evaluate, weighted_grads

RNG = np.random.default_rng(20261203)


def masked(x, n_past, fill):
    """ggml's rule in numpy: x with `fill` at [..., i, j] for j > n_past + i."""
    rows, cols = x.shape[-2:]
    above = np.arange(cols)[None, :] > n_past + np.arange(rows)[:, None]
    return np.where(above, fill, x).astype(x.dtype)


SHAPES = [((4, 4), 0), ((4, 4), 2), ((3, 9), 5), ((7, 3), 0), ((7, 3), 1), ((2, 3), 6),
          ((2, 4, 5), 1), ((2, 2, 3, 4), 0)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,n_past", SHAPES)
@pytest.mark.parametrize("build,fill", [(diag_mask_inf, -np.inf), (diag_mask_zero, 0.0)])
def test_forward_is_ggml_rule(build, fill, shape, n_past, dtype):
    x = RNG.uniform(-3, 3, shape).astype(dtype)
    got = evaluate(lambda t: build(t, n_past), x)
    np.testing.assert_array_equal(got, masked(x, n_past, fill))


@pytest.mark.parametrize("build,fill", [(diag_mask_inf, -np.inf), (diag_mask_zero, 0.0)])
def test_forward_reads_views_through_their_strides(build, fill):
    x = RNG.uniform(-3, 3, (5, 6, 3))
    got = evaluate(lambda t: build(ops.permute(t, (2, 0, 1)), 1), x)
    np.testing.assert_array_equal(got, masked(x.transpose(2, 0, 1), 1, fill))


def test_row_zero_keeps_n_past_plus_one_columns():
    x = np.ones((3, 6))
    got = evaluate(lambda t: diag_mask_inf(t, 2), x)
    assert np.isfinite(got[0]).sum() == 3 and np.isfinite(got[2]).sum() == 5


@pytest.mark.parametrize("build", [diag_mask_inf, diag_mask_zero])
def test_gradient_is_diag_mask_zero_of_g(build):
    x = RNG.uniform(-3, 3, (2, 4, 7))
    w = RNG.uniform(0.5, 1.5, x.shape)
    (gx,) = weighted_grads(lambda t: build(t, 2), [x], np.where(np.isinf(masked(x, 2, -np.inf)),
                                                                 0.0, w))
    np.testing.assert_array_equal(gx, masked(w, 2, 0.0))


@pytest.mark.parametrize("n_past", [0, 3])
def test_softmax_of_diag_mask_inf_is_the_causal_softmax(n_past):
    torch = pytest.importorskip("torch")
    x = RNG.uniform(-3, 3, (2, 5, 8))
    got = evaluate(lambda t: ops.softmax(diag_mask_inf(t, n_past)), x)
    causal = torch.ones(5, 8, dtype=torch.bool).triu(n_past + 1)
    want = torch.tensor(x).masked_fill(causal, -torch.inf).softmax(-1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert np.all(got[..., 0, n_past + 1:] == 0.0)       # no weight past the diagonal


@pytest.mark.parametrize("fill_op", [diag_mask_inf, diag_mask_zero])
def test_threaded_row_split_gives_the_same_bits(fill_op):
    x = RNG.uniform(-3, 3, (3, 700, 613)).astype(np.float32)
    with engine_thread_count(1):
        one = evaluate(lambda t: fill_op(t, 4), x)
    with engine_thread_count(3), paths.recording() as taken:
        three = evaluate(lambda t: fill_op(t, 4), x)
    assert taken["split:cpu_diag_mask"] > 0
    np.testing.assert_array_equal(one, three)
    np.testing.assert_array_equal(three, masked(x, 4, 0.0 if fill_op is diag_mask_zero
                                                else -np.inf))


def _x(shape, dtype=np.float32):
    return engine.input_tensor(shape, dtype)


@pytest.mark.parametrize("build,error,match", [
    (lambda: diag_mask_inf(_x((5,)), 0), ShapeError, r"diag_mask_inf: .*2 to 4 axes.*\[5\]"),
    (lambda: diag_mask_zero(_x((1, 2, 3, 4, 5)), 0), ShapeError, "diag_mask_zero: .*5]"),
    (lambda: diag_mask_inf(_x((3, 4), np.int32), 0), DTypeError, "diag_mask_inf: .*int32"),
    (lambda: diag_mask_inf(_x((3, 4)), -1), ParamError, "diag_mask_inf: n_past"),
    (lambda: diag_mask_zero(_x((3, 4)), 1.0), ParamError, "diag_mask_zero: n_past"),
    (lambda: diag_mask_zero(_x((3, 4)), True), ParamError, "diag_mask_zero: n_past"),
])
def test_errors_name_the_op_and_the_problem(build, error, match):
    with pytest.raises(error, match=match):
        build()
