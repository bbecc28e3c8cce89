"""The strided view ops: strided_slice (offsets and steps) and expand (stride 0) alias their
input, say when they are contiguous, refuse what they cannot view, and their gradients put
g back where the view reads (their samples go through tests/engine/ops/test_ops.py)."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import ops
from engine.errors import ParamError, ShapeError
from engine.registry import get_op


def test_strided_slice_is_numpys_slice_as_a_view():
    x = np.arange(48.0).reshape(6, 8)
    v = get_op("strided_slice").view([x], slices=((1, 5, 1), (0, 8, 2)))
    np.testing.assert_array_equal(v, x[1:5, ::2])
    assert np.shares_memory(v, x) and v.strides == (x.strides[0], 2 * x.strides[1])


def test_expand_is_a_stride_0_view():
    x = np.arange(3.0).reshape(3, 1)
    v = get_op("expand").view([x], shape=(3, 4))
    np.testing.assert_array_equal(v, np.broadcast_to(x, (3, 4)))
    assert np.shares_memory(v, x) and v.strides == (x.strides[0], 0)


@pytest.mark.parametrize("slices, contiguous", [
    (((1, 3, 1), (0, 8, 1)), True),      # whole rows: one contiguous range at an offset
    (((1, 2, 1), (2, 6, 1)), True),      # part of one row
    (((1, 3, 1), (2, 6, 1)), False),     # parts of two rows
    (((0, 6, 2), (0, 8, 1)), False),     # every other row
    (((0, 6, 1), (0, 8, 2)), False)])    # every other column
def test_strided_slice_says_when_it_is_contiguous(slices, contiguous):
    x = engine.input_tensor((6, 8), "f32")
    assert ops.strided_slice(x, slices).contiguous is contiguous


def test_expand_is_contiguous_only_where_it_grows_nothing():
    x = engine.input_tensor((3, 1), "f32")
    assert not ops.expand(x, (3, 4)).contiguous and ops.expand(x, (3, 1)).contiguous


@pytest.mark.parametrize("slices, match", [
    (((0, 7, 1), (0, 8, 1)), "strided_slice: 0:7:1 on axis 0"),
    (((2, 2, 1), (0, 8, 1)), "0 <= start < stop"),
    (((0, 6, 0), (0, 8, 1)), "step >= 1"),
    (((0, 6, 1),), ParamError)])
def test_strided_slice_refuses_what_is_not_a_view(slices, match):
    x = engine.input_tensor((6, 8), "f32")
    if isinstance(match, str):
        with pytest.raises(ShapeError, match=match):
            ops.strided_slice(x, slices)
    else:
        with pytest.raises(match):
            ops.strided_slice(x, slices)


@pytest.mark.parametrize("shape", [(3, 4, 1), (4, 4), (6, 1)])
def test_expand_grows_only_axes_of_side_1(shape):
    with pytest.raises(ShapeError, match="cannot expand shape"):
        ops.expand(engine.input_tensor((3, 1), "f32"), shape)


@pytest.mark.parametrize("side, slc", [(9, (1, 9, 3)), (8, (0, 7, 3)), (7, (2, 7, 2)),
                                       (5, (4, 5, 1))])
def test_the_slice_gradient_spreads_g_over_zeros(side, slc):
    """d/dx sum(w * x[start:stop:step]) is w at the slice's places, zero elsewhere (also
    where g spread to n * step elements overhangs the end of x and is cut)."""
    x = engine.param((2, side), "f64", name="x")
    x.set(np.random.default_rng(0).normal(size=(2, side)))
    y = ops.strided_slice(x, ((0, 2, 1), slc))
    w = np.random.default_rng(1).normal(size=y.shape)
    loss = ops.sum(ops.mul(y, engine.constant(w, "f64"))).set_loss()
    graph = engine.Graph([loss])
    grads = graph.build_backward(loss)
    graph.compute("cpu")
    want = np.zeros((2, side))
    want[:, slice(*slc)] = w
    np.testing.assert_allclose(grads[x].numpy(), want)
