"""Activations and the unary table: edge values, one-pass backward ops, clear errors, and
generated cases (the table's strategies) against torch, forward and backward."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import engine
from engine import ops
from engine.elementwise import UNARY
from engine.ops.unary import activation_back
from engine.registry import get_op, make_node
from engine.strategies import MAX_ELEMENTS
from tests.engine.ops.op_harness import TOL, evaluate

ACTIVATIONS = [u.name for u in UNARY.values() if u.backward is None]
NAMES = [u.name for u in UNARY.values()]
PARAMS = {"elu": {"alpha": 1.0}, "leaky_relu": {"negative_slope": 0.01},
          "clamp": {"min": -0.5, "max": 0.5}, "scale": {"scale": -1.5}}
# (kink, how far inputs keep from it); clamp's kinks are its bounds
KINKS = {"abs": [0.0], "sgn": [0.0], "step": [0.0], "relu": [0.0], "elu": [0.0],
         "leaky_relu": [0.0], "hardswish": [-3.0, 3.0], "softplus": [20.0]}


def _torch_ref(name, x, **params):
    return get_op(name).torch(torch.tensor(x), **params).numpy()


def _kinks(sample):
    p = sample.kwargs
    return [p["min"], p["max"]] if sample.op == "clamp" else KINKS.get(sample.op, [])


def _assert_off_kinks(sample, x):
    margin = 0.05 if sample.op == "clamp" else 0.1 - 1e-6
    for k in _kinks(sample):
        assert np.abs(x.astype(np.float64) - k).min() >= margin - 1e-6, \
            f"{sample}: an input within {margin} of the kink at {k}"


# --- forward values ------------------------------------------------------------------------
EDGES = np.array([-150.0, -40.0, -20.5, -3.0, -1e-3, 0.0, 1e-3, 0.5, 3.0, 19.9, 20.5, 150.0])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_edge_values_match_torch_and_stay_finite(name, dtype):
    x = EDGES.astype({"f32": np.float32, "f64": np.float64}[dtype])
    params = PARAMS.get(name, {})
    got = evaluate(lambda t: get_op(name).build(t, **params), x)
    # finite wherever the float64 result fits the dtype (expm1(150) overflows float32)
    fits = np.abs(_torch_ref(name, EDGES, **params)) <= np.finfo(x.dtype).max
    assert np.isfinite(got[fits]).all() and np.isinf(got[~fits]).all(), f"{name}: {got}"
    np.testing.assert_allclose(got, _torch_ref(name, x, **params), **TOL[dtype])


# gelu_erf's and silu's float32 math rounds each value as it comes (engine.backends.cpu.
# vector_unary.gelu_erf_f32, silu_f32: within a few ulps of the truth)
FLOAT32_ULPS = {"gelu_erf": 4, "silu": 4}


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_float32_is_within_an_ulp_of_the_float64_result(name):
    """Activations compute in float64 or in float32 arithmetic that keeps the result within
    an ulp (sigmoid, tanh: 0.76), or a few (FLOAT32_ULPS): a float32 output is within that
    of the float64 one, rounded."""
    x32 = np.random.default_rng(0).uniform(-6, 6, 200).astype(np.float32)
    params = PARAMS.get(name, {})
    build = lambda t: get_op(name).build(t, **params)  # noqa: E731
    np.testing.assert_array_max_ulp(
        evaluate(build, x32), evaluate(build, x32.astype(np.float64)).astype(np.float32),
        FLOAT32_ULPS.get(name, 1))


def test_softplus_threshold_and_clamp_edges():
    x = np.array([19.5, 20.0, 20.5, 100.0])
    np.testing.assert_array_equal(evaluate(ops.softplus, x)[2:], x[2:])   # x above 20
    np.testing.assert_allclose(evaluate(ops.softplus, x)[:2], np.log1p(np.exp(x[:2])))
    y = np.array([-np.inf, -2.0, 0.3, 2.0, np.inf, np.nan])
    got = evaluate(lambda t: ops.clamp(t, -1.0, math.inf), y)
    np.testing.assert_array_equal(got, [-1.0, -1.0, 0.3, 2.0, np.inf, np.nan])
    assert evaluate(lambda t: ops.clamp(t, 0.5, 0.5), np.array([0.0, 1.0])).tolist() == \
        [0.5, 0.5]


def test_defaults_follow_torch():
    x = np.linspace(-3, 3, 13)
    t = torch.tensor(x)
    np.testing.assert_allclose(evaluate(ops.elu, x), torch.nn.functional.elu(t).numpy())
    np.testing.assert_allclose(evaluate(ops.leaky_relu, x),
                               torch.nn.functional.leaky_relu(t).numpy())


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "gelu"])
def test_zero_d_input(name):
    got = evaluate(get_op(name).build, np.array(0.7))
    assert got.shape == () and np.isclose(got, _torch_ref(name, np.array(0.7)))


# --- backward: one dedicated op, one pass -------------------------------------------------
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_backward_is_one_dedicated_op(name):
    x = engine.param((3, 4), name="x")
    loss = ops.sum(get_op(name).build(x, **PARAMS.get(name, {}))).set_loss()
    grads = engine.Graph([loss]).build_backward(loss)
    gx = grads[x]
    assert gx.op == f"{name}_back" and gx.srcs[1] is x
    assert gx.params == {k: float(v) for k, v in PARAMS.get(name, {}).items()}


@pytest.mark.parametrize("name", ["gelu", "clamp", "elu"])
@pytest.mark.parametrize("perm_g, perm_x", [(False, True), (True, False), (True, True)])
def test_back_op_takes_strided_inputs(name, perm_g, perm_x):
    rng = np.random.default_rng(1)
    shape, axes = (4, 2, 3), (2, 0, 1)          # a leaf of shape (2, 3, 4) permuted by axes
    gv = rng.uniform(-1, 1, shape)
    xv = rng.uniform(0.6, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    params = PARAMS.get(name, {})

    def leaf(v, perm):
        return np.ascontiguousarray(v.transpose(np.argsort(axes))) if perm else v

    def build(tg, tx):
        return activation_back(name, ops.permute(tg, axes) if perm_g else tg,
                               ops.permute(tx, axes) if perm_x else tx, **params)
    want = get_op(f"{name}_back").torch(torch.tensor(gv), torch.tensor(xv), **params)
    np.testing.assert_allclose(evaluate(build, leaf(gv, perm_g), leaf(xv, perm_x)),
                               want.numpy(), **TOL["f64"])


def test_gradient_of_a_permuted_activation_output():
    """A permute after the activation hands its backward a strided g (cont is inserted)."""
    rng = np.random.default_rng(2)
    a = rng.uniform(-2, 2, (3, 4, 5))
    x = engine.param(a.shape, "f64", name="x")
    w = rng.uniform(-1, 1, (5, 3, 4))
    y = ops.permute(ops.silu(x), (2, 0, 1))
    loss = ops.sum(ops.mul(y, engine.constant(w))).set_loss()
    graph = engine.Graph([loss])
    grads = graph.build_backward(loss)
    x.set(a)
    graph.compute()
    t = torch.tensor(a, requires_grad=True)
    (torch.nn.functional.silu(t).permute(2, 0, 1) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(grads[x].numpy(), t.grad.numpy(), **TOL["f64"])


# --- errors ---------------------------------------------------------------------------------
def f(shape, dtype="f32"):
    return engine.input_tensor(shape, dtype)


@pytest.mark.parametrize("build, error, match", [
    (lambda: ops.gelu(f((2,), "i32")), engine.DTypeError, r"gelu: needs a float input"),
    (lambda: ops.clamp(f((2,)), 1.0, -1.0), engine.ParamError, r"clamp: min 1.0 exceeds max"),
    (lambda: ops.clamp(f((2,)), math.nan, 1.0), engine.ParamError, r"clamp: .*min is NaN"),
    (lambda: ops.elu(f((2,)), "a"), engine.ParamError, r"elu: .*alpha must be a number"),
    (lambda: ops.leaky_relu(f((2,)), True), engine.ParamError, r"negative_slope must be"),
    (lambda: make_node("elu", (f((2,)),)), engine.ParamError, r"elu: takes parameters"),
    (lambda: make_node("sin", (f((2,)),), alpha=1.0), engine.ParamError, r"sin: takes"),
    (lambda: activation_back("tanh", f((2, 3)), f((3, 2))), engine.DTypeError,
     r"tanh_back: .*shapes \[2, 3\] and \[3, 2\]"),
    (lambda: activation_back("tanh", f((2,)), f((2,), "f64")), engine.DTypeError,
     r"tanh_back: needs a gradient and an input of one float dtype"),
    (lambda: make_node("tanh_back", (ops.permute(f((2, 3)), (1, 0)), f((3, 2)))),
     engine.ShapeError, r"tanh_back: gradient .* non-contiguous"),
    (lambda: activation_back("clamp", f((2,)), f((2,)), min=2.0, max=1.0),
     engine.ParamError, r"clamp_back: min 2.0 exceeds max"),
])
def test_clear_errors(build, error, match):
    with pytest.raises(error, match=match):
        build()


# --- the samples ----------------------------------------------------------------------------
def test_sample_strings_are_unique_and_keep_off_kinks():
    seen = set()
    for name in NAMES + [f"{a}_back" for a in ACTIVATIONS]:
        for s in get_op(name).samples():
            assert str(s) not in seen, f"two cases print as {s}"
            seen.add(str(s))
            x = s.generate_inputs()[-1]                 # x is the last input of <name>_back
            _assert_off_kinks(s if not name.endswith("_back") else
                              type(s)(name[:-5], s.inputs, s.params, s.dtype), x)
            assert x.size <= MAX_ELEMENTS


# --- the rows expm1 and gelu_quick --------------------------------------------------------
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_expm1_keeps_its_digits_near_zero(dtype):
    """expm1(x) for tiny x is x (1 + x/2): exp(x) - 1 would lose every digit; its
    gradient op is g e^x (ggml_expm1)."""
    x = np.array([1e-10, -3e-8, 2e-5, -1e-3, 0.5, 5.0])
    want = np.expm1(x)
    got = evaluate(ops.expm1, x.astype(np.float32 if dtype == "f32" else np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-7 if dtype == "f32" else 1e-15)
    g = np.linspace(-1.0, 1.0, x.size)
    back = evaluate(lambda gt, xt: ops.expm1_back(gt, xt), g, x)
    np.testing.assert_allclose(back, g * np.exp(x), rtol=1e-15)


def test_gelu_quick_is_ggmls_formula():
    """gelu_quick(x) = x sigmoid(1.702 x) (ggml's GELU_QUICK), distinct from both gelus,
    and its gradient op is g (s + 1.702 x s (1 - s))."""
    x = np.linspace(-6.0, 6.0, 41)
    s = 1.0 / (1.0 + np.exp(-1.702 * x))
    np.testing.assert_allclose(evaluate(ops.gelu_quick, x), x * s, rtol=1e-14, atol=1e-300)
    assert np.abs(evaluate(ops.gelu_quick, x) - evaluate(ops.gelu, x)).max() > 1e-3
    g = np.cos(x)
    np.testing.assert_allclose(evaluate(lambda gt, xt: ops.gelu_quick_back(gt, xt), g, x),
                               g * (s + 1.702 * x * s * (1.0 - s)), rtol=1e-13, atol=1e-15)
