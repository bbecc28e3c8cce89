"""Sample cases: stable strings and seeds, generators that keep off kinks, promotion."""

from __future__ import annotations

import numpy as np

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
    i = InputSpec("i", (50,), "int", 0, 3, dtype="i32", grad=False).generate(rng, "f32")
    assert i.dtype == np.int32 and set(np.unique(i)) <= {0, 1, 2}


def test_promoted_keeps_the_name_and_raises_every_float_dtype():
    s = Sample.make("im2col", [InputSpec("x", (1, 2, 4, 4))], "f64", kh=3, kw=3, dtype="f32")
    assert s.precision == "f32"
    p = s.promoted("f64")
    assert str(p) == str(s) and p.seed() == s.seed()
    assert p.kwargs["dtype"] == "f64" and p.precision == "f64"


def test_permuted_input_is_a_strided_view_of_its_leaf():
    import engine
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
