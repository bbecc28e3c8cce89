"""Focused tests of attention, attention_fwd and attention_back: the engine's output and
log-sum-exp against a loop written from the formulas (engine.ops.attention's doc), the
torch reference against the same loop, attention_back against torch autograd with an lse
gradient, rows that see no key, the mask's missing gradient, the fast paths (query blocks,
causal skipping, threads) against their plain twins, and the clear errors of malformed
builds. The registry samples (gradcheck, tests/engine/ops/test_ops.py) check the gradients
themselves.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import engine
from engine.backends.alibi_math import alibi_slopes
from engine.backends.cpu import paths, threads
from engine.errors import DTypeError, ParamError, ShapeError
from engine.ops.attention import (
    _torch_attention_back,
    _torch_attention_fwd,
    attention,
    attention_back,
    attention_fwd,
    split_gradients,
)
from tests.engine.ops.op_harness import evaluate, weighted_grads

RNG = np.random.default_rng(20251204)


def _loop_reference(q, k, v, mask=None, *, scale=None, causal=False, logit_softcap=0.0,
                    max_bias=0.0):
    """(out, lse) in float64, one (b, h, i) row at a time, from the module doc's formulas."""
    q4, k4, v4 = (np.asarray(a, np.float64).reshape((-1,) + a.shape[-3:]) for a in (q, k, v))
    nb, hq, tq, d = q4.shape
    hkv, tk = k4.shape[1], k4.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    m4 = None if mask is None else np.broadcast_to(
        np.asarray(mask, np.float64), q.shape[:-1] + (tk,)).reshape(nb, hq, tq, tk)
    out, lse = np.zeros((nb, hq, tq, v4.shape[3])), np.zeros((nb, hq, tq))
    for b in range(nb):
        for h in range(hq):
            c = h // (hq // hkv)
            for i in range(tq):
                s = scale * (k4[b, c] @ q4[b, h, i])
                if logit_softcap > 0:
                    s = logit_softcap * np.tanh(s / logit_softcap)
                if m4 is not None:
                    s = s + alibi_slopes(hq, max_bias)[h] * m4[b, h, i]
                if causal:
                    s = np.where(np.arange(tk) > i + tk - tq, -np.inf, s)
                if np.all(s == -np.inf):
                    lse[b, h, i] = -np.inf
                    continue
                top = s.max()
                e = np.exp(s - top)
                lse[b, h, i] = top + np.log(e.sum())
                out[b, h, i] = e @ v4[b, c] / e.sum()
    lead = q.shape[:-1]
    return out.reshape(lead + (v.shape[-1],)), lse.reshape(lead)


def _arrays(qs, ks, vs, ms=None, dtype=np.float64):
    arrays = [RNG.uniform(-2, 2, s).astype(dtype) for s in (qs, ks, vs)]
    return arrays + ([] if ms is None else [RNG.uniform(-3, 1, ms).astype(dtype)])


CASES = [
    ((2, 3, 4), (2, 5, 4), (2, 5, 4), None, {}),
    ((2, 4, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3), None, dict(causal=True, scale=0.6)),
    ((1, 2, 6, 4), (1, 2, 3, 4), (1, 2, 3, 2), None, dict(causal=True, scale=0.5)),
    ((2, 2, 3, 4), (2, 1, 5, 4), (2, 1, 5, 2), (2, 1, 3, 5), dict(causal=True)),
    ((3, 4, 5), (3, 6, 5), (3, 6, 2), (6,), dict(logit_softcap=2.0, scale=0.9)),
    ((1, 6, 2, 4), (1, 3, 5, 4), (1, 3, 5, 4), (1, 6, 2, 5),
     dict(max_bias=8.0, logit_softcap=3.0, causal=True, scale=0.5)),
    ((1, 2, 200, 8), (1, 1, 150, 8), (1, 1, 150, 8), (200, 150),
     dict(max_bias=4.0, causal=True, scale=0.4)),                      # query blocks
]


@pytest.mark.parametrize("qs, ks, vs, ms, params", CASES)
def test_forward_matches_the_formulas(qs, ks, vs, ms, params):
    arrays = _arrays(qs, ks, vs, ms)
    want_out, want_lse = _loop_reference(*arrays, **params)
    got = evaluate(lambda *t: attention_fwd(*t, **params), *arrays)
    np.testing.assert_allclose(got[..., :-1], want_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[..., -1], want_lse, rtol=1e-10, atol=1e-12)
    out = evaluate(lambda *t: attention(*t, **params), *arrays)
    np.testing.assert_array_equal(out, got[..., :-1])
    ref = _torch_attention_fwd(*[torch.from_numpy(a) for a in arrays], **params).numpy()
    np.testing.assert_allclose(ref, got, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-5), (np.float16, 2e-2)])
