"""The registry's network ops as tinygrad Tensor code, by op name: products, softmax, norms,
convolutions, pooling, im2col, get_rows, rope, attention and the decoder blocks.

tinygrad's own functions where it has them (matmul, softmax, log_softmax, layernorm,
conv2d, conv_transpose2d, max_pool2d, avg_pool2d, logsumexp, fancy indexing); rope, ALiBi
softmax, im2col and attention written from their formulas with tinygrad ops. Where the
registry's float64 definition computes in a wider type than the case's (softmax with a
mask, norm and rms_norm and rope in float64, attention of 16-bit inputs in float32), the
tinygrad code casts the same way, so that the precision verdict compares like with like.
The backward ops whose gradient gradcheck also checks (im2col_back, im2col_1d_back,
get_rows_back, rope_back) are tinygrad's VJP of their forward op, or rope at -theta.
"""

from __future__ import annotations

import math

import numpy as np

from engine.ops.rope import DEFAULTS as ROPE_DEFAULTS
from engine.ops.softmax import n_heads
from engine.reference_math import reference_alibi_slopes, reference_yarn_range


def _dt(name):
    from tinygrad import dtypes
    return {"f64": dtypes.float64, "f32": dtypes.float32}[name]


def _pair(v):
    return tuple(v) if isinstance(v, (list, tuple)) else (v, v)


def _const(array, like):
    from tinygrad import Tensor
    return Tensor(np.ascontiguousarray(array), device=like.device)


def _zeros(shape, like):
    from tinygrad import Tensor
    return Tensor.zeros(*shape, dtype=like.dtype, device=like.device).contiguous()


def _matmul(a, b):
    return a @ b


def _out_prod(a, b):
    return b.transpose(-1, -2) @ a


def _softmax(x, mask=None, sinks=None, scale=1.0, max_bias=0.0):
    """softmax(scale x + slope_h mask), a sink logit per head in the normaliser; with a
    mask in float64 (as the registry's definition), else tinygrad's softmax of scale x."""
    if mask is None:
        return (x * scale).softmax(-1)
    h = n_heads(x.shape)
    lead = (h, 1, 1)[-min(3, x.ndim):]
    slopes = _const(reference_alibi_slopes(h, max_bias).reshape(lead), x)
    z = x.cast(_dt("f64")) * scale + slopes * mask.cast(_dt("f64"))
    if sinks is None:
        return z.softmax(-1).cast(x.dtype)
    column = sinks.cast(_dt("f64")).reshape(lead).expand(*z.shape[:-1], 1)
    return z.cat(column, dim=-1).softmax(-1)[..., :-1].cast(x.dtype)


def _norm(x, eps=1e-5):
    return x.cast(_dt("f64")).layernorm(-1, eps).cast(x.dtype)


def _rms_normed(x, eps):
    z = x.cast(_dt("f64"))
    return (z * (z.square().mean(-1, keepdim=True) + eps).rsqrt()).cast(x.dtype)


def _rms_norm(x, eps=1e-6):
    """x / sqrt(mean(x^2) + eps): tinygrad has no rms_norm; written with its ops."""
    return _rms_normed(x, eps)


def _conv_2d(x, w, stride=1, padding=0, dilation=1):
    return x.conv2d(w, stride=_pair(stride), padding=_pair(padding), dilation=_pair(dilation))


def _conv_transpose_2d(x, w, stride=1):
    return x.conv_transpose2d(w, stride=_pair(stride))


def _pool(x, mode, kernel, stride=None, padding=0, dims=2):
    size = (lambda v: tuple(v) if isinstance(v, (list, tuple)) else (v,) * dims)
    k = size(kernel)
    s = k if stride is None else size(stride)
    p = size(padding)
    if mode == "max":
        return x.max_pool2d(kernel_size=k, stride=s, padding=p)
    return x.avg_pool2d(kernel_size=k, stride=s, padding=p, count_include_pad=True)


def _pool_1d(x, mode, kernel, stride=None, padding=0):
    return _pool(x, mode, kernel, stride, padding, dims=1)


