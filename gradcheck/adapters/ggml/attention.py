"""attention and the decoder blocks in ggml: the unfused attention that ggml differentiates,
ggml_flash_attn_ext forward only, and llama.cpp's decoder layer built from ggml's own ops.

Shapes in ggml's order (ne, see graph.py): q [D, Tq, Hq, B], k [D, Tk, Hkv, B],
v [Dv, Tk, Hkv, B], as the registry's (B, H, T, D) tensors are.

attention, unfused (llama.cpp's build_attn_mha without flash attention), differentiated:

    kq  = ggml_mul_mat(k, q)                         [Tk, Tq, Hq, B]; GQA: mul_mat's broadcast
                                                     (query head h reads kv head h / (Hq/Hkv))
    kq  = ggml_diag_mask_inf(kq, Tk - Tq)            if causal
    kq  = ggml_soft_max_ext(kq, mask, scale, max_bias)   mask repeated to [Tk, Tq, ..] if
                                                     numpy broadcasts it along rows or columns
    out = ggml_mul_mat(ggml_cont(ggml_transpose(v)), kq)   [Dv, Tq, Hq, B]: the case's layout

In float16 (F16 q, k, v) the scores come out F32 and mul_mat(v, kq) rounds the
probabilities to F16, v's vec_dot_type (coverage.F16_OPS).

No softcap: llama.cpp's unfused softcap is ggml_scale, ggml_tanh, ggml_scale, and ggml_tanh
has no backward (coverage.NO_BACKWARD); those cases are unsupported. Nor rows with every key
masked (causal with Tq > Tk): ggml_diag_mask_inf asserts n_past >= 0, and ggml_soft_max of
an all -inf row divides by a zero sum (NaN) where attention defines 0.

ggml_flash_attn_ext(q, k, v, mask, scale, max_bias, logit_softcap) has no backward
(ggml_compute_backward aborts on GGML_OP_FLASH_ATTN_EXT), so it is checked forward only
(`flash`, run by the adapter's forward_only_output for gradcheck.forward_only): q as F32
(the kernel reads q as floats), k and v in the case's type, the mask F16 (ggml asserts
it), contiguous, [Tk, Tq, Hq, B], the case's mask broadcast and the causal cut (-inf)
added. ggml 0.20.2 has no GGML_KQ_MASK_PAD (removed upstream; the kernel reads mask row i
for query i, so ne[1] = Tq rows suffice). The result is permuted, [Dv, Hq, Tq, B]. The
reference sees the mask as ggml does, rounded to F16.

attention_block and mlp_block: llama.cpp's llm_build_llama layer (see engine.ops.
decoder_blocks) with ggml_rms_norm, ggml_mul (the norm's weight), ggml_mul_mat (weights in
ggml's layout, the registry's (n_out, n_in)), ggml_reshape_4d, ggml_rope_ext, ggml_permute,
the unfused attention with llama.cpp's kq_mask (a constant F32 input of 0 and -inf) in
ggml_soft_max_ext, ggml_cont, ggml_swiglu_split, ggml_add (the residual).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from checkkit.ggml import BASE, GGML_TYPE_F16, GGML_TYPE_F32
from gradcheck.adapters.ggml.graph import Context
from gradcheck.adapters.ggml.rope import rope_ext

FLASH = "ggml_flash_attn_ext"
FLASH_NO_BACKWARD = ("ggml has no backward for ggml_flash_attn_ext (ggml_compute_backward: "
                     "'unsupported ggml op for backward pass: FLASH_ATTN_EXT'); its forward "
                     "is checked alone")
SIGNATURES = {BASE: {FLASH: (ctypes.c_void_p, [ctypes.c_void_p] * 5 + [ctypes.c_float] * 3)}}
NO_SOFTCAP = ("ggml cannot differentiate a softcap: llama.cpp's unfused form is ggml_scale, "
              "ggml_tanh, ggml_scale, and ggml_tanh has no backward (GGML_UNARY_OP_TANH is "
              "not in ggml_compute_backward)")
DEAD_ROWS = ("rows with every key masked (causal, Tq > Tk): ggml_diag_mask_inf asserts "
             "n_past >= 0 and ggml_soft_max divides an all -inf row by a zero sum (NaN), "
             "where attention defines 0")


def declare(lib) -> None:
    """ggml_flash_attn_ext made an attribute of `lib` (once)."""
    if not hasattr(lib, FLASH):
        lib.declare(SIGNATURES)


def _heads_first(g: Context, t):
    """ggml_permute(t, 0, 2, 1, 3): [D, H, T, B] <-> [D, T, H, B]."""
    return g.lib.ggml_permute(g.ctx, t, 0, 2, 1, 3)


def _params(case):
    kw = case.kwargs
    d = case.inputs[0].shape[-1]
    scale = kw.get("scale")
    return (1.0 / math.sqrt(d) if scale is None else scale, bool(kw.get("causal")),
            float(kw.get("logit_softcap", 0.0)), float(kw.get("max_bias", 0.0)))


# --- attention, unfused ---------------------------------------------------------------------
def attention_why_not(case):
    _, causal, softcap, _ = _params(case)
    if softcap > 0.0:
        return NO_SOFTCAP
    if causal and case.inputs[0].shape[-2] > case.inputs[1].shape[-2]:
        return DEAD_ROWS
    return None


def _mask_for(g: Context, mask, scores_ne, is_view: bool):
    """The case's mask as ggml_soft_max_ext takes it: contiguous (ggml_cont of a view), rows
    of Tk and at least Tq of them (ggml_repeat_4d where numpy broadcasts it along either)."""
    mask = g.cont(mask) if is_view else mask
    mn = g.ne(mask)
    if mn[:2] != tuple(scores_ne[:2]):
        mask = g.repeat_4d(mask, scores_ne[0], scores_ne[1], mn[2], mn[3])
    return mask


def _unfused(g: Context, q, k, v, mask, scale, causal, max_bias):
    """llama.cpp's attention without flash attention, on [D, T, H, B] tensors."""
    kq = g.mul_mat(g.not_transposed(k), q)
    if causal:
        n_past = g.ne(k)[1] - g.ne(q)[1]
        kq = g.diag_mask_inf(kq, n_past)
    kq = g.soft_max_ext(kq, mask, scale, max_bias if mask is not None else 0.0)
    return g.mul_mat(g.cont(g.transpose(v)), kq)


