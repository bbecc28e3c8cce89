"""Focused tests of the indexing and layout ops: block, pad, concat, set, acc, repeat (and
repeat_back), get_rows (and get_rows_back), dropout, and the reductions sum_rows and mean.

Edge cases the registry samples do not reach (repeated indices in many column bands, more
than four irreducible axes, garbage in the output buffer, out-of-range indices at run time,
thread-count independence, the dropout hash shared by numpy and numba) and the clear errors
of malformed builds. Each op's generated cases against torch are in
tests/engine/test_strategies.py.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

import engine
from engine import ops
from engine.backends.cpu.dropout import _keep, keep, keep_mask, threshold
from engine.errors import DTypeError, EngineError, ParamError, RowIndexError, ShapeError
from tests.engine.ops.op_harness import evaluate, weighted_grads

RNG = np.random.default_rng(20240611)


def _threads(n):
    """A context in which numba runs n threads (at most what it has)."""
    class _Ctx:
        def __enter__(self):
            self.before = numba.get_num_threads()
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))

        def __exit__(self, *exc):
            numba.set_num_threads(self.before)
    return _Ctx()


# --- get_rows ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_get_rows_back_adds_repeated_indices_in_every_column_band(dtype):
    """Many repeats of few rows, 70 columns (three bands of the column-parallel kernel)."""
    table = RNG.uniform(-1, 1, (4, 70)).astype(dtype)
    idx = np.array([[3, 1, 3, 3, 0], [1, 1, 3, 0, 3]], np.int32)
    g = RNG.uniform(-1, 1, idx.shape + (70,)).astype(dtype)
    out = evaluate(ops.get_rows, table, idx)
    np.testing.assert_array_equal(out, table[idx])
    (dt, di) = weighted_grads(ops.get_rows, [table, idx], g)
    want = np.zeros((4, 70), dtype)               # the same sums, in the same order
    np.add.at(want, idx.reshape(-1), g.reshape(-1, 70))
    np.testing.assert_array_equal(dt, want)
    assert di is None                                   # indices get no gradient
    assert np.all(dt[2] == 0)                           # a row never picked


def test_get_rows_back_is_the_same_bits_for_any_thread_count():
    from engine.backends.cpu.get_rows import cpu_get_rows_back
    idx = RNG.integers(0, 7, (3, 50)).astype(np.int32)
    g = RNG.uniform(-1, 1, (3, 50, 100)).astype(np.float32)
    results = []
    for n in (1, 2):
        out = np.full((7, 100), np.nan, np.float32)   # garbage in the buffer
        with _threads(n):
            cpu_get_rows_back(out, [g, idx], nrows=7)
        results.append(out)
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("bad", [5, -1, 1 << 20])
@pytest.mark.parametrize("op", ["get_rows", "get_rows_back"])
def test_out_of_range_index_raises_at_run_time(op, bad):
    idx = np.array([0, 4, bad, 2], np.int32)
    with pytest.raises(RowIndexError, match=rf"{op}: index {bad} out of range for a table "
                                            r"of 5 rows"):
        if op == "get_rows":
            evaluate(ops.get_rows, np.zeros((5, 3)), idx)
        else:
            evaluate(lambda g, i: ops.get_rows_back(g, i, 5), np.zeros((4, 3)), idx)
    assert issubclass(RowIndexError, EngineError) and issubclass(RowIndexError, IndexError)


def test_get_rows_with_batched_and_strided_indices():
    table = RNG.uniform(-1, 1, (6, 3))
    leaf = RNG.integers(0, 6, (5, 2)).astype(np.int32)
    out = evaluate(lambda t, i: ops.get_rows(t, ops.permute(i, (1, 0))), table, leaf)
    np.testing.assert_array_equal(out, table[leaf.T])
    assert out.shape == (2, 5, 3)


# --- repeat -----------------------------------------------------------------------------------
def test_repeat_and_back_beyond_four_irreducible_axes():
    """Every axis of a 5-D x tiled: no two axes merge, so the numpy fallback runs."""
    x = RNG.uniform(-1, 1, (2, 3, 2, 3, 2))
    shape = (4, 6, 4, 6, 4)
    out = evaluate(lambda t: ops.repeat(t, shape), x)
    np.testing.assert_array_equal(out, np.tile(x, (2, 2, 2, 2, 2)))
    g = RNG.uniform(-1, 1, shape)
    (dx,) = weighted_grads(lambda t: ops.repeat(t, shape), [x], g)
    want = g.reshape(2, 2, 2, 3, 2, 2, 2, 3, 2, 2).sum(axis=(0, 2, 4, 6, 8))
    np.testing.assert_allclose(dx, want, rtol=1e-13)


def test_repeat_back_of_a_strided_gradient_ignores_garbage():
    from engine.backends.cpu.repeat import cpu_repeat_back
    g = np.ascontiguousarray(RNG.uniform(-1, 1, (6, 8, 4)).transpose(2, 0, 1))   # (4, 6, 8)
    out = np.full((2, 3, 4), np.nan)
    cpu_repeat_back(out, [g], shape=(2, 3, 4))
    np.testing.assert_allclose(out, g.reshape(2, 2, 2, 3, 2, 4).sum(axis=(0, 2, 4)),
                               rtol=1e-13)


def test_repeat_grows_the_rank_like_torch():
    x = RNG.uniform(-1, 1, (3,))
    np.testing.assert_array_equal(evaluate(lambda t: ops.repeat(t, (2, 2, 6)), x),
                                  np.tile(x, (2, 2, 2)))


# --- pad, block, concat, set, acc ----------------------------------------------------------------
def test_pad_zeroes_a_dirty_output_buffer():
    from engine.backends.cpu.pad import cpu_pad
    x = RNG.uniform(1, 2, (2, 3))
    out = np.full((5, 4), np.nan)
    cpu_pad(out, [x], pads=((1, 2), (0, 1)))
    np.testing.assert_array_equal(out, np.pad(x, ((1, 2), (0, 1))))


def test_block_is_a_view_with_the_right_contiguity():
    x = engine.input_tensor((4, 5, 6))
    assert ops.block(x, (1, 0, 0), (2, 5, 6)).contiguous
    assert ops.block(x, (1, 2, 0), (1, 2, 6)).contiguous
    assert not ops.block(x, (0, 1, 0), (2, 2, 6)).contiguous
    assert not ops.block(ops.permute(x, (1, 0, 2)), (0, 0, 0), (5, 4, 6)).contiguous
    with pytest.raises(ShapeError, match="reshape: input of shape"):
        ops.reshape(ops.block(x, (0, 0, 1), (4, 5, 2)), (-1,))
    a = RNG.uniform(-1, 1, (4, 5, 6))
    got = evaluate(lambda t: ops.reshape(ops.block(t, (1, 0, 0), (2, 5, 6)), (10, 6)), a)
    np.testing.assert_array_equal(got, a[1:3].reshape(10, 6))
    got = evaluate(lambda t: ops.block(ops.block(t, (1, 1, 1), (3, 3, 3)), (1, 0, 2), (2, 2, 1)),
                   a)
    np.testing.assert_array_equal(got, a[2:4, 1:3, 3:4])


def test_concat_of_six_axes_permuted():
    """More than four irreducible axes: the block copy loops over the leading ones."""
    a = RNG.uniform(-1, 1, (2, 3, 2, 2, 3, 2))
    b = RNG.uniform(-1, 1, (2, 3, 2, 2, 3, 2))
    perm = (5, 3, 1, 0, 2, 4)
    got = evaluate(lambda s, t: ops.concat(ops.permute(s, perm), ops.permute(t, perm), 2),
                   a, b)
    np.testing.assert_array_equal(got, np.concatenate([a.transpose(perm), b.transpose(perm)],
                                                      axis=2))


def test_set_zeroes_the_block_gradient_of_a_exactly():
    a, b = RNG.uniform(-1, 1, (4, 5)), RNG.uniform(-1, 1, (2, 2))
    g = RNG.uniform(1, 2, (4, 5))
    da, db = weighted_grads(lambda s, t: ops.set(s, t, (1, 3)), [a, b], g)
    want = g.copy()
    want[1:3, 3:5] = 0
    np.testing.assert_array_equal(da, want)
    np.testing.assert_array_equal(db, g[1:3, 3:5])
    da, db = weighted_grads(lambda s, t: ops.acc(s, t, (1, 3)), [a, b], g)
    np.testing.assert_array_equal(da, g)
    np.testing.assert_array_equal(db, g[1:3, 3:5])


# --- dropout ------------------------------------------------------------------------------------
def test_dropout_hash_is_one_function_in_numpy_and_numba():
    idx = np.concatenate([np.arange(1000, dtype=np.uint64),
                          np.array([2 ** 40, 2 ** 63 - 1, 2 ** 64 - 2], np.uint64)])
    for seed in (0, 1, 2 ** 63 + 5, 2 ** 64 - 1):
        for p in (0.0, 0.3, 0.9):
            t = threshold(p)
            with np.errstate(over="ignore"):
                want = keep(np.uint64(seed), idx, t)
            got = np.array([_keep(np.uint64(seed), i, t) for i in idx])
            np.testing.assert_array_equal(got, want)


def test_dropout_is_seeded_thread_independent_and_keeps_one_minus_p():
    x = np.ones((200, 500), np.float32)
    outs = []
    for n in (1, 2):
        with _threads(n):
            outs.append(evaluate(lambda t: ops.dropout(t, 0.3, 123), x))
    np.testing.assert_array_equal(outs[0], outs[1])
    mask = keep_mask(123, x.shape, 0.3)
    np.testing.assert_array_equal(outs[0], np.where(mask, np.float32(1 / 0.7), 0))
    assert abs(mask.mean() - 0.7) < 0.005                         # 100k draws: sd 0.0014
    other = evaluate(lambda t: ops.dropout(t, 0.3, 124), x)
    assert (other != outs[0]).mean() > 0.3                      # another seed, another mask
    np.testing.assert_array_equal(evaluate(lambda t: ops.dropout(t, 0.0, 5), x), x)


def test_dropout_backward_uses_the_forward_mask():
    x = RNG.uniform(-1, 1, (6, 7))
    g = RNG.uniform(1, 2, (6, 7))
    (dx,) = weighted_grads(lambda t: ops.dropout(t, 0.5, 9), [x], g)
    np.testing.assert_allclose(dx, g * keep_mask(9, x.shape, 0.5) * 2.0, rtol=1e-15)


# --- sum_rows and mean -------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, (0, 3), None])
def test_mean_along_every_axis(axis):
    x = RNG.uniform(-1, 1, (2, 3, 4, 5))
    np.testing.assert_allclose(evaluate(lambda t: ops.mean(t, axis, keepdims=True), x),
                               x.mean(axis=axis, keepdims=True), rtol=1e-13)


def test_sum_rows_keeps_the_last_axis():
    x = RNG.uniform(-1, 1, (3, 4, 7))
    np.testing.assert_allclose(evaluate(ops.sum_rows, x), x.sum(-1, keepdims=True),
                               rtol=1e-13)


# --- errors -------------------------------------------------------------------------------------
def _t(shape, dtype="f32"):
    return engine.input_tensor(shape, dtype)


@pytest.mark.parametrize("build, error, match", [
    (lambda: ops.block(_t((4, 5)), (1, 3), (2, 3)), ShapeError,
     r"block: a block of shape \[2, 3\] at offset \[1, 3\] does not fit in shape \[4, 5\]"),
    (lambda: ops.block(_t((4, 5)), (1,), (2, 3)), ParamError, "offset must be a sequence of 2"),
    (lambda: ops.block(_t((4, 5)), (0, -1), (2, 3)), ParamError, "offset must be >= 0"),
    (lambda: ops.block(_t((4, 5)), (0, 0), (2, 2.5)), ParamError, "shape must be a sequence"),
    (lambda: ops.block(_t((4, 5), "i32"), (0, 0), (2, 2)), DTypeError, "block: needs a float"),
    (lambda: ops.pad(_t((4, 5)), ((1, 1),)), ParamError, "one .before, after. pair per axis"),
    (lambda: ops.pad(_t((4, 5)), ((1, 1), (0, -2))), ParamError, r"pads\[1\] must be >= 0"),
    (lambda: ops.pad(_t((4, 5)), ((1, 1), (0, 1, 2))), ParamError, r"pads\[1\] must be"),
    (lambda: ops.pad(_t((4, 5)), 3), ParamError, "pads must be 2"),
    (lambda: ops.concat(_t((4, 5)), _t((4, 5), "f64"), 0), DTypeError,
     r"concat: needs float inputs of one dtype.*\[4, 5\] and \[4, 5\]"),
    (lambda: ops.concat(_t((4, 5)), _t((3, 4)), 0), ShapeError,
     r"concat: shapes \[4, 5\] and \[3, 4\] must agree on every axis but axis 0"),
    (lambda: ops.concat(_t((4, 5)), _t((4,)), 0), ShapeError, "must agree"),
    (lambda: ops.concat(_t((4, 5)), _t((4, 5)), 2), ShapeError, "axis 2 out of range"),
    (lambda: ops.concat(_t((4, 5)), _t((4, 5)), True), ParamError, "axis must be an int"),
    (lambda: ops.set(_t((4, 5)), _t((2, 3)), (3, 0)), ShapeError,
     r"set: a block of shape \[2, 3\] at offset \[3, 0\] does not fit in shape \[4, 5\]"),
    (lambda: ops.acc(_t((4, 5)), _t((3,)), (0, 0)), ShapeError,
     r"acc: a and b need the same number of axes.*\[4, 5\] and \[3\]"),
    (lambda: ops.acc(_t((4, 5)), _t((2, 2), "f64"), (0, 0)), DTypeError, "acc: needs float"),
    (lambda: ops.set(_t((4, 5)), _t((2, 2)), (0,)), ParamError, "offset must be a sequence"),
    (lambda: ops.repeat(_t((2, 3)), (4, 5)), ShapeError,
     r"repeat: every side of \[4, 5\] must be a positive multiple .*\[2, 3\]"),
    (lambda: ops.repeat(_t((2, 3)), (6,)), ShapeError, "fewer axes"),
    (lambda: ops.repeat(_t((2, 3)), 6), ParamError, "repeat: shape must be a sequence of ints"),
    (lambda: ops.repeat(_t((2, 3)), (0, 3)), ShapeError, "positive multiple"),
    (lambda: ops.repeat(_t((2, 3), "i32"), (4, 3)), DTypeError, "repeat: needs a float"),
    (lambda: ops.repeat_back(_t((4, 5)), (2, 3)), ShapeError, "repeat_back: every side"),
    (lambda: ops.get_rows(_t((5, 3)), _t((4,), "f32")), DTypeError,
     "get_rows: indices must be int32"),
    (lambda: ops.get_rows(_t((5, 3)), _t((2, 2, 2), "i32")), ShapeError, r"shape \(K,\)"),
    (lambda: ops.get_rows(_t((5,)), _t((2,), "i32")), ShapeError,
     r"the table must have shape \(R, C\)"),
    (lambda: ops.get_rows(_t((5, 3), "i32"), _t((2,), "i32")), DTypeError, "must be float"),
    (lambda: ops.get_rows_back(_t((3, 2)), _t((4,), "i32"), 5), ShapeError,
     r"get_rows_back: the gradient must have shape indices.shape \+ \(C,\)"),
    (lambda: ops.get_rows_back(_t((4, 2)), _t((4,), "i32"), 0), ParamError,
     "nrows must be positive"),
    (lambda: ops.dropout(_t((4,)), 1.0, 0), ParamError, r"dropout: p must be a number in \[0, 1\)"),
    (lambda: ops.dropout(_t((4,)), -0.1, 0), ParamError, "p must be"),
    (lambda: ops.dropout(_t((4,)), float("nan"), 0), ParamError, "p must be"),
    (lambda: ops.dropout(_t((4,)), True, 0), ParamError, "p must be"),
    (lambda: ops.dropout(_t((4,)), 0.5, -1), ParamError, r"seed must be an int in \[0, 2\^64\)"),
    (lambda: ops.dropout(_t((4,)), 0.5, 2 ** 64), ParamError, "seed must be"),
    (lambda: ops.dropout(_t((4,)), 0.5, 1.0), ParamError, "seed must be"),
    (lambda: ops.dropout(_t((4,), "i32"), 0.5, 1), DTypeError, "dropout: needs a float"),
    (lambda: ops.sum_rows(_t(())), ShapeError, "sum_rows: needs at least one axis"),
    (lambda: ops.mean(_t((2, 3)), 2), ShapeError, "mean: axis 2 out of range"),
])
def test_errors_name_the_op_and_the_problem(build, error, match):
    with pytest.raises(error, match=match):
        build()
