"""attention: fused scaled-dot-product attention (ggml's flash_attn_ext, torch's
scaled_dot_product_attention), its primitive attention_fwd and its dedicated backward
attention_back.

q (B, Hq, Tq, D) or (Hq, Tq, D); k (.., Hkv, Tk, D); v (.., Hkv, Tk, Dv), the same batch;
Hq % Hkv == 0 and query head h reads kv head h // G, G = Hq / Hkv (grouped-query
attention). mask (optional, q's dtype) broadcasts by numpy's rules to (.., Hq, Tq, Tk).
For each (b, h, i, j), with slope_h = alibi_slope(h, Hq, max_bias) (1 without ALiBi):

    s_ij = scale <q[b, h, i], k[b, h // G, j]>             scale None: 1 / sqrt(D)
    s_ij = cap tanh(s_ij / cap)                            if logit_softcap = cap > 0
    s_ij += slope_h mask[b, h, i, j]
    s_ij = -inf where causal and j > i + (Tk - Tq)         (bottom-right aligned)
    p_ij = exp(s_ij - lse_i),  lse_i = log sum_j exp(s_ij)
    out[b, h, i] = sum_j p_ij v[b, h // G, j]

A row with every key masked gets out = 0 and lse = -inf, and passes no gradient.

attention(q, k, v, mask, ...) is a composite: the view [..., :Dv] (block) of the primitive
attention_fwd, whose output packs (.., Hq, Tq, Dv + 1): out in [..., :Dv], lse in
[..., Dv]. attention_fwd's gradient is one node of the dedicated backward op
attention_back(g, q, k, v, [mask], fwd), g the packed output's gradient (its lse column
honoured), fwd attention_fwd's output (P is recomputed from its saved lse, never stored;
for 16-bit dtypes, whose saved lse is rounded, each recomputed row is also divided by its
sum). With dO = g[..., :Dv], g_lse = g[..., Dv]:

    D_i = sum_d dO_id O_id = sum_j p_ij dP_ij,  dP = dO V^T,
    dS_ij = p_ij (dP_ij - D_i + g_lse_i)
    dS_ij *= 1 - tanh^2(s_ij / cap) (softcap),   dq = scale dS K,
    dk = scale dS^T Q,  dv = P^T dO    (dk, dv summed over the G query heads of a kv head)

attention_back's output is 1-D: dq, dk, dv raveled in C order over their logical shapes and
concatenated; the rule splits it with block and reshape views. The mask gets no gradient
(a constant of the op, as in ggml and flash attention; the samples mark it grad=False).
Kernels: engine.backends.cpu.attention, engine.backends.cuda.attention. The torch
reference is scaled_dot_product_attention (enable_gqa) with an explicit float mask carrying
the causal cut, ALiBi slopes times the mask; softcap and lse are written from the formulas.
"""

from __future__ import annotations

import dataclasses
import math

from engine.backends.cpu.attention import cpu_attention_back, cpu_attention_fwd
from engine.errors import DTypeError, ParamError, ShapeError
from engine.ops.block import block
from engine.ops.broadcast import broadcast_shapes
from engine.ops.shape import reshape
from engine.params import (
    Params,
    alibi_param,
    bool_param,
    factor_param,
    float_param,
)
from engine.reference_math import reference_alibi_slopes
from engine.registry import OpDef, VJPOf, make_node, register, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import HALF_SCALE_DTYPES, bench_case, scale_case
from engine.strategies import MAX_ELEMENTS, draw_input, draw_range, sample_strategy
from engine.tensor import is_float

SOFTCAP = float_param(0.0, default=0.0, why="0: no softcap; the kernels divide the scores "
                      "by a positive cap")
# the primitives' parameters: scale as the node holds it (the builders resolve None)
PARAMS = Params(dict(scale=factor_param(), causal=bool_param(default=False),
                     logit_softcap=SOFTCAP, max_bias=alibi_param()))
# the composite's: scale None is 1 / sqrt(D)
ATTENTION_PARAMS = Params(dict(scale=factor_param(default=None, nullable=True),
                               causal=bool_param(default=False), logit_softcap=SOFTCAP,
                               max_bias=alibi_param()))