def attention(g: Context, case, xs):
    scale, causal, _, max_bias = _params(case)
    q, k, v = xs[:3]
    mask = None
    if len(xs) > 3:
        scores = (g.ne(k)[1], g.ne(q)[1])
        mask = _mask_for(g, xs[3], scores, case.inputs[3].is_view)
    return _unfused(g, q, k, v, mask, scale, causal, max_bias)


# --- flash attention, forward only ----------------------------------------------------------
def flash_mask(case, arrays) -> np.ndarray | None:
    """The F16 mask ggml_flash_attn_ext gets, numpy (.., Hq, Tq, Tk): the case's mask
    broadcast, -inf where causal cuts (j > i + Tk - Tq); None without either."""
    q, k = arrays[0], arrays[1]
    _, causal, _, _ = _params(case)
    scores = (*q.shape[:-1], k.shape[-2])
    if len(arrays) < 4 and not causal:
        return None
    m = np.zeros(scores) if len(arrays) < 4 else np.broadcast_to(
        np.asarray(arrays[3], np.float64), scores)
    if causal:
        tq, tk = scores[-2:]
        cut = np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq)
        m = np.where(cut, -np.inf, m)
    return np.ascontiguousarray(m, np.float16)


def flash_inputs(case, arrays) -> list[np.ndarray]:
    """The values ggml_flash_attn_ext computes on: the case's, the mask rounded to F16."""
    out = list(arrays)
    if len(out) > 3:
        out[3] = np.asarray(out[3]).astype(np.float16).astype(np.asarray(out[3]).dtype)
    return out


def flash(g: Context, case, views, arrays):
    """ggml_flash_attn_ext of the case's q, k, v tensors `views` (q as F32) and the F16 mask
    of `arrays`, permuted back to the case's layout [Dv, Tq, Hq, B] (a view)."""
    declare(g.lib)
    scale, _, softcap, max_bias = _params(case)
    mask = flash_mask(case, arrays)
    m = None if mask is None else g.from_numpy(mask, GGML_TYPE_F16)
    out = g.flash_attn_ext(g.as_f32(views[0]), views[1], views[2], m, scale,
                           max_bias if len(arrays) > 3 else 0.0, softcap)
    return _heads_first(g, out)


