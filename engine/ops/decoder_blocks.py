"""The two blocks of a llama-style decoder layer, as composite ops built from registry ops in
the order llama.cpp's graph builders (llm_build_llama, build_norm, build_attn, build_ffn)
make them. Weights are in ggml's layout: a projection W from n_in to n_out features is
numpy (n_out, n_in) (ggml ne [n_in, n_out]) and is applied as ggml_mul_mat(W, h) = h W^T.

x has shape (T, E) or (B, T, E) (ggml's cur, ne [E, T, B]): T tokens of E features.

attention_block(x, pos, attn_norm, wq, wk, wv, wo; n_head, n_head_kv, eps, rope parameters):

    h       = rms_norm(x, eps) * attn_norm                       attn_norm (E,)
    q       = rope(reshape(h wq^T, (.., T, Hq, D)), pos)          wq (Hq D, E)
    k       = rope(reshape(h wk^T, (.., T, Hkv, D)), pos)         wk (Hkv D, E)
    v       = reshape(h wv^T, (.., T, Hkv, Dv))                   wv (Hkv Dv, E)
    o       = attention(q, k, v permuted to (.., H, T, D), causal=True, scale)
              (grouped-query: query head h reads kv head h // (Hq / Hkv))
    out     = x + reshape(cont(o permuted to (.., T, Hq, Dv)), (.., T, Hq Dv)) wo^T
                                                                  wo (E, Hq Dv)

with Hq = n_head, Hkv = n_head_kv, D = wq.shape[0] / Hq, Dv = wv.shape[0] / Hkv, pos int32
(T,) (one position per token), rope's parameters as engine.ops.rope (n_dims, mode,
freq_base, ...; llama.cpp's defaults) and scale 1/sqrt(D) unless given (llama's kq_scale).

mlp_block(x, ffn_norm, w_gate, w_up, w_down; eps), the SwiGLU feed-forward (LLM_FFN_SILU,
LLM_FFN_PAR):

    h   = rms_norm(x, eps) * ffn_norm                            ffn_norm (E,)
    out = x + swiglu(h w_gate^T, h w_up^T) w_down^T              w_gate, w_up (F, E),
                                                                 w_down (E, F)

(swiglu's split form: silu(gate) * up). Both are differentiated through their parts.
"""

from __future__ import annotations

import dataclasses
import math

from engine.errors import DTypeError, ParamError, ShapeError
from engine.ops.attention import ATTENTION_PARAMS
from engine.ops.matmul import matmul
from engine.ops.norm import check_eps, eps_param, rms_norm
from engine.ops.rope import DEFAULTS as ROPE_DEFAULTS
from engine.ops.rope import PARAMS as ROPE_DECLARED
from engine.ops.rope import _torch_rope, rope
from engine.ops.shape import cont, permute, reshape, transpose
from engine.params import INT32_MAX, Params, int_param, integer
from engine.registry import OpDef, register, registered, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case, scale_case
from engine.strategies import MAX_ELEMENTS, draw_input, sample_strategy
from engine.tensor import is_float

EPS = 1e-5                               # llama's f_norm_rms_eps, the samples'
MLP_PARAMS = Params(dict(eps=eps_param(EPS)))
# n_head, n_head_kv, eps, scale (None: 1/sqrt(D)) and rope's parameters (llama.cpp's
# defaults but n_dims) with rope's rules
ATTENTION_BLOCK_PARAMS = Params(
    dict(n_head=int_param(1, INT32_MAX, why="query heads; the projections' rows divide by it"),
         n_head_kv=int_param(1, INT32_MAX, why="key and value heads, dividing n_head"),
         eps=eps_param(EPS), scale=ATTENTION_PARAMS["scale"],
         **{k: p if k == "n_dims" else dataclasses.replace(p, default=ROPE_DEFAULTS[k])
            for k, p in ROPE_DECLARED.items()}),
    rules=ROPE_DECLARED.rules)
ROPE_PARAMS = tuple(ROPE_DEFAULTS) + ("n_dims",)
# input ranges: activations and weights of a model's scale (the blocks' parts have their
# own samples for extreme ranges)
X_RANGE, W_RANGE, NORM_RANGE = (-1.0, 1.0), (-1.0, 1.0), (0.5, 1.5)


