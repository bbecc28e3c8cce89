"""ALiBi's per-head slopes (ggml's soft_max_ext and flash_attn_ext with max_bias > 0),
written once for the CPU and CUDA kernels of softmax and attention, which inline it
(scalar_math), and for the torch references.

With n heads, n2 = 2^floor(log2(n)) (the largest power of two not above n), and
m0 = 2^(-max_bias / n2), m1 = 2^(-max_bias / (2 n2)), head h (0-based) has the slope

    slope_h = m0^(h + 1)                      for h < n2
            = m1^(2 (h - n2) + 1)             for h >= n2
            = 1                               when max_bias = 0 (no ALiBi)

which multiplies the additive mask of that head: logits = scale x + slope_h mask. This is
ggml's rule (and the ALiBi paper's geometric sequence for a power-of-two n, interleaved
for the rest). Float64 throughout.
"""

from __future__ import annotations

import math

from engine.backends.cpu.jit import scalar_math


@scalar_math
def alibi_slope(h, n_head, max_bias):
    """The ALiBi slope of head h (0-based) of n_head heads (module doc); 1.0 when
    max_bias <= 0."""
    if max_bias <= 0.0:
        return 1.0
    n2 = 2.0 ** math.floor(math.log2(n_head))
    if h < n2:
        return (2.0 ** (-max_bias / n2)) ** (h + 1.0)
    return (2.0 ** (-max_bias / (2.0 * n2))) ** (2.0 * (h - n2) + 1.0)


def alibi_slopes(n_head: int, max_bias: float):
    """The slopes of heads 0..n_head-1 as a float64 numpy array (for dispatchers and the
    torch references)."""
    import numpy as np
    return np.array([alibi_slope(float(h), float(n_head), float(max_bias))
                     for h in range(n_head)], dtype=np.float64)