def flash_why_not(case) -> str | None:
    """Why ggml_flash_attn_ext cannot run `case` forward, or None."""
    if "f64" in case.float_dtypes:
        return "ggml computes in f32; the case is f64"
    if len(case.inputs[0].shape) > 4:
        return "ggml tensors have at most 4 dimensions"
    return None


# --- the decoder blocks ---------------------------------------------------------------------
def _linear(g: Context, w, h):
    """ggml_mul_mat(w, h): h w^T for a weight of ggml's layout (cont if stored transposed:
    mul_mat's first operand must not be)."""
    return g.mul_mat(g.not_transposed(w), h)


def _normed(g: Context, x, weight, eps):
    return g.mul(g.rms_norm(g.contiguous(x), eps), weight)


def _lead(case):
    """(T, B) of the case's x, (T, E) or (B, T, E)."""
    shape = case.inputs[0].shape
    return shape[-2], (shape[0] if len(shape) == 3 else 1)


def mlp_block(g: Context, case, xs):
    """llama.cpp's build_norm + build_ffn(LLM_FFN_SILU, LLM_FFN_PAR) + residual."""
    x, ffn_norm, w_gate, w_up, w_down = xs
    h = _normed(g, x, ffn_norm, case.kwargs["eps"])
    act = g.swiglu_split(_linear(g, w_gate, h), _linear(g, w_up, h))
    return g.add(_linear(g, w_down, act), x)


def causal_kq_mask(t: int) -> np.ndarray:
    """llama.cpp's kq_mask for T tokens of one sequence: 0 where key j <= query i, -inf
    above."""
    return np.where(np.arange(t)[None, :] > np.arange(t)[:, None], -np.inf,
                    0.0).astype(np.float32)


def attention_block(g: Context, case, xs):
    """llama.cpp's llm_build_llama attention half: build_norm, the q/k/v projections,
    ggml_reshape, ggml_rope_ext on q and k, build_attn_mha (unfused, causal kq_mask),
    ggml_cont of the permuted heads, the output projection, the residual."""
    kw = case.kwargs
    x, pos, attn_norm, wq, wk, wv, wo = xs
    t, b = _lead(case)
    hq, hkv = kw["n_head"], kw["n_head_kv"]
    d = case.inputs[3].shape[0] // hq
    dv = case.inputs[5].shape[0] // hkv
    h = _normed(g, x, attn_norm, kw["eps"])

    def rotated(w, heads):
        y = g.reshape_4d(_linear(g, w, h), d, heads, t, b)
        return rope_ext(g, y, pos, None, kw)
    q, k = _heads_first(g, rotated(wq, hq)), _heads_first(g, rotated(wk, hkv))
    v = _heads_first(g, g.reshape_4d(_linear(g, wv, h), dv, hkv, t, b))
    mask = g.from_numpy(causal_kq_mask(t), GGML_TYPE_F32)
    scale = kw.get("scale")
    kqv = _unfused(g, q, k, v, mask, 1.0 / math.sqrt(d) if scale is None else scale, False,
                   0.0)
    cur = g.reshape_4d(g.cont(_heads_first(g, kqv)), dv * hq, t, b, 1)
    return g.add(_linear(g, wo, cur), x)


# registry op -> (the ggml calls, build[, why_not]): rows of ops.OPS (16-bit cases: see
# coverage.F16_NO_KERNEL)
ROWS = {
    "attention": ("ggml_mul_mat(k, q), ggml_diag_mask_inf (causal), ggml_soft_max_ext(kq, "
                  "mask, scale, max_bias), ggml_mul_mat(cont(v^T), kq); "
                  "ggml_flash_attn_ext forward only", attention, attention_why_not),
    "attention_block": ("llama.cpp's attention layer: ggml_rms_norm, ggml_mul, ggml_mul_mat, "
                        "ggml_rope_ext, ggml_soft_max_ext (causal kq_mask), ggml_add",
                        attention_block),
    "mlp_block": ("llama.cpp's SwiGLU FFN: ggml_rms_norm, ggml_mul, ggml_mul_mat, "
                  "ggml_swiglu_split, ggml_add", mlp_block),
}
