"""GGUF files: the engine's one place that writes and reads them, through the `gguf` package.

A GGUF file holds key/value metadata and named tensors. A tensor of numpy shape
(n_0, ..., n_{k-1}) (last axis fastest) is stored with ggml's `ne` = (n_{k-1}, ..., n_0), the
numpy shape reversed, over the same bytes in C order. `gguf`'s writer and reader do the
reversal, so callers here only ever see numpy shapes: ggml's MNIST `fc1.weight` is (500, 784)
here and ne = [784, 500] in the file.

    save_gguf("model.gguf", {"fc1.weight": w1, "fc1.bias": b1}, arch="mnist-fc")
    gf = load_gguf("model.gguf", arch="mnist-fc")
    expect_tensors(gf, {"fc1.weight": ((500, 784), np.float32), "fc1.bias": ((500,), np.float32)})

Types written (and the only ones read back):

    numpy float32 / float64 / int32 / int8   ->  tensors of type F32 / F64 / I32 / I8
    bool / int / float / str                 ->  KV of type BOOL / INT64 / FLOAT64 / STRING
    list or tuple of one of those four       ->  KV ARRAY of that element type

GGUF has no unsigned tensor type, so uint8 is refused rather than reinterpreted: store bytes
k in 0..255 as int8 k - 128 (as the MNIST cache, mnist_target.data_cache, does with pixels).

INT64 and FLOAT64 make every Python int in [-2**63, 2**63) and every float (NaN and Inf
included) round-trip exactly. Loading also accepts the other scalar KV types other writers use
(UINT32, FLOAT32, ...), returned as plain int/float. Loading parses a binary layout only; no code
in a file is ever run.

Reading checks the header with its own parser (struct and numpy on the first bytes) before any
tensor data is read or any large object is built, as ggml's gguf reader does: names are UTF-8
of at most 63 bytes and unique, 1 to 4 dims, each tensor's offset is the running sum of the
previous tensors' sizes padded to the alignment, and every count and length must fit in the
bytes left in the file. Metadata is capped (engine.gguf_read's MAX_*), far above what our
writers produce (an MNIST CNN
training graph from engine.graph_io has 28 keys, 974 array elements, its longest array 240):

    MAX_HEADER_BYTES       16 MiB    metadata and tensor table together
    MAX_KV                 4,096     key/value pairs
    MAX_TENSORS            65,536    tensors
    MAX_ARRAY_LEN          65,536    elements in one metadata array
    MAX_METADATA_ELEMENTS  262,144   elements in all metadata arrays together

so a refused header costs milliseconds. `load_gguf(..., expect=...)` copies only the tensors
a caller asks for, after checking their names, shapes and dtypes against the header.

Writing goes through engine.files.atomic_write, the one atomic writer: a temporary file
beside the target (beside a link's final target), fsync'ed and renamed onto it; straight
into an existing FIFO or character device and into /dev/stdout, /dev/fd/N and
/proc/*/fd/N; a read-only file (no write bit in its mode, whoever runs it), a directory and
other special files are refused. Any failure is an engine.files.WriteError naming the file.

This module holds the writer and is where callers import everything from: what reading and
writing share is engine.gguf_format, the reader engine.gguf_read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter
from gguf.gguf_writer import WriterState

from engine.files import atomic_write
from engine.gguf_format import (
    ARCH_KEY,
    HALF_DTYPES,
    HEADER_FIELDS,
    MAX_DIMS,
    MAX_NAME_BYTES,
    RESERVED_KEYS,
    TENSOR_TYPES,
    GGUFFile,
    GGUFFormatError,
    check_tensors,
    expect_tensors,
)
from engine.gguf_read import _BoundedReader, load_gguf  # noqa: F401 (tests patch the reader here)

__all__ = ["ARCH_KEY", "MAX_DIMS", "MAX_NAME_BYTES", "GGUFFile", "GGUFFormatError",
           "check_tensors", "expect_tensors", "load_gguf", "save_gguf"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _as_stored(array: np.ndarray) -> np.ndarray:
    """`array` as the data section stores it: a 16-bit float's bit patterns, else itself."""
    return array.view(np.uint16) if array.dtype in HALF_DTYPES else array


# --- writing ---------------------------------------------------------------------------------

def save_gguf(path: str | os.PathLike[str], tensors: Mapping[str, np.ndarray], arch: str,
              metadata: Mapping[str, Any] | None = None) -> None:
    """Write `tensors` and `metadata` to a GGUF file at `path`, with general.architecture = arch.

    Tensors must be numpy arrays of dtype float32, float64, int32 or int8 (any byte order or
    memory layout) with 1 to 4 dimensions and names of at most 63 UTF-8 bytes, as ggml
    requires. 0-d arrays are refused rather than silently stored as shape (1,): pass
    `a.reshape(1)`. NaN and Inf are stored as they are. Metadata values follow the table in
    the module docstring; a tuple comes back as a list; empty and mixed-type lists are refused,
    since a GGUF array has one element type and needs an element to show it.

    Everything is checked before anything touches the disk. The file is written through
    engine.files.atomic_write: to a temporary file beside `path` (beside its final target
    when `path` is a symbolic link, which stays a link), synced, and moved onto it with
    os.replace, so it holds either its old contents or the complete new file; on any error
    the temporary file is removed and an existing file is left as it was. An existing FIFO
    or character device, /dev/stdout, /dev/fd/N and /proc/*/fd/N are written straight into
    instead (there is nothing to replace).

    Raises GGUFFormatError naming the tensor or key for anything GGUF cannot hold, and
    engine.files.WriteError (an EngineError and an OSError) naming `path` when it cannot be
    written: a directory, a block device or socket, an existing read-only file (it is not
    replaced), a missing directory, a full disk (/dev/full), an I/O error.
    """
    if not isinstance(arch, str) or not arch:
        raise GGUFFormatError(f"arch must be a non-empty string, got {arch!r}")
    entries = {key: _metadata_entry(key, value) for key, value in (metadata or {}).items()}
    arrays = {name: _tensor_for_writing(name, array) for name, array in tensors.items()}
    with atomic_write(path) as raw:
        _write_file(raw, arch, entries, arrays)


