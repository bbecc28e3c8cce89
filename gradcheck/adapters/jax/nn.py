"""The registry's network ops in jax: convolutions, pooling, columns, norms, softmax,
attention, rope and the decoder blocks.

    conv_2d            lax.conv_general_dilated, NCHW input, OIHW kernel
    conv_transpose_2d  lax.conv_general_dilated of the input dilated by the stride and
                       padded by k - 1, with the kernel flipped and its in/out axes
                       exchanged (torch's conv_transpose2d, no padding)
    pool_1d, pool_2d   lax.reduce_window: max (padding -inf), or a sum over the window
                       divided by its full size (avg, padding counted)
    im2col, im2col_1d  lax.conv_general_dilated_patches (features ordered (c, ky, kx)),
                       moved to (N, OH, OW, C*KH*KW) / (N, OL, C*K)
    im2col_back, im2col_1d_back   jax.linear_transpose of the above: jax's col2im
    norm, rms_norm     from their formulas, in float64, rounded once to x's dtype (as the
                       registry's torch references)
    softmax            jax.nn.softmax of scale x (no mask, in x's dtype); with a mask, in
                       float64: scale x + slope_h mask, one sink logit per head
    attention(_fwd)    jax.nn.dot_product_attention (xla) where it applies: equal head
                       sizes of k and v, no softcap; else softmax(s) @ v from jax.numpy;
                       16-bit inputs computed in float32; lse from its formula
    rope(_back)        from its formula (ggml_rope_ext with YaRN), in float64
    mlp_block, attention_block   composed of the above, as the registry's torch references
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from engine.ops.rope import DEFAULTS as ROPE_DEFAULTS
from engine.ops.softmax import n_heads
from engine.param_checks import pair
from engine.reference_math import reference_alibi_slopes, reference_yarn_range
from engine.tensor import DTYPES

NCHW = ("NCHW", "OIHW", "NCHW")
NCL = ("NCH", "OIH", "NCH")


def _pairs(op, **values):
    return (pair(op, name, v) for name, v in values.items())


def conv_2d(x, w, stride=1, padding=0, dilation=1):
    stride, padding, dilation = _pairs("conv_2d", stride=stride, padding=padding,
                                       dilation=dilation)
    return lax.conv_general_dilated(x, w, stride, [(p, p) for p in padding],
                                    rhs_dilation=dilation, dimension_numbers=NCHW)


def conv_transpose_2d(x, w, stride=1):
    """torch's conv_transpose2d(x, w (C_in, C_out, KH, KW), stride), padding 0."""
    (sh, sw), (kh, kw) = pair("conv_transpose_2d", "stride", stride), w.shape[2:]
    kernel = jnp.flip(w, (2, 3)).swapaxes(0, 1)           # (C_out, C_in, KH, KW)
    return lax.conv_general_dilated(x, kernel, (1, 1), [(kh - 1, kh - 1), (kw - 1, kw - 1)],
                                    lhs_dilation=(sh, sw), dimension_numbers=NCHW)


def _window(x, mode, kernel, stride, padding):
    """max or avg pooling over the trailing len(kernel) axes."""
    n = len(kernel)       # (numpy init values: jax differentiates its max and sum windows)
    dims = (1,) * (x.ndim - n) + tuple(kernel)
    strides = (1,) * (x.ndim - n) + tuple(stride)
    pads = ((0, 0),) * (x.ndim - n) + tuple((p, p) for p in padding)
    if mode == "max":
        return lax.reduce_window(x, np.array(-np.inf, x.dtype), lax.max, dims, strides,
                                 pads)
    total = lax.reduce_window(x, np.array(0, x.dtype), lax.add, dims, strides, pads)
    return total / math.prod(kernel)


def pool_2d(x, mode, kernel, stride=None, padding=0):
    kernel = pair("pool_2d", "kernel", kernel)
    stride = kernel if stride is None else pair("pool_2d", "stride", stride)
    return _window(x, mode, kernel, stride, pair("pool_2d", "padding", padding))


def pool_1d(x, mode, kernel, stride=None, padding=0):
    return _window(x, mode, (kernel,), (kernel if stride is None else stride,), (padding,))


def _in(x, dtype):
    return x if dtype is None else x.astype(DTYPES[dtype])


def im2col(x, kh, kw, stride=(1, 1), padding=(0, 0), dilation=(1, 1), dtype=None,
           layout="NHWK"):
    stride, padding, dilation = _pairs("im2col", stride=stride, padding=padding,
                                       dilation=dilation)
    cols = lax.conv_general_dilated_patches(x, (kh, kw), stride, [(p, p) for p in padding],
                                            rhs_dilation=dilation, dimension_numbers=NCHW)
    if layout == "NKHW":
        return _in(cols, dtype)                           # (N, C*KH*KW, OH, OW)
    return _in(jnp.moveaxis(cols, 1, -1), dtype)          # (N, OH, OW, C*KH*KW)


