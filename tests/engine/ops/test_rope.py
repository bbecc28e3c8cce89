"""Focused tests of rope and rope_back: the engine against an independent loop written from
ggml's algorithm (ggml_compute_forward_rope: theta advanced by repeated products, YaRN's
corr dims and ramp), the torch reference against the same loop, the rotation's
orthogonality (rope_back undoes rope), YaRN's correction dims, the gradients that do not
exist (pos, freq_factors) and the clear errors of malformed builds. The registry samples
(gradcheck, tests/engine/ops/test_ops.py) check the gradients themselves.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.backends.rope_math import yarn_corr_dims
from engine.errors import DTypeError, ParamError, ShapeError
from engine.ops.rope import DEFAULTS, YARN, _torch_rope, rope, rope_back
from tests.engine.ops.op_harness import evaluate, weighted_grads

RNG = np.random.default_rng(20251203)


def _ggml_rope(x, pos, ff, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
               attn_factor, beta_fast, beta_slow, sign=1.0):
    """ggml's forward rope, element by element in float64, for x of shape (..., T, H, D)."""
    x4 = x.reshape((-1,) + x.shape[-3:]).astype(np.float64)
    out = x4.copy()
    ln = lambda n_rot: n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (  # noqa: E731
        2 * math.log(freq_base)) if n_ctx_orig else -math.inf
    low = max(0.0, math.floor(ln(beta_fast)) if n_ctx_orig else -math.inf)
    high = min(n_dims - 1.0, math.ceil(ln(beta_slow)) if n_ctx_orig else -math.inf)
    theta_scale = freq_base ** (-2.0 / n_dims)
    half = n_dims // 2
    for t in range(x4.shape[1]):
        theta = float(pos[t])
        for i0 in range(0, n_dims, 2):
            extrap = theta / (ff[i0 // 2] if ff is not None else 1.0)
            th, ms = freq_scale * extrap, attn_factor
            if ext_factor != 0.0:
                ramp = 1 - min(1.0, max(0.0, (i0 // 2 - low) / max(0.001, high - low)))
                mix = ramp * ext_factor
                th = th * (1 - mix) + extrap * mix
                ms *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
            c, s = math.cos(th) * ms, sign * math.sin(th) * ms
            j0, j1 = (i0 // 2, i0 // 2 + half) if mode == "neox" else (i0, i0 + 1)
            a0, a1 = x4[:, t, :, j0], x4[:, t, :, j1]
            out[:, t, :, j0] = a0 * c - a1 * s
            out[:, t, :, j1] = a0 * s + a1 * c
            theta *= theta_scale
    return out.reshape(x.shape)


CASES = [((5, 3, 8), 8, {}), ((4, 2, 10), 6, {}), ((2, 4, 2, 12), 8, YARN),
         ((3, 2, 16), 16, dict(YARN, attn_factor=0.7, beta_fast=16.0, n_ctx_orig=2048)),
         ((3, 1, 8), 8, dict(freq_scale=0.5, freq_base=500000.0, attn_factor=2.0))]


def _inputs(shape, n_dims, with_ff, dtype=np.float64):
    x = RNG.uniform(-1, 1, shape).astype(dtype)
    pos = RNG.integers(-50, 5000, shape[-3]).astype(np.int32)
    ff = RNG.uniform(0.5, 4.0, n_dims // 2).astype(dtype) if with_ff else None
    return x, pos, ff


def _params(n_dims, mode, extra):
    return dict(DEFAULTS, n_dims=n_dims, **{**extra, "mode": mode})


@pytest.mark.parametrize("with_ff", [False, True])
@pytest.mark.parametrize("mode", ["normal", "neox"])
@pytest.mark.parametrize("shape, n_dims, extra", CASES)
def test_rope_matches_ggmls_algorithm(shape, n_dims, extra, mode, with_ff):
    x, pos, ff = _inputs(shape, n_dims, with_ff)
    p = _params(n_dims, mode, extra)
    want = _ggml_rope(x, pos, ff, **p)
    arrays = [x, pos] + ([ff] if with_ff else [])
    got = evaluate(lambda *t: rope(*t, **p), *arrays)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)
    np.testing.assert_array_equal(got[..., n_dims:], x[..., n_dims:])   # passed through
    ref = _torch_rope(*[torch.from_numpy(a) for a in arrays], **p).numpy()
    np.testing.assert_allclose(ref, want, rtol=1e-9, atol=1e-11)
    back = evaluate(lambda *t: rope_back(*t, **p), *arrays)
    np.testing.assert_allclose(back, _ggml_rope(x, pos, ff, **p, sign=-1.0), rtol=1e-9,
                               atol=1e-11)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["normal", "neox"])
def test_rope_back_undoes_rope_up_to_the_magnitude_scale(mode, dtype):
    """mscale R(-theta) mscale R(theta) = mscale^2: the rotation is orthogonal."""
    x, pos, ff = _inputs((2, 6, 3, 10), 8, True, dtype)
    p = _params(8, mode, dict(YARN, attn_factor=1.3))
    mscale = 1.3 * (1.0 + 0.1 * math.log(1.0 / 0.25))
    y = evaluate(lambda a, b, c: rope_back(rope(a, b, c, **p), b, c, **p), x, pos, ff)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(y[..., :8], mscale ** 2 * x[..., :8], rtol=tol, atol=tol)


def test_position_zero_is_the_identity():
    x, _, _ = _inputs((3, 2, 8), 8, False)
    pos = np.zeros(3, np.int32)
    got = evaluate(lambda a, b: rope(a, b, n_dims=8, mode="neox"), x, pos)
    np.testing.assert_array_equal(got, x)


def test_yarn_corr_dims_are_ggmls():
    """llama's 128 dims, a 4096-token original context: dims 20 .. 46 (hand computed from
    n_dims ln(n_ctx / (2 pi beta)) / (2 ln base): 20.94 and 45.03)."""
    assert yarn_corr_dims(128, 4096, 10000.0, 32.0, 1.0) == (20.0, 46.0)
    assert yarn_corr_dims(16, 4096, 10000.0, 32.0, 1.0) == (2.0, 6.0)
    low, high = yarn_corr_dims(8, 0, 10000.0, 32.0, 1.0)        # no original context
    assert low == 0.0 and high == -math.inf


def test_pos_and_freq_factors_get_no_gradient():
    x, pos, ff = _inputs((3, 2, 8), 8, True)
    g = RNG.uniform(-1, 1, x.shape)
    gx, gpos, gff = weighted_grads(lambda *t: rope(*t, n_dims=8), [x, pos, ff], g,
                                   params=[True, False, True])
    assert gpos is None
    assert np.all(gff == 0)              # flagged, but no gradient flows to the factors
    want = _ggml_rope(g, pos, ff, **_params(8, "normal", {}), sign=-1.0)
    np.testing.assert_allclose(gx, want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("shapes, kwargs, error, words", [
    ([(3, 2, 8), (3,)], dict(n_dims=7), ParamError, "n_dims must be even"),
    ([(3, 2, 8), (3,)], dict(n_dims=10), ParamError, "at most D = 8"),
    ([(3, 2, 8), (4,)], dict(n_dims=8), ShapeError, "pos must have shape (T,)"),
    ([(2, 8), (2,)], dict(n_dims=8), ShapeError, "(T, H, D) or (B, T, H, D)"),
    ([(3, 2, 8), (3,), (3,)], dict(n_dims=8), ShapeError, "freq_factors must have shape"),
    ([(3, 2, 8), (3,)], dict(n_dims=8, mode="gptj"), ParamError, "mode must be one of"),
    ([(3, 2, 8), (3,)], dict(n_dims=8, freq_base=-1.0), ParamError, "freq_base must be"),
    ([(3, 2, 8), (3,)], dict(n_dims=8, n_ctx_orig=-5), ParamError, "n_ctx_orig"),
])
def test_malformed_builds_raise_clear_errors(shapes, kwargs, error, words):
    import engine
    x = engine.input_tensor(shapes[0], np.float32)
    pos = engine.input_tensor(shapes[1], np.int32)
    ff = [engine.input_tensor(s, np.float32) for s in shapes[2:]]
    with pytest.raises(error, match="rope") as info:
        rope(x, pos, *ff, **kwargs)
    assert words in str(info.value)


def test_pos_must_be_int32_and_factors_of_xs_dtype():
    import engine
    x = engine.input_tensor((3, 2, 8), np.float32)
    with pytest.raises(DTypeError, match="pos must be int32"):
        rope(x, engine.input_tensor((3,), np.float32), n_dims=8)
    with pytest.raises(DTypeError, match="freq_factors dtype"):
        rope(x, engine.input_tensor((3,), np.int32), engine.input_tensor((4,), np.float64),
             n_dims=8)