def _check_floats(op, x, others):
    if x.ndim not in (2, 3):
        raise ShapeError(f"{op}: x must have shape (T, E) or (B, T, E), got shapes "
                         f"{shapes_str(x, *others)}")
    for t in (x, *others):
        if not is_float(t.dtype) or t.dtype != x.dtype:
            raise DTypeError(f"{op}: x and the weights must be float of one dtype, got "
                             f"{[str(s.dtype) for s in (x, *others)]} (shapes "
                             f"{shapes_str(x, *others)})")


def _need(op, ok, what, *tensors):
    if not ok:
        raise ShapeError(f"{op}: {what}, got shapes {shapes_str(*tensors)}")


def _linear(h, w):
    """h w^T: ggml_mul_mat(w, h) for a weight w of ggml's layout, numpy (n_out, n_in)."""
    return matmul(h, transpose(w))


def _normed(x, weight, eps):
    """build_norm(x, weight, LLM_NORM_RMS): rms_norm(x) * weight."""
    return registered.mul(rms_norm(x, eps), weight)


# --- mlp_block ------------------------------------------------------------------------------
def mlp_block(x, ffn_norm, w_gate, w_up, w_down, *, eps=EPS):
    """The SwiGLU feed-forward block with its residual (module doc): x (T, E) or (B, T, E),
    ffn_norm (E,), w_gate and w_up (F, E), w_down (E, F)."""
    op, ws = "mlp_block", (ffn_norm, w_gate, w_up, w_down)
    _check_floats(op, x, ws)
    e = x.shape[-1]
    f = w_gate.shape[0] if w_gate.ndim == 2 else -1
    _need(op, ffn_norm.shape == (e,) and w_gate.shape == (f, e) and w_up.shape == (f, e)
          and w_down.shape == (e, f), "needs ffn_norm (E,), w_gate and w_up (F, E) and "
          "w_down (E, F) for x (.., T, E)", x, *ws)
    h = _normed(x, ffn_norm, check_eps(op, eps))
    act = registered.swiglu(_linear(h, w_gate), _linear(h, w_up))
    return registered.add(x, _linear(act, w_down))


def _torch_rms_normed(x, weight, eps):
    import torch.nn.functional as F
    return F.rms_norm(x, (x.shape[-1],), eps=eps) * weight


def _torch_mlp_block(x, ffn_norm, w_gate, w_up, w_down, *, eps=EPS):
    import torch.nn.functional as F
    h = _torch_rms_normed(x, ffn_norm, eps)
    return x + F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


def _w(name, shape, low=W_RANGE[0], high=W_RANGE[1], **view):
    return InputSpec(name, shape, "uniform", low, high, **view)


def _mlp_inputs(lead, e, f, views=None):
    views = views or {}
    return [_w("x", lead + (e,), *X_RANGE, **views.get("x", {})),
            _w("ffn_norm", (e,), *NORM_RANGE),
            _w("w_gate", (f, e), **views.get("w_gate", {})),
            _w("w_up", (f, e), **views.get("w_up", {})),
            _w("w_down", (e, f), **views.get("w_down", {}))]


@both_dtypes
def _mlp_samples(dtype):
    """Unbatched and batched tokens; weights stored transposed (permuted views), a sliced
    x and an expanded (stride-0) up projection."""
    cases = [((3,), 4, 6, None), ((2, 3), 4, 5, None), ((4,), 5, 3, None),
             ((3,), 4, 6, {"w_gate": {"permute": (1, 0)}, "w_down": {"permute": (1, 0)}}),
             ((2, 3), 4, 4, {"x": {"slice": ((1, 3, 1), (0, 5, 2), (1, 5, 1))},
                             "w_up": {"expand": (0,)}})]
    return [Sample.make("mlp_block", _mlp_inputs(lead, e, f, views), dtype, eps=EPS)
            for lead, e, f, views in cases]


def _mlp_scale():
    """Scale case: 1031 tokens of 128 features, hidden size 344: every projection 45
    million multiply-adds on the engine's threads."""
    return [scale_case("mlp_block", _mlp_inputs((1031,), 128, 344), eps=EPS)]


# weights drawn in any layout but expanded: a stride-0 weight ties its values, and its
# gradient, summed over them, cancels to a small difference of large terms
_TIED_NOT = {"expand": False}
_X_FAMILY = (("uniform", -1.0, 1.0), ("uniform", -2.0, 2.0), ("uniform", 0.5, 1.5))
_W_FAMILY = (("uniform", -1.0, 1.0), ("uniform", -0.5, 0.5), ("uniform", 0.0, 1.0))


