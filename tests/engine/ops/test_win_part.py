"""Focused tests of win_part and win_unpart (SAM's windowing, ggml's WIN_PART/WIN_UNPART):
ggml's layout spelt out element by element, zero padding written over a garbage buffer,
each op the other's gradient, the threaded split along rows of windows (taken by the
scale cases, the same bits at any thread count), and the clear errors of malformed builds.
The registry's samples run against torch in tests/engine/ops/test_ops.py."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import ops
from engine.backends.cpu import paths
from engine.backends.cpu.win_part import cpu_win_part, cpu_win_unpart
from engine.errors import DTypeError, ParamError, ShapeError
from engine.registry import get_op
from gradcheck.adapters.engine_adapter import EngineAdapter, engine_thread_count, weighted_graph
from gradcheck.backprop import loss_weights as case_weights
from tests.engine.ops.op_harness import evaluate, loss_weights, weighted_grads

RNG = np.random.default_rng(20261205)


def _windows_by_hand(x, w):
    """ggml's loops: window py * npx + px holds x[py*w + i, px*w + j], zeros outside."""
    h, wd, c = x.shape
    npy, npx = -(-h // w), -(-wd // w)
    out = np.zeros((npy * npx, w, w, c), x.dtype)
    for py in range(npy):
        for px in range(npx):
            for i in range(w):
                for j in range(w):
                    if py * w + i < h and px * w + j < wd:
                        out[py * npx + px, i, j] = x[py * w + i, px * w + j]
    return out


@pytest.mark.parametrize("shape,w", [((5, 7, 3), 3), ((6, 6, 2), 3), ((3, 2, 1), 4),
                                     ((4, 5, 2), 1), ((1, 8, 2), 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_win_part_and_unpart_follow_ggml_and_invert_each_other(shape, w, dtype):
    x = RNG.uniform(-1, 1, shape).astype(dtype)
    parts = evaluate(lambda t: ops.win_part(t, w), x)
    np.testing.assert_array_equal(parts, _windows_by_hand(x, w))
    back = evaluate(lambda t: ops.win_unpart(t, shape[0], shape[1], w), parts)
    np.testing.assert_array_equal(back, x)


def test_win_part_writes_its_padding_over_garbage():
    x = RNG.uniform(-1, 1, (5, 4, 2)).astype(np.float32)
    out = np.full((4, 3, 3, 2), np.nan, np.float32)
    cpu_win_part(out, [x], window=3)
    np.testing.assert_array_equal(out, _windows_by_hand(x, 3))


def test_each_is_the_others_gradient():
    x = RNG.uniform(-1, 1, (5, 7, 2))
    w = loss_weights((6, 3, 3, 2))
    (dx,) = weighted_grads(lambda t: ops.win_part(t, 3), [x], w)
    np.testing.assert_array_equal(dx, evaluate(lambda t: ops.win_unpart(t, 5, 7, 3), w))
    y = RNG.uniform(-1, 1, (6, 3, 3, 2))
    g = loss_weights((5, 7, 2))
    (dy,) = weighted_grads(lambda t: ops.win_unpart(t, 5, 7, 3), [y], g)
    np.testing.assert_array_equal(dy, _windows_by_hand(g, 3))
    assert np.all(dy[5, 2] == 0) and np.all(dy[:, :, 1:][[2, 5]] == 0)   # y's padding


@pytest.mark.parametrize("op", ["win_part", "win_unpart"])
def test_the_scale_case_splits_along_window_rows(op):
    case = get_op(op).scale()[0]
    arrays = case.generate_inputs()
    out = weighted_graph(case, arrays, as_params=False)[1]
    with engine_thread_count(3), paths.recording() as taken:
        EngineAdapter().vjp(case, arrays, case_weights(out.shape, 0))
    assert taken[f"split:{op}"] > 0, dict(taken)


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
def test_the_split_gives_the_same_bits_for_any_thread_count(parts):
    x = RNG.uniform(-1, 1, (151, 149, 48)).astype(np.float32)[:, :, ::-1]   # strided
    want = _windows_by_hand(x, 14)
    out = np.full(want.shape, np.nan, np.float32)
    back = np.full(x.shape, np.nan, np.float32)
    with engine_thread_count(parts):
        cpu_win_part.bind(out, [x], window=14)()
        cpu_win_unpart.bind(back, [out], height=151, width=149, window=14)()
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(back, x)


def test_malformed_builds_raise_clear_errors():
    x = engine.input_tensor((4, 5, 2), np.float32)
    with pytest.raises(ShapeError, match=r"win_part: x must be an image \(H, W, C\)"):
        ops.win_part(engine.input_tensor((4, 5), np.float32), 2)
    with pytest.raises(ParamError, match="win_part: window must be an int in"):
        ops.win_part(x, 0)
    with pytest.raises(ParamError, match="win_part: window must be an int"):
        ops.win_part(x, 2.0)
    with pytest.raises(DTypeError, match="win_part: needs a float input"):
        ops.win_part(engine.input_tensor((4, 5, 2), np.int32), 2)
    y = engine.input_tensor((6, 2, 2, 3), np.float32)
    with pytest.raises(ShapeError, match=r"win_unpart: y must have shape .*\[4, 2, 2, 'C'\]"
                                         r".*got \[6, 2, 2, 3\]"):
        ops.win_unpart(y, 4, 3, 2)
    with pytest.raises(ShapeError, match="win_unpart: y must have shape"):
        ops.win_unpart(engine.input_tensor((6, 2, 2), np.float32), 4, 5, 2)
    with pytest.raises(ParamError, match="win_unpart: height must be an int in"):
        ops.win_unpart(y, 0, 5, 2)
    assert ops.win_unpart(y, 3, 5, 2).shape == (3, 5, 3)
