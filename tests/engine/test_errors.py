"""Bad input gets a clear error when the op is built, naming the op and the shapes."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import ops
from engine.registry import OPS, OpDef, make_node


def f(shape, dtype="f32"):
    return engine.input_tensor(shape, dtype)


@pytest.mark.parametrize("build, match", [
    (lambda: ops.add(f((2, 3)), f((4,))), r"add: shapes \[2, 3\] and \[4\] do not broadcast"),
    (lambda: ops.mul(f((2, 3)), f((2, 3), "f64")), r"mul: dtypes differ"),
    (lambda: ops.relu(f((2,), "i32")), r"relu: needs a float input"),
    (lambda: ops.reshape(f((2, 3)), (4, 2)), r"reshape: cannot reshape \[2, 3\]"),
    (lambda: ops.reshape(ops.permute(f((2, 3)), (1, 0)), (6,)), r"non-contiguous"),
    (lambda: ops.permute(f((2, 3)), (0, 0)), r"permute: axes \[0, 0\]"),
    (lambda: ops.sum(f((2, 3)), 2), r"sum: axis 2 out of range for shape \[2, 3\]"),
    (lambda: ops.broadcast_to(f((2, 3)), (3, 3)), r"broadcast_to"),
])
def test_build_errors_are_clear(build, match):
    with pytest.raises(engine.EngineError, match=match):
        build()


def test_unknown_op_lists_known_ones():
    with pytest.raises(engine.UnknownOpError, match="unknown op 'pool3d'.*relu"):
        engine.get_op("pool3d")


def test_unknown_dtype():
    with pytest.raises(engine.DTypeError, match="unsupported dtype"):
        engine.input_tensor((2,), np.int8)


def test_set_with_wrong_shape():
    x = engine.input_tensor((2, 3))
    with pytest.raises(engine.EngineError, match=r"shape \[2, 3\] from an array of shape \[4\]"):
        x.set(np.zeros(4))


def test_reading_an_intermediate_says_how():
    y = ops.exp(f((2,)))
    with pytest.raises(engine.EngineError, match="set_output"):
        y.numpy()


def test_unknown_backend():
    g = engine.Graph([ops.exp(f((2,)))])
    with pytest.raises(engine.BackendError, match="unknown backend 'tpu'"):
        g.compute("tpu")


def test_backward_through_an_op_without_gradient_is_refused(monkeypatch):
    op = OpDef("opaque_copy", infer=lambda x: (x.shape, x.dtype), no_grad="test op")
    monkeypatch.setitem(OPS, op.name, op)
    x = engine.param((3, 4), "f32", name="x")
    loss = ops.sum(make_node("opaque_copy", (x,)))
    with pytest.raises(engine.EngineError, match="op opaque_copy has no backward .test op."):
        engine.Graph([loss]).build_backward(loss)


def test_registry_refuses_an_op_without_backward_or_reason():
    with pytest.raises(ValueError, match="give a backward rule or say why"):
        OpDef("mystery", infer=lambda x: (x.shape, x.dtype))


@pytest.mark.parametrize("op, nsrcs, params", [
    ("dropout", 1, {"p": "0.5", "seed": 1}), ("dropout", 1, {"p": 0.5, "seed": "1"}),
    ("rms_norm", 1, {"eps": "1e-5"}), ("norm", 1, {"eps": True}),
    ("rms_norm_back", 2, {"eps": "x"}), ("norm_back", 2, {"eps": None}),
    ("softmax", 1, {"scale": "2"}), ("softmax", 1, {"scale": True}),
    ("softmax_back", 2, {"scale": "__import__('os')"}),
    ("sum", 1, {"axes": (0,), "keepdims": "no"}), ("sum", 1, {"axes": [0], "keepdims": False}),
])
def test_op_params_are_checked_by_the_shape_rule_itself(op, nsrcs, params):
    """A node built straight from the registry (as a graph file is loaded) gets the same
    parameter checks as the op's builder: nothing malformed reaches a kernel."""
    x = engine.input_tensor((3, 4))
    with pytest.raises(engine.EngineError, match=op.split("_")[0]):
        make_node(op, (x,) * nsrcs, **params)
