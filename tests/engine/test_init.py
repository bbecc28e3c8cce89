"""Seeded initialisers: same seed, same bits; bounds and spreads as torch defines them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine import init


@pytest.mark.parametrize("fn", [init.uniform, init.normal, init.kaiming_uniform,
                                init.kaiming_normal, init.glorot_uniform, init.glorot_normal])
def test_seeded(fn):
    a = fn((50, 40), seed=3)
    b = fn((50, 40), seed=3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, fn((50, 40), seed=4))
    assert a.dtype == np.float32
    assert fn((3, 2), seed=0, dtype="f64").dtype == np.float64


def test_fans_follow_torch():
    assert init.fans((10, 20)) == (20, 10)
    assert init.fans((8, 3, 5, 5)) == (75, 200)


def test_kaiming_uniform_bound_is_torch_linear_default():
    w = init.kaiming_uniform((500, 784), a=math.sqrt(5), seed=0)
    bound = 1 / math.sqrt(784)        # torch.nn.Linear: gain sqrt(2/6) * sqrt(3/fan_in)
    assert np.abs(w).max() <= bound * (1 + 1e-6)
    assert np.abs(w).max() > 0.99 * bound


def test_spreads():
    n = init.kaiming_normal((400, 300), nonlinearity="relu", seed=1)
    assert abs(n.std() - math.sqrt(2 / 300)) < 0.01 * math.sqrt(2 / 300) * 5
    g = init.glorot_uniform((300, 200), seed=1)
    assert np.abs(g).max() <= math.sqrt(6 / 500) * (1 + 1e-6)
    b = init.bias_uniform((500,), 784, seed=2)
    assert np.abs(b).max() <= 1 / math.sqrt(784)