def test_low_precision_forward_is_close_to_float64(dtype, tol):
    arrays = _arrays((1, 4, 150, 16), (1, 2, 150, 16), (1, 2, 150, 16), (150, 150))
    params = dict(causal=True, max_bias=2.0, scale=0.25)
    want = evaluate(lambda *t: attention_fwd(*t, **params), *arrays)
    got = evaluate(lambda *t: attention_fwd(*t, **params), *[a.astype(dtype) for a in arrays])
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def test_the_node_structure_and_the_default_scale():
    q, k, v = (engine.input_tensor(s, np.float32) for s in ((2, 3, 16), (2, 5, 16),
                                                            (2, 5, 7)))
    y = attention(q, k, v)
    assert y.op == "block" and y.shape == (2, 3, 7)
    (fwd,) = y.srcs
    assert fwd.op == "attention_fwd" and fwd.shape == (2, 3, 8)
    assert fwd.params == dict(scale=0.25, causal=False, logit_softcap=0.0, max_bias=0.0)


@pytest.mark.parametrize("qs, ks, vs, ms, params", CASES)
def test_attention_back_is_torch_autograd_with_an_lse_gradient(qs, ks, vs, ms, params):
    arrays = _arrays(qs, ks, vs, ms)
    g = RNG.uniform(-1, 1, qs[:-1] + (vs[-1] + 1,))

    def build(g, q, k, v, *mask):
        fwd = attention_fwd(q, k, v, *mask, **params)
        return attention_back(g, q, k, v, mask[0] if mask else None, fwd, **params)
    got = evaluate(build, g, *arrays)
    assert got.shape == (sum(a.size for a in arrays[:3]),)
    want = _torch_attention_back(*[torch.from_numpy(a) for a in (g, *arrays)], **params)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-11)

    def split(g, q, k, v, *mask):           # the rule's views of the flat output
        return split_gradients(build(g, q, k, v, *mask), q, k, v)[1]
    dk = evaluate(split, g, *arrays)
    np.testing.assert_array_equal(dk.reshape(-1), got[arrays[0].size:][:arrays[1].size])


def test_rows_that_see_no_key_give_zeros_and_no_gradient():
    """Causal with Tq > Tk (the first Tq - Tk rows) and a mask row all -inf: out 0, lse
    -inf, and gradients of those rows of q exactly 0, the others finite."""
    q, k, v = _arrays((1, 2, 5, 4), (1, 2, 3, 4), (1, 2, 3, 3))
    mask = np.zeros((5, 3))
    mask[3] = -np.inf
    fwd = evaluate(lambda *t: attention_fwd(*t, causal=True), q, k, v, mask)
    dead = [0, 1, 3]
    assert np.all(fwd[:, :, dead, :-1] == 0) and np.all(fwd[:, :, dead, -1] == -np.inf)
    assert np.isfinite(fwd[:, :, [2, 4]]).all()
    w = RNG.uniform(0.5, 1.5, (1, 2, 5, 3))
    gq, gk, gv, gmask = weighted_grads(lambda *t: attention(*t, causal=True),
                                       [q, k, v, mask], w, params=[True, True, True, False])
    assert gmask is None and all(np.isfinite(g).all() for g in (gq, gk, gv))
    assert np.all(gq[:, :, dead] == 0) and np.any(gq[:, :, [2, 4]] != 0)


def test_the_mask_gets_no_gradient():
    q, k, v, mask = _arrays((2, 3, 4), (2, 5, 4), (2, 5, 4), (3, 5))
    w = RNG.uniform(0.5, 1.5, (2, 3, 4))
    *_, gmask = weighted_grads(lambda *t: attention(*t, scale=0.5), [q, k, v, mask], w)
    assert np.all(gmask == 0)            # flagged, but no gradient flows to the mask


