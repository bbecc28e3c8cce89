"""MNIST's source files written by hand for the data tests: IDX files and their contents."""

import gzip

import numpy as np

from mnist_target.idx import IDX_FILES


def sample_pixels(n, seed=0):
    """uint8 images (n, 784) that hit 0 and 255, and labels (n,) covering 0..9."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 784), dtype=np.uint8)
    images[0, :2] = [0, 255]
    return images, (np.arange(n) % 10).astype(np.int32)


def idx_images(images, magic=0x00000803, rows=28, cols=28):
    header = np.array([magic, len(images), rows, cols], ">u4").tobytes()
    return header + np.asarray(images, np.uint8).tobytes()


def idx_labels(labels, magic=0x00000801):
    return np.array([magic, len(labels)], ">u4").tobytes() + np.asarray(labels, np.uint8).tobytes()


def write_idx_dir(directory, n_train=12, n_test=7, gz=False, replace=None):
    """The four IDX files in `directory` (made), `replace`: file name -> bytes written instead.
    Returns the uint8 images and labels written, as (train_images, train_labels, ...)."""
    directory.mkdir(parents=True, exist_ok=True)
    train, test = sample_pixels(n_train, 1), sample_pixels(n_test, 2)
    contents = dict(zip(IDX_FILES.values(), (idx_images(train[0]), idx_labels(train[1]),
                                                  idx_images(test[0]), idx_labels(test[1])),
                        strict=True))
    for name, content in {**contents, **(replace or {})}.items():
        path = directory / (f"{name}.gz" if gz else name)
        path.write_bytes(gzip.compress(content) if gz else content)
    return (*train, *test)


def assert_same_data(a, b):
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
