"""attention's kernel-bug makers, for the mutants engine/ops/attention.py declares.

They sit here, not at the end of engine/ops/attention.py beside the mutants, because that
module has no room for them under the 500-line limit. Each makes a buggy kernel of
attention_back (or of its causal block skipping, shared with attention_fwd) from the real
one: the real kernel handed changed inputs (an lse gradient, a saved log-sum-exp, k and v
repeated), or prepared under changed block bounds. See engine.mutation.kernels for how a
kernel bug is made.
"""

from __future__ import annotations

import contextlib

import numpy as np

from engine.backends.alibi_math import alibi_slopes
from engine.backends.cpu import attention as cpu_attention
from engine.backends.cpu.jit import bindable


def _attention_parts(ins):
    """attention_back's inputs as (g, q, k, v, mask or None, fwd)."""
    g, q, k, v, *rest = ins
    return g, q, k, v, (rest[0] if len(rest) == 2 else None), rest[-1]


def attention_back_without_d(real):
    """attention_back with the softmax Jacobian's -D_i dropped: dS = P (dP + g_lse) where
    it is P (dP - D_i + g_lse), D_i = sum_d dO_id O_id = sum_j P_ij dP_ij. The real kernel
    handed an lse gradient g_lse + D_i (D_i from g and fwd's saved O), which cancels its
    -D_i; dv (P^T dO) is untouched, as in the bug."""
    def kernel(out, ins, **params):
        g, q, k, v, mask, fwd = _attention_parts(ins)
        g2 = np.array(g)
        g2[..., -1] += np.einsum("...d,...d->...", g[..., :-1], fwd[..., :-1])
        real(out, [g2, q, k, v, *([] if mask is None else [mask]), fwd], **params)
    return kernel


def _wrong_lse(q, k, mask, scale, causal, logit_softcap, max_bias, masked, scaled):
    """Each row's log-sum-exp of attention's scores in float64, without the mask and
    the causal cut (`masked` False) or without `scale` (`scaled` False)."""
    hq, tq, tk = q.shape[-3], q.shape[-2], k.shape[-2]
    kr = np.repeat(np.asarray(k, np.float64), hq // k.shape[-3], axis=-3)
    s = np.asarray(q, np.float64) @ np.swapaxes(kr, -1, -2) * (scale if scaled else 1.0)
    if logit_softcap > 0.0:
        s = logit_softcap * np.tanh(s / logit_softcap)
    if masked and mask is not None:
        s = s + alibi_slopes(hq, max_bias)[:, None, None] * mask
    if masked and causal:
        s = np.where(np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq), -np.inf, s)
    m = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):          # rows with no visible key: NaN, unread
        return (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]


def attention_back_wrong_lse(masked=True, scaled=True):
    """attention_back recomputing P from a wrong log-sum-exp: the real kernel handed a fwd
    whose lse column is that of the scores without the mask and causal cut (masked False)
    or without the scale (scaled False)."""
    def make(real):
        def kernel(out, ins, **params):
            g, q, k, v, mask, fwd = _attention_parts(ins)
            f = np.array(fwd)
            f[..., -1] = _wrong_lse(q, k, mask, masked=masked, scaled=scaled, **params)
            real(out, [g, q, k, v, *([] if mask is None else [mask]), f], **params)
        return kernel
    return make


def attention_back_gqa_wrong_groups(real):
    """attention_back summing the K and V gradients of query head h into kv head h % Hkv
    instead of h // G (G = Hq / Hkv; P and dS still from the right kv head): the real
    kernel run on k and v repeated to every query head (each gets its own head's
    contribution), summed over the wrong groups."""
    def kernel(out, ins, **params):
        g, q, k, v, mask, fwd = _attention_parts(ins)
        hkv = k.shape[-3]
        group = q.shape[-3] // hkv
        kr, vr = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
        flat = np.empty(q.size + kr.size + vr.size, out.dtype)
        real(flat, [g, q, kr, vr, *([] if mask is None else [mask]), fwd], **params)
        pieces, at = [flat[:q.size]], q.size
        for full in (kr, vr):
            per_head = flat[at:at + full.size].reshape(full.shape)
            lead = full.shape[:-3]
            # query head h = i * hkv + c has h % hkv = c: the groups strided by hkv
            pieces.append(per_head.reshape(*lead, group, hkv, *full.shape[-2:])
                          .sum(axis=-4).reshape(-1))
            at += full.size
        out[...] = np.concatenate(pieces)
    return kernel


@contextlib.contextmanager
def _blocks_one_key_short():
    geometry = cpu_attention._Geometry
    real = geometry.keys

    def keys(self, i0, i1, tiled):
        n = real(self, i0, i1, tiled)
        return n - 1 if tiled and self.causal and 0 < n < self.tk else n
    geometry.keys = keys
    try:
        yield
    finally:
        geometry.keys = real


def attention_causal_skip_one_key_short(real):
    """attention's causal block skipping (attention:causal_skip) stops each query block's
    products one key before the last one its last row sees: that row loses its diagonal
    key. Only the tiled path (more than TILE query rows) computes blocks; the plain twin
    multiplies every key. The blocks are laid out when the kernel is prepared."""
    def prepare(out, ins, **params):
        with _blocks_one_key_short():
            return real.bind(out, ins, **params)
    prepare.__name__ = getattr(real, "__name__", "kernel")
    return bindable(prepare)


def alibi_slopes_geometric(real):
    """ALiBi's slopes as one geometric sequence for any head count, 2^(-max_bias (h + 1) / n):
    right for a power of two, but ggml interleaves a second sequence for the heads beyond
    the largest power of two below n (engine.backends.alibi_math)."""
    def slopes(n_head, max_bias):
        if max_bias <= 0.0:
            return real(n_head, max_bias)
        return 2.0 ** (-max_bias * np.arange(1, n_head + 1, dtype=np.float64) / n_head)
    return slopes


# --- which cases exercise a bug ------------------------------------------------------------
def heads(case) -> int:
    """Hq, the query heads of an attention case."""
    return next(s.shape[-3] for s in case.inputs if s.name == "q")


def gqa_groups(case) -> str:
    """"mixed" where attention's kv heads h // G and h % Hkv of some query head h differ
    (Hkv > 1 and G > 1), else "same"."""
    shapes = {s.name: s.shape for s in case.inputs}
    hq, hkv = shapes["q"][-3], shapes["k"][-3]
    return "mixed" if hkv > 1 and hq // hkv > 1 else "same"