def _windows(x, kernel, stride, padding, dilation):
    """The patch columns of x's trailing len(kernel) axes: x padded, then one strided
    slice per kernel offset, stacked after the channel axis: (N, C, prod(kernel), *out)."""
    from tinygrad import Tensor
    nd = len(kernel)
    spatial = x.shape[-nd:]
    out = [(n + 2 * p - d * (k - 1) - 1) // s + 1
           for n, k, s, p, d in zip(spatial, kernel, stride, padding, dilation, strict=True)]
    xp = x.pad(((0, 0),) * (x.ndim - nd) + tuple((p, p) for p in padding))
    cols = []
    for offsets in np.ndindex(*kernel):
        index = tuple(slice(o * d, o * d + (n - 1) * s + 1, s)
                      for o, d, n, s in zip(offsets, dilation, out, stride, strict=True))
        cols.append(xp[(slice(None), slice(None)) + index])
    return Tensor.stack(*cols, dim=2), out


def _im2col(x, kh, kw, stride=1, padding=0, dilation=1, dtype=None, layout="NHWK"):
    """NCHW -> (N, OH, OW, C*KH*KW), columns ordered (c, ky, kx), or with layout NKHW
    (N, C*KH*KW, OH, OW): written with pad and strided slices (tinygrad's im2col is
    private to its pooling)."""
    n, c = x.shape[:2]
    cols, (oh, ow) = _windows(x, (kh, kw), _pair(stride), _pair(padding), _pair(dilation))
    out = cols.reshape(n, c * kh * kw, oh, ow)
    if layout == "NHWK":
        out = out.permute(0, 2, 3, 1)
    return out if dtype is None else _cast(out, dtype)


def _im2col_1d(x, k, stride=1, padding=0, dilation=1, dtype=None):
    n, c = x.shape[:2]
    cols, (ol,) = _windows(x, (k,), (stride,), (padding,), (dilation,))
    out = cols.reshape(n, c * k, ol).permute(0, 2, 1)
    return out if dtype is None else _cast(out, dtype)


def _cast(t, dtype):
    from gradcheck.adapters.tinygrad_adapter.device import tinygrad_dtype
    return t.cast(tinygrad_dtype(dtype))


def _vjp_at_zeros(forward, shape, g, **params):
    """tinygrad's VJP of the linear op `forward` for g, taken at zeros of `shape` (the
    point does not matter for a linear op); differentiable in g."""
    x0 = _zeros(shape, g)
    (dx,) = forward(x0, **params).gradient(x0, gradient=g)
    return dx


def _im2col_back(g, x_shape, kh, kw, stride=1, padding=0, dilation=1, dtype=None,
                 layout="NHWK"):
    dx = _vjp_at_zeros(_im2col, x_shape, g, kh=kh, kw=kw, stride=stride, padding=padding,
                       dilation=dilation, layout=layout)
    return dx if dtype is None else _cast(dx, dtype)


def _im2col_1d_back(g, x_shape, k, stride=1, padding=0, dilation=1, dtype=None):
    dx = _vjp_at_zeros(_im2col_1d, x_shape, g, k=k, stride=stride, padding=padding,
                       dilation=dilation)
    return dx if dtype is None else _cast(dx, dtype)


def _get_rows(table, idx):
    return table[idx]


def _get_rows_back(g, idx, nrows):
    x0 = _zeros((nrows, g.shape[-1]), g)
    (dx,) = _get_rows(x0, idx).gradient(x0, gradient=g)
    return dx


def _rope(x, pos, freq_factors=None, *, sign=1.0, n_dims, mode, n_ctx_orig, freq_base,
          freq_scale, ext_factor, attn_factor, beta_fast, beta_slow):
    """rope from its formulas (engine.ops.rope), in float64, rounded once to x's dtype."""
    f64 = _dt("f64")
    half = n_dims // 2
    i = np.arange(half, dtype=np.float64)
    inv_freq = _const(freq_base ** (-2.0 * i / n_dims), x)
    extrap = pos.cast(f64).reshape(-1, 1) * inv_freq
    if freq_factors is not None:
        extrap = extrap / freq_factors.cast(f64)
    theta, mscale = extrap * freq_scale, attn_factor
    if ext_factor != 0.0:
        low, high = reference_yarn_range(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
        mix = (1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)) * ext_factor
        theta = theta * _const(1.0 - mix, x) + extrap * _const(mix, x)
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    c = (theta.cos() * mscale).unsqueeze(1)           # (T, 1, half): over the heads
    s = (theta.sin() * (sign * mscale)).unsqueeze(1)
    xd = x.cast(f64)
    rot = xd[..., :n_dims]
    if mode == "neox":
        x0, x1 = rot[..., :half], rot[..., half:]
        y = (x0 * c - x1 * s).cat(x0 * s + x1 * c, dim=-1)
    else:
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        y = (x0 * c - x1 * s).stack(x0 * s + x1 * c, dim=-1).flatten(-2)
    if n_dims < x.shape[-1]:
        y = y.cat(xd[..., n_dims:], dim=-1)
    return y.cast(x.dtype)


