"""The GGUF cache of decoded MNIST: int8 pixels, keys that follow the files, unusable and
unwritable caches, the default directory."""

from __future__ import annotations

import warnings

import gguf
import numpy as np
import pytest

from engine.gguf_io import load_gguf, save_gguf
from mnist_target import data_cache
from mnist_target.data import MnistCacheWarning, load_mnist
from tests.mnist_target.data_files import assert_same_data, idx_labels, write_idx_dir


def cache_file(cache_dir):
    (path,) = cache_dir.glob("mnist-idx-*-v1.gguf")
    return path


def test_cache_round_trip_stores_int8(tmp_path):
    train_images, *_ = write_idx_dir(tmp_path / "idx")
    first = load_mnist(tmp_path / "idx", cache_dir=tmp_path / "cache")
    assert "cache written" in first.source
    stored = load_gguf(cache_file(tmp_path / "cache"), arch="mnist-data").tensors["train.images"]
    assert stored.dtype == np.int8 and np.array_equal(stored.astype(np.int16) + 128, train_images)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = load_mnist(tmp_path / "idx", cache_dir=tmp_path / "cache")
    assert f"(cached: {cache_file(tmp_path / 'cache')})" in second.source
    assert_same_data(first, second)


def test_cache_key_follows_file_contents(tmp_path):
    write_idx_dir(tmp_path / "idx")
    load_mnist(tmp_path / "idx", cache_dir=tmp_path / "cache")
    write_idx_dir(tmp_path / "idx", replace={"t10k-labels-idx1-ubyte": idx_labels([9] * 7)})
    reloaded = load_mnist(tmp_path / "idx", cache_dir=tmp_path / "cache")
    assert "cache written" in reloaded.source and set(reloaded.test_labels) == {9}
    assert len(list((tmp_path / "cache").glob("*.gguf"))) == 2


def _damage(path, how):
    content = path.read_bytes()
    if how in ("old version", "tensor missing"):
        gf = load_gguf(path)
        tensors = {k: v for k, v in gf.tensors.items()
                   if how == "old version" or k != "test.labels"}
        metadata = {**gf.metadata, "mnist.cache_version": 0 if how == "old version" else 1}
        return save_gguf(path, tensors, "mnist-data", metadata)
    flipped = content[:-1000] + bytes([content[-1000] ^ 1]) + content[-999:]  # in test.images
    path.write_bytes({"truncated": content[: len(content) // 2], "empty": b"",
                      "garbage": b"not a gguf file at all", "pixel flipped": flipped}[how])


@pytest.mark.parametrize("how, reason", [
    ("truncated", r"truncated GGUF file"), ("empty", r"not a GGUF file: it is empty"),
    ("garbage", r"not a GGUF file"), ("pixel flipped", r"do not match the hash stored with them"),
    ("old version", r"cache version 0 for source '[0-9a-f]{64}', expected 1"),
    ("tensor missing", r"tensors \['test.images', 'train.images', 'train.labels'\], expected"),
])
def test_unusable_cache_warns_and_is_rebuilt(tmp_path, how, reason):
    write_idx_dir(tmp_path / "idx")
    good = load_mnist(tmp_path / "idx", cache_dir=tmp_path / "cache")
    _damage(cache_file(tmp_path / "cache"), how)
    with pytest.warns(MnistCacheWarning, match=rf"MNIST cache .*\.gguf is unusable .*{reason}.*"
                                               r"rebuilding it"):
        rebuilt = load_mnist(tmp_path / "idx", cache_dir=tmp_path / "cache")
    assert_same_data(rebuilt, good)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "cached:" in load_mnist(tmp_path / "idx", cache_dir=tmp_path / "cache").source


def test_unwritable_cache_warns_and_goes_on(tmp_path):
    write_idx_dir(tmp_path / "idx")
    (tmp_path / "a_file").write_bytes(b"")
    with pytest.warns(MnistCacheWarning, match=r"could not be written"):
        mnist = load_mnist(tmp_path / "idx", cache_dir=tmp_path / "a_file" / "cache")
    assert mnist.source == f"IDX files in {tmp_path / 'idx'}" and len(mnist.train_images) == 12


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADVERIFY_CACHE", str(tmp_path / "g"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert data_cache.default_cache_dir() == tmp_path / "g"
    monkeypatch.delenv("GRADVERIFY_CACHE")
    assert data_cache.default_cache_dir() == tmp_path / "x" / "gradverify"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_cache.default_cache_dir() == tmp_path / "home" / ".cache" / "gradverify"


def test_int8_gguf_round_trip(tmp_path):
    values = np.arange(-128, 128, dtype=np.int8).reshape(4, 64)
    save_gguf(tmp_path / "t.gguf", {"q": values, "q.t": values.T}, "arch")
    types = {tensor.tensor_type for tensor in gguf.GGUFReader(tmp_path / "t.gguf").tensors}
    assert types == {gguf.GGMLQuantizationType.I8}
    loaded = load_gguf(tmp_path / "t.gguf", arch="arch").tensors
    assert loaded["q"].dtype == np.int8 and np.array_equal(loaded["q"], values)
    assert np.array_equal(loaded["q.t"], values.T)