def _check(op, q, k, v, mask, **_):
    """The shape and dtype rules shared by attention, attention_fwd and attention_back
    (their parameters are declared: PARAMS); returns the shape (.., Hq, Tq, Tk) the mask
    broadcasts to."""
    srcs = (q, k, v) if mask is None else (q, k, v, mask)
    shapes = shapes_str(*srcs)
    for name, t in zip(("q", "k", "v", "mask"), srcs, strict=False):
        if not is_float(t.dtype):
            raise DTypeError(f"{op}: {name} must be float, got {t.dtype} (shapes {shapes})")
        if t.dtype != q.dtype:
            raise DTypeError(f"{op}: {name} dtype {t.dtype} differs from q's {q.dtype} "
                             f"(shapes {shapes})")
    if q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ShapeError(f"{op}: q, k, v must all be (H, T, D) or all (B, H, T, D), got "
                         f"shapes {shapes}")
    *lead, hq, tq, d = q.shape
    *klead, hkv, tk, dk = k.shape
    if lead != klead or tuple(v.shape[:-1]) != tuple(k.shape[:-1]):
        raise ShapeError(f"{op}: k and v must share q's batch and each other's heads and "
                         f"length, got shapes {shapes}")
    if dk != d:
        raise ShapeError(f"{op}: k's head size {dk} differs from q's {d} (shapes {shapes})")
    if hkv == 0 or hq % hkv:
        raise ShapeError(f"{op}: q's {hq} heads must be a multiple of k's and v's {hkv} "
                         f"(grouped-query attention), got shapes {shapes}")
    scores = (*lead, hq, tq, tk)
    if mask is not None:
        try:
            fits = mask.ndim <= q.ndim and broadcast_shapes(op, scores, mask.shape) == scores
        except ShapeError:
            fits = False
        if not fits:
            raise ShapeError(f"{op}: mask of shape {list(mask.shape)} does not broadcast to "
                             f"the scores' shape {list(scores)} (shapes {shapes})")
    return scores


def _packed(q, v):
    return (*q.shape[:-1], v.shape[-1] + 1)


def _fwd_infer(q, k, v, *mask, **params):
    _check("attention_fwd", q, k, v, mask[0] if mask else None, **params)
    return _packed(q, v), q.dtype


def _back_infer(g, q, k, v, *rest, **params):
    *mask, fwd = rest
    _check("attention_back", q, k, v, mask[0] if mask else None, **params)
    if fwd.op == "attention_fwd" and fwd.params != params:
        # P is recomputed as exp(s - lse) with fwd's lse: another scale overflows it
        raise ParamError(f"attention_back: its parameters {params} differ from those of "
                         f"its fwd, attention_fwd with {fwd.params}")
    packed = _packed(q, v)
    for name, t in (("g", g), ("fwd", fwd)):
        if tuple(t.shape) != packed:
            raise ShapeError(f"attention_back: {name} must have attention_fwd's packed shape "
                             f"{list(packed)} (.., Hq, Tq, Dv + 1), got {list(t.shape)} "
                             f"(q, k, v: {shapes_str(q, k, v)})")
        if t.dtype != q.dtype:
            raise DTypeError(f"attention_back: {name} dtype {t.dtype} differs from q's "
                             f"{q.dtype}")
    return (q.size + k.size + v.size,), q.dtype


def _params(op, q, scale, causal, logit_softcap, max_bias):
    """The node's parameters, checked against PARAMS; scale None becomes 1 / sqrt(D)."""
    if scale is None:
        if q.shape[-1] == 0:
            raise ShapeError(f"{op}: the default scale 1/sqrt(D) needs D > 0, got q of "
                             f"shape {list(q.shape)}")
        scale = 1.0 / math.sqrt(q.shape[-1])
    return PARAMS.check(op, dict(scale=scale, causal=causal, logit_softcap=logit_softcap,
                                 max_bias=max_bias))


def _srcs(*tensors, mask=None):
    return tensors if mask is None else (*tensors[:-1], mask, tensors[-1])


def attention_fwd(q, k, v, mask=None, *, scale=None, causal=False, logit_softcap=0.0,
                  max_bias=0.0):
    """The primitive: (.., Hq, Tq, Dv + 1), attention's output in [..., :Dv] and each row's
    log-sum-exp in [..., Dv] (module doc)."""
    params = _params("attention_fwd", q, scale, causal, logit_softcap, max_bias)
    return make_node("attention_fwd", (q, k, v) if mask is None else (q, k, v, mask),
                     **params)


