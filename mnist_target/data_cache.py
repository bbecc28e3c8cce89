"""The cache of decoded MNIST: one GGUF file (engine.gguf_io) per source.

    pixels, description = cached_pixels(idx_source("~/mnist"), cache_dir=None)

The file lies in `cache_dir` (default $GRADVERIFY_CACHE, else $XDG_CACHE_HOME/gradverify,
else ~/.cache/gradverify), named mnist-<kind>-<source key>-v<CACHE_VERSION>.gguf, the key
being the SHA-256 of the source's bytes (mnist_target.pixels.Source). GGUF has no uint8
tensors: pixel k is stored as int8 k - 128. The SHA-256 of the decoded arrays is stored too; a
cache that cannot be read or does not match is rebuilt, and one that cannot be written is
skipped, both with a MnistCacheWarning; a cache name taken by anything but a regular file
(a FIFO, a device, a link loop) is neither read nor written, with a warning.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import numpy as np

from checkkit.cache import default_cache_dir
from engine.errors import EngineError
from engine.gguf_io import load_gguf, save_gguf
from mnist_target.idx import regular_file_problem
from mnist_target.pixels import MnistDataError, Pixels, Source

CACHE_VERSION = 1
CACHE_ARCH = "mnist-data"
PIXEL_OFFSET = 128  # cached int8 = pixel k - 128


class MnistCacheWarning(UserWarning):
    """The MNIST cache could not be used or written; the data was decoded from its source."""


def cached_pixels(source: Source, cache_dir: str | os.PathLike[str] | None = None
                  ) -> tuple[Pixels, str]:
    """(the source's Pixels, where they came from in words): read from the cache in
    `cache_dir` (default default_cache_dir()) when it holds them, else decoded and cached."""
    cache_path = Path(cache_dir if cache_dir is not None else default_cache_dir()).expanduser() \
        / f"mnist-{source.kind}-{source.key}-v{CACHE_VERSION}.gguf"
    what = source.description
    problem = regular_file_problem(cache_path) if os.path.lexists(cache_path) else None
    if problem:  # a FIFO would block the read and the write; the user's file is left alone
        warnings.warn(f"MNIST cache {cache_path}: {problem}; going on without the cache",
                      MnistCacheWarning, stacklevel=3)
        return source.decode(), what
    if cache_path.exists():
        try:
            return _read_cache(cache_path, source.key), f"{what} (cached: {cache_path})"
        except Exception as exc:  # a cache is disposable: any failure means rebuild it
            warnings.warn(f"MNIST cache {cache_path} is unusable ({type(exc).__name__}: {exc}); "
                          "rebuilding it", MnistCacheWarning, stacklevel=3)
    pixels = source.decode()
    try:
        _write_cache(cache_path, source.key, pixels, what)
        what = f"{what} (cache written: {cache_path})"
    except (OSError, EngineError) as exc:
        warnings.warn(f"MNIST cache {cache_path} could not be written ({exc}); going on "
                      "without it", MnistCacheWarning, stacklevel=3)
    return pixels, what


def _write_cache(path: Path, key: str, pixels: Pixels, what: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name.replace("_", "."): (array.astype(np.int16) - PIXEL_OFFSET).astype(np.int8)
               if array.dtype == np.uint8 else array for name, array in pixels._asdict().items()}
    save_gguf(path, tensors, CACHE_ARCH, {"mnist.cache_version": CACHE_VERSION,
                                          "mnist.source_sha256": key, "mnist.source": what,
                                          "mnist.data_sha256": _pixels_sha256(pixels)})


def _read_cache(path: Path, key: str) -> Pixels:
    """The cached arrays. The stored hash is of the decoded arrays, which were checked before
    they were written, so a match proves names, shapes, dtypes and values at once."""
    gf = load_gguf(path, arch=CACHE_ARCH)
    version, source = gf.metadata.get("mnist.cache_version"), gf.metadata.get("mnist.source_sha256")
    if version != CACHE_VERSION or source != key:
        raise MnistDataError(f"{path}: cache version {version!r} for source {source!r}, expected "
                             f"{CACHE_VERSION} for {key}")
    names = [name.replace("_", ".") for name in Pixels._fields]
    if sorted(gf.tensors) != sorted(names):
        raise MnistDataError(f"{path}: tensors {sorted(gf.tensors)}, expected {sorted(names)}")
    pixels = Pixels(*((gf.tensors[name].astype(np.int16) + PIXEL_OFFSET).astype(np.uint8)
                      if name.endswith("images") else gf.tensors[name] for name in names))
    if _pixels_sha256(pixels) != gf.metadata.get("mnist.data_sha256"):
        raise MnistDataError(f"{path}: the arrays do not match the hash stored with them")
    return pixels


def _pixels_sha256(pixels: Pixels) -> str:
    digest = hashlib.sha256()
    for array in pixels:
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()
