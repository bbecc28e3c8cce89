"""MNIST's IDX files (train-images-idx3-ubyte, ..., each plain or .gz), read and validated.

    images = read_idx_images("t10k-images-idx3-ubyte.gz")    # uint8 (10000, 784)
    source = idx_source("~/mnist")                           # the four files of a directory

An IDX file is a big-endian header, the magic (0x00000803: unsigned bytes in 3 dimensions,
the images; 0x00000801: in 1 dimension, the labels) and each dimension as a uint32 (n, 28, 28
or n), followed by the bytes in C order. A name ending in .gz is gunzipped first. Checked:
the magic, 28 x 28 images, 1 <= n <= MAX_ITEMS, the byte count the header implies (a
truncated file or trailing bytes are named), labels in 0..9, and as many labels as images
per split. Only regular files are read (a FIFO or device is refused, never waited on); a
plain file's size is checked against its header before its data is read, and a .gz file is
gunzipped as a stream no further than one byte past the size its header declares, so a small
crafted file cannot expand into gigabytes.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import stat
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
)

IDX_FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
             "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 0x00000803, 0x00000801  # unsigned bytes, 3 / 1 dims
MAX_ITEMS = 300_000  # images or labels in one file: 5 x MNIST's train set (EMNIST digits: 240,000)
MAX_IDX_BYTES = 16 + MAX_ITEMS * NPIXELS  # the largest IDX file read
MAX_GZ_BYTES = MAX_IDX_BYTES + MAX_IDX_BYTES // 100 + (1 << 20)  # more than gzip ever adds
_PIECE = 1 << 20   # bytes gunzipped at a time
_TRAILING_PROBE = 1 << 16  # bytes read past the declared end of a .gz file to count extra


def read_idx_images(path: str | os.PathLike[str]) -> np.ndarray:
    """uint8 images (n, 784) from an IDX images file (0x00000803, n x 28 x 28), maybe .gz."""
    return _decode_idx(_read_idx_file(Path(path), images=True), os.fspath(path), images=True)


def read_idx_labels(path: str | os.PathLike[str]) -> np.ndarray:
    """int32 labels (n,) in 0..9 from an IDX labels file (0x00000801, n), maybe .gz."""
    return _decode_idx(_read_idx_file(Path(path), images=False), os.fspath(path), images=False)


def idx_source(data_dir: str | os.PathLike[str]) -> Source:
    """The four IDX files in `data_dir`, read (about 50 MB). Its key is the SHA-256 over the
    four files as found, each as name, byte length and bytes, so any edit makes a new key."""
    files = _find_idx_files(Path(os.path.expanduser(os.fspath(data_dir))))
    contents = {role: _read_idx_file(path, role.endswith("images"))
                for role, path in files.items()}
    return Source("idx", _idx_sha256(files, contents), f"IDX files in {data_dir}",
                  lambda: _decode_idx_files(files, contents))


def regular_file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why `path` is not a regular file to read (after following links), in words: "no such
    file", "a symbolic link loop", "not a regular file (it is a FIFO)", ...; None if it is.
    Nothing is opened, so a FIFO or device is never waited on."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return _stat_problem(path, exc)
    return None if stat.S_ISREG(mode) else f"not a regular file (it is {_kind(mode)})"


def read_regular_file(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` of them. MnistDataError naming
    the file otherwise: missing, not a regular file (a FIFO is refused, not waited on),
    unreadable or larger."""
    with _open_regular(path) as file:
        size = os.fstat(file.fileno()).st_size
        if size > max_bytes:
            raise MnistDataError(f"{os.fspath(path)}: {size} bytes, more than the {max_bytes} "
                                 "expected of it")
        return _read_bytes(file, size, os.fspath(path))


def _stat_problem(path, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symbolic link loop (too many levels of symbolic links)"
    if exc.errno == errno.ENOENT:
        return "a symbolic link to a missing file" if os.path.lexists(path) else "no such file"
    return f"cannot be read: {exc.strerror or exc}"


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)),
                "a file" if stat.S_ISREG(mode) else "not a file")


