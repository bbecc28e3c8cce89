"""engine.backends.cpu.layout: copies of transposed views (copy_call), and the dispatchers'
contiguous copies of strided inputs (dense, contiguous)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ml_dtypes import bfloat16

from engine.backends.cpu import CPU, layout, paths


def assert_same_bits(got, want):
    bits = np.dtype(f"u{got.itemsize}")
    np.testing.assert_array_equal(got.view(bits), np.ascontiguousarray(want).view(bits))


def tiled(call) -> bool:
    return getattr(call, "func", None) is layout._transpose_tiles


@settings(max_examples=60, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=2), rows=st.integers(1, 21),
       cols=st.integers(1, 21), step=st.sampled_from([1, 2]),
       dtype=st.sampled_from([np.float32, np.float64, np.int32, np.float16, bfloat16]))
def test_copy_of_a_transposed_view_is_the_view(lead, rows, cols, step, dtype):
    """The view x (last two axes swapped, every `step`-th column of the source kept) lands
    in out exactly, also after its source changes (the call reads x at each run); views
    with at least 8 rows are copied by the tiled kernel."""
    rng = np.random.default_rng(rows * 100 + cols)
    source = rng.integers(-99, 99, (*lead, cols, rows * step)).astype(dtype)
    if dtype in (np.float16, bfloat16):     # copied as patterns: NaN payloads kept too
        source.reshape(-1)[::7] = np.array(np.nan, dtype)
    x = np.swapaxes(source[..., ::step], -1, -2)          # shape (*lead, rows, cols)
    out = np.empty(x.shape, dtype)
    call = layout.copy_call(out, x)
    call()
    assert_same_bits(out, x)
    source += 1
    call()
    assert_same_bits(out, x)
    assert tiled(call) == (rows >= 8 and cols > 1 and step == 1)


def test_views_it_cannot_tile_go_to_numpy():
    rng = np.random.default_rng(0)
    a = rng.random((6, 4, 10, 12))
    for x in (a.transpose(1, 0, 3, 2),       # batch axes that do not merge
              a[0].T[::2],                   # no contiguous axis
              a[0, 0],                       # contiguous already
              np.ascontiguousarray(a[0, 0].T, np.float16).T):   # not out's dtype
        out = np.empty(x.shape)
        call = layout.copy_call(out, x)
        assert not tiled(call)
        call()
        np.testing.assert_array_equal(out, x)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 21), n=st.integers(1, 21), col0=st.integers(0, 5),
       right=st.integers(0, 5))
def test_transpose_into_a_band_of_columns(m, n, col0, right):
    """transpose_into writes src.T into out's columns [col0, col0 + m) and nothing else."""
    rng = np.random.default_rng(m * 100 + n)
    src = rng.normal(size=(m, n)).astype(np.float32)
    out = np.full((n, col0 + m + right), -7.0, np.float32)
    layout.transpose_into(src, out, col0)
    np.testing.assert_array_equal(out[:, col0:col0 + m], src.T)
    assert (out[:, :col0] == -7).all() and (out[:, col0 + m:] == -7).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, bfloat16, np.int64])
def test_the_executors_copy_of_a_view_tiles_big_transposes(dtype):
    """CpuBackend.bind_copy (a view copied into its persistent buffer) copies a big
    transposed view by cont's tiled kernel, the same bits as its plain twin (numpy's copy);
    a small one and a contiguous one by numpy."""
    rng = np.random.default_rng(1)
    x = np.swapaxes(rng.normal(size=(3, 131, 67)).astype(dtype), -1, -2)
    for view, fast in ((x, True), (x[:1, :9, :9], False), (x.transpose(0, 2, 1), False)):
        out = np.full(view.shape, 5, dtype)
        with paths.recording() as taken:
            call = CPU.bind_copy(out, view)
        call()
        assert_same_bits(out, view)
        assert (taken["copy:tiled"] > 0) == fast, dict(taken)
        with paths.plain(), paths.recording() as taken:
            plain_out = np.full(view.shape, 5, dtype)
            CPU.bind_copy(plain_out, view)()
        assert not taken
        assert_same_bits(plain_out, out)


@pytest.mark.parametrize("writeable", [True, False])
def test_dense_copies_a_strided_view_when_the_call_runs(writeable):
    """dense: a C-contiguous array is passed as it is (no copy); a transposed or sliced one
    gets a C-contiguous array whose copy is filled by the call it adds, from the data the
    view holds when the call runs; read-only where the view is (numba types writability)."""
    source = np.arange(24.0).reshape(4, 6)
    copies: list = []
    assert layout.dense(source, copies) is source and not copies
    for view in (source.T, source[:, ::2], np.broadcast_to(source[:1], (4, 6))):
        if not writeable:
            view = view.view()
            view.flags.writeable = False
        copies = []
        got = layout.dense(view, copies)
        assert got.flags.c_contiguous and got.shape == view.shape and len(copies) == 1
        assert got.flags.writeable == view.flags.writeable
        source += 1                                    # the data as the call will see it
        copies[0]()
        np.testing.assert_array_equal(got, view)
        source -= 1


def test_contiguous_copies_now_and_keeps_read_only():
    """contiguous: the same, the copy made at once (for dispatchers that run at once)."""
    source = np.arange(12.0).reshape(3, 4)
    assert layout.contiguous(source) is source
    view = source.T
    view.flags.writeable = False
    got = layout.contiguous(view)
    assert got.flags.c_contiguous and not got.flags.writeable
    np.testing.assert_array_equal(got, view)
