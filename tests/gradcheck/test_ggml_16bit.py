"""The ggml adapter on 16-bit cases: the f16 and bf16 registry rows ggml runs agree with our
engine, ggml's own rounding of f32 activations to the weights' type fails the precision
verdict where it should, and the cases ggml cannot run say why (the adapter's other tests:
test_ggml_adapter)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.registry import get_op
from engine.samples import InputSpec, Sample
from gradcheck.adapters.engine_adapter import EngineAdapter, weighted_graph
from gradcheck.adapters.ggml import GgmlAdapter
from gradcheck.check import loss_weights
from gradcheck.runner import run_checks
from tests.gradcheck.ggml_agreement import NEEDS_LIBGGML, assert_agrees, sample

pytestmark = NEEDS_LIBGGML


@pytest.fixture(scope="module")
def adapter():
    return GgmlAdapter()


# --- 16-bit cases ----------------------------------------------------------------------------
# Which 16-bit registry rows ggml runs (coverage.F16_OPS); each one run here is known not to
# abort: no permuted cotangent (CPY's and CONT's backward assert a contiguous gradient), no
# sliced f16 input (VIEW's backward zero-fills an F16 tensor, which ggml_acc rejects), no
# broadcast batch in an f16 matmul (out_prod_f16_f32 asserts equal batches).
F16_PASSING = [
    ("cast", "cast(type=f16,x=[3,4],dtype=f32)"),                    # cpy f16 -> f32
    ("cast", "cast(type=f16,x=[2,3,4]perm[2,0,1],dtype=f32)"),
    ("cast", "cast(type=f32,x=[3,4],dtype=f16)"),                    # cpy f32 -> f16
    ("cast", "cast(type=f32,x=[2,3,4]perm[2,0,1],dtype=f16)"),
    ("cast", "cast(type=f16,x=[3,4],dtype=f16)"),
    ("get_rows", "get_rows(type=f16,table=[5,4],idx=[2,3])"),        # from an F16 table
    ("get_rows", "get_rows(type=f16,table=[6,40],idx=[7])"),
    ("matmul", "matmul(type=f16,a=[3,4],b=[4,5])"),                  # F16 weights
    ("matmul", "matmul(type=f16,a=[2,3,4],b=[2,4,5]perm[0,2,1])"),
    ("conv_2d", "conv_2d(type=f16,x=[2,3,6,5],w=[4,3,3,3],dilation=1,padding=1,stride=1)"),
]


@pytest.mark.parametrize("op, text", F16_PASSING, ids=[t for _, t in F16_PASSING])
def test_f16_rows_agree_with_our_engine(adapter, op, text):
    """ggml's f16 results (F32 outputs and gradients, where ggml computes them so) agree
    with ours within float16's tolerance; the 16-bit leaves are F16 tensors."""
    assert_agrees(adapter, sample(op, text), "f16")


def test_f16_rows_pass_with_the_precision_verdict():
    adapter = GgmlAdapter()
    results = run_checks([sample(op, text) for op, text in F16_PASSING], engine=adapter)
    for r in results:
        assert r.status == "pass", (r.name, r.message)
        # torch f16 where torch's result is f16, else the error model (cast to f32)
        assert r.metrics["ratio"] <= 1 and r.metrics["precision_ref"] in ("torch f16",
                                                                          "model"), r.name


def _mixed_matmul(weights: str, k: int = 48):
    """The registry's matmul of float32 activations and `weights`-dtype weights stored as
    ggml stores them (b=[K,N]perm[1,0]), of inner length `k`."""
    return next(c for c in get_op("matmul").samples() if c.inputs[1].dtype == weights
                and c.inputs[0].shape[-1] == k)


def test_f16_weights_with_f32_activations_are_f16_accurate_only():
    """ggml's own case, mul_mat(F16 weights, F32 activations) -> F32: the gradients pass,
    and the float32 output fails the precision verdict in float32 (ratio in the hundreds)
    because ggml rounds the activations to float16 first; our engine passes the same
    cases (it widens the weights, exact)."""
    cases = [c for c in get_op("matmul").samples() if c.inputs[1].dtype == "f16"]
    assert len(cases) == 3
    for r in run_checks(cases, engine=GgmlAdapter()):
        assert r.status == "fail" and r.message.startswith("precision: output"), r.name
        assert r.metrics["precision_ref"] == "model" and r.metrics["ratio"] > 100
    for r in run_checks(cases):
        assert r.status == "pass" and r.metrics["ratio"] < 1, (r.name, r.message)


