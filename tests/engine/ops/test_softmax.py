"""Focused tests of softmax's ALiBi slopes and attention sinks, and of softmax_sink_back: the
engine against an independent loop written from ggml's algorithm (ggml_compute_forward_
soft_max_f32: slopes by powf(m0, h + 1) and powf(m1, 2 (h - n_head_log2) + 1), the sink in
the row max and the normaliser), gradients against torch in float64, the sink's gradient
from its closed form, rows masked entirely, sinks without a mask, the sink gradient's
accuracy where the sink's share is tiny (recomputed, not 1 - sum y), thread-count
independence and the clear errors of malformed builds. The registry samples (gradcheck,
tests/engine/ops/test_ops.py) check every gradient on every dtype.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import engine
from engine import ops
from engine.backends.cpu import threads
from engine.errors import DTypeError, ParamError, ShapeError
from engine.ops.softmax import n_heads, torch_softmax
from tests.engine.ops.op_harness import TOL, evaluate, weighted_grads

RNG = np.random.default_rng(20251204)


def _ggml_softmax(x, mask, sinks, scale, max_bias):
    """ggml's soft_max_ext (+ add_sinks), row by row in float64, for x of at most 4 axes:
    heads are x's axis -3 (ne[2]), the mask broadcast to x."""
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape).astype(np.float64)
    m4 = np.broadcast_to(np.zeros(1) if mask is None else mask, x.shape).reshape(x4.shape)
    n_head = x4.shape[1]
    n_head_log2 = 2 ** math.floor(math.log2(n_head))
    m0 = 2.0 ** (-max_bias / n_head_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_head_log2)
    out = np.empty_like(x4)
    for a, h, i in np.ndindex(x4.shape[:3]):
        slope = 1.0 if max_bias <= 0 else (m0 ** (h + 1) if h < n_head_log2
                                           else m1 ** (2 * (h - n_head_log2) + 1))
        w = scale * x4[a, h, i] + slope * m4[a, h, i]
        top = w.max() if sinks is None else max(w.max(), sinks[h])
        e = np.exp(w - top)
        total = e.sum() + (0.0 if sinks is None else math.exp(sinks[h] - top))
        out[a, h, i] = e / total
    return out.reshape(x.shape)


def _build(x, mask=None, sinks=None, scale=1.0, max_bias=0.0):
    return ops.softmax(x, scale, mask, max_bias=max_bias, sinks=sinks)


# (x shape, mask shape, with sinks, scale, max_bias): 1, 3, 4 and 5 heads (4 a power of two:
# one slope sequence; 3 and 5: both), masks shared by heads or per head
CASES = [((3, 2, 5), (2, 5), False, 1.0, 8.0), ((5, 3, 4), (5, 3, 4), False, 0.5, 2.0),
         ((2, 4, 3, 6), (2, 1, 3, 6), True, -0.7, 1.0), ((4, 7), (4, 7), True, 2.0, 8.0),
         ((2, 3, 2, 5), (5,), True, 1.0, 0.0), ((6,), (6,), True, 1.0, 3.0)]


@pytest.mark.parametrize("shape, mshape, with_sinks, scale, max_bias", CASES)
def test_forward_matches_ggml_algorithm_and_torch(shape, mshape, with_sinks, scale, max_bias):
    x = RNG.uniform(-3, 3, shape)
    mask = RNG.uniform(-5, 0, mshape)
    sinks = RNG.uniform(-2, 2, (n_heads(shape),)) if with_sinks else None
    want = _ggml_softmax(x, mask, sinks, scale, max_bias)
    args = [x, mask] + ([sinks] if with_sinks else [])
    got = evaluate(lambda *t: _build(*t, scale=scale, max_bias=max_bias), *args)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)
    ref = torch_softmax(*(torch.tensor(a) for a in args), scale=scale, max_bias=max_bias)
    np.testing.assert_allclose(ref.numpy(), want, rtol=1e-12, atol=1e-300)
    if with_sinks:
        assert (got.sum(-1) < 1.0).all()     # the sinks' share is no output


