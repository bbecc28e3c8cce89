"""engine.tensor: Tensor.set from the tensor's own buffer (a caller that gathered its data
there, as bench_mnist's trainer does) keeps the data without a copy; from any other array
it copies, so a later write to that array does not reach the tensor."""

from __future__ import annotations

import numpy as np

import engine
from engine import ops


def test_set_from_its_own_buffer_keeps_the_data():
    x = engine.input_tensor((2, 3), "f32", name="x")
    buf = x.buffer()
    np.take(np.arange(12, dtype=np.float32).reshape(4, 3), [3, 1], axis=0, out=buf, mode="clip")
    assert x.set(buf) is x and x.buffer() is buf
    g = engine.Graph([ops.scale(x, 2.0)])
    g.compute()
    np.testing.assert_array_equal(g.outputs[0].numpy(), [[18, 20, 22], [6, 8, 10]])


def test_set_from_another_array_copies_it():
    x = engine.input_tensor((2,), "f32", name="x")
    a = np.array([1.0, 2.0], np.float32)
    x.set(a)
    a[:] = 7.0
    np.testing.assert_array_equal(x.buffer(), [1.0, 2.0])