@pytest.mark.parametrize("causal, ms", [(True, None), (False, (1, 4, 300, 260))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_fast_paths_agree_with_the_plain_twins(causal, ms, dtype):
    """300 queries (3 blocks of 128, ragged), 4 heads on 2 threads: the tiled, causally
    skipping, threaded kernels against one block over every key on one thread."""
    arrays = _arrays((1, 4, 300, 32), (1, 2, 260, 32), (1, 2, 260, 48), ms, dtype)
    g = RNG.uniform(-1, 1, (1, 4, 300, 49)).astype(dtype)
    params = dict(causal=causal, logit_softcap=0.0 if causal else 4.0, scale=0.2,
                  max_bias=0.0 if causal else 3.0)

    def build(g, q, k, v, *mask):
        fwd = attention_fwd(q, k, v, *mask, **params)
        return fwd, attention_back(g, q, k, v, mask[0] if mask else None, fwd, **params)

    def run():
        leaves = [engine.input_tensor(a.shape, a.dtype) for a in (g, *arrays)]
        outs = build(*leaves)
        for t, a in zip(leaves, (g, *arrays), strict=True):
            t.set(a)
        return engine.compute(*outs)
    before = threads.get_num_threads()
    threads.set_num_threads(2)
    try:
        with paths.recording() as taken:
            fast = run()
        with paths.plain(), paths.recording() as plain_taken:
            plain = run()
    finally:
        threads.set_num_threads(before)
    want = {"attention:tiles", "attention:compiled", "attention:head_tasks",
            "split:cpu_attention_fwd", "split:cpu_attention_back"}
    assert want | ({"attention:causal_skip"} if causal else set()) <= set(taken)
    assert not plain_taken
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-5)
    for a, b in zip(fast, plain, strict=True):
        np.testing.assert_allclose(a, b, **tol)


@pytest.mark.parametrize("causal, ms", [(True, None), (False, (300, 260))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_thread_count_gives_the_same_bits(causal, ms, dtype):
    """The compiled (batch, head) tasks (attention:compiled), forward and backward, give
    the same bits on 1, 2 and 3 threads: a task's arithmetic does not depend on which
    thread runs it, and its products hold BLAS to one thread (SciPy's OpenBLAS on two
    threads summed float64 products in another order). 2 batches x 4 query heads on 2 kv
    heads: 8 tasks each way (the backward's by query head, attention:head_tasks, its
    partials summed in head order), so 3 threads take uneven shares."""
    arrays = _arrays((2, 4, 300, 32), (2, 2, 260, 32), (2, 2, 260, 48), ms, dtype)
    g = RNG.uniform(-1, 1, (2, 4, 300, 49)).astype(dtype)
    params = dict(causal=causal, scale=0.2, max_bias=0.0 if causal else 3.0)
    before = threads.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            threads.set_num_threads(n)
            leaves = [engine.input_tensor(a.shape, a.dtype) for a in (g, *arrays)]
            gt, q, k, v, *mask = leaves
            fwd = attention_fwd(q, k, v, *mask, **params)
            back = attention_back(gt, q, k, v, mask[0] if mask else None, fwd, **params)
            for t, a in zip(leaves, (g, *arrays), strict=True):
                t.set(a)
            with paths.recording() as taken:
                results.append(engine.compute(fwd, back))
            assert taken["attention:compiled"] > 0 and taken["attention:head_tasks"] > 0
            assert (n > 1) == (taken["split:cpu_attention_back"] > 0)
    finally:
        threads.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shapes, kwargs, error, words", [
    ([(3, 4), (3, 4), (3, 4)], {}, ShapeError, "(H, T, D) or all (B, H, T, D)"),
    ([(2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)], {}, ShapeError, "must all be (H, T, D)"),
    ([(3, 3, 4), (2, 5, 4), (2, 5, 4)], {}, ShapeError, "multiple of k's and v's 2"),
    ([(2, 3, 4), (2, 5, 3), (2, 5, 4)], {}, ShapeError, "head size 3 differs from q's 4"),
    ([(2, 3, 4), (2, 5, 4), (2, 6, 4)], {}, ShapeError, "share q's batch"),
    ([(1, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4)], {}, ShapeError, "share q's batch"),
    ([(2, 3, 4), (2, 5, 4), (2, 5, 4), (3, 4)], {}, ShapeError, "does not broadcast"),
    ([(2, 3, 4), (2, 5, 4), (2, 5, 4), (1, 1, 3, 5)], {}, ShapeError, "does not broadcast"),
    ([(2, 3, 4), (2, 5, 4), (2, 5, 4)], dict(logit_softcap=-1.0), ParamError, "softcap"),
    ([(2, 3, 4), (2, 5, 4), (2, 5, 4)], dict(max_bias=-1.0), ParamError, "max_bias"),
    ([(2, 3, 4), (2, 5, 4), (2, 5, 4)], dict(scale=float("nan")), ParamError, "scale"),
    ([(2, 3, 4), (2, 5, 4), (2, 5, 4)], dict(causal=1), ParamError, "causal"),
    ([(2, 3, 0), (2, 5, 0), (2, 5, 4)], {}, ShapeError, "needs D > 0"),
])
def test_malformed_builds_raise_clear_errors(shapes, kwargs, error, words):
    ts = [engine.input_tensor(s, np.float32) for s in shapes]
    for build in (attention, attention_fwd):
        with pytest.raises(error, match="attention") as info:
            build(*ts, **kwargs)
        assert words in str(info.value)


def test_dtypes_must_agree():
    q, k = engine.input_tensor((2, 3, 4), np.float32), engine.input_tensor((2, 5, 4), np.float32)
    with pytest.raises(DTypeError, match="attention: v dtype float64 differs from q's"):
        attention(q, k, engine.input_tensor((2, 5, 4), np.float64))
    with pytest.raises(DTypeError, match="attention: mask dtype float16"):
        attention(q, k, k, engine.input_tensor((3, 5), np.float16))
    with pytest.raises(DTypeError, match="q must be float"):
        attention(engine.input_tensor((2, 3, 4), np.int32), k, k)


def test_attention_back_checks_its_packed_inputs():
    q, k, v = (engine.input_tensor(s, np.float32) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 6)))
    fwd = attention_fwd(q, k, v)
    with pytest.raises(ShapeError, match=r"attention_back: g must have .* \[2, 3, 7\]"):
        attention_back(engine.input_tensor((2, 3, 6), np.float32), q, k, v, None, fwd)
    g = engine.input_tensor((2, 3, 7), np.float32)
    with pytest.raises(ShapeError, match="attention_back: fwd must have"):
        attention_back(g, q, k, v, None, engine.input_tensor((2, 3, 6), np.float32))
    assert attention_back(g, q, k, v, None, fwd).shape == (24 + 40 + 60,)