def attention(q, k, v, mask=None, *, scale=None, causal=False, logit_softcap=0.0,
              max_bias=0.0):
    """Scaled-dot-product attention (module doc): q (B, Hq, Tq, D) or (Hq, Tq, D), k and v
    with Hkv heads (Hq % Hkv == 0), an optional additive mask broadcasting to
    (.., Hq, Tq, Tk) (no gradient); scale None is 1/sqrt(D); causal masks keys
    j > i + Tk - Tq; logit_softcap > 0 caps the scores; max_bias > 0 scales the mask by
    ALiBi's slope of each head. Returns (.., Hq, Tq, Dv)."""
    params = _params("attention", q, scale, causal, logit_softcap, max_bias)
    _check("attention", q, k, v, mask, **params)
    fwd = attention_fwd(q, k, v, mask, **params)
    return block(fwd, (0,) * fwd.ndim, (*fwd.shape[:-1], v.shape[-1]))


def attention_back(g, q, k, v, mask, fwd, *, scale=None, causal=False, logit_softcap=0.0,
                   max_bias=0.0):
    """The gradient of attention_fwd at (q, k, v) for its packed output's gradient g, given
    fwd = attention_fwd(q, k, v, mask, same params): 1-D, dq, dk, dv raveled and
    concatenated (module doc). mask may be None."""
    params = _params("attention_back", q, scale, causal, logit_softcap, max_bias)
    return make_node("attention_back", _srcs(g, q, k, v, fwd, mask=mask), **params)


def _back_build(g, q, k, v, mask=None, **params):
    """The registry's builder (the samples'): attention_back with fwd built as
    attention_fwd(q, k, v, mask) itself, so that a sample's fwd is always its forward."""
    fwd = attention_fwd(q, k, v, mask, **params)
    return attention_back(g, q, k, v, mask, fwd, **params)


def split_gradients(flat, q, k, v):
    """attention_back's flat output as (dq, dk, dv), views shaped as q, k, v."""
    out, at = [], 0
    for t in (q, k, v):
        out.append(reshape(block(flat, (at,), (t.size,)), t.shape))
        at += t.size
    return tuple(out)


def _fwd_backward(g, out, q, k, v, *mask, **params):
    flat = attention_back(g, q, k, v, mask[0] if mask else None, out, **params)
    return (*split_gradients(flat, q, k, v), *(None for _ in mask))


def _back_primals(g, q, k, v, mask=None, **params):
    """attention_back's registry case (g, q, k, v, [mask]; its builder makes fwd) is
    attention_fwd's VJP at (q, k, v) for g, the mask a constant."""
    inputs = {"q": q, "k": k, "v": v} | ({} if mask is None else {"mask": mask})
    return inputs, g, params


# --- torch references ---------------------------------------------------------------------------
def _torch_parts(q, k, v, mask=None, *, scale=None, causal=False, logit_softcap=0.0,
                 max_bias=0.0):
    """(out, lse) in torch, computed in q's dtype (float32 for 16-bit inputs, rounded once
    at the end): scaled_dot_product_attention with enable_gqa and an explicit float mask
    (ALiBi slope times the mask, -inf above the bottom-right diagonal when causal), or with
    a softcap, the softmax written from the formulas; lse from the formulas."""
    import torch
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    q, k, v = (t.to(work) for t in (q, k, v))
    *lead, hq, tq, d = q.shape
    tk = k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    bias = torch.zeros((tq, tk), dtype=work)
    if mask is not None:
        slopes = torch.as_tensor(reference_alibi_slopes(hq, max_bias),
                                 dtype=work).reshape(hq, 1, 1)
        bias = bias + slopes * mask.to(work)
    if causal:
        above = torch.arange(tk)[None, :] > torch.arange(tq)[:, None] + (tk - tq)
        bias = bias.masked_fill(above, float("-inf"))
    bias = bias.expand(*lead, hq, tq, tk)
    group = hq // k.shape[-3]
    kg, vg = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    s = scale * (q @ kg.transpose(-1, -2))
    if logit_softcap > 0.0:
        s = logit_softcap * torch.tanh(s / logit_softcap)
    s = s + bias
    dead = torch.isneginf(s).all(-1, keepdim=True)      # rows with no visible key
    live = s.masked_fill(dead, 0.0)
    lse = torch.logsumexp(live, -1).masked_fill(dead[..., 0], float("-inf"))
    if logit_softcap > 0.0:
        out = torch.softmax(live, -1) @ vg
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=bias.masked_fill(dead, 0.0), scale=scale, enable_gqa=True)
    out = torch.where(dead, 0.0, out)
    return out.to(dtype), lse.to(dtype)


