"""rope in ggml: ggml_rope_ext called with a registry rope case's parameters (engine.ops.rope,
llama.cpp's defaults where a case leaves one out), for the rope op's row (ops.py) and the
decoder layer's q and k (attention.py)."""

from __future__ import annotations

ROPE_MODES = {"normal": 0, "neox": 2}       # GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_NEOX


def rope_ext(g, x, pos, factors, kw):
    """ggml_rope_ext(x, pos, factors or NULL, ...) with the rope parameters in `kw`: x is
    ggml's [D, H, T, B], one position per token (pos ne0 == x ne2)."""
    return g.rope_ext(x, pos, factors, kw["n_dims"], ROPE_MODES[kw.get("mode", "normal")],
                      kw.get("n_ctx_orig", 0), kw.get("freq_base", 10000.0),
                      kw.get("freq_scale", 1.0), kw.get("ext_factor", 0.0),
                      kw.get("attn_factor", 1.0), kw.get("beta_fast", 32.0),
                      kw.get("beta_slow", 1.0))
