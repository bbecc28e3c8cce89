"""The GLU family (engine.ops.glu): ggml's semantics of the fused and split forms, the
swapped halves, gradients of every input against torch, the threaded split of the CPU
kernel, and the clear errors of malformed builds. The registry samples are checked by
gradcheck and tests/engine/ops/test_ops.py; the generated cases by test_strategies.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine
from engine import ops
from engine.backends.cpu import paths, threads
from engine.backends.cpu.glu import ACTIVATIONS, glu
from engine.errors import DTypeError, ParamError, ShapeError
from tests.engine.ops.op_harness import TOL, evaluate, weighted_grads

RNG = np.random.default_rng(20251203)
NP_ACT = {
    "silu": lambda v: v / (1.0 + np.exp(-v)),
    "gelu": lambda v: 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v ** 3))),
    "gelu_erf": lambda v: torch.nn.functional.gelu(torch.tensor(v)).numpy(),
    "gelu_quick": lambda v: v / (1.0 + np.exp(-1.702 * v)),
    "relu": lambda v: np.maximum(v, 0.0),
}


def _inputs(shape, dtype=np.float64):
    """Values off relu's kink at 0."""
    v = RNG.uniform(0.1, 2.0, shape) * RNG.choice([-1.0, 1.0], shape)
    return v.astype(dtype)


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
@pytest.mark.parametrize("swapped", [False, True])
def test_fused_form_is_act_of_one_half_times_the_other(op, swapped):
    """ggml_glu: out = act(x[..., :n]) * x[..., n:], the halves exchanged when swapped."""
    x = _inputs((2, 3, 8))
    lo, hi = x[..., :4], x[..., 4:]
    a, b = (hi, lo) if swapped else (lo, hi)
    want = NP_ACT[ACTIVATIONS[op]](a) * b
    got = evaluate(lambda t: getattr(ops, op)(t, swapped=swapped), x)
    assert got.shape == (2, 3, 4)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_split_form_is_act_of_a_times_b(op):
    """ggml_glu_split: out = act(a) * b."""
    a, b = _inputs((3, 5)), _inputs((3, 5))
    got = evaluate(lambda s, t: getattr(ops, op)(s, t), a, b)
    np.testing.assert_allclose(got, NP_ACT[ACTIVATIONS[op]](a) * b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_gradients_of_both_forms_match_torch(op, dtype):
    """The fused input gets both halves' gradients (in its own order when swapped); each
    split input its own."""
    np_dtype = np.float64 if dtype == "f64" else np.float32
    ref = engine.registry.get_op(op).torch
    x = _inputs((3, 6), np_dtype)
    a, b = _inputs((3, 3), np_dtype), _inputs((3, 3), np_dtype)
    w = RNG.uniform(0.5, 1.5, (3, 3))
    for swapped in (False, True):
        (gx,) = weighted_grads(lambda t, s=swapped: getattr(ops, op)(t, swapped=s), [x], w)
        t = torch.tensor(x.astype(np.float64), requires_grad=True)
        (ref(t, swapped=swapped) * torch.tensor(w)).sum().backward()
        np.testing.assert_allclose(gx, t.grad.numpy(), **TOL[dtype])
    ga, gb = weighted_grads(lambda s, t: getattr(ops, op)(s, t), [a, b], w)
    ta, tb = (torch.tensor(v.astype(np.float64), requires_grad=True) for v in (a, b))
    (ref(ta, tb) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(ga, ta.grad.numpy(), **TOL[dtype])
    np.testing.assert_allclose(gb, tb.grad.numpy(), **TOL[dtype])


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_backward_uses_the_activation_gradient_op(op):
    """grad_a = <act>_back(g b, a), and the fused gradient joins the halves (concat)."""
    x = engine.param((2, 6), "f32", name="x")
    y = getattr(ops, op)(x, swapped=True)
    loss = ops.sum(y).set_loss()
    graph = engine.Graph([y.set_output(), loss])
    grads = graph.build_backward(loss)
    assert grads[x].op == "concat"
    assert f"{ACTIVATIONS[op]}_back" in {n.op for n in graph.nodes}


def test_threaded_split_gives_the_plain_bits():
    """A big fused input runs as chunks on the engine's threads (split:cpu_swiglu), with
    the bits of the whole (one thread: the same vector kernel, vector:swiglu, unsplit)."""
    kernel = glu("swiglu")
    x = RNG.uniform(-4, 4, (1031, 1040)).astype(np.float32)
    whole = np.full((1031, 520), np.nan, np.float32)
    out = np.full_like(whole, np.nan)
    before = threads.get_num_threads()
    try:
        threads.set_num_threads(1)
        kernel.bind(whole, [x], swapped=False)()
        threads.set_num_threads(3)
        with paths.recording() as taken:
            kernel.bind(out, [x], swapped=False)()
    finally:
        threads.set_num_threads(before)
    assert taken["split:cpu_swiglu"] == 1
    np.testing.assert_array_equal(out, whole)
    np.testing.assert_allclose(whole, NP_ACT["silu"](x[:, :520].astype(np.float64)) *
                               x[:, 520:], rtol=1e-6)


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_the_scale_case_takes_the_threaded_split(op):
    """Each op's scale case, forward and backward at 3 threads, splits its kernel."""
    from gradcheck.adapters.engine_adapter import EngineAdapter, engine_thread_count, weighted_graph
    from gradcheck.backprop import loss_weights
    case = engine.registry.get_op(op).scale()[0]
    arrays = case.generate_inputs()
    with engine_thread_count(3), paths.recording() as taken:
        out = weighted_graph(case, arrays, as_params=False)[1]
        EngineAdapter().vjp(case, arrays, loss_weights(out.shape, 0))
    assert taken[f"split:cpu_{op}"] > 0, sorted(taken)


def _f32(shape, dtype="f32"):
    return engine.input_tensor(shape, dtype)


@pytest.mark.parametrize("build, error, match", [
    (lambda: ops.swiglu(_f32((3, 5))), ShapeError, r"swiglu: .*even.*\[3, 5\]"),
    (lambda: ops.geglu(_f32((3, 4)), _f32((3, 5))), ShapeError, r"geglu: .*one shape"),
    (lambda: ops.reglu(_f32((3, 4)), _f32((3, 4)), swapped=True), ParamError,
     r"reglu: swapped applies to the fused form"),
    (lambda: ops.swiglu(_f32((2, 4), "i32")), DTypeError, r"swiglu: inputs must be float"),
    (lambda: ops.geglu_erf(_f32((2, 4)), _f32((2, 4), "f64")), DTypeError,
     r"geglu_erf: .*one dtype"),
    (lambda: ops.geglu_quick(_f32((1, 2, 1, 2, 4))), ShapeError, r"1 to 4 axes"),
    (lambda: ops.swiglu(_f32((2, 4)), swapped=1), ParamError, r"swapped must be True or"),
])
def test_clear_errors(build, error, match):
    with pytest.raises(error, match=match):
        build()