@pytest.mark.parametrize("weights", ["f16", "bf16"])
def test_mul_mat_rounds_f32_activations_to_the_weights_type(adapter, weights):
    """ggml_mul_mat converts its F32 second operand to the weights' vec_dot_type: the
    product equals, bit for bit, that of the activations rounded to f16 (bf16) first."""
    case = _mixed_matmul(weights)
    a, b = case.generate_inputs()
    got = adapter.forward_only(case, [a, b], (4, 5))
    rounded = dataclasses.replace(case, inputs=(dataclasses.replace(case.inputs[0],
                                                                   dtype=weights),
                                                case.inputs[1]))
    assert np.array_equal(got, adapter.forward_only(
        rounded, [a.astype(b.dtype), b], (4, 5)))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(got - exact).max() > 1e3 * np.abs(a.astype(np.float32) @ b.astype(
        np.float32) - exact).max()


BF16_FORWARD = [
    Sample.make("cast", [InputSpec("x", (3, 4), low=-3.0, high=3.0)], "f32", dtype="bf16"),
    Sample.make("cast", [InputSpec("x", (2, 3, 4), permute=(2, 0, 1), low=-300.0,
                                   high=300.0)], "bf16", dtype="f32"),
    Sample.make("cast", [InputSpec("x", (3, 4), low=-3.0, high=3.0)], "bf16", dtype="f16"),
    Sample.make("cast", [InputSpec("x", (3, 4), low=-3.0, high=3.0)], "f16", dtype="bf16"),
    Sample.make("get_rows", [InputSpec("table", (5, 4)),
                             InputSpec("idx", (2, 3), "int", 0, 5, "i32", False)], "bf16"),
]


@pytest.mark.parametrize("case", BF16_FORWARD, ids=str)
def test_bf16_forward_agrees_with_our_engine(adapter, case):
    """ggml has no backward through BF16 (unsupported, with ggml.c:7277 as the reason); its
    forward CPY and GET_ROWS give our engine's values exactly (round to nearest even)."""
    assert "ggml.c:7277" in adapter.unsupported(case)
    arrays = case.generate_inputs()
    _, out, _, _ = weighted_graph(case, arrays, as_params=True)
    ours = EngineAdapter("cpu").vjp(case, arrays, loss_weights(out.shape, case.seed())).output
    got = adapter.forward_only(case, arrays, ours.shape)
    assert np.array_equal(got.astype(np.float32), ours.astype(np.float32))


@pytest.mark.parametrize("case, reason", [
    (Sample.make("softmax", [InputSpec("x", (3, 4))], "f16", scale=1.0),
     "no F16 kernel for ggml_soft_max (ops.cpp:5580"),
    (Sample.make("mul", [InputSpec("a", (3, 4)), InputSpec("b", (3, 4))], "f16"),
     "binary-ops.cpp:135"),
    (Sample.make("relu", [InputSpec("x", (3, 4))], "bf16"), "ggml.c:7277"),
])
def test_16_bit_cases_ggml_cannot_run_say_why(adapter, case, reason):
    assert reason in adapter.unsupported(case)


def test_the_ratio_rule_fails_conv_2d_in_f32_on_its_own():
    """ggml_conv_2d's F16 im2col in an f32 case: the one row whose fixed tolerances pass
    (a single channel, 3x3) fails on its precision ratio, in the thousands."""
    from gradcheck.precision import PRECISION_RATIO
    case = sample("conv_2d", "conv_2d(type=f32,x=[1,1,5,5],w=[1,1,3,3],dilation=1,padding=0,"
                             "stride=1)")
    (r,) = run_checks([case], engine=GgmlAdapter())
    assert r.status == "fail" and r.message.startswith("precision: ")
    assert r.metrics["ratio"] > 100 * PRECISION_RATIO
    assert r.metrics["precision_ref"] == "torch f32"
