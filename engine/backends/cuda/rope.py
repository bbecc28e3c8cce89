"""CUDA kernels of rope and rope_back (rotary position embeddings, ggml's ROPE and ROPE_BACK):
one kernel, the rotation by +theta (rope) or -theta (rope_back), one thread per output
element of x seen as (B, T, H, D), in a grid-stride loop (engine.backends.cuda.launch).

An element j < n_dims belongs to pair i (normal: j = 2i or 2i + 1; neox: j = i or
i + n_dims/2); its thread computes the pair's (c, s) (engine.backends.rope_math, float64,
the CPU kernel's scalar math) and

    first of the pair:   out[j0] = x[j0] c - sign x[j1] s
    second of the pair:  out[j1] = sign x[j0] s + x[j1] c         (sign +1: rope, -1: back)

elements j >= n_dims are copied. The same float64 arithmetic as the CPU kernel, rounded
once on store. 16-bit inputs reach the kernel widened to float32 (engine.backends.cuda.half).
"""

from __future__ import annotations

from numba import cuda

from engine.backends.cuda.arrays import strided, with_rank
from engine.backends.cuda.launch import grid_stride, unravel4
from engine.backends.rope_math import rope_cos_sin, rope_inv_freq, yarn_corr_dims


@cuda.jit
def _rope(x, pos, ff, has_ff, out, n_dims, neox, sign, freq_base, freq_scale, corr_low,
          corr_high, ext_factor, attn_factor):
    """out = x with pairs of its first n_dims dims rotated by sign * theta (module doc)."""
    _, nt, nh, nd = out.shape
    half = n_dims // 2
    for flat in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        b, t, h, j = unravel4(flat, nt, nh, nd)
        if j >= n_dims:
            out[b, t, h, j] = x[b, t, h, j]
            continue
        if neox:
            i = j % half
            j0 = i
            j1 = i + half
        else:
            i = j // 2
            j0 = 2 * i
            j1 = j0 + 1
        f = 1.0
        if has_ff:
            f = float(ff[i])
        c, s = rope_cos_sin(float(pos[t]), float(i),
                            rope_inv_freq(float(i), float(n_dims), freq_base), freq_scale,
                            f, corr_low, corr_high, ext_factor, attn_factor)
        s = sign * s
        a0 = float(x[b, t, h, j0])
        a1 = float(x[b, t, h, j1])
        if j == j0:
            out[b, t, h, j] = a0 * c - a1 * s
        else:
            out[b, t, h, j] = a0 * s + a1 * c


def _launch(out, ins, sign, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
            attn_factor, beta_fast, beta_slow):
    if out.size == 0:
        return
    x, pos, *ff = ins
    low, high = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    out4 = with_rank(out, 4)
    # without factors: a 1-D placeholder (out's first element), never read
    factors = ff[0] if ff else strided(out, (1,), (out.dtype.itemsize,))
    grid_stride(_rope, out.size, with_rank(x, 4), pos, factors, bool(ff), out4, int(n_dims),
                mode == "neox", float(sign), float(freq_base), float(freq_scale), low, high,
                float(ext_factor), float(attn_factor))


def cuda_rope(out, ins, **params):
    """Dispatcher of rope: kernel(out, [x, pos] or [x, pos, freq_factors], **params)."""
    _launch(out, ins, 1.0, **params)


def cuda_rope_back(out, ins, **params):
    """Dispatcher of rope_back: kernel(out, [g, pos] or [g, pos, freq_factors], **params)."""
    _launch(out, ins, -1.0, **params)


def _signatures():
    """float32 and float64, x contiguous or strided, with or without freq factors."""
    scalars = "int64, boolean, float64, float64, float64, float64, float64, float64, float64"
    sigs = []
    for dt in ("float32", "float64"):
        for lay in ("[:, :, :, ::1]", "[:, :, :, :]"):
            for ff in ("[::1]", "[:]"):
                sigs.append((_rope, f"void({dt}{lay}, int32[:], {dt}{ff}, boolean, "
                                    f"{dt}[:, :, :, :], {scalars})"))
    return sigs


PTX_SIGNATURES = _signatures()