def _rope_back(g, pos, freq_factors=None, **params):
    return _rope(g, pos, freq_factors, sign=-1.0, **params)


def _attention_parts(q, k, v, mask=None, *, scale=None, causal=False, logit_softcap=0.0,
                     max_bias=0.0):
    """(out, lse) from the formulas with tinygrad ops, in q's dtype (float32 for 16-bit
    inputs, rounded once at the end, as the registry's definition): grouped-query heads,
    ALiBi slope times the mask, -inf above the bottom-right diagonal when causal, softcap;
    rows that see no key give 0 and lse -inf."""
    dtype = q.dtype
    work = _dt("f32") if dtype.itemsize == 2 else dtype
    q, k, v = (t.cast(work) for t in (q, k, v))
    *lead, hq, tq, d = q.shape
    tk = k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    group = hq // k.shape[-3]
    kg, vg = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    s = (q @ kg.transpose(-1, -2)) * scale
    if logit_softcap > 0.0:
        s = (s / logit_softcap).tanh() * logit_softcap
    if mask is not None:
        slopes = _const(reference_alibi_slopes(hq, max_bias).reshape(hq, 1, 1), s).cast(work)
        s = s + slopes * mask.cast(work)
    dead = None
    if causal:
        above = np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq)
        s = _const(above, s).where(-math.inf, s)
        rows = above.all(-1, keepdims=True)
        dead = _const(rows, s) if rows.any() else None
    live = s if dead is None else dead.where(0.0, s)
    out = live.softmax(-1) @ vg
    lse = live.logsumexp(-1)
    if dead is not None:
        out = dead.where(0.0, out)
        lse = dead[..., 0].where(-math.inf, lse)
    return out.cast(dtype), lse.cast(dtype)


def _attention(q, k, v, mask=None, **params):
    return _attention_parts(q, k, v, mask, **params)[0]


def _attention_fwd(q, k, v, mask=None, **params):
    out, lse = _attention_parts(q, k, v, mask, **params)
    return out.cat(lse.unsqueeze(-1), dim=-1)


def _linear(x, w):
    return x @ w.transpose(-1, -2)


def _mlp_block(x, ffn_norm, w_gate, w_up, w_down, *, eps=1e-5):
    h = _rms_normed(x, eps) * ffn_norm
    return x + _linear(_linear(h, w_gate).silu() * _linear(h, w_up), w_down)


def _attention_block(x, pos, attn_norm, wq, wk, wv, wo, *, n_head, n_head_kv, n_dims,
                     eps=1e-5, scale=None, **rope_params):
    """rms_norm with its weight, q/k/v projections, rope on q and k, causal grouped-query
    attention, output projection, residual: as the registry's torch equivalent."""
    rope_params = {**ROPE_DEFAULTS, **rope_params, "n_dims": n_dims}
    d, dv = wq.shape[0] // n_head, wv.shape[0] // n_head_kv
    h = _rms_normed(x, eps) * attn_norm
    lead = tuple(x.shape[:-1])
    q = _rope(_linear(h, wq).reshape(*lead, n_head, d), pos, **rope_params)
    k = _rope(_linear(h, wk).reshape(*lead, n_head_kv, d), pos, **rope_params)
    v = _linear(h, wv).reshape(*lead, n_head_kv, dv)
    o = _attention(q.transpose(-3, -2), k.transpose(-3, -2), v.transpose(-3, -2),
                   causal=True, scale=1.0 / math.sqrt(d) if scale is None else scale)
    return x + _linear(o.transpose(-3, -2).flatten(-2), wo)


NN = {
    "matmul": _matmul,
    "out_prod": _out_prod,
    "softmax": _softmax,
    "log_softmax": lambda x: x.log_softmax(-1),
    "norm": _norm,
    "rms_norm": _rms_norm,
    "conv_2d": _conv_2d,
    "conv_transpose_2d": _conv_transpose_2d,
    "pool_2d": _pool,
    "pool_1d": _pool_1d,
    "im2col": _im2col,
    "im2col_1d": _im2col_1d,
    "im2col_back": _im2col_back,
    "im2col_1d_back": _im2col_1d_back,
    "get_rows": _get_rows,
    "get_rows_back": _get_rows_back,
    "rope": _rope,
    "rope_back": _rope_back,
    "attention": _attention,
    "attention_fwd": _attention_fwd,
    "mlp_block": _mlp_block,
    "attention_block": _attention_block,
}