def _torch_attention(q, k, v, mask=None, **params):
    return _torch_parts(q, k, v, mask, **params)[0]


def _bench_torch_attention(q, k, v, mask=None, *, scale=None, causal=False, logit_softcap=0.0,
                            max_bias=0.0):
    """torch's own attention, for the bench: scaled_dot_product_attention in q's dtype,
    causal as is_causal where Tq = Tk (torch's causal mask is aligned top left, ours bottom
    right), a mask as an additive bias (times the ALiBi slopes), without the reference's
    log-sum-exp and its search for rows that see no key; with a softcap, which torch's op
    has not, or rows that see no key (causal, Tq > Tk), the reference."""
    import torch
    import torch.nn.functional as F
    hq, tq, tk = q.shape[-3], q.shape[-2], k.shape[-2]
    if logit_softcap > 0.0 or (causal and tq > tk):
        return _torch_attention(q, k, v, mask, scale=scale, causal=causal,
                                logit_softcap=logit_softcap, max_bias=max_bias)
    bias = None
    if mask is not None:
        slopes = torch.as_tensor(reference_alibi_slopes(hq, max_bias), dtype=q.dtype)
        bias = slopes.reshape(hq, 1, 1) * mask
    if causal and (bias is not None or tq != tk):
        above = torch.arange(tk)[None, :] > torch.arange(tq)[:, None] + (tk - tq)
        bias = (0.0 if bias is None else bias) + torch.zeros(
            (tq, tk), dtype=q.dtype).masked_fill(above, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                          is_causal=causal and bias is None, scale=scale,
                                          enable_gqa=hq != k.shape[-3])


def _torch_attention_fwd(q, k, v, mask=None, **params):
    out, lse = _torch_parts(q, k, v, mask, **params)
    return __import__("torch").cat([out, lse[..., None]], -1)


def _torch_attention_back(g, q, k, v, mask=None, **params):
    """torch autograd's gradient of attention_fwd's reference at (q, k, v) for g, raveled
    and concatenated as attention_back's output."""
    import torch
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        grads = torch.autograd.grad(_torch_attention_fwd(*leaves, mask, **params), leaves, g)
    return torch.cat([t.reshape(-1) for t in grads])


# --- samples ------------------------------------------------------------------------------------
QK = dict(low=-2.0, high=2.0)                   # scores up to a few units: peaked softmaxes
MASK = dict(low=-3.0, high=1.0, grad=False)
BTHD = (0, 2, 1, 3)                             # a (B, T, H, D) leaf seen as (B, H, T, D)
# (q, k, v, mask: shape or (shape, view keywords); params). Shapes are small: every element
# is differentiated numerically
CASES = [
    ((2, 3, 4), (2, 5, 4), (2, 5, 4), None, {}),                        # rank 3, 1/sqrt(D)
    ((2, 4, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3), None, dict(causal=True, scale=0.6)),  # GQA
    ((1, 4, 4, 3), (1, 1, 4, 3), (1, 1, 4, 3), None, dict(causal=True, scale=0.8)),
    ((1, 2, 5, 4), (1, 2, 3, 4), (1, 2, 3, 2), None, dict(causal=True, scale=0.5)),  # dead rows
    ((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4), (3, 5), dict(scale=0.5)),  # mask for all
    ((2, 2, 3, 4), (2, 1, 5, 4), (2, 1, 5, 2), (2, 1, 3, 5), dict(causal=True, scale=0.7)),
    ((2, 3, 4), (2, 4, 4), (2, 4, 3), None, dict(logit_softcap=2.0, scale=0.9)),  # softcap
    ((1, 2, 4, 4), (1, 1, 4, 4), (1, 1, 4, 4), (4, 4),
     dict(logit_softcap=3.0, causal=True, scale=1.0)),
    ((1, 3, 3, 4), (1, 3, 4, 4), (1, 3, 4, 4), (3, 4), dict(max_bias=8.0, scale=0.5)),  # ALiBi
    ((1, 4, 2, 4), (1, 2, 5, 4), (1, 2, 5, 4), (1, 4, 2, 5),
     dict(max_bias=4.0, logit_softcap=2.0, scale=0.5)),
]
# layouts: (q, k, v, mask view keywords), the (B, T, H, D) leaves of llama.cpp's layout, an
# offset strided slice of each (the last axis stepped: no BLAS row), a transposed mask
VIEWS = [
    (((2, 2, 3, 4), dict(permute=BTHD)), ((2, 1, 5, 4), dict(permute=BTHD)),
     ((2, 1, 5, 3), dict(permute=BTHD)), None, dict(causal=True, scale=0.5)),
    (((2, 3, 4), dict(slice=((0, 2, 1), (1, 4, 1), (0, 8, 2)))),
     ((2, 4, 4), dict(slice=((1, 3, 1), (0, 4, 1), (1, 5, 1)))),
     ((2, 4, 3), dict(slice=((0, 2, 1), (0, 8, 2), (0, 3, 1)))),
     ((3, 4), dict(permute=(1, 0))), dict(scale=0.5)),
    (((1, 2, 3, 4), {}), ((1, 2, 4, 4), dict(expand=(1,))), ((1, 2, 4, 4), dict(expand=(1,))),
     None, dict(causal=True, scale=0.6)),
]