@pytest.mark.parametrize("shape, mshape, with_sinks, scale, max_bias", CASES)
@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_gradients_of_x_mask_and_sinks_match_torch(shape, mshape, with_sinks, scale, max_bias,
                                                     dtype):
    np_dtype = np.float64 if dtype == "f64" else np.float32
    x = RNG.uniform(-3, 3, shape).astype(np_dtype)
    args = [x, RNG.uniform(-5, 0, mshape).astype(np_dtype)]
    if with_sinks:
        args.append(RNG.uniform(-2, 2, (n_heads(shape),)).astype(np_dtype))
    w = RNG.uniform(-1, 1, shape)
    got = weighted_grads(lambda *t: _build(*t, scale=scale, max_bias=max_bias), args, w)
    tens = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in args]
    (torch_softmax(*tens, scale=scale, max_bias=max_bias) * torch.tensor(w)).sum().backward()
    for g, t in zip(got, tens, strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), **TOL[dtype])


def test_sink_gradient_is_minus_p_sink_times_the_rows_dot():
    """grad_sink_h = -sum over head h's rows of p_sink sum_j g_j y_j, p_sink = 1 - sum_j y_j
    (here in float64, where the subtraction is harmless)."""
    x, mask = RNG.uniform(-2, 2, (2, 3, 4, 5)), RNG.uniform(-3, 0, (4, 5))
    sinks, w = RNG.uniform(-1, 1, (3,)), RNG.uniform(-1, 1, (2, 3, 4, 5))
    y = _ggml_softmax(x, mask, sinks, 0.5, 4.0)
    want = -((1.0 - y.sum(-1)) * (w * y).sum(-1)).sum(axis=(0, 2))
    got = weighted_grads(lambda a, m, s: _build(a, m, s, 0.5, 4.0), [x, mask, sinks], w,
                         params=[False, False, True])[2]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_alibi_without_a_mask_changes_nothing():
    x = RNG.uniform(-3, 3, (4, 2, 5))
    np.testing.assert_allclose(evaluate(lambda a: ops.softmax(a, 0.5, max_bias=8.0), x),
                               evaluate(lambda a: ops.softmax(a, 0.5), x), rtol=0, atol=0)


def test_max_bias_zero_is_the_plain_masked_softmax():
    x, mask = RNG.uniform(-3, 3, (3, 2, 5)), RNG.uniform(-5, 0, (2, 5))
    got = evaluate(lambda a, m: ops.softmax(a, 1.5, m, max_bias=0.0), x, mask)
    np.testing.assert_allclose(got, torch.softmax(torch.tensor(1.5 * x + mask), -1).numpy(),
                               rtol=1e-12)


