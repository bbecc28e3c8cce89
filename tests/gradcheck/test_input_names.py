"""A case of the user's function is named after it and its inputs after its parameters
(gradcheck.api.function_name, input_names): `swish(x=[4,5],beta=[5])`, not
`swish(x0=[4,5],x1=[5])`; a torch.autograd.Function's `F.apply` after F and F.forward."""

from __future__ import annotations

import numpy as np
import pytest

from gradcheck.api import check_numpy, check_torch, function_name, input_names
from gradcheck.pytest import function_case


def swish(x, beta):
    from engine import ops
    return ops.mul(x, ops.sigmoid(ops.mul(x, beta)))


def test_inputs_are_named_after_the_positional_parameters():
    x, beta = np.ones((4, 5)), np.full((5,), 1.5)
    assert str(function_case(swish, [x, beta])) == "swish(x=[4,5],beta=[5])"
    assert input_names(lambda a, /, b, *, c=1: a, 2) == ["a", "b"]
    assert function_name(lambda a: a) == "lambda"


def test_inputs_beyond_the_parameters_or_without_a_signature_are_numbered():
    def head(a, *rest):
        return a
    assert input_names(head, 3) == ["a", "x1", "x2"]
    import math
    assert input_names(math.hypot, 2) == ["x0", "x1"]       # a builtin without a signature

    def clash(x1, *rest):
        return x1
    assert input_names(clash, 2) == ["x1", "_x1"]


def test_check_numpy_names_its_case_after_the_forward():
    def scaled_tanh(x, scale):
        return np.tanh(x) * scale

    def vjp(g, x, scale):
        return [g * scale * (1 - np.tanh(x) ** 2), None]

    x = np.random.default_rng(0).normal(size=(3, 4))
    r = check_numpy(scaled_tanh, vjp, [x, np.float64(2.0)], grad=[True, False],
                    cotangents=("contiguous",))
    assert r.status == "pass", r.message
    assert r.name == "scaled_tanh(x=[3,4],scale=[])"
    unnamed = check_numpy(np.tanh, lambda g, x: [g * (1 - np.tanh(x) ** 2)], [x],
                          cotangents=("contiguous",))
    assert unnamed.name in ("tanh(x=[3,4])", "tanh(x0=[3,4])")   # numpy 2's ufuncs: (x, /)


def _functions():
    torch = pytest.importorskip("torch")

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, values, factor):
            ctx.save_for_backward(factor)
            return values * factor

        @staticmethod
        def backward(ctx, g):
            (factor,) = ctx.saved_tensors
            return g * factor, None

    class Cube(torch.autograd.Function):          # forward without ctx: setup_context
        @staticmethod
        def forward(inputs):
            return inputs ** 3

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * g * x ** 2
    return Scale, Cube


def test_an_autograd_function_is_named_after_its_class_and_forward():
    scale, cube = _functions()
    x = np.random.default_rng(1).normal(size=(3, 4))
    assert function_name(scale.apply) == "Scale"
    assert input_names(scale.apply, 2) == ["values", "factor"]
    assert input_names(cube.apply, 1) == ["inputs"]
    r = check_torch(scale.apply, [x, np.full((4,), 2.0)], grad=[True, False],
                    cotangents=("contiguous",))
    assert r.status == "pass", r.message
    assert r.name == "Scale(values=[3,4],factor=[4])"
    assert check_torch(cube.apply, [x], cotangents=("contiguous",)).name == \
        "Cube(inputs=[3,4])"
    # a name given wins; the inputs keep their parameter names
    named = check_torch(cube.apply, [x], name="cube", cotangents=("contiguous",))
    assert named.name == "cube(inputs=[3,4])"
