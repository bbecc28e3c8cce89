"""MNIST's IDX files: exact pixels, plain and .gz, and every validation error naming the file."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from mnist_target import idx
from mnist_target.data import MnistData, MnistDataError, load_mnist
from tests.mnist_target.data_files import (
    assert_same_data,
    idx_images,
    idx_labels,
    sample_pixels,
    write_idx_dir,
)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_idx_dir_loads_exact_pixels(tmp_path, gz):
    train_images, train_labels, test_images, test_labels = write_idx_dir(tmp_path, gz=gz)
    mnist = load_mnist(tmp_path, use_cache=False)
    scaled = [(images / 255).astype(np.float32) for images in (train_images, test_images)]
    assert_same_data(mnist, MnistData(*scaled[:1], train_labels, *scaled[1:], test_labels))
    assert mnist.train_images.max() == 1.0 and mnist.train_images.min() == 0.0
    assert mnist.source == f"IDX files in {tmp_path}"


def test_plain_file_wins_over_gz(tmp_path):
    write_idx_dir(tmp_path, gz=True, replace={"t10k-labels-idx1-ubyte": idx_labels([9] * 7)})
    write_idx_dir(tmp_path, gz=False)
    assert load_mnist(tmp_path, use_cache=False).test_labels[0] == 0


IMAGES_OK = idx_images(sample_pixels(3)[0])
IDX_ERRORS = {  # name: (file kind, content, message)
    "labels magic": ("images", idx_images(np.zeros((2, 784)), magic=0x00000801),
                     r"IDX magic 0x00000801, expected 0x00000803 \(unsigned bytes, 3 dimensions\)"),
    "int16 magic": ("images", idx_images(np.zeros((2, 784)), magic=0xB03), r"magic 0x00000b03"),
    "images magic": ("labels", idx_images(np.zeros((2, 784))),
                     r"magic 0x00000803, expected 0x00000801 \(unsigned bytes, 1 dimension\)"),
    "28x27": ("images", idx_images(np.zeros((2, 756)), cols=27), r"are 28 x 27, expected 28 x 28"),
    "empty": ("images", b"", r"truncated IDX header: 0 bytes, expected at least 16"),
    "3 bytes": ("images", IMAGES_OK[:3], r"truncated IDX header: 3 bytes"),
    "15 bytes": ("images", IMAGES_OK[:15], r"truncated IDX header: 15 bytes"),
    "header only": ("images", IMAGES_OK[:16],
                    r"truncated: 16 bytes, expected 2368 \(16 header \+ 3 x 28 x 28 data\)"),
    "1000 bytes": ("images", IMAGES_OK[:1000], r"truncated: 1000 bytes, expected 2368"),
    "one short": ("images", IMAGES_OK[:-1], r"truncated: 2367 bytes, expected 2368"),
    "one more": ("images", IMAGES_OK + b"\0", r"trailing bytes: 2369 bytes, expected 2368"),
    "labels short": ("labels", idx_labels([1, 2])[:9], r"truncated: 9 bytes, expected 10"),
    "labels long": ("labels", idx_labels([1, 2]) + b"xy", r"trailing bytes: 12 bytes, expected 10"),
    "label 10": ("labels", idx_labels([1, 2, 10, 3]), r"label 10 at index 2 is outside"),
    "label 255": ("labels", idx_labels([255]), r"label 255 at index 0"),
}


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
@pytest.mark.parametrize("kind, content, message", IDX_ERRORS.values(), ids=IDX_ERRORS)
def test_idx_validation_errors_name_the_file(tmp_path, kind, content, message, gz):
    path = tmp_path / ("f.gz" if gz else "f")
    path.write_bytes(gzip.compress(content) if gz else content)
    reader = idx.read_idx_images if kind == "images" else idx.read_idx_labels
    with pytest.raises(MnistDataError, match=message) as info:
        reader(path)
    assert str(path) in str(info.value)
    assert ("(decompressed)" in str(info.value)) == gz


PACKED = gzip.compress(IMAGES_OK)


@pytest.mark.parametrize("packed", [
    b"plain bytes" + PACKED, PACKED[: len(PACKED) // 2],
    PACKED[:100] + bytes([PACKED[100] ^ 0xFF]) + PACKED[101:],
], ids=["not gzip", "truncated", "flipped byte"])
def test_corrupt_gzip(tmp_path, packed):
    (tmp_path / "f.gz").write_bytes(packed)
    with pytest.raises(MnistDataError, match=r"f\.gz: corrupt gzip data"):
        idx.read_idx_images(tmp_path / "f.gz")


def test_missing_files_are_listed(tmp_path):
    write_idx_dir(tmp_path)
    for name in ("train-labels-idx1-ubyte", "t10k-images-idx3-ubyte"):
        (tmp_path / name).unlink()
    with pytest.raises(MnistDataError) as info:
        load_mnist(tmp_path, use_cache=False)
    message = str(info.value)
    assert "missing train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz]" in message
    assert all(name in message for name in idx.IDX_FILES.values()) and str(tmp_path) in message
    with pytest.raises(MnistDataError, match=r"nowhere: not a directory"):
        load_mnist(tmp_path / "nowhere")


def test_image_and_label_counts_must_agree(tmp_path):
    write_idx_dir(tmp_path, replace={"train-labels-idx1-ubyte": idx_labels([1] * 11)})
    with pytest.raises(MnistDataError, match=r"train-images-idx3-ubyte holds 12 images but .*"
                                             r"train-labels-idx1-ubyte holds 11 labels"):
        load_mnist(tmp_path, use_cache=False)
