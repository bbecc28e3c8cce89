"""The scalar math of rope (rotary position embeddings, ggml's ROPE with YaRN), written
once for the CPU and the CUDA kernels (engine.backends.cpu.rope, engine.backends.cuda.rope),
which inline it (scalar_math).

For the pair i (0 <= i < n_dims/2) of a token at position p, as ggml's rope_yarn:

    theta_extrap = p * freq_base^(-2i / n_dims) / ff_i          (ff_i = 1 without factors)
    theta_interp = freq_scale * theta_extrap
    ramp_i       = 1 - clamp((i - corr_low) / max(0.001, corr_high - corr_low), 0, 1)
    theta        = theta_interp                                   if ext_factor = 0
                   theta_interp (1 - m) + theta_extrap m,  m = ramp_i * ext_factor  otherwise
    mscale       = attn_factor                                    if ext_factor = 0
                   attn_factor (1 + 0.1 log(1 / freq_scale))      otherwise
    (c, s)       = (mscale cos(theta), mscale sin(theta))

and (corr_low, corr_high) = yarn_corr_dims(...) (ggml_rope_yarn_corr_dims): the pair
indices where the rotation's wavelength spans beta_fast and beta_slow turns of the original
context n_ctx_orig. Everything is float64 (ggml computes in float32, with theta advanced
by repeated products; the float64 values are the truth its float32 approximates).

The kernels hand these functions scalars, never arrays (under the CUDA simulator a kernel
calls them as compiled CPU functions, which cannot take the simulator's device arrays).
"""

from __future__ import annotations

import math

from engine.backends.cpu.jit import scalar_math


def _corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> float:
    """The (fractional) pair index whose wavelength fits n_rot times into n_ctx_orig:
    n_dims log(n_ctx_orig / (2 pi n_rot)) / (2 log(base)); -inf for n_ctx_orig 0."""
    if n_ctx_orig <= 0:
        return -math.inf if base > 1.0 else math.inf
    return n_dims * math.log(n_ctx_orig / (n_rot * 2.0 * math.pi)) / (2.0 * math.log(base))


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: (max(0, floor(corr_dim(beta_fast))),
    min(n_dims - 1, ceil(corr_dim(beta_slow)))), as floats (the high end may be -inf)."""
    start = math.floor(v) if math.isfinite(v := _corr_dim(n_dims, n_ctx_orig, beta_fast,
                                                             freq_base)) else v
    end = math.ceil(v) if math.isfinite(v := _corr_dim(n_dims, n_ctx_orig, beta_slow,
                                                         freq_base)) else v
    return float(max(0.0, start)), float(min(n_dims - 1.0, end))


@scalar_math
def rope_inv_freq(i, n_dims, freq_base):
    """freq_base^(-2i / n_dims): pair i's angle per position before scaling (module doc),
    in float64; the kernels compute it once per pair, not per token."""
    return freq_base ** (-2.0 * i / n_dims)


@scalar_math
def rope_cos_sin(p, i, inv_freq, freq_scale, ff, corr_low, corr_high, ext_factor,
                 attn_factor):
    """(mscale cos(theta), mscale sin(theta)) of pair i at position p (module doc), in
    float64; inv_freq is rope_inv_freq(i, ...), ff the pair's frequency factor (1.0
    without factors)."""
    theta_extrap = p * inv_freq / ff
    theta = freq_scale * theta_extrap
    mscale = attn_factor
    if ext_factor != 0.0:
        y = (i - corr_low) / max(0.001, corr_high - corr_low)
        mix = (1.0 - min(1.0, max(0.0, y))) * ext_factor
        theta = theta * (1.0 - mix) + theta_extrap * mix
        mscale = mscale * (1.0 + 0.1 * math.log(1.0 / freq_scale))
    return mscale * math.cos(theta), mscale * math.sin(theta)