def im2col_1d(x, k, stride=1, padding=0, dilation=1, dtype=None):
    cols = lax.conv_general_dilated_patches(x, (k,), (stride,), [(padding, padding)],
                                            rhs_dilation=(dilation,), dimension_numbers=NCL)
    return _in(jnp.moveaxis(cols, 1, -1), dtype)          # (N, OL, C*K)


def _transposed(forward):
    """The adjoint of a columns op at x_shape: jax's transpose of it, computed in the
    op's `dtype` (its sums too: a float16 g with dtype f32 adds up in float32)."""
    def back(g, x_shape, dtype=None, **params):
        g = _in(g, dtype)
        image = jax.ShapeDtypeStruct(tuple(x_shape), g.dtype)
        (dx,) = jax.linear_transpose(lambda x: forward(x, **params), image)(g)
        return dx
    return back


def norm(x, eps=1e-5):
    z = x.astype(jnp.float64)
    mu = z.mean(-1, keepdims=True)
    var = jnp.square(z - mu).mean(-1, keepdims=True)
    return ((z - mu) * lax.rsqrt(var + eps)).astype(x.dtype)


def rms_norm(x, eps=1e-6):
    z = x.astype(jnp.float64)
    return (z * lax.rsqrt(jnp.square(z).mean(-1, keepdims=True) + eps)).astype(x.dtype)


def softmax(x, mask=None, sinks=None, scale=1.0, max_bias=0.0):
    """softmax(scale x + slope_h mask) along the last axis, with one sink logit per head in
    the normaliser (engine.ops.softmax)."""
    if mask is None:
        return jax.nn.softmax(x * scale, axis=-1)
    h = n_heads(x.shape)
    lead = (h, 1, 1)[-min(3, x.ndim):]
    slopes = jnp.asarray(reference_alibi_slopes(h, max_bias)).reshape(lead)
    z = x.astype(jnp.float64) * scale + slopes * mask.astype(jnp.float64)
    if sinks is None:
        return jax.nn.softmax(z, axis=-1).astype(x.dtype)
    column = jnp.broadcast_to(sinks.astype(jnp.float64).reshape(lead), (*z.shape[:-1], 1))
    return jax.nn.softmax(jnp.concatenate([z, column], -1), axis=-1)[..., :-1].astype(x.dtype)


def attention_parts(q, k, v, mask=None, *, scale=None, causal=False, logit_softcap=0.0,
                    max_bias=0.0):
    """(out, lse) of scaled-dot-product attention (engine.ops.attention), rows with no
    visible key giving out 0 and lse -inf."""
    dtype = q.dtype
    work = jnp.float32 if dtype in (DTYPES["f16"], DTYPES["bf16"]) else dtype
    q, k, v = (t.astype(work) for t in (q, k, v))
    *lead, hq, tq, d = q.shape
    hk, tk, dv = k.shape[-3], k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    bias = jnp.zeros((tq, tk), work)
    if mask is not None:
        slopes = jnp.asarray(reference_alibi_slopes(hq, max_bias), work).reshape(hq, 1, 1)
        bias = bias + slopes * mask.astype(work)
    if causal:
        above = np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq)
        bias = jnp.where(above, -jnp.inf, bias)
    bias = jnp.broadcast_to(bias, (*lead, hq, tq, tk))
    group = hq // hk
    kg, vg = jnp.repeat(k, group, axis=-3), jnp.repeat(v, group, axis=-3)
    s = scale * (q @ jnp.swapaxes(kg, -1, -2))
    if logit_softcap > 0.0:
        s = logit_softcap * jnp.tanh(s / logit_softcap)
    s = s + bias
    dead = jnp.all(jnp.isneginf(s), axis=-1, keepdims=True)
    live = jnp.where(dead, 0.0, s)
    lse = jnp.where(dead[..., 0], -jnp.inf, jax.nn.logsumexp(live, axis=-1))
    if logit_softcap > 0.0 or dv != d:
        out = jax.nn.softmax(live, axis=-1) @ vg
    else:
        out = _dot_product_attention(q, k, v, jnp.where(dead, 0.0, bias), scale)
    out = jnp.where(dead, 0.0, out)
    return out.astype(dtype), lse.astype(dtype)


