"""engine.backends.cpu.layout: copies of transposed views (copy_call)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.backends.cpu import layout


def tiled(call) -> bool:
    return getattr(call, "func", None) is layout._transpose_tiles


@settings(max_examples=60, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=2), rows=st.integers(1, 21),
       cols=st.integers(1, 21), step=st.sampled_from([1, 2]),
       dtype=st.sampled_from([np.float32, np.float64, np.int32]))
def test_copy_of_a_transposed_view_is_the_view(lead, rows, cols, step, dtype):
    """The view x (last two axes swapped, every `step`-th column of the source kept) lands
    in out exactly, also after its source changes (the call reads x at each run); views
    with at least 8 rows are copied by the tiled kernel."""
    rng = np.random.default_rng(rows * 100 + cols)
    source = rng.integers(-99, 99, (*lead, cols, rows * step)).astype(dtype)
    x = np.swapaxes(source[..., ::step], -1, -2)          # shape (*lead, rows, cols)
    out = np.empty(x.shape, dtype)
    call = layout.copy_call(out, x)
    call()
    np.testing.assert_array_equal(out, x)
    source += 1
    call()
    np.testing.assert_array_equal(out, x)
    assert tiled(call) == (rows >= 8 and cols > 1 and step == 1)


def test_views_it_cannot_tile_go_to_numpy():
    rng = np.random.default_rng(0)
    a = rng.random((6, 4, 10, 12))
    for x in (a.transpose(1, 0, 3, 2),       # batch axes that do not merge
              a[0].T[::2],                   # no contiguous axis
              a[0, 0],                       # contiguous already
              np.ascontiguousarray(a[0, 0].T, np.float16).T):   # numba has no f16
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
