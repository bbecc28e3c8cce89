"""The parameters that the references derive from an op's parameters, written apart from the
engine: the torch equivalents (and the jax and tinygrad implementations gradcheck runs) take
ALiBi's slopes and YaRN's correction range from here, never from the kernels' helpers
(engine.backends.alibi_math, engine.backends.rope_math). A bug in a helper that the engine
and its references shared would move both alike and pass every check; written twice, from
ggml's definitions, it fails the rows that use it (tests/gradcheck/test_references.py).

ALiBi (ggml_soft_max_ext, ggml_flash_attn_ext with max_bias > 0), for n heads: with k the
largest power of two not above n, the first k heads take the powers 1..k of
2^(-max_bias / k), the other n - k the odd powers 1, 3, 5, ... of 2^(-max_bias / (2 k));
every slope is 1 without ALiBi (max_bias = 0).

YaRN's correction range (ggml_rope_yarn_corr_dims): the dimension d(beta) at which the
rotation's wavelength 2 pi base^(2d / n_dims) spans n_ctx_orig / beta, that is

    d(beta) = n_dims ln(n_ctx_orig / (2 pi beta)) / (2 ln base),

rounded outward to whole pairs and kept within the rotated dimensions: low = max(0,
floor(d(beta_fast))), high = min(n_dims - 1, ceil(d(beta_slow))).
"""

from __future__ import annotations

import math

import numpy as np


def reference_alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi's slope of each of `n_head` heads (module doc), float64."""
    if max_bias <= 0:
        return np.ones(n_head)
    k = 1 << (int(n_head).bit_length() - 1)          # the largest power of two <= n_head
    first = 2.0 ** (-max_bias / k * np.arange(1, k + 1))
    rest = 2.0 ** (-max_bias / (2 * k) * np.arange(1, 2 * (n_head - k), 2))
    return np.concatenate([first, rest])[:n_head]


def reference_yarn_range(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                         beta_slow: float) -> tuple[float, float]:
    """YaRN's correction range (low, high) in dimensions (module doc); with no original
    context (n_ctx_orig 0) every dimension is below the range: (0, -inf)."""
    def dim(beta):
        if n_ctx_orig <= 0:
            return -np.inf if freq_base > 1 else np.inf
        return n_dims * np.log(n_ctx_orig / (2 * np.pi * beta)) / (2 * np.log(freq_base))
    low, high = dim(beta_fast), dim(beta_slow)
    low = np.floor(low) if np.isfinite(low) else low
    high = np.ceil(high) if np.isfinite(high) else high
    return float(max(0.0, low)), float(min(n_dims - 1.0, high))


def torch_gelu_erf(x):
    """x Phi(x) in torch, for the references of gelu_erf and geglu_erf: torch's own
    `gelu(x)` in float32 and the 16-bit dtypes (what a kernel writer compares against), but
    in float64, the truth, 0.5 x erfc(-x / sqrt 2), whose autograd keeps the tail: torch's
    float64 gelu takes Phi(x) as (1 + erf(x / sqrt 2)) / 2, which is 0 below x = -8.3, so its
    gradient there is x phi(x) alone, 0.75% off at x = -11.5 (and any float32 kernel that is
    right there fails the precision verdict against it)."""
    import torch
    if x.dtype != torch.float64:
        return torch.nn.functional.gelu(x)
    return 0.5 * x * torch.special.erfc(-x / math.sqrt(2.0))


GELU_TANH_CUBIC = 0.044715      # torch's gelu(approximate="tanh"): sqrt(2/pi) (x + 0.044715 x^3)


def torch_gelu(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in torch, for the references of gelu
    and geglu: torch's own `gelu(x, approximate="tanh")` in float32 and the 16-bit dtypes
    (what a kernel writer compares against), but in float64, the truth, x sigmoid(2 sqrt(2/pi)
    (x + 0.044715 x^3)), the same function (0.5 (1 + tanh(u / 2)) = sigmoid(u)), whose
    autograd keeps the tail: torch's float64 gelu takes 1 + tanh and 1 - tanh^2, which
    round to 0 once tanh rounds to -1, so its gradient is 0 below x = -7.15 where the truth
    is -4.3e-18 at x = -7.6875 and -4.4e-38 at x = -10.18 (mpmath), values that float32
    and bfloat16 hold (and right kernels failed the precision verdict against the 0:
    gradcheck --op gelu --op geglu --random 200, four false alarms)."""
    import torch
    if x.dtype != torch.float64:
        return torch.nn.functional.gelu(x, approximate="tanh")
    u = (2.0 * math.sqrt(2.0 / math.pi)) * (x + GELU_TANH_CUBIC * x * x * x)
    return x * torch.sigmoid(u)
