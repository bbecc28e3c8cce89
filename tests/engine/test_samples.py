"""Sample cases: stable strings and seeds, generators that keep off kinks, promotion."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import engine
from engine import ops
from engine.samples import InputSpec, Sample


def test_string_is_the_filter_key_and_seeds_the_data():
    s = Sample.make("pool_2d", [InputSpec("x", (2, 3, 8, 8), "distinct")], "f32",
                    mode="max", kernel=(3, 3))
    assert str(s) == "pool_2d(type=f32,x=[2,3,8,8],kernel=[3,3],mode=max)"
    np.testing.assert_array_equal(s.generate_inputs()[0], s.generate_inputs()[0])
    other = Sample.make("pool_2d", [InputSpec("x", (2, 3, 8, 8), "distinct")], "f64",
                        mode="max", kernel=(3, 3))
    assert s.seed() != other.seed()


def test_generators():
    rng = np.random.default_rng(0)
    x = InputSpec("x", (1000,), "away_from_zero", 0.1, 2.0).generate(rng, "f32")
    assert x.dtype == np.float32 and np.abs(x).min() >= 0.1 and (x < 0).any()
    d = InputSpec("d", (6, 7), "distinct").generate(rng, "f64")
    assert len(np.unique(d)) == d.size
    p = InputSpec("p", (5, 4), "probs").generate(rng, "f32")
    np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-6)
    lp = InputSpec("lp", (5, 4), "log_probs", -20.0, 20.0).generate(rng, "f64")
    assert (lp <= 0).all()
    np.testing.assert_allclose(np.exp(lp).sum(-1), 1, rtol=1e-14)
    i = InputSpec("i", (50,), "int", 0, 3, dtype="i32", grad=False).generate(rng, "f32")
    assert i.dtype == np.int32 and set(np.unique(i)) <= {0, 1, 2}


def test_promoted_keeps_the_name_and_raises_every_float_dtype():
    s = Sample.make("im2col", [InputSpec("x", (1, 2, 4, 4))], "f64", kh=3, kw=3, dtype="f32")
    assert s.precision == "f32"
    p = s.promoted("f64")
    assert str(p) == str(s) and p.seed() == s.seed()
    assert p.kwargs["dtype"] == "f64" and p.precision == "f64"


def test_permuted_input_is_a_strided_view_of_its_leaf():
    spec = InputSpec("x", (3, 4, 5), permute=(2, 0, 1))
    s = Sample.make("exp", [spec], "f64")
    assert str(s) == "exp(type=f64,x=[3,4,5]perm[2,0,1])"
    (value,) = s.generate_inputs()
    (leaf_value,) = s.leaf_arrays([value])
    assert leaf_value.shape == (4, 5, 3) and leaf_value.flags.c_contiguous
    np.testing.assert_array_equal(spec.from_leaf(leaf_value), value)
    leaf = engine.input_tensor(leaf_value.shape, "f64")
    out = s.build(leaf)
    assert out.shape == (3, 4, 5) and not out.srcs[0].contiguous


# --- drawn ranges and input views -------------------------------------------------------------
def test_a_drawn_range_is_in_the_string_and_so_seeds_the_data():
    x = InputSpec("x", (3, 4), low=-8.0, high=8.0, show_range=True)
    s = Sample.make("exp", [x], "f64")
    assert str(s) == "exp(type=f64,x=[3,4]range[-8,8])"
    narrower = Sample.make("exp", [dataclasses.replace(x, low=-0.5, high=0.5)], "f64")
    assert str(narrower) == "exp(type=f64,x=[3,4]range[-0.5,0.5])"
    assert s.seed() != narrower.seed()
    (a,) = s.generate_inputs()
    (b,) = narrower.generate_inputs()
    assert a.min() >= -8 and a.max() <= 8 and np.abs(b).max() <= 0.5 and np.abs(a).max() > 0.5
    away = InputSpec("x", (5,), "away_from_zero", 0.1, 3.0, show_range=True)
    assert str(away) == "x=[5]away_from_zero[0.1,3]"
    # a registry sample's fixed range stays out of its string (and its seed)
    assert str(dataclasses.replace(x, show_range=False)) == "x=[3,4]"


def test_a_sliced_input_is_an_offset_strided_view_of_a_larger_leaf():
    spec = InputSpec("x", (4, 4), slice=((1, 5, 1), (0, 8, 2)))
    assert str(spec) == "x=[4,4]slice[1:5,0:8:2]" and spec.leaf_shape == (6, 8)
    (value,) = Sample.make("exp", [spec], "f64").generate_inputs()
    leaf = spec.to_leaf(value)
    assert leaf.shape == (6, 8) and leaf.flags.c_contiguous
    view = spec.from_leaf(leaf)
    np.testing.assert_array_equal(view, value)
    # the view's offset and strides are the slice's: row 1, every other column
    assert np.shares_memory(view, leaf)
    assert view.strides == (leaf.strides[0], 2 * leaf.strides[1])
    assert _address(view) - _address(leaf) == leaf.strides[0]
    outside = np.ones(leaf.shape, bool)
    outside[1:5, 0:8:2] = False
    assert np.isnan(leaf[outside]).all() and not np.isnan(view).any()


def test_an_expanded_input_is_a_stride_0_view_of_a_smaller_leaf():
    spec = InputSpec("g", (3, 4), expand=(1,))
    assert str(spec) == "g=[3,4]expand[1]" and spec.leaf_shape == (3, 1)
    value = spec.generate(np.random.default_rng(0), "f32")
    assert value.shape == (3, 4) and (value == value[:, :1]).all()    # drawn per leaf element
    leaf = spec.to_leaf(value)
    assert leaf.shape == (3, 1)
    view = spec.from_leaf(leaf)
    assert view.strides == (leaf.strides[0], 0) and np.shares_memory(view, leaf)
    np.testing.assert_array_equal(view, value)


def test_slice_and_expand_combine_and_bad_views_are_refused():
    spec = InputSpec("g", (3, 4), slice=((1, 4, 1), (2, 3, 1)), expand=(1,))
    assert str(spec) == "g=[3,4]slice[1:4,2:3]expand[1]" and spec.leaf_shape == (5, 5)
    leaf = spec.to_leaf(spec.generate(np.random.default_rng(1), "f64"))
    assert spec.from_leaf(leaf).strides == (leaf.strides[0], 0)
    with pytest.raises(ValueError, match="does not give its side"):
        InputSpec("x", (4, 4), slice=((1, 5, 1), (0, 8, 3)))
    with pytest.raises(ValueError, match="permute goes alone"):
        InputSpec("x", (4, 4), permute=(1, 0), expand=(0,))
    with pytest.raises(ValueError, match="expand"):
        InputSpec("x", (4, 4), expand=(2,))


def test_the_gradient_of_a_view_lands_in_its_leaf():
    """Backprop through the view ops: a sliced leaf's gradient is the view's at the slice's
    places and zero on its border; an expanded leaf's is the sum along the expanded axis.
    InputSpec.from_leaf shows both in the layout the op sees; leaf_gradient is its adjoint."""
    a_spec = InputSpec("a", (3, 4), slice=((1, 4, 1), (0, 8, 2)))
    b_spec = InputSpec("b", (3, 4), expand=(1,))
    s = Sample.make("mul", [a_spec, b_spec], "f64")
    a, b = s.generate_inputs()
    leaves = []
    for spec, value in zip(s.inputs, s.leaf_arrays([a, b]), strict=True):
        t = engine.param(value.shape, "f64", name=spec.name)
        t.set(value)
        leaves.append(t)
    w = np.random.default_rng(2).uniform(-1, 1, (3, 4))
    out = s.build(*leaves).set_output()
    assert [t.op for t in out.srcs] == ["strided_slice", "expand"]
    assert all(t.view_of is leaf and not t.contiguous for t, leaf in zip(out.srcs, leaves,
                                                                         strict=True))
    loss = ops.sum(ops.mul(out, engine.constant(w, "f64"))).set_loss()
    graph = engine.Graph([loss])
    grads = graph.build_backward(loss)
    graph.compute("cpu")
    np.testing.assert_allclose(out.numpy(), a * b)
    ga, gb = (grads[t].numpy() for t in leaves)
    want_a = np.zeros((5, 8))        # the leaf: 1 + 4 rows, 0 + 8 columns
    want_a[1:4, 0:8:2] = w * b
    np.testing.assert_allclose(ga, want_a)
    np.testing.assert_allclose(gb, (w * a).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(a_spec.from_leaf(ga), w * b)
    np.testing.assert_allclose(b_spec.from_leaf(gb), np.broadcast_to(gb, (3, 4)))
    np.testing.assert_allclose(b_spec.leaf_gradient(w * a), gb)
    np.testing.assert_allclose(b_spec.view_gradient(w * a), np.broadcast_to(gb, (3, 4)))
    np.testing.assert_allclose(a_spec.leaf_gradient(w * b), want_a)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]