def _open_regular(path):
    """`path` opened for reading, if it is a regular file; MnistDataError naming it if not."""
    where = os.fspath(path)
    problem = regular_file_problem(where)
    if problem is None:
        try:   # non-blocking, in case it was swapped for a FIFO since the stat
            file = os.fdopen(os.open(where, os.O_RDONLY | os.O_NONBLOCK), "rb")
        except OSError as exc:
            problem = _stat_problem(where, exc)
        else:
            mode = os.fstat(file.fileno()).st_mode
            if stat.S_ISREG(mode):
                return file
            file.close()
            problem = f"not a regular file (it is {_kind(mode)})"
    raise MnistDataError(f"{where}: {problem}")


def _read_bytes(file, count: int, where: str) -> bytes:
    try:
        return file.read(count)
    except OSError as exc:
        raise MnistDataError(f"{where}: cannot be read: {exc.strerror or exc}") from None


def _find_idx_files(data_dir: Path) -> dict[str, Path]:
    """role -> path of the four IDX files in data_dir; the plain file wins over its .gz. A name
    that exists in any form (a FIFO, a broken link) is taken, so that reading it says what
    is wrong with it rather than calling it missing."""
    try:
        mode = os.stat(data_dir).st_mode
        is_dir, why = stat.S_ISDIR(mode), f"it is {_kind(mode)}"
    except OSError as exc:
        is_dir, why = False, _stat_problem(data_dir, exc)
    if not is_dir:
        raise MnistDataError(f"{data_dir}: not a directory ({why}); expected a directory of "
                             "the MNIST IDX files")
    found = {role: next((p for p in (data_dir / name, data_dir / f"{name}.gz")
                         if os.path.lexists(p)), None) for role, name in IDX_FILES.items()}
    missing = [f"{IDX_FILES[role]}[.gz]" for role, path in found.items() if path is None]
    if missing:
        raise MnistDataError(f"{data_dir}: missing {', '.join(missing)}; looked for "
                             f"{', '.join(IDX_FILES.values())}, each plain or .gz")
    return found


def _read_idx_file(path: Path, images: bool) -> bytes:
    """The bytes of one IDX file. A plain file's header and size are checked before its data is
    read; a .gz file's size is bounded (MAX_GZ_BYTES), its header checked when gunzipped."""
    where = os.fspath(path)
    with _open_regular(path) as file:
        size = os.fstat(file.fileno()).st_size
        if where.endswith(".gz"):
            if size > MAX_GZ_BYTES:
                raise MnistDataError(f"{where}: {size} bytes, more than an IDX file of at most "
                                     f"{MAX_ITEMS} items gzips to ({MAX_GZ_BYTES})")
            return _read_bytes(file, size, where)
        header = _read_bytes(file, _header_bytes(images), where)
        dims = _check_header(header, where, images)
        _check_length(size, dims, where)
        content = header + _read_bytes(file, size - len(header), where)
    _check_length(len(content), dims, where)  # the file shrank while it was read
    return content


def _decode_idx_files(files: dict[str, Path], contents: dict[str, bytes]) -> Pixels:
    arrays = {role: _decode_idx(contents[role], str(files[role]), images=role.endswith("images"))
              for role in IDX_FILES}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if len(images) != len(labels):
            raise MnistDataError(f"{files[f'{split}_images']} holds {len(images)} images but "
                                 f"{files[f'{split}_labels']} holds {len(labels)} labels")
    return Pixels(**arrays)


def _header_bytes(images: bool) -> int:
    return 16 if images else 8  # the magic and 3 or 1 dimensions, 4 bytes each