def _dot_product_attention(q, k, v, bias, scale):
    """jax.nn.dot_product_attention on (..., H, T, D) arrays (it takes (B, T, H, D)); the
    query heads share the key heads in groups (GQA)."""
    *lead, hq, tq, d = q.shape

    def btnh(t):
        return jnp.swapaxes(t.reshape(-1, *t.shape[-3:]), 1, 2)
    out = jax.nn.dot_product_attention(btnh(q), btnh(k), btnh(v),
                                       bias.reshape(-1, *bias.shape[-3:]), scale=scale,
                                       implementation="xla")
    return jnp.swapaxes(out, 1, 2).reshape(*lead, hq, tq, v.shape[-1])


def attention(q, k, v, mask=None, **params):
    return attention_parts(q, k, v, mask, **params)[0]


def attention_fwd(q, k, v, mask=None, **params):
    out, lse = attention_parts(q, k, v, mask, **params)
    return jnp.concatenate([out, lse[..., None]], -1)


def rope(x, pos, freq_factors=None, *, sign=1.0, n_dims, mode, n_ctx_orig, freq_base,
         freq_scale, ext_factor, attn_factor, beta_fast, beta_slow):
    """x (.., T, H, D) rotated pairwise by theta = pos freq_scale freq_base^(-2i/n_dims)
    (YaRN-mixed when ext_factor != 0), times mscale; the first n_dims features only, in
    float64, rounded once to x's dtype. `sign` -1 rotates back (rope_back)."""
    half = n_dims // 2
    i = np.arange(half, dtype=np.float64)
    inv_freq = freq_base ** (-2.0 * i / n_dims)
    extrap = pos.astype(jnp.float64)[:, None] * inv_freq
    if freq_factors is not None:
        extrap = extrap / freq_factors.astype(jnp.float64)
    theta, mscale = freq_scale * extrap, attn_factor
    if ext_factor != 0.0:
        low, high = reference_yarn_range(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
        mix = (1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)) * ext_factor
        theta = theta * (1.0 - mix) + extrap * mix
        mscale *= 1.0 + 0.1 * np.log(1.0 / freq_scale)
    c = (mscale * jnp.cos(theta))[:, None, :]             # (T, 1, half): over the heads
    s = (sign * mscale * jnp.sin(theta))[:, None, :]
    xd = x.astype(jnp.float64)
    rot = xd[..., :n_dims]
    if mode == "neox":
        x0, x1 = rot[..., :half], rot[..., half:]
        y = jnp.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], -1)
    else:
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        y = jnp.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).reshape(rot.shape)
    return jnp.concatenate([y, xd[..., n_dims:]], -1).astype(x.dtype)


def rope_back(g, pos, freq_factors=None, **params):
    return rope(g, pos, freq_factors, sign=-1.0, **params)


def _rms_normed(x, weight, eps):
    z = x * lax.rsqrt(jnp.square(x).mean(-1, keepdims=True) + eps)
    return z * weight


def _linear(x, w):
    return x @ w.T


def mlp_block(x, ffn_norm, w_gate, w_up, w_down, *, eps):
    h = _rms_normed(x, ffn_norm, eps)
    return x + _linear(jax.nn.silu(_linear(h, w_gate)) * _linear(h, w_up), w_down)


def attention_block(x, pos, attn_norm, wq, wk, wv, wo, *, n_head, n_head_kv, n_dims, eps,
                    scale=None, **rope_params):
    """llama's causal self-attention block (engine.ops.decoder_blocks)."""
    rope_params = {**ROPE_DEFAULTS, **rope_params, "n_dims": n_dims}
    d, dv = wq.shape[0] // n_head, wv.shape[0] // n_head_kv
    h = _rms_normed(x, attn_norm, eps)

    def heads(t, n, size):
        return t.reshape(*t.shape[:-1], n, size)
    q = rope(heads(_linear(h, wq), n_head, d), pos, **rope_params)
    k = rope(heads(_linear(h, wk), n_head_kv, d), pos, **rope_params)
    v = heads(_linear(h, wv), n_head_kv, dv)
    o = attention(jnp.swapaxes(q, -3, -2), jnp.swapaxes(k, -3, -2), jnp.swapaxes(v, -3, -2),
                  causal=True, scale=scale)
    o = jnp.swapaxes(o, -3, -2)
    return x + _linear(o.reshape(*o.shape[:-2], -1), wo)


OPS = {
    "conv_2d": conv_2d,
    "conv_transpose_2d": conv_transpose_2d,
    "pool_2d": pool_2d,
    "pool_1d": pool_1d,
    "im2col": im2col,
    "im2col_1d": im2col_1d,
    "im2col_back": _transposed(im2col),
    "im2col_1d_back": _transposed(im2col_1d),
    "norm": norm,
    "rms_norm": rms_norm,
    "softmax": softmax,
    "attention": attention,
    "attention_fwd": attention_fwd,
    "rope": rope,
    "rope_back": rope_back,
    "mlp_block": mlp_block,
    "attention_block": attention_block,
}