def test_sinks_without_a_mask_are_a_zero_mask_without_gradient():
    x, sinks = RNG.uniform(-3, 3, (3, 2, 5)), RNG.uniform(-1, 1, (3,))
    xt, st = engine.param(x.shape, "f64"), engine.param(sinks.shape, "f64")
    y = ops.softmax(xt, 2.0, sinks=st)
    assert len(y.srcs) == 3 and y.srcs[1].shape == (1,) and not y.srcs[1].is_param
    got = evaluate(lambda a, s: ops.softmax(a, 2.0, sinks=s), x, sinks)
    np.testing.assert_allclose(got, _ggml_softmax(x, None, sinks, 2.0, 0.0), rtol=1e-12)
    w = RNG.uniform(-1, 1, x.shape)
    plain = weighted_grads(lambda a, s: ops.softmax(a, 2.0, sinks=s), [x, sinks], w)
    masked = weighted_grads(lambda a, s: ops.softmax(a, 2.0, ops.scale(a, 0.0), sinks=s),
                            [x, sinks], w)
    for a, b in zip(plain, masked, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_row_masked_entirely_gives_its_weight_to_the_sink(dtype):
    """With every key masked (-inf) a row is all zeros (the sink takes it all), no NaN,
    and its gradients are zero; without sinks such a row is NaN (0/0), as in ggml."""
    x = RNG.uniform(-3, 3, (2, 3, 4)).astype(dtype)
    mask = np.zeros((3, 4), dtype)
    mask[1] = -np.inf
    sinks = np.array([0.5, -1.0], dtype)
    y = evaluate(lambda a, m, s: ops.softmax(a, mask=m, sinks=s), x, mask, sinks)
    assert np.isfinite(y).all() and (y[:, 1] == 0).all()
    w = RNG.uniform(-1, 1, x.shape)
    gx, gm, gs = weighted_grads(lambda a, m, s: ops.softmax(a, mask=m, sinks=s),
                                [x, mask, sinks], w, params=[True, False, True])
    assert gm is None and np.isfinite(gx).all() and np.isfinite(gs).all()
    assert (gx[:, 1] == 0).all()


def test_the_sink_gradient_keeps_its_accuracy_when_the_sink_takes_almost_nothing():
    """p_sink of about 1e-7: 1 - sum y from float32 y would err by about its own size; the
    kernel recomputes p_sink from the logits, so float32 keeps float32's relative accuracy."""
    x = RNG.uniform(2, 3, (2, 8, 16))
    sinks = np.array([-14.0, -13.0])
    w = RNG.uniform(0.5, 1.5, x.shape)
    want = weighted_grads(lambda a, s: ops.softmax(a, sinks=s), [x, sinks], w,
                          params=[False, True])[1]
    got = weighted_grads(lambda a, s: ops.softmax(a, sinks=s),
                         [x.astype(np.float32), sinks.astype(np.float32)], w,
                         params=[False, True])[1]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_the_sink_gradient_does_not_depend_on_the_thread_count():
    """cpu_softmax_sink_back over row ranges on 1, 2, 3 and 7 threads: the same bits (each
    head's sum runs over per-row terms in one order)."""
    from engine.registry import get_op
    kernel = get_op("softmax_sink_back").kernels["cpu"]
    x = RNG.uniform(-3, 3, (5, 206, 1031)).astype(np.float32)
    g = RNG.uniform(-1, 1, x.shape).astype(np.float32)
    mask = RNG.uniform(-5, 0, (206, 1031)).astype(np.float32)
    sinks = RNG.uniform(-1, 3, (5,)).astype(np.float32)
    results = []
    before = threads.get_num_threads()
    try:
        for n in (1, 2, 3, 7):
            threads.set_num_threads(n)
            out = np.empty(5, np.float32)
            kernel(out, [g, x, mask, sinks], scale=0.5, max_bias=8.0)
            results.append(out)
    finally:
        threads.set_num_threads(before)
    for r in results[1:]:
        assert np.array_equal(r, results[0])


def _t(shape, dtype="f32"):
    return engine.input_tensor(shape, dtype)


@pytest.mark.parametrize("build, error, match", [
    (lambda: ops.softmax(_t((3, 4, 5)), mask=_t((4, 5)), sinks=_t((4,))), ShapeError,
     r"softmax: sinks must have shape \(H,\) = \(3,\), one logit per head \(x's axis -3\), "
     r"got shapes \[3, 4, 5\] and \[4, 5\] and \[4\]"),
    (lambda: ops.softmax(_t((4, 5)), sinks=_t((1, 1))), ShapeError,
     r"sinks must have shape \(H,\) = \(1,\)"),
    (lambda: ops.softmax(_t((3, 4, 5)), mask=_t((4, 5)), sinks=_t((3,), "f64")), DTypeError,
     "softmax: sinks dtype float64 differs from input dtype float32"),
    (lambda: ops.softmax(_t((3, 4)), mask=_t((3, 4)), max_bias=-1.0), ParamError,
     r"softmax: max_bias must be >= 0 \(0: no ALiBi\), got -1.0"),
    (lambda: ops.softmax(_t((3, 4)), max_bias="8"), ParamError,
     "softmax: max_bias must be a number"),
    (lambda: ops.softmax(_t((1, 2, 1, 3, 4)), sinks=_t((1,))), ShapeError,
     "softmax: a mask needs an input of at most 4 axes"),
    (lambda: ops.softmax_sink_back(_t((3, 4)), _t((3, 5)), _t((3, 5)), _t((1,))), ShapeError,
     r"softmax_sink_back: inputs must have the same shape, got \[3, 4\] and \[3, 5\]"),
    (lambda: engine.registry.make_node("softmax_sink_back", (_t((3, 4)), _t((3, 4)),
                                                             _t((3, 4))), scale=1.0),
     ShapeError, "softmax_sink_back: takes g, x, mask and sinks, got 3 inputs"),
    (lambda: engine.registry.make_node("softmax", (_t((3, 4)),) * 4, scale=1.0), ShapeError,
     "softmax: takes x, mask and sinks, got 4 inputs"),
])
def test_malformed_builds_fail_clearly(build, error, match):
    with pytest.raises(error, match=match):
        build()
