"""CPU kernels of rope and rope_back (rotary position embeddings, ggml's ROPE and
ROPE_BACK): one kernel, the rotation by +theta (rope) or -theta (rope_back).

x is seen as (B, T, H, D) (a 3-D x gets B = 1), pos as (T,). The kernel first fills a
table of (c, s) per token t and pair i < n_dims/2 (engine.backends.rope_math, float64;
freq_base^(-2i/n_dims) once per pair), then rotates each row (b, t, h) along its last axis:

    normal: (j0, j1) = (2i, 2i + 1)        neox: (j0, j1) = (i, i + n_dims/2)
    out[.., j0] = x[.., j0] c - sign x[.., j1] s
    out[.., j1] = sign x[.., j0] s + x[.., j1] c          (sign +1: rope, -1: rope_back)

dims j >= n_dims are copied. The arithmetic is float64, rounded once on store; float16 and
bfloat16 inputs reach the kernel widened to float32 (engine.backends.cpu.half). A strided
x (a permuted, sliced or expanded view) is copied C-contiguous first (layout.dense, when
the call runs), so that numba compiles the kernel once per dtype, not again per layout
(such views made 4 of its 6 compilations in a cold `gradcheck --all`: `python
bench/bench_first_run.py --breakdown --records F`). The table,
(T, n_dims/2, 2) float64, is a scratch buffer the dispatcher allocates when it binds the
call (kernels never allocate) and the kernel fills from pos when it runs. Outputs of at
least threads.MIN_ELEMENTS elements run as ranges of tokens on the engine's threads (the
fast path split:cpu_rope; its plain twin is one range), each range with a table of its
own: each token's rows are computed exactly as whole, so the result does not depend on
the thread count.
"""

from __future__ import annotations

import numpy as np

from engine.backends.calls import sequence
from engine.backends.cpu import layout, threads
from engine.backends.cpu.jit import bindable, call, kernel
from engine.backends.rope_math import rope_cos_sin, rope_inv_freq, yarn_corr_dims


@kernel
def _rope(x, pos, ff, has_ff, out, table, n_dims, neox, sign, freq_base, freq_scale,
          corr_low, corr_high, ext_factor, attn_factor):
    """out = x with pairs of its first n_dims dims rotated by sign * theta (module doc);
    table (T, n_dims/2, 2) is scratch for the (c, sign s) of each token and pair."""
    nb, nt, nh, nd = x.shape
    half = n_dims // 2
    for i in range(half):
        inv_freq = rope_inv_freq(np.float64(i), np.float64(n_dims), freq_base)
        f = np.float64(ff[i]) if has_ff else 1.0
        for t in range(nt):
            c, s = rope_cos_sin(np.float64(pos[t]), np.float64(i), inv_freq, freq_scale, f,
                                corr_low, corr_high, ext_factor, attn_factor)
            table[t, i, 0] = c
            table[t, i, 1] = sign * s
    step = 1 if neox else 2          # j0 of pair i: i (neox) or 2i (normal)
    gap = half if neox else 1        # j1 - j0
    for b in range(nb):
        for t in range(nt):
            for h in range(nh):
                for i in range(half):
                    c = table[t, i, 0]
                    s = table[t, i, 1]
                    j0 = i * step
                    a0 = np.float64(x[b, t, h, j0])
                    a1 = np.float64(x[b, t, h, j0 + gap])
                    out[b, t, h, j0] = a0 * c - a1 * s
                    out[b, t, h, j0 + gap] = a0 * s + a1 * c
                for j in range(n_dims, nd):
                    out[b, t, h, j] = x[b, t, h, j]


def _as_4d(arr):
    return arr if arr.ndim == 4 else arr[None]


def _token_chunks(out, ins, parts):
    """Ranges of tokens (axis -3 of x and out, pos's axis 0) for the engine's threads, or
    None for an output too small to pay for the hand-over."""
    if out.size * 2 < threads.MIN_ELEMENTS:
        return None
    axis = out.ndim - 3
    cut = (slice(None),) * axis
    x, pos, *ff = ins
    return [(out[cut + (slice(lo, hi),)], [x[cut + (slice(lo, hi),)], pos[lo:hi], *ff])
            for lo, hi in threads.bounds(out.shape[axis], parts)]


def _prepare(out, ins, sign, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
             attn_factor, beta_fast, beta_slow):
    x, pos, *ff = ins
    low, high = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    factors = ff[0] if ff else out.reshape(-1)[:1]     # never read without factors
    table = np.empty((pos.shape[0], n_dims // 2, 2))
    copies: list = []
    x = layout.dense(_as_4d(x), copies)
    return sequence(*copies, call(_rope, x, pos, factors, bool(ff), _as_4d(out), table,
                                  int(n_dims), mode == "neox", float(sign), float(freq_base),
                                  float(freq_scale), low, high, float(ext_factor),
                                  float(attn_factor)))


def _cpu_rope_prepare(out, ins, **params):
    """kernel(out, [x, pos] or [x, pos, freq_factors], **rope's params)."""
    return _prepare(out, ins, 1.0, **params)


def _cpu_rope_back_prepare(out, ins, **params):
    """kernel(out, [g, pos] or [g, pos, freq_factors], **rope's params)."""
    return _prepare(out, ins, -1.0, **params)


cpu_rope = threads.split(bindable(_cpu_rope_prepare), chunks=_token_chunks)
cpu_rope_back = threads.split(bindable(_cpu_rope_back_prepare), chunks=_token_chunks)