class _CountingFile:
    """A binary output that counts what is written, so that gguf's writer can ask tell() of a
    pipe too."""

    def __init__(self, raw):
        self.raw, self.position = raw, 0

    def write(self, data) -> int:
        self.raw.write(data)
        self.position += memoryview(data).nbytes
        return memoryview(data).nbytes

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:   # the caller closes the file it opened
        self.flush()


def _write_file(raw, arch: str, entries: dict, arrays: dict[str, np.ndarray]) -> None:
    """The whole GGUF file, written in order into the open binary file `raw`: gguf's writer
    for the header, metadata and tensor table, then each array's bytes, padded."""
    out = _CountingFile(raw)
    writer = GGUFWriter(None, arch)
    for key, (value, value_type, element_type) in entries.items():
        writer.add_key_value(key, value, value_type, element_type)
    for name, array in arrays.items():
        if array.dtype in HALF_DTYPES:
            writer.add_tensor(name, _as_stored(array), raw_dtype=TENSOR_TYPES[array.dtype])
        else:
            writer.add_tensor(name, array)
    writer.fout, writer.state = [out], WriterState.EMPTY   # our file, not one it opens
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    _write_tensor_data(out, arrays.values(), writer.data_alignment)
    out.flush()


def _write_tensor_data(out: _CountingFile, arrays: Iterable[np.ndarray], alignment: int) -> None:
    """The data section: each array little-endian in C order, every one padded to
    `alignment`, as ggml reads it."""
    for array in arrays:
        out.write(bytes(-out.tell() % alignment))
        array = _as_stored(array)
        little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        out.write(memoryview(little.reshape(-1)).cast("B"))
        out.write(bytes(-out.tell() % alignment))


def _metadata_entry(key: Any, value: Any) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    """(value as written, its GGUF type, the element type for arrays) for one KV pair."""
    if not isinstance(key, str) or not key:
        raise GGUFFormatError(f"metadata keys must be non-empty strings, got {key!r}")
    if key in RESERVED_KEYS or key in HEADER_FIELDS:
        raise GGUFFormatError(f"metadata key {key!r} is reserved: the writer sets it itself")
    where = f"metadata {key!r}"
    if not isinstance(value, (list, tuple)):
        scalar, value_type = _metadata_scalar(value, where)
        return scalar, value_type, None
    if not value:
        raise GGUFFormatError(f"{where}: an empty list cannot be stored (a GGUF array needs an "
                              "element to fix its type)")
    items = [_metadata_scalar(item, where) for item in value]
    element_types = {item_type for _, item_type in items}
    if len(element_types) > 1:
        names = sorted(t.name for t in element_types)
        raise GGUFFormatError(f"{where}: list mixes element types {names}; GGUF arrays hold one "
                              "type (write ints as floats to mix them)")
    return [item for item, _ in items], GGUFValueType.ARRAY, element_types.pop()


def _metadata_scalar(value: Any, where: str) -> tuple[Any, GGUFValueType]:
    if isinstance(value, (bool, np.bool_)):
        return bool(value), GGUFValueType.BOOL
    if isinstance(value, (int, np.integer)):
        if not _INT64_MIN <= int(value) <= _INT64_MAX:
            raise GGUFFormatError(f"{where}: int {value} does not fit in INT64")
        return int(value), GGUFValueType.INT64
    if isinstance(value, (float, np.floating)):
        return float(value), GGUFValueType.FLOAT64
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise GGUFFormatError(f"{where}: string is not encodable as UTF-8: {exc}") from None
        return value, GGUFValueType.STRING
    raise GGUFFormatError(f"{where}: unsupported value {value!r} of type {type(value).__name__}; "
                          "use bool, int, float, str or a flat list of one of these")


def _tensor_for_writing(name: Any, array: Any) -> np.ndarray:
    """`array` as a native-endian C-contiguous array of a GGUF tensor type, after the checks."""
    if not isinstance(name, str) or not name:
        raise GGUFFormatError(f"tensor names must be non-empty strings, got {name!r}")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise GGUFFormatError(f"tensor {name!r}: name is {len(name.encode('utf-8'))} bytes; "
                              f"ggml allows at most {MAX_NAME_BYTES}")
    if not isinstance(array, np.ndarray):
        raise GGUFFormatError(f"tensor {name!r}: expected a numpy array, got "
                              f"{type(array).__name__}")
    native = array.dtype.newbyteorder("=")
    dtype = next((d for d in TENSOR_TYPES if native == d), None)
    if dtype is None:
        raise GGUFFormatError(f"tensor {name!r}: unsupported dtype {array.dtype}; GGUF files "
                              "here hold float16, bfloat16, float32, float64, int32 and int8")
    if array.ndim == 0:
        raise GGUFFormatError(f"tensor {name!r}: 0-d arrays are not stored; reshape it to (1,)")
    if array.ndim > MAX_DIMS:
        raise GGUFFormatError(f"tensor {name!r}: shape {list(array.shape)} has {array.ndim} "
                              f"dimensions; ggml allows at most {MAX_DIMS}")
    return np.ascontiguousarray(array, dtype=dtype)