def test_one_element_gradients_are_contiguous_blocks():
    """q, k, v of one element each: the rule's block views of attention_back's output are
    one element, contiguous wherever they lie (engine.ops.block), so reshape takes them;
    one key: P = 1 and q, k get exactly no gradient."""
    flat = engine.input_tensor((3,), np.float32)
    assert engine.ops.block(flat, (1,), (1,)).contiguous
    q, k, v = _arrays((1, 1, 1), (1, 1, 1), (1, 1, 1))
    gq, gk, gv = weighted_grads(lambda *t: attention(*t, scale=0.5), [q, k, v],
                                np.full((1, 1, 1), 0.75))
    assert gq[0, 0, 0] == 0 and gk[0, 0, 0] == 0 and gv[0, 0, 0] == 0.75


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_the_saved_lse_rounding_is_undone_and_a_wrong_lse_kept(dtype):
    """One key per row and scores near 40 (|lse| ~ 40: its storage rounding moves
    exp(s - lse) by 40 u): q and k get exactly no gradient and dv is g's sum. An lse off by
    0.1 (more than its rounding) is used as it is: dv comes out exp(-0.1) times as big."""
    from engine.backends.cpu import CPU
    from engine.registry import get_op
    cpu_attention_fwd = CPU.kernel(get_op("attention_fwd"), [np.dtype(dtype)] * 4)
    cpu_attention_back = CPU.kernel(get_op("attention_back"), [np.dtype(dtype)] * 6)
    q = np.full((2, 3, 4), 3.0, dtype)
    k, v = np.full((2, 1, 4), 3.3, dtype), RNG.uniform(-1, 1, (2, 1, 5)).astype(dtype)
    params = dict(scale=1.0, causal=False, logit_softcap=0.0, max_bias=0.0)
    fwd = np.empty((2, 3, 6), dtype)
    cpu_attention_fwd(fwd, [q, k, v], **params)
    g = RNG.uniform(-1, 1, fwd.shape).astype(dtype)
    g[..., -1] = 0.0
    out = np.empty(q.size + k.size + v.size, dtype)
    cpu_attention_back(out, [g, q, k, v, fwd], **params)
    assert np.all(out[:q.size + k.size] == 0)
    dv = out[q.size + k.size:].reshape(v.shape).astype(np.float64)
    # within the rounding of a 3-term sum in dtype (relative to the terms: the sum cancels
    # to 0.016 in some columns, and BLAS's order of the terms is its own); a P off by the
    # lse's storage rounding (40 u) would err ten times as much
    terms = g[..., :-1].astype(np.float64)
    np.testing.assert_array_less(np.abs(dv - terms.sum(1, keepdims=True)),
                                 4 * np.finfo(dtype).eps * np.abs(terms).sum(1, keepdims=True))
    shifted = fwd.copy()
    shifted[..., -1] += 0.1
    cpu_attention_back(out, [g, q, k, v, shifted], **params)
    work = np.float32 if dtype == np.float16 else dtype     # the kernel's product's dtype
    s = (q.astype(work) @ k.astype(work).swapaxes(1, 2)).astype(np.float64)   # (2, 3, 1)
    p = np.exp(s - shifted[..., -1:].astype(np.float64))                    # about e^-0.1
    terms = p * g[..., :-1].astype(np.float64)
    np.testing.assert_array_less(
        np.abs(out[q.size + k.size:].reshape(v.shape) - terms.sum(1, keepdims=True)),
        8 * np.finfo(dtype).eps * np.abs(terms).sum(1, keepdims=True))