def _check_header(header: bytes, where: str, images: bool) -> tuple[int, ...]:
    """The dimensions in an IDX header (its first bytes), after checking them."""
    magic, ndim = (IDX_IMAGES_MAGIC, 3) if images else (IDX_LABELS_MAGIC, 1)
    header_bytes = _header_bytes(images)
    if len(header) < header_bytes:
        raise MnistDataError(f"{where}: truncated IDX header: {len(header)} bytes, expected at "
                             f"least {header_bytes}")
    found_magic = int.from_bytes(header[:4], "big")
    if found_magic != magic:
        raise MnistDataError(f"{where}: IDX magic 0x{found_magic:08x}, expected 0x{magic:08x} "
                             f"(unsigned bytes, {ndim} dimension{'s' * (ndim > 1)})")
    dims = tuple(int(d) for d in np.frombuffer(header, ">u4", ndim, 4))
    if images and dims[1:] != (ROWS, COLS):
        raise MnistDataError(f"{where}: images are {dims[1]} x {dims[2]}, expected {ROWS} x {COLS}")
    what = "images" if images else "labels"
    if dims[0] == 0:
        raise MnistDataError(f"{where}: no {what} (the header's count is 0)")
    if dims[0] > MAX_ITEMS:
        raise MnistDataError(f"{where}: the header declares {dims[0]} {what}, more than the "
                             f"{MAX_ITEMS} read")
    return dims


def _check_length(length: int, dims: tuple[int, ...], where: str, exact: bool = True) -> None:
    """MnistDataError unless `length` bytes are what the header's `dims` imply. `exact`
    False: `length` is a lower bound (a .gz file not gunzipped to its end)."""
    header_bytes = 4 * (1 + len(dims))
    expected = header_bytes + int(np.prod(dims))
    if length != expected:
        problem = "truncated" if length < expected else "trailing bytes"
        count = f"{length} bytes" if exact else f"more than {length - 1} bytes"
        raise MnistDataError(f"{where}: {problem}: {count}, expected {expected} "
                             f"({header_bytes} header + {' x '.join(map(str, dims))} data)")


def _gunzip_idx(content: bytes, path: str, images: bool) -> tuple[tuple[int, ...], bytes]:
    """(dims, data bytes) of a gzipped IDX file, gunzipped as a stream: the header first, then
    no more than one byte past the data it declares (a little more to count trailing bytes)."""
    where = f"{path} (decompressed)"
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(content)) as stream:
            header = stream.read(_header_bytes(images))
            dims = _check_header(header, where, images)
            size = int(np.prod(dims))
            data = _read_up_to(stream, size + 1)  # at the stream's end: its CRC checked too
            if len(data) > size:
                extra = stream.read(_TRAILING_PROBE)
                _check_length(len(header) + len(data) + len(extra), dims, where,
                              exact=len(extra) < _TRAILING_PROBE)
    except (OSError, EOFError, zlib.error) as exc:
        raise MnistDataError(f"{path}: corrupt gzip data: {exc}") from None
    _check_length(len(header) + len(data), dims, where)
    return dims, data


def _read_up_to(stream, limit: int) -> bytes:
    """At most `limit` bytes of `stream`, read in pieces: a header that declares more data
    than the stream holds costs only the data it holds, not an allocation of `limit`."""
    pieces, got = [], 0
    while got < limit:
        piece = stream.read(min(_PIECE, limit - got))
        if not piece:
            break
        pieces.append(piece)
        got += len(piece)
    return b"".join(pieces)


def _decode_idx(content: bytes, where: str, images: bool) -> np.ndarray:
    """The array of one IDX file's bytes (gunzipped first if `where` ends in .gz)."""
    if where.endswith(".gz"):
        dims, data = _gunzip_idx(content, where, images)
        where = f"{where} (decompressed)"
    else:
        dims = _check_header(content[:_header_bytes(images)], where, images)
        _check_length(len(content), dims, where)
        data = memoryview(content)[_header_bytes(images):]
    array = np.frombuffer(data, np.uint8)
    if images:
        return array.reshape(dims[0], NPIXELS).copy()
    check_label_range(array, f"{where} labels")
    return array.astype(np.int32)


def _idx_sha256(files: dict[str, Path], contents: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for role in IDX_FILES:
        digest.update(f"{files[role].name}\0{len(contents[role])}\0".encode())
        digest.update(contents[role])
    return digest.hexdigest()