def _specs(q, k, v, mask):
    """InputSpecs of (shape, view keywords) pairs (or plain shapes)."""
    def spec(name, arg, **kw):
        shape, view = arg if isinstance(arg[0], tuple) else (arg, {})
        return InputSpec(name, shape, **kw, **view)
    out = [spec("q", q, **QK), spec("k", k, **QK), spec("v", v)]
    return out if mask is None else [*out, spec("mask", mask, **MASK)]


def _all_cases():
    return [(_specs(q, k, v, m), p) for q, k, v, m, p in CASES + VIEWS]


@both_dtypes
def _attention_samples(dtype):
    return [Sample.make("attention", specs, dtype, **p) for specs, p in _all_cases()]


@both_dtypes
def _fwd_samples(dtype):
    """attention_fwd's: every case, its lse column differentiated too."""
    return [Sample.make("attention_fwd", specs, dtype, **p) for specs, p in _all_cases()]


# attention_back's g: contiguous, a permuted view, a stride-0 broadcast along the heads, and
# an offset slice of a larger buffer (no dead rows: fwd's lse -inf there is no point to
# take a VJP at)
G_VIEWS = [{}, dict(permute=(0, 2, 1, 3)), dict(expand=(1,)), "sliced"]


@both_dtypes
def _back_samples(dtype):
    out = []
    for i, (specs, p) in enumerate(_all_cases()):
        if i == 3:                                    # the dead rows' case
            continue
        q, v = specs[0].shape, specs[2].shape
        packed = (*q[:-1], v[-1] + 1)
        view = G_VIEWS[i % len(G_VIEWS)] if len(packed) == 4 else {}
        if view == "sliced":
            view = dict(slice=tuple((1, 1 + n, 1) for n in packed))
        g = InputSpec("g", packed, grad=False, **view)
        out.append(Sample.make("attention_back", [g, *(dataclasses.replace(s, grad=False)
                                                      for s in specs)], dtype, **p))
    return out


def _attention_scale():
    """Scale cases (each above threads.MIN_MACS: (batch, head) pairs on the engine's
    threads; more than TILE = 128 query rows, ragged: the query blocks): causal GQA of 257
    tokens of 4 heads read from (B, T, H, D) leaves (causal block skipping; in float32,
    float16 and bfloat16); a mask shared by the heads with ALiBi and a softcap, Tq < Tk,
    rank 3 and Dv != D; causal with Tq - Tk above a block, so that a whole block of rows
    sees no key."""
    causal = [InputSpec("q", (1, 4, 257, 64), permute=BTHD, **QK),
              InputSpec("k", (1, 2, 257, 64), permute=BTHD, **QK),
              InputSpec("v", (1, 2, 257, 64), permute=BTHD)]
    masked = [InputSpec("q", (4, 131, 64), **QK), InputSpec("k", (4, 263, 64), **QK),
              InputSpec("v", (4, 263, 48)), InputSpec("mask", (131, 263), **MASK)]
    dead = [InputSpec("q", (2, 2, 300, 64), **QK), InputSpec("k", (2, 2, 160, 64), **QK),
            InputSpec("v", (2, 2, 160, 64))]
    return ([scale_case("attention", causal, dt, causal=True, scale=0.125)
             for dt in ("f32", *HALF_SCALE_DTYPES)] +
            [scale_case("attention", masked, max_bias=8.0, logit_softcap=5.0, scale=0.5),
             scale_case("attention", dead, causal=True, scale=0.2)])


