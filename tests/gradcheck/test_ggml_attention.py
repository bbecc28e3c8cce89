"""ggml's attention through the adapter: the unfused graph that ggml differentiates,
ggml_flash_attn_ext checked forward only, and llama.cpp's decoder blocks from ggml's ops.

Every case run in this process is one on which ggml 0.20.2 does not abort (GQA with a batch
and ALiBi abort in ggml's backward: docs/findings/ggml.md)."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

from engine.samples import InputSpec, Sample
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.adapters.ggml import GgmlAdapter
from gradcheck.adapters.ggml import attention as ggml_attention
from gradcheck.backprop import loss_weights
from gradcheck.numeric import compare
from gradcheck.runner import run_checks
from tests.gradcheck.ggml_agreement import assert_agrees

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libggml") is None,
                                reason="the libggml-python wheel is not installed")
QK = dict(low=-2.0, high=2.0)
BTHD = (0, 2, 1, 3)


@pytest.fixture(scope="module")
def adapter():
    return GgmlAdapter()


def attention(q, k, v, mask=None, dtype="f32", views=None, **params):
    views = views or {}
    inputs = [InputSpec("q", q, **QK, **views.get("q", {})),
              InputSpec("k", k, **QK, **views.get("k", {})),
              InputSpec("v", v, **views.get("v", {}))]
    if mask is not None:
        inputs.append(InputSpec("mask", mask, low=-3.0, high=1.0, grad=False))
    return Sample.make("attention", inputs, dtype, **params)


def block(op, inputs, **params):
    return Sample.make(op, inputs, "f32", **params)


UNFUSED = [
    attention((2, 3, 4), (2, 5, 4), (2, 5, 3), scale=0.5),                     # rank 3
    attention((1, 4, 4, 3), (1, 2, 4, 3), (1, 2, 4, 3), causal=True, scale=0.8),  # GQA, B=1
    attention((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 2), (3, 5), causal=True, scale=0.7),
    attention((1, 2, 3, 4), (1, 1, 5, 4), (1, 1, 5, 4), (1, 2, 1, 5), scale=1.0),  # mask rows
    attention((1, 3, 2, 4), (1, 3, 4, 4), (1, 3, 4, 4), causal=True, scale=0.5,
              views={"q": {"permute": BTHD}, "k": {"permute": BTHD}}),        # (B,T,H,D)
]
X, W = dict(low=-1.0, high=1.0), dict(low=-1.0, high=1.0)
BLOCKS = [
    block("attention_block", [InputSpec("x", (3, 4), **X),
                              InputSpec("pos", (3,), "int", 0, 64, dtype="i32", grad=False),
                              InputSpec("attn_norm", (4,), low=0.5, high=1.5),
                              InputSpec("wq", (8, 4), **W), InputSpec("wk", (4, 4), **W),
                              InputSpec("wv", (4, 4), **W), InputSpec("wo", (4, 8), **W)],
          n_head=2, n_head_kv=1, n_dims=4, mode="neox", eps=1e-5),
    block("mlp_block", [InputSpec("x", (2, 3, 4), **X),
                        InputSpec("ffn_norm", (4,), low=0.5, high=1.5),
                        InputSpec("w_gate", (5, 4), **W), InputSpec("w_up", (5, 4), **W),
                        InputSpec("w_down", (4, 5), permute=(1, 0), **W)], eps=1e-5),
]


@pytest.mark.parametrize("case", UNFUSED + BLOCKS, ids=str)
def test_ggml_agrees_with_our_engine(adapter, case):
    assert_agrees(adapter, case)


def test_unfused_attention_in_f16_is_f16_accurate(adapter):
    """F16 q, k, v: mul_mat's scores are F32, but mul_mat(v, kq) rounds the probabilities
    to F16 (v's vec_dot_type): an F32 output of F16 accuracy, gradients in F32."""
    assert_agrees(adapter, attention((2, 3, 4), (2, 5, 4), (2, 5, 4), dtype="f16"), "f16")


@pytest.mark.parametrize("case, reason", [
    (attention((2, 3, 4), (2, 4, 4), (2, 4, 3), logit_softcap=2.0), "ggml_tanh has no "
     "backward"),
    (attention((1, 2, 5, 4), (1, 2, 3, 4), (1, 2, 3, 2), causal=True), "n_past >= 0"),
    (attention((2, 3, 4), (2, 5, 4), (2, 5, 4), dtype="bf16"), "ggml.c:7277"),
    (dataclasses.replace(BLOCKS[1], dtype="f16"), "ggml_rms_norm (ops.cpp:3873"),
])
def test_attention_ggml_cannot_differentiate_says_why(adapter, case, reason):
    assert reason in adapter.unsupported(case)


# --- ggml_flash_attn_ext, forward only -------------------------------------------------------
FLASH = ggml_attention.FLASH


def test_flash_attention_is_a_forward_only_variant_of_attention_cases_only(adapter):
    case = UNFUSED[0]
    assert adapter.forward_only_checks(case) == {FLASH: None}
    f64 = attention((2, 3, 4), (2, 5, 4), (2, 5, 4), dtype="f64")
    assert "f32" in adapter.forward_only_checks(f64)[FLASH]
    assert adapter.forward_only_checks(BLOCKS[1]) == {}
    assert adapter.forward_only_checks(dataclasses.replace(case, cotangent="permuted")) == {}


def test_flash_mask_is_f16_with_the_causal_cut_bottom_right_aligned():
    case = attention((1, 2, 2, 4), (1, 1, 3, 4), (1, 1, 3, 4), (2, 3), causal=True)
    arrays = case.generate_inputs()
    m = ggml_attention.flash_mask(case, arrays)
    assert m.dtype == np.float16 and m.shape == (1, 2, 2, 3) and m.flags.c_contiguous
    assert np.isneginf(m[..., 0, 2]).all() and np.isfinite(m[..., 1, :]).all()
    np.testing.assert_array_equal(m[0, 1, :, :2], arrays[3][:, :2].astype(np.float16))
    plain = attention((2, 3, 4), (2, 5, 4), (2, 5, 4))
    assert ggml_attention.flash_mask(plain, plain.generate_inputs()) is None


@pytest.mark.parametrize("case", [
    attention((1, 4, 5, 4), (1, 2, 6, 4), (1, 2, 6, 3), (5, 6), causal=True, max_bias=8.0,
              logit_softcap=3.0, scale=0.5),
    attention((2, 2, 4, 4), (2, 1, 3, 4), (2, 1, 3, 4), causal=True, scale=0.7),  # dead rows
    attention((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4), dtype="f16", scale=0.5),
    attention((1, 2, 3, 4), (1, 2, 4, 4), (1, 2, 4, 4), views={"v": {"permute": BTHD}},
              causal=True),
])
def test_flash_attention_forward_agrees_with_our_engine(adapter, case):
    """ggml's output (permuted back from [Dv, Hq, Tq, B]) against ours on the same inputs,
    the mask rounded to F16 as ggml gets it; a row with no key is 0 in both."""
    out, seen = adapter.forward_only_output(FLASH, case, case.generate_inputs())
    weights = loss_weights(out.shape, case.seed())
    ours = EngineAdapter("cpu").vjp(case, seen, weights).output
    assert out.shape == ours.shape
    cmp = compare(out, ours, case.precision)
    assert cmp.ok, cmp


def test_an_attention_case_gets_a_forward_only_row_that_says_so():
    (row, flash) = run_checks([UNFUSED[1]], engine=GgmlAdapter(), use_torch=False)
    assert row.status == "pass" and "check" not in row.labels
    assert flash.status == "pass" and flash.name == f"{UNFUSED[1]} [{FLASH}: forward only]"
    assert flash.labels["check"] == "forward only" and flash.labels["variant"] == FLASH
    assert "the gradients are not checked" in flash.message
