"""broadcast_block (engine.backends.cpu.block): numpy's broadcast written into a contiguous
destination, for a big one by compiled row fills and copies with streaming stores
(broadcast:streaming), by numpy's fill or copy otherwise and numpy's copy in plain mode."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.backends.cpu import block, paths

DTYPES = [np.float32, np.float64, np.uint16]   # uint16: the 16-bit floats' patterns


@st.composite
def broadcasts(draw):
    """(source, destination shape, destination offset in elements): a source of 1-3 axes,
    some of them 1 (broadcast), possibly fewer axes than the destination, possibly a strided
    view (every other element along its last axis)."""
    shape = draw(st.lists(st.integers(1, 40), min_size=1, max_size=3))
    src_shape = [1 if draw(st.booleans()) else n for n in shape]
    src_shape = src_shape[draw(st.integers(0, len(src_shape) - 1)):]
    dtype = draw(st.sampled_from(DTYPES))
    strided = draw(st.booleans()) and src_shape[-1] > 1
    big = np.arange(np.prod(src_shape) * (2 if strided else 1)).astype(dtype) % 251 + 1
    src = big.reshape(src_shape[:-1] + [src_shape[-1] * (2 if strided else 1)])
    if strided:
        src = src[..., ::2]
    return src, tuple(shape), draw(st.integers(0, 9))


@pytest.mark.parametrize("streaming", [False, True])
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=broadcasts())
def test_the_broadcast_is_numpys_and_writes_nothing_around_it(case, streaming, monkeypatch):
    # every size streams, or none (the same setting for every example: the fixture need not
    # reset between them); the vectors' alignment and each row's ends vary with the offset
    # and the row length
    monkeypatch.setattr(block, "STREAM_MIN_BYTES", 0 if streaming else 1 << 62)
    monkeypatch.setattr(block, "STREAM_MIN_RUN", 0)
    src, shape, offset = case
    size = int(np.prod(shape))
    buf = np.full(offset + size + 9, 7, src.dtype)
    dst = buf[offset:offset + size].reshape(shape)
    block.broadcast_block(dst, src)
    np.testing.assert_array_equal(dst, np.broadcast_to(src, shape))
    assert (buf[:offset] == 7).all() and (buf[offset + size:] == 7).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("src_shape", "path"), [
    ((1,), "broadcast:streaming"),        # sum's gradient over all axes: one value
    ((512, 1), "broadcast:streaming"),    # over the last axis: a value per row
    ((1031,), "broadcast:streaming"),     # a row repeated
    ((4, 1), None),                       # 16 KB written, under 1 MiB at any thread count
])
def test_the_paths_taken_and_plain_modes_copy(dtype, src_shape, path, monkeypatch):
    monkeypatch.setattr(block, "STREAM_MIN_BYTES", 1 << 20)   # at least 1 MiB written
    rows = 512 if src_shape[0] in (1, 512, 1031) else 4
    shape = (rows, 1031)
    src = (np.arange(np.prod(src_shape)) % 97 + 1).astype(dtype).reshape(src_shape)
    want = np.broadcast_to(src, shape)
    dst = np.zeros(shape, dtype)
    with paths.recording() as taken:
        block.broadcast_block(dst, src)
    np.testing.assert_array_equal(dst, want)
    assert set(taken) == ({path} if block.STREAMING and path else set())
    dst[...] = 0
    with paths.plain(), paths.recording() as taken:
        block.broadcast_block(dst, src)
    np.testing.assert_array_equal(dst, want)
    assert not taken


def test_a_strided_or_many_axes_broadcast_goes_to_numpy():
    src = np.arange(6, dtype=np.float32).reshape(2, 1, 3)[:, :, ::2]   # inner stride 2
    dst = np.empty((2, 5, 2), np.float32)
    with paths.recording() as taken:
        block.broadcast_block(dst, src)
    np.testing.assert_array_equal(dst, np.broadcast_to(src, dst.shape))
    assert not taken
    src = np.arange(8, dtype=np.float32).reshape(2, 1, 2, 1, 2)     # three irreducible axes
    dst = np.empty((2, 3, 2, 3, 2), np.float32)
    with paths.recording() as taken:
        block.broadcast_block(dst, src)
    np.testing.assert_array_equal(dst, np.broadcast_to(src, dst.shape))
    assert not taken


@st.composite
def blocks(draw):
    """(source, destination block, its buffer, where the block lies in it): a block of 1-4
    axes cut from a bigger buffer at a drawn offset (concat's, pad's and set's blocks), the
    source possibly a slice of a bigger array (strided rows) or a permuted view."""
    shape = draw(st.lists(st.integers(1, 12), min_size=1, max_size=4))
    dtype = draw(st.sampled_from(DTYPES))
    extra = [draw(st.integers(0, 3)) for _ in shape]
    offset = draw(st.integers(0, 9))
    outer = [n + e for n, e in zip(shape, extra, strict=True)]
    buf = np.full(offset + int(np.prod(outer)) + 9, 7, dtype)
    dst = buf[offset:offset + int(np.prod(outer))].reshape(outer)[tuple(slice(0, n) for n in shape)]
    src = (np.arange(np.prod(outer)) % 251 + 1).astype(dtype).reshape(outer)
    src = src[tuple(slice(e, None) for e in extra)]
    if draw(st.booleans()) and len(shape) > 1:
        order = draw(st.permutations(range(len(shape))))
        src = np.ascontiguousarray(src.transpose(order)).transpose(np.argsort(order))
    return src, dst, buf


@pytest.mark.parametrize("streaming", [False, True])
@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=blocks(), add=st.booleans())
def test_copy_block_copies_or_adds_and_writes_nothing_around(case, add, streaming, monkeypatch):
    """copy_block(dst, src[, add]) with every copy of contiguous rows streamed, or none:
    the block is src (or 7 + src), the rest of its buffer untouched; only a copy whose rows
    are contiguous in both arrays streams (copy:streaming), and plain mode never does."""
    monkeypatch.setattr(block, "STREAM_MIN_BYTES", 0 if streaming else 1 << 62)
    monkeypatch.setattr(block, "STREAM_MIN_RUN", 0)
    src, dst, buf = case
    keep = buf.copy()
    want = (dst + src).astype(dst.dtype) if add else src.copy()
    with paths.recording() as taken:
        block.copy_block(dst, src, add)
    np.testing.assert_array_equal(dst, want)
    outside = np.ones(buf.shape, bool)
    outside[np.asarray(dst.__array_interface__["data"][0] - buf.ctypes.data) // buf.itemsize
            + np.indices(dst.shape).reshape(dst.ndim, -1).T @ (np.array(dst.strides)
                                                                // buf.itemsize)] = False
    assert (buf[outside] == keep[outside]).all()
    dims = block.coalesce(dst.shape, src.strides, dst.strides) or [(1, [0, 0])]
    rows = dims[-1][1] == [src.itemsize, dst.itemsize]      # the merged rows contiguous
    may = streaming and block.STREAMING and not add
    assert taken["copy:streaming"] == (1 if may and rows else 0), sorted(taken)
    with paths.plain(), paths.recording() as taken:
        block.copy_block(dst, src)
    assert not taken


def test_copy_block_streams_only_long_contiguous_runs(monkeypatch):
    """Runs shorter than STREAM_MIN_RUN bytes (a permuted view's 64 float32, pad's gradient
    rows) take ordinary stores however big the copy; runs of that length stream."""
    monkeypatch.setattr(block, "STREAM_MIN_BYTES", 0)
    src = np.arange(64 * 2048, dtype=np.float32).reshape(64, 2048)
    for cols, streamed in ((block.STREAM_MIN_RUN // 4 - 1, False),
                           (block.STREAM_MIN_RUN // 4, True)):
        dst = np.zeros((64, 2048), np.float32)
        with paths.recording() as taken:
            block.copy_block(dst[:, :cols], src[:, :cols])
        np.testing.assert_array_equal(dst[:, :cols], src[:, :cols])
        assert not dst[:, cols:].any()
        assert (taken["copy:streaming"] == 1) == (streamed and block.STREAMING), (cols, taken)
