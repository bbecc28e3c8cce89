"""Focused tests of the decoder blocks (attention_block, mlp_block): the engine against a
float64 numpy layer written from llama.cpp's order of operations (rope by ggml's algorithm,
tests/engine/ops/test_rope.py), grouped-query attention against multi-head attention with
the kv heads repeated, and the clear errors of malformed builds. The registry samples
(gradcheck, tests/engine/ops/test_ops.py) check the gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.errors import DTypeError, ParamError, ShapeError
from engine.ops.decoder_blocks import attention_block, mlp_block
from engine.ops.rope import DEFAULTS
from tests.engine.ops.op_harness import evaluate
from tests.engine.ops.test_rope import _ggml_rope

RNG = np.random.default_rng(20260821)
EPS = 1e-5


def _rms_normed(x, w):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + EPS) * w


def _numpy_mlp(x, norm, w_gate, w_up, w_down):
    h = _rms_normed(x, norm)
    gate, up = h @ w_gate.T, h @ w_up.T
    return x + (gate / (1 + np.exp(-gate)) * up) @ w_down.T


def _numpy_attention(x, pos, norm, wq, wk, wv, wo, n_head, n_head_kv, rope):
    """llama.cpp's layer, one (b, head, query) at a time: causal softmax over keys j <= i."""
    t, d = x.shape[-2], wq.shape[0] // n_head
    h = _rms_normed(x, norm)
    q = _ggml_rope((h @ wq.T).reshape(*x.shape[:-1], n_head, d), pos, None, **rope)
    k = _ggml_rope((h @ wk.T).reshape(*x.shape[:-1], n_head_kv, d), pos, None, **rope)
    v = (h @ wv.T).reshape(*x.shape[:-1], n_head_kv, -1)
    o = np.zeros(q.shape[:-1] + (v.shape[-1],))
    group = n_head // n_head_kv
    for idx in np.ndindex(*x.shape[:-2]):
        for head in range(n_head):
            for i in range(t):
                s = np.array([q[idx][i, head] @ k[idx][j, head // group] / math.sqrt(d)
                              for j in range(i + 1)])
                p = np.exp(s - s.max())
                o[idx][i, head] = (p / p.sum()) @ v[idx][: i + 1, head // group]
    return x + o.reshape(*x.shape[:-1], -1) @ wo.T


def _weights(*shapes):
    return [RNG.uniform(-1, 1, s) for s in shapes]


@pytest.mark.parametrize("lead", [(3,), (2, 4)])
def test_mlp_block_is_llamas_swiglu_feed_forward(lead):
    e, f = 5, 7
    x = RNG.uniform(-1, 1, lead + (e,))
    norm = RNG.uniform(0.5, 1.5, e)
    w_gate, w_up, w_down = _weights((f, e), (f, e), (e, f))
    got = evaluate(lambda *t: mlp_block(*t, eps=EPS), x, norm, w_gate, w_up, w_down)
    np.testing.assert_allclose(got, _numpy_mlp(x, norm, w_gate, w_up, w_down), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("lead, n_head, n_head_kv, d, n_dims, mode", [
    ((4,), 2, 1, 4, 4, "normal"), ((2, 3), 4, 2, 4, 2, "neox"), ((5,), 3, 3, 2, 2, "normal")])
def test_attention_block_is_llamas_causal_gqa_layer(lead, n_head, n_head_kv, d, n_dims, mode):
    e, t = 6, lead[-1]
    x = RNG.uniform(-1, 1, lead + (e,))
    pos = RNG.integers(0, 100, t).astype(np.int32)
    norm = RNG.uniform(0.5, 1.5, e)
    wq, wk, wv, wo = _weights((n_head * d, e), (n_head_kv * d, e), (n_head_kv * d, e),
                              (e, n_head * d))
    params = dict(n_head=n_head, n_head_kv=n_head_kv, n_dims=n_dims, mode=mode,
                  freq_base=500.0)
    got = evaluate(lambda *a: attention_block(*a, eps=EPS, **params), x, pos, norm, wq, wk,
                   wv, wo)
    rope = dict(DEFAULTS, n_dims=n_dims, mode=mode, freq_base=500.0)
    want = _numpy_attention(x, pos, norm, wq, wk, wv, wo, n_head, n_head_kv, rope)
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)


def test_grouped_query_attention_is_multi_head_attention_with_repeated_kv_heads():
    """Query head h reads kv head h // (n_head / n_head_kv): the same as n_head kv heads,
    each kv head's projection rows repeated for its group."""
    e, d, t, n_head, n_head_kv = 4, 2, 3, 4, 2
    x = RNG.uniform(-1, 1, (t, e))
    pos = np.arange(t, dtype=np.int32)
    norm = np.ones(e)
    wq, wk, wv, wo = _weights((n_head * d, e), (n_head_kv * d, e), (n_head_kv * d, e),
                              (e, n_head * d))

    def repeated(w):
        return np.repeat(w.reshape(n_head_kv, d, e), n_head // n_head_kv, axis=0).reshape(-1, e)

    def block(n_kv):
        return lambda *a: attention_block(*a, n_head=n_head, n_head_kv=n_kv, n_dims=d)
    gqa = evaluate(block(n_head_kv), x, pos, norm, wq, wk, wv, wo)
    mha = evaluate(block(n_head), x, pos, norm, wq, repeated(wk), repeated(wv), wo)
    np.testing.assert_allclose(gqa, mha, rtol=1e-13, atol=1e-13)


def test_the_last_token_does_not_change_the_earlier_ones():
    """Causal: a later token is invisible to the rows before it."""
    e, d = 4, 2
    x = RNG.uniform(-1, 1, (4, e))
    pos = np.arange(4, dtype=np.int32)
    ws = [np.ones(e)] + _weights((2 * d, e), (d, e), (d, e), (e, 2 * d))

    def run(xs):
        return evaluate(lambda *a: attention_block(*a, n_head=2, n_head_kv=1, n_dims=d),
                        xs, pos[: len(xs)], *ws)
    np.testing.assert_allclose(run(x)[:3], run(x[:3]), rtol=1e-13, atol=1e-13)


def _tensors(*arrays):
    import engine
    return [engine.input_tensor(a.shape, a.dtype) for a in arrays]


def _attention_args(e=4, n_head=2, n_head_kv=1, d=2, t=3, dtype=np.float64):
    return [np.zeros((t, e), dtype), np.zeros(t, np.int32), np.zeros(e, dtype),
            np.zeros((n_head * d, e), dtype), np.zeros((n_head_kv * d, e), dtype),
            np.zeros((n_head_kv * d, e), dtype), np.zeros((e, n_head * d), dtype)]


@pytest.mark.parametrize("change, error, words", [
    (lambda a: a.__setitem__(3, np.zeros((5, 4))), ShapeError, "multiple of n_head"),
    (lambda a: a.__setitem__(6, np.zeros((4, 6))), ShapeError, "n_head * Dv = 4"),
    (lambda a: a.__setitem__(2, np.zeros(3)), ShapeError, "attn_norm of shape (E,)"),
    (lambda a: a.__setitem__(0, np.zeros(4)), ShapeError, "(T, E) or (B, T, E)"),
    (lambda a: a.__setitem__(4, np.zeros((2, 4), np.float32)), DTypeError, "one dtype"),
])
def test_malformed_attention_blocks_are_named(change, error, words):
    arrays = _attention_args()
    change(arrays)
    with pytest.raises(error, match="attention_block") as err:
        attention_block(*_tensors(*arrays), n_head=2, n_head_kv=1, n_dims=2)
    assert words in str(err.value)


def test_heads_that_do_not_group_and_unknown_parameters_are_refused():
    t = _tensors(*_attention_args(n_head=3, n_head_kv=2))
    with pytest.raises(ParamError, match="multiple of n_head_kv"):
        attention_block(*t, n_head=3, n_head_kv=2, n_dims=2)
    t = _tensors(*_attention_args())
    with pytest.raises(ParamError, match="unknown parameter 'rope_mode'"):
        attention_block(*t, n_head=2, n_head_kv=1, n_dims=2, rope_mode="neox")
    with pytest.raises(ParamError, match="n_dims"):
        attention_block(*t, n_head=2, n_head_kv=1, n_dims=3)


def test_malformed_mlp_blocks_are_named():
    x, norm = np.zeros((3, 4)), np.zeros(4)
    with pytest.raises(ShapeError, match=r"mlp_block: needs .* w_down \(E, F\)"):
        mlp_block(*_tensors(x, norm, np.zeros((6, 4)), np.zeros((6, 4)), np.zeros((6, 4))))
    with pytest.raises(ParamError, match="eps"):
        mlp_block(*_tensors(x, norm, np.zeros((6, 4)), np.zeros((6, 4)), np.zeros((4, 6))),
                  eps=-1.0)
