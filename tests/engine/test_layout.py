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