def _fwd_scale():
    """attention_fwd's scale case: attention's causal GQA case in float32, its loss now
    weighing the log-sum-exp column too (the lse gradient on the tiled, split paths)."""
    return [scale_case("attention_fwd", case.inputs, **dict(case.params))
            for case in _attention_scale()[:1]]


# the strategies' ranges of q and k (moderate, tiny, shifted: scores of a few units at most)
QK_RANGES = (("uniform", -2.0, 2.0), ("uniform", -1e-3, 1e-3), ("uniform", 1.0, 2.0))
MASK_RANGES = (("uniform", -3.0, 1.0), ("uniform", -50.0, 0.0))


def _strategy(op):
    """Shapes (rank 3 or 4, GQA groups of 1-3, Tq and Tk of 1-5, D, Dv), layouts, a mask
    broadcast from any shape, and the parameters, with q, k, v (and g) within gradcheck's
    MAX_ELEMENTS checked elements; attention_back's cases see a key in every row."""
    @sample_strategy
    def strategy(draw, dtype):
        from hypothesis import strategies as st

        from engine.strategies import broadcast_source
        lead = tuple(draw(st.lists(st.integers(1, 2), max_size=1)))
        hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 3))
        hq, tq, tk = hkv * group, draw(st.integers(1, 4)), draw(st.integers(1, 5))
        causal = draw(st.booleans())
        if causal and op == "attention_back":
            tk = max(tk, tq)
        rows_q, rows_kv = math.prod(lead) * hq * tq, math.prod(lead) * hkv * tk
        d = draw(st.integers(1, max(1, min(5, (MAX_ELEMENTS // 2) // (rows_q + rows_kv)))))
        dv = draw(st.integers(1, max(1, min(4, (MAX_ELEMENTS // 2) // (rows_kv + rows_q)))))
        grad = op != "attention_back"
        inputs = [draw_input(draw, "q", (*lead, hq, tq, d), QK_RANGES, grad=grad),
                  draw_input(draw, "k", (*lead, hkv, tk, d), QK_RANGES, grad=grad),
                  draw_input(draw, "v", (*lead, hkv, tk, dv), grad=grad)]
        params = dict(causal=causal, scale=draw(st.sampled_from((0.3, 0.5, 1.0, 1.7))))
        if draw(st.booleans()):
            params["logit_softcap"] = draw(st.sampled_from((1.0, 3.0, 20.0)))
        if draw(st.booleans()):
            shape = draw(broadcast_source((*lead, hq, tq, tk), min_dims=1))
            kind, low, high = draw_range(draw, MASK_RANGES)
            inputs.append(InputSpec("mask", shape, kind, low, high, grad=False,
                                    show_range=True))
            if draw(st.booleans()):
                params["max_bias"] = draw(st.integers(1, 64)) / 4.0
        if op == "attention_back":
            inputs.insert(0, draw_input(draw, "g", (*lead, hq, tq, dv + 1), grad=False))
        return Sample.make(op, inputs, dtype, **params)
    strategy.__name__ = f"_{op}_strategy"
    return strategy


def _attention_bench():
    """Bench case: bench/bench_attention.py's, causal self-attention of 8 heads, 512 tokens,
    head size 64, batch 1."""
    q, k, v = (InputSpec(name, (1, 8, 512, 64), **(QK if name != "v" else {}))
               for name in "qkv")
    return [bench_case("attention", [q, k, v], causal=True, scale=0.125)]


register(OpDef("attention", kind="composite", compose=attention, params=ATTENTION_PARAMS,
               torch=_torch_attention, bench_torch=_bench_torch_attention,
               samples=_attention_samples, scale=_attention_scale, bench=_attention_bench,
               strategy=_strategy("attention"),
               doc="scaled-dot-product attention (GQA, mask, causal, softcap, ALiBi): the "
                   "view [..., :Dv] of attention_fwd"))
register(OpDef("attention_fwd", params=PARAMS, infer=_fwd_infer, backward=_fwd_backward,
               kernels={"cpu": cpu_attention_fwd,
                        "cuda": "engine.backends.cuda.attention:cuda_attention_fwd"},
               build=attention_fwd, torch=_torch_attention_fwd, samples=_fwd_samples,
               scale=_fwd_scale, strategy=_strategy("attention_fwd"),
               doc="attention's output and log-sum-exp packed (.., Hq, Tq, Dv + 1); "
                   "gradient: attention_back"))
register(OpDef("attention_back", params=PARAMS, kind="backward", infer=_back_infer,
               no_grad="a dedicated backward op without a backward rule of its own",
               kernels={"cpu": cpu_attention_back,
                        "cuda": "engine.backends.cuda.attention:cuda_attention_back"},
               build=_back_build, torch=_torch_attention_back, samples=_back_samples,
               strategy=_strategy("attention_back"),
               vjp_of=VJPOf("attention_fwd", _back_primals, wrt=("q", "k", "v")),
               doc="the gradient of attention_fwd, P recomputed from the saved log-sum-exp: "
                   "dq, dk, dv raveled and concatenated"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.mutation import Mutant  # noqa: E402
from engine.mutation import attention as bugs  # noqa: E402  (the kernel-bug makers)
from engine.mutation.patches import all_of, function_replaced, kernel_replaced  # noqa: E402

mutation.register(
    Mutant("attention_alibi_slopes_geometric", ("attention",),
           "ALiBi's slopes one geometric sequence for a head count that is no power of two",
           lambda: function_replaced(bugs.cpu_attention, "alibi_slopes",
                                     bugs.alibi_slopes_geometric), kind="parameter rule",
           where=lambda c: c.kwargs.get("max_bias", 0) > 0 and bugs.heads(c) not in (1, 2, 4, 8)),
    Mutant("attention_back_drops_d_term", ("attention", "attention_back"),
           "attention's backward drops the softmax Jacobian's -D_i (D_i = sum_d dO_id O_id): "
           "dS = P (dP + g_lse) instead of P (dP - D_i + g_lse)",
           lambda: kernel_replaced("attention_back", bugs.attention_back_without_d),
           kind="dropped term"),
    Mutant("attention_back_unmasked_lse", ("attention", "attention_back"),
           "attention's backward recomputes P from the log-sum-exp of the row without its "
           "mask and causal cut, instead of the saved (masked) one",
           lambda: kernel_replaced("attention_back", bugs.attention_back_wrong_lse(masked=False)),
           where=lambda case: case.kwargs.get("causal") or any(
               s.name == "mask" for s in case.inputs), kind="wrong saved statistic"),
    Mutant("attention_back_unscaled_lse", ("attention", "attention_back"),
           "attention's backward recomputes P from the log-sum-exp of the row's dot products "
           "without the scale",
           lambda: kernel_replaced("attention_back", bugs.attention_back_wrong_lse(scaled=False)),
           where=lambda case: case.kwargs.get("scale", 0.5) != 1.0,
           kind="wrong saved statistic"),
    Mutant("attention_gqa_grad_wrong_groups", ("attention", "attention_back"),
           "grouped-query attention's K and V gradients summed over the query heads h with "
           "h % Hkv = c instead of h // G = c (G = Hq / Hkv)",
           lambda: kernel_replaced("attention_back", bugs.attention_back_gqa_wrong_groups),
           where=lambda case: bugs.gqa_groups(case) == "mixed",
           kind="wrong broadcast reduction"),
    Mutant("attention_causal_skip_one_key_short", ("attention",),
           "causal attention's query blocks (attention:causal_skip, from 129 query rows) "
           "stop their products one key short: each block's last row loses its diagonal "
           "key",
           lambda: all_of(*(lambda op=op: kernel_replaced(
               op, bugs.attention_causal_skip_one_key_short)
               for op in ("attention_fwd", "attention_back"))),
           where=lambda case: case.kwargs.get("causal") and case.dtype == "f32",
           tier="scale", max_cases=1, kind="chunk boundary"),
)