def _draw_x(draw, shape):
    """x off its rows' constant layouts (an expanded row cancels rms_norm's gradient)."""
    return draw_input(draw, "x", shape, _X_FAMILY, layout={"expand": tuple(range(
        len(shape) - 1))})


@sample_strategy
def _mlp_strategy(draw, dtype):
    """1-4 tokens (batch 0-2), 1-6 features, hidden size 1-6, at most MAX_ELEMENTS inputs;
    ranges of a model's scale, any layout (weights not expanded)."""
    from hypothesis import strategies as st
    lead = (draw(st.integers(1, 2)),) if draw(st.booleans()) else ()
    t, e = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    f = draw(st.integers(1, max(1, min(6, (MAX_ELEMENTS - math.prod(lead) * t * e - e)
                                           // (3 * e)))))
    return Sample.make("mlp_block", [
        _draw_x(draw, lead + (t, e)),
        draw_input(draw, "ffn_norm", (e,), (("uniform", *NORM_RANGE),), layout=_TIED_NOT),
        *(draw_input(draw, name, shape, _W_FAMILY, layout=_TIED_NOT)
          for name, shape in (("w_gate", (f, e)), ("w_up", (f, e)), ("w_down", (e, f))))],
        dtype, eps=EPS)


# --- attention_block ------------------------------------------------------------------------
def _heads(op, x, wq, wk, wv, wo, n_head, n_head_kv):
    """(D, Dv) of the projections, validated."""
    n_head, n_head_kv = integer(op, "n_head", n_head), integer(op, "n_head_kv", n_head_kv)
    if n_head < 1 or n_head_kv < 1 or n_head % n_head_kv:
        raise ParamError(f"{op}: n_head ({n_head}) must be a positive multiple of n_head_kv "
                         f"({n_head_kv})")
    e = x.shape[-1]
    ws = (wq, wk, wv, wo)
    _need(op, all(w.ndim == 2 for w in ws) and wq.shape[1] == wk.shape[1] == wv.shape[1] == e
          and wo.shape[0] == e, "needs wq, wk, wv of shape (heads * head size, E) and wo "
          "(E, n_head * Dv) for x (.., T, E)", x, *ws)
    _need(op, wq.shape[0] % n_head == 0 and wk.shape[0] % n_head_kv == 0
          and wv.shape[0] % n_head_kv == 0, f"needs wq rows a multiple of n_head "
          f"({n_head}), wk and wv rows of n_head_kv ({n_head_kv})", x, *ws)
    d, dv = wq.shape[0] // n_head, wv.shape[0] // n_head_kv
    _need(op, wk.shape[0] // n_head_kv == d and wo.shape[1] == n_head * dv,
          f"needs one head size D = {d} for q and k and wo of n_head * Dv = {n_head * dv} "
          "columns", x, *ws)
    return d, dv


def _split_heads(t, n, size):
    """(.., T, n size) -> (.., T, n, size)."""
    return reshape(t, t.shape[:-1] + (n, size))


def _heads_first(t):
    """(.., T, H, D) -> (.., H, T, D), a view (ggml_permute(t, 0, 2, 1, 3))."""
    axes = tuple(range(t.ndim - 3)) + (t.ndim - 2, t.ndim - 3, t.ndim - 1)
    return permute(t, axes)


def attention_block(x, pos, attn_norm, wq, wk, wv, wo, *, n_head, n_head_kv, n_dims,
                    eps=EPS, scale=None, **rope_params):
    """Causal self-attention with rotary embeddings, grouped-query heads and the residual
    (module doc): x (T, E) or (B, T, E), pos int32 (T,), attn_norm (E,), wq (Hq D, E),
    wk (Hkv D, E), wv (Hkv Dv, E), wo (E, Hq Dv); rope_params: engine.ops.rope's."""
    op = "attention_block"
    _check_floats(op, x, (attn_norm, wq, wk, wv, wo))
    _need(op, attn_norm.shape == (x.shape[-1],), "needs attn_norm of shape (E,)", x,
          attn_norm)
    d, dv = _heads(op, x, wq, wk, wv, wo, n_head, n_head_kv)
    unknown = sorted(set(rope_params) - set(ROPE_PARAMS))
    if unknown:
        raise ParamError(f"{op}: unknown parameter {unknown[0]!r}; takes n_head, n_head_kv, "
                         f"eps, scale and rope's {list(ROPE_PARAMS)}")
    rope_params = {**ROPE_DEFAULTS, **rope_params, "n_dims": n_dims}
    h = _normed(x, attn_norm, check_eps(op, eps))
    q = rope(_split_heads(_linear(h, wq), n_head, d), pos, **rope_params)
    k = rope(_split_heads(_linear(h, wk), n_head_kv, d), pos, **rope_params)
    v = _split_heads(_linear(h, wv), n_head_kv, dv)
    o = registered.attention(_heads_first(q), _heads_first(k), _heads_first(v),
                             scale=1.0 / math.sqrt(d) if scale is None else scale,
                             causal=True)
    o = reshape(cont(_heads_first(o)), x.shape[:-1] + (n_head * dv,))
    return registered.add(x, _linear(o, wo))


def _torch_attention_block(x, pos, attn_norm, wq, wk, wv, wo, *, n_head, n_head_kv, n_dims,
                           eps=EPS, scale=None, precise=True, **rope_params):
    """torch's ops: F.rms_norm, F.linear, the rope of engine.ops.rope written from its
    formulas, F.scaled_dot_product_attention (causal, enable_gqa)."""
    import torch.nn.functional as F
    rope_params = {**ROPE_DEFAULTS, **rope_params, "n_dims": n_dims}
    d, dv = wq.shape[0] // n_head, wv.shape[0] // n_head_kv
    h = _torch_rms_normed(x, attn_norm, eps)
    q = _torch_rope(F.linear(h, wq).unflatten(-1, (n_head, d)), pos, precise=precise,
                    **rope_params)
    k = _torch_rope(F.linear(h, wk).unflatten(-1, (n_head_kv, d)), pos, precise=precise,
                    **rope_params)
    v = F.linear(h, wv).unflatten(-1, (n_head_kv, dv))
    o = F.scaled_dot_product_attention(q.transpose(-3, -2), k.transpose(-3, -2),
                                       v.transpose(-3, -2), is_causal=True,
                                       scale=1.0 / math.sqrt(d) if scale is None else scale,
                                       enable_gqa=n_head != n_head_kv)
    return x + F.linear(o.transpose(-3, -2).flatten(-2), wo)


def _attention_inputs(lead, t, e, n_head, n_head_kv, d, views=None, pos=(0, 64)):
    views = views or {}

    def w(name, shape, low=W_RANGE[0], high=W_RANGE[1]):
        return _w(name, shape, low, high, **views.get(name, {}))
    return [w("x", lead + (t, e), *X_RANGE),
            InputSpec("pos", (t,), "int", pos[0], pos[1], dtype="i32", grad=False),
            w("attn_norm", (e,), *NORM_RANGE),
            w("wq", (n_head * d, e)), w("wk", (n_head_kv * d, e)), w("wv", (n_head_kv * d, e)),
            w("wo", (e, n_head * d))]


# (batch, T, E, n_head, n_head_kv, D, n_dims, mode, views, rope parameters besides defaults)
_ATTENTION_CASES = [
    ((), 3, 5, 2, 1, 4, 4, "normal", None, {}),                       # GQA 2:1
    ((2,), 3, 4, 2, 2, 2, 2, "neox", None, {}),                        # batched, MHA
    ((), 4, 4, 4, 2, 4, 2, "neox", None, {"freq_base": 500000.0}),     # partial rotation
    ((), 3, 4, 2, 1, 4, 4, "normal", {"wq": {"permute": (1, 0)}, "x": {"slice": (
        (1, 7, 2), (1, 5, 1))}}, {"freq_scale": 0.5}),                   # views
    ((), 2, 3, 3, 1, 2, 2, "normal", None, {}),                        # 3 heads per kv head
    ((2,), 3, 4, 2, 1, 2, 2, "neox", None, {}),                        # batched GQA
]


def _attention_sample(dtype, lead, t, e, nh, nkv, d, n_dims, mode, views, extra, tier=None):
    make = {None: Sample.make, "scale": scale_case, "bench": bench_case}[tier]
    return make("attention_block", _attention_inputs(lead, t, e, nh, nkv, d, views), dtype,
                n_head=nh, n_head_kv=nkv, n_dims=n_dims, mode=mode, eps=EPS, **extra)


@both_dtypes
def _attention_samples(dtype):
    """Grouped-query (2 query heads per kv head) and plain multi-head, batched, partial
    rotation, neox and normal pairs, a transposed-stored wq and a sliced x, a group of 3,
    batched grouped-query."""
    return [_attention_sample(dtype, *c) for c in _ATTENTION_CASES]


def _attention_scale():
    """Scale case: 257 tokens of 256 features, 8 query heads and 2 kv heads of 32: the
    projections on the engine's threads (16.8 million multiply-adds for wq)."""
    return [_attention_sample("f32", (), 257, 256, 8, 2, 32, 32, "neox", None, {}, "scale")]


@sample_strategy
def _attention_strategy(draw, dtype):
    """1-2 kv heads, 1-2 query heads per kv head, head size 2 or 4 (n_dims 2..D), 1-4
    tokens (batch 0-2), 1-6 features, at most MAX_ELEMENTS inputs; either mode; positions
    anywhere in [-100, 5000)."""
    from hypothesis import strategies as st
    nkv = draw(st.integers(1, 2))
    nh = nkv * draw(st.integers(1, 2))
    d = draw(st.sampled_from((2, 4)))
    n_dims = 2 * draw(st.integers(1, d // 2))
    lead = (draw(st.integers(1, 2)),) if draw(st.booleans()) else ()
    t = draw(st.integers(1, 4))
    e_max = max(1, min(6, MAX_ELEMENTS // (math.prod(lead) * t + 2 * (nh + nkv) * d + 1)))
    e = draw(st.integers(1, e_max))
    x = _draw_x(draw, lead + (t, e))
    lo = draw(st.integers(-100, 4000))
    pos = InputSpec("pos", (t,), "int", lo, lo + draw(st.integers(1, 1000)), dtype="i32",
                    grad=False, show_range=True)
    norm = draw_input(draw, "attn_norm", (e,), (("uniform", *NORM_RANGE),), layout=_TIED_NOT)
    weights = [draw_input(draw, name, shape, _W_FAMILY, layout=_TIED_NOT) for name, shape in (
        ("wq", (nh * d, e)), ("wk", (nkv * d, e)), ("wv", (nkv * d, e)), ("wo", (e, nh * d)))]
    return Sample.make("attention_block", [x, pos, norm, *weights], dtype, n_head=nh,
                       n_head_kv=nkv, n_dims=n_dims,
                       mode=draw(st.sampled_from(("normal", "neox"))), eps=EPS)


def _mlp_bench():
    """Bench case: a llama-like feed-forward block, 512 tokens of 1024 features, hidden
    size 2816."""
    return [bench_case("mlp_block", _mlp_inputs((512,), 1024, 2816), eps=EPS)]


def _attention_bench():
    """Bench case: a llama-like attention block, 512 tokens of 1024 features, 16 query
    heads and 4 kv heads of 64, neox rope over the whole head."""
    return [_attention_sample("f32", (), 512, 1024, 16, 4, 64, 64, "neox", None, {}, "bench")]


def _bench_torch_attention_block(*tensors, **params):
    """The block's torch reference with its rope in x's dtype (the reference's rope computes
    in float64), for the bench."""
    return _torch_attention_block(*tensors, precise=False, **params)


register(OpDef("mlp_block", kind="composite", compose=mlp_block, params=MLP_PARAMS,
               torch=_torch_mlp_block,
               samples=_mlp_samples, scale=_mlp_scale, bench=_mlp_bench,
               strategy=_mlp_strategy,
               doc="llama's SwiGLU feed-forward block: x + swiglu(rms_norm(x) w_gate^T, "
                   "rms_norm(x) w_up^T) w_down^T (rms_norm with its weight)"))
register(OpDef("attention_block", kind="composite", compose=attention_block,
               params=ATTENTION_BLOCK_PARAMS,
               torch=_torch_attention_block, bench_torch=_bench_torch_attention_block,
               samples=_attention_samples, scale=_attention_scale, bench=_attention_bench,
               strategy=_attention_strategy,
               doc="llama's causal self-attention block: rms_norm, q/k/v projections, rope "
                   "on q and k, grouped-query attention, output projection, residual"))

__all__ = ["attention_block", "mlp_block"]


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("attention_block", "composite: rms_norm, matmul, rope, attention and add, whose "
                                   "mutants (or stated reasons) cover its gradient")
mutation.exempt("mlp_block", "composite: rms_norm, matmul, swiglu and add, whose mutants (or "
                             "stated reasons) cover its gradient")
