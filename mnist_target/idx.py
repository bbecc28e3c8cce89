"""MNIST's IDX files (train-images-idx3-ubyte, ..., each plain or .gz), read and validated.

    images = read_idx_images("t10k-images-idx3-ubyte.gz")    # uint8 (10000, 784)
    source = idx_source("~/mnist")                           # the four files of a directory

An IDX file is a big-endian header, the magic (0x00000803: unsigned bytes in 3 dimensions,
the images; 0x00000801: in 1 dimension, the labels) and each dimension as a uint32 (n, 28, 28
or n), followed by the bytes in C order. A name ending in .gz is gunzipped first. Checked:
the magic, 28 x 28 images, the byte count the header implies (a truncated file or trailing
bytes are named), labels in 0..9, and as many labels as images per split.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from pathlib import Path

import numpy as np

from mnist_target.pixels import (
    COLS,
    NPIXELS,
    ROWS,
    MnistDataError,
    Pixels,
    Source,
    check_label_range,
    read_file,
)

IDX_FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
             "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 0x00000803, 0x00000801  # unsigned bytes, 3 / 1 dims


def read_idx_images(path: str | os.PathLike[str]) -> np.ndarray:
    """uint8 images (n, 784) from an IDX images file (0x00000803, n x 28 x 28), maybe .gz."""
    return _decode_idx(read_file(Path(path)), os.fspath(path), images=True)


def read_idx_labels(path: str | os.PathLike[str]) -> np.ndarray:
    """int32 labels (n,) in 0..9 from an IDX labels file (0x00000801, n), maybe .gz."""
    return _decode_idx(read_file(Path(path)), os.fspath(path), images=False)


def idx_source(data_dir: str | os.PathLike[str]) -> Source:
    """The four IDX files in `data_dir`, read (about 50 MB). Its key is the SHA-256 over the
    four files as found, each as name, byte length and bytes, so any edit makes a new key."""
    files = _find_idx_files(Path(os.path.expanduser(os.fspath(data_dir))))
    contents = {role: read_file(path) for role, path in files.items()}
    return Source("idx", _idx_sha256(files, contents), f"IDX files in {data_dir}",
                  lambda: _decode_idx_files(files, contents))


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


def _decode_idx_files(files: dict[str, Path], contents: dict[str, bytes]) -> Pixels:
    arrays = {role: _decode_idx(contents[role], str(files[role]), images=role.endswith("images"))
              for role in IDX_FILES}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if len(images) != len(labels):
            raise MnistDataError(f"{files[f'{split}_images']} holds {len(images)} images but "
                                 f"{files[f'{split}_labels']} holds {len(labels)} labels")
    return Pixels(**arrays)


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
    check_label_range(data, f"{where} labels")
    return data.astype(np.int32)


def _idx_sha256(files: dict[str, Path], contents: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for role in IDX_FILES:
        digest.update(f"{files[role].name}\0{len(contents[role])}\0".encode())
        digest.update(contents[role])
    return digest.hexdigest()
