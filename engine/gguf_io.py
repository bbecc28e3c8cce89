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
bytes left in the file. Metadata is capped, far above what our writers produce (an MNIST CNN
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
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.gguf_writer import WriterState

from engine.errors import EngineError
from engine.files import atomic_write

ARCH_KEY = "general.architecture"
MAX_DIMS = 4  # GGML_MAX_DIMS: ggml refuses tensors with more dimensions
MAX_NAME_BYTES = 63  # GGML_MAX_NAME = 64 bytes, the terminating NUL included
GGUF_MAGIC = b"GGUF"
READ_VERSIONS = (2, 3)  # GGUF v1 had 32-bit counts; ggml refuses it too
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
MAX_HEADER_BYTES = 16 * 2**20
MAX_KV = 4096
MAX_TENSORS = 65536
MAX_ARRAY_LEN = 65536
MAX_METADATA_ELEMENTS = 262144

# Keys a caller may not set: the architecture has its own argument, the alignment must match
# the layout the writer produces, and the reader reports the header under the GGUF.* names.
_RESERVED_KEYS = (ARCH_KEY, "general.alignment")
_READER_HEADER_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")

_TENSOR_TYPES = {
    np.dtype(np.float32): GGMLQuantizationType.F32,
    np.dtype(np.float64): GGMLQuantizationType.F64,
    np.dtype(np.int32): GGMLQuantizationType.I32,
    np.dtype(np.int8): GGMLQuantizationType.I8,
    np.dtype(np.float16): GGMLQuantizationType.F16,
    np.dtype(ml_dtypes.bfloat16): GGMLQuantizationType.BF16,
}
_NUMPY_DTYPES = {ggml_type: dtype for dtype, ggml_type in _TENSOR_TYPES.items()}
# the 16-bit floats go through the file as their bit patterns (uint16 in the file's byte
# order: ml_dtypes' bfloat16 has no byte order of its own)
_HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _as_stored(array: np.ndarray) -> np.ndarray:
    """`array` as the data section stores it: a 16-bit float's bit patterns, else itself."""
    return array.view(np.uint16) if array.dtype in _HALF else array
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class GGUFFormatError(EngineError, ValueError):
    """A GGUF file that cannot be read as asked, or data that cannot be written as GGUF."""


@dataclass(frozen=True)
class GGUFFile:
    """A loaded GGUF file.

    arch: its `general.architecture`. tensors: name -> array in numpy order, a writable
    C-contiguous copy in native byte order, in file order. metadata: every other KV pair as a
    plain Python value (bool, int, float, str, or a list of one of these). path: where it came
    from, for messages.
    """

    arch: str
    tensors: dict[str, np.ndarray]
    metadata: dict[str, Any]
    path: str = ""


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
        if array.dtype in _HALF:
            writer.add_tensor(name, _as_stored(array), raw_dtype=_TENSOR_TYPES[array.dtype])
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
    if key in _RESERVED_KEYS or key in _READER_HEADER_FIELDS:
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
    dtype = next((d for d in _TENSOR_TYPES if native == d), None)
    if dtype is None:
        raise GGUFFormatError(f"tensor {name!r}: unsupported dtype {array.dtype}; GGUF files "
                              "here hold float16, bfloat16, float32, float64, int32 and int8")
    if array.ndim == 0:
        raise GGUFFormatError(f"tensor {name!r}: 0-d arrays are not stored; reshape it to (1,)")
    if array.ndim > MAX_DIMS:
        raise GGUFFormatError(f"tensor {name!r}: shape {list(array.shape)} has {array.ndim} "
                              f"dimensions; ggml allows at most {MAX_DIMS}")
    return np.ascontiguousarray(array, dtype=dtype)


# --- reading ---------------------------------------------------------------------------------

# GGUF value type -> struct/numpy code of its scalar (BOOL is one byte, checked to be 0 or 1)
_SCALAR_CODES = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "B", GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8   # empty name, one dim, type, offset
_MIN_KV_BYTES = 8 + 4 + 1                    # empty key, type, a one-byte value
_CHUNK = 1 << 16


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    shape: tuple[int, ...]   # numpy order
    dtype: np.dtype          # in the file's byte order
    offset: int              # from the start of the data section
    nbytes: int
    half: bool = False       # a 16-bit float, stored as uint16 patterns in the byte order


class _BoundedReader:
    """The header of a GGUF file (metadata and tensor table), parsed with struct from an open
    binary file, reading only as far as the header goes.

    Every count and length is checked against the bytes left in the file and against the caps
    (MAX_*) before it is used, so no crafted header can make it allocate, loop or read past
    the end; the tensor table is checked as ggml's reader checks it. Raises GGUFFormatError.
    """

    def __init__(self, file, size: int, where: str):
        self.file, self.size, self.where = file, size, where
        self.buffer, self.pos, self.order = b"", 0, "<"
        self.elements = 0
        self._check_magic()
        self.version = self._version()
        tensor_count, kv_count = self._unpack("QQ", "the tensor and key/value counts")
        self._check_count(tensor_count, _MIN_TENSOR_INFO_BYTES, MAX_TENSORS, "tensors")
        self._check_count(kv_count, _MIN_KV_BYTES, MAX_KV, "key/value pairs")
        self.fields: dict[str, tuple[GGUFValueType, Any]] = {}
        for _ in range(kv_count):
            key = self._text(self._string("a metadata key"), "a metadata key")
            if key in self.fields:
                raise self._corrupt(f"metadata key {key!r} appears twice")
            (value_type,) = self._unpack("I", f"the type of metadata {key!r}")
            self.fields[key] = self._value(value_type, key)
        self.alignment = self._alignment()
        self.tensors = [self._tensor_info(i) for i in range(tensor_count)]
        self.data_offset = self.pos + (-self.pos % self.alignment if self.tensors else 0)
        self._check_layout()

    # --- bytes ----------------------------------------------------------------------------
    def _need(self, end: int, what: str) -> None:
        """Make sure bytes [0, end) are read, or raise naming `what` needs them."""
        if end <= len(self.buffer):
            return
        if end > self.size:
            raise GGUFFormatError(f"{self.where}: truncated GGUF file: it has {self.size} bytes, "
                                  f"but {what} at byte {self.pos} needs {end}")
        if end > MAX_HEADER_BYTES:
            raise GGUFFormatError(f"{self.where}: GGUF header too large: {what} reaches byte "
                                  f"{end}; at most {MAX_HEADER_BYTES} header bytes are read")
        want = min(max(end, 2 * len(self.buffer), _CHUNK), self.size, MAX_HEADER_BYTES)
        self.file.seek(len(self.buffer))
        more = self.file.read(want - len(self.buffer))
        self.buffer += more
        if len(self.buffer) < end:   # the file shrank while we read it
            raise GGUFFormatError(f"{self.where}: truncated GGUF file: it ended at byte "
                                  f"{len(self.buffer)} while {what} needs {end}")

    def _unpack(self, codes: str, what: str) -> tuple:
        layout = struct.Struct(self.order + codes)
        self._need(self.pos + layout.size, what)
        values = layout.unpack_from(self.buffer, self.pos)
        self.pos += layout.size
        return values

    def _string(self, what: str) -> bytes:
        (length,) = self._unpack("Q", what)
        self._need(self.pos + length, what)
        raw = self.buffer[self.pos:self.pos + length]
        self.pos += length
        return raw

    def _text(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._corrupt(f"{what} is not valid UTF-8: {exc}") from None

    def _corrupt(self, problem: str) -> GGUFFormatError:
        return GGUFFormatError(f"{self.where}: corrupt GGUF file: {problem}")

    def _check_count(self, count: int, least_bytes: int, cap: int, what: str) -> None:
        self._need(self.pos + count * least_bytes, f"its {count} {what}")
        if count > cap:
            raise GGUFFormatError(f"{self.where}: GGUF header holds {count} {what}; at most "
                                  f"{cap} are read")

    # --- header -----------------------------------------------------------------------------
    def _check_magic(self) -> None:
        head = self.file.read(len(GGUF_MAGIC))
        if not head:
            raise GGUFFormatError(f"{self.where}: not a GGUF file: it is empty")
        if not GGUF_MAGIC.startswith(head):
            raise GGUFFormatError(f"{self.where}: not a GGUF file: it starts with {head!r}, "
                                  f"not the magic {GGUF_MAGIC!r}")
        self._need(len(GGUF_MAGIC), "the magic")
        self.pos = len(GGUF_MAGIC)

    def _version(self) -> int:
        (version,) = self._unpack("I", "the version")
        if version & 0xFFFF == 0:   # written on a machine of the other byte order
            self.order = ">"
            version = int.from_bytes(struct.pack("<I", version), "big")
        if version not in READ_VERSIONS:
            raise self._corrupt(f"unsupported version {version} (versions "
                                f"{' and '.join(map(str, READ_VERSIONS))} are read)")
        return version

    def _value(self, value_type: int, key: str) -> tuple[GGUFValueType, Any]:
        """(type, value) of one metadata value; arrays as (ARRAY, (element type, list))."""
        where = f"metadata {key!r}"
        if value_type == GGUFValueType.STRING:
            return GGUFValueType.STRING, self._text(self._string(where), where)
        if value_type in _SCALAR_CODES:
            kind = GGUFValueType(value_type)
            (value,) = self._unpack(_SCALAR_CODES[kind], where)
            return kind, self._scalar(kind, value, where)
        if value_type != GGUFValueType.ARRAY:
            raise self._corrupt(f"{where} has unknown type {value_type}")
        element_type, length = self._unpack("IQ", where)
        if element_type == GGUFValueType.ARRAY:
            raise GGUFFormatError(f"{self.where}: {where} is a nested array, which is not read")
        if element_type != GGUFValueType.STRING and element_type not in _SCALAR_CODES:
            raise self._corrupt(f"{where} is an array of unknown type {element_type}")
        kind = GGUFValueType(element_type)
        item_bytes = 8 if kind == GGUFValueType.STRING else struct.calcsize(_SCALAR_CODES[kind])
        self._need(self.pos + length * item_bytes, f"{where} ({length} elements)")
        self.elements += length
        if length > MAX_ARRAY_LEN or self.elements > MAX_METADATA_ELEMENTS:
            raise GGUFFormatError(
                f"{self.where}: {where} has {length} elements; at most {MAX_ARRAY_LEN} in one "
                f"array and {MAX_METADATA_ELEMENTS} in all are read")
        if kind == GGUFValueType.STRING:
            return GGUFValueType.ARRAY, (kind, [self._text(self._string(where), where)
                                                for _ in range(length)])
        dtype = np.dtype(self.order + _SCALAR_CODES[kind])
        values = np.frombuffer(self.buffer, dtype, length, self.pos)
        self.pos += length * item_bytes
        if kind == GGUFValueType.BOOL:
            if values.size and values.max() > 1:
                raise self._corrupt(f"{where} holds a BOOL that is neither 0 nor 1")
            return GGUFValueType.ARRAY, (kind, values.astype(bool).tolist())
        return GGUFValueType.ARRAY, (kind, values.tolist())

    def _scalar(self, kind: GGUFValueType, value: Any, where: str) -> Any:
        if kind == GGUFValueType.BOOL:
            if value > 1:
                raise self._corrupt(f"{where} is a BOOL of byte {value}, neither 0 nor 1")
            return bool(value)
        return value

    def _alignment(self) -> int:
        field = self.fields.get("general.alignment")
        if field is None:
            return DEFAULT_ALIGNMENT
        kind, value = field
        if kind != GGUFValueType.UINT32 or value == 0 or value & (value - 1):
            raise self._corrupt(f"general.alignment must be a UINT32 power of two, got "
                                f"{value!r} of type {kind.name}")
        return value

    def _tensor_info(self, index: int) -> _TensorInfo:
        raw = self._string(f"the name of tensor {index}")
        if len(raw) > MAX_NAME_BYTES:
            raise self._corrupt(f"tensor {index}'s name is {len(raw)} bytes; ggml allows at "
                                f"most {MAX_NAME_BYTES}")
        name = self._text(raw, f"the name of tensor {index}")
        at = f"tensor {name!r}"
        (n_dims,) = self._unpack("I", at)
        if not 1 <= n_dims <= MAX_DIMS:
            raise self._corrupt(f"{at} has {n_dims} dimensions; ggml allows 1 to {MAX_DIMS}")
        ne = self._unpack("Q" * n_dims, at)
        count = 1
        for n in ne:
            count *= n
        if max(ne) >= 2**63 or count >= 2**63:
            raise self._corrupt(f"{at} has shape ne={list(ne)}, whose element count does not "
                                "fit in int64")
        (type_id,) = self._unpack("I", at)
        dtype = _NUMPY_DTYPES.get(type_id)
        if dtype is None:
            type_name = (GGMLQuantizationType(type_id).name
                         if type_id in GGMLQuantizationType._value2member_map_ else str(type_id))
            raise GGUFFormatError(f"{self.where}: tensor {name!r} has unsupported type "
                                  f"{type_name}; only F16, BF16, F32, F64, I32 and I8 are "
                                  "read")
        (offset,) = self._unpack("Q", at)
        return _TensorInfo(name, tuple(reversed(ne)), dtype.newbyteorder(self.order), offset,
                           count * dtype.itemsize, dtype in _HALF)

    def _check_layout(self) -> None:
        """Names unique; each tensor right after the one before, padded to the alignment (as
        ggml requires); the data section inside the file."""
        seen, expected = set(), 0
        for t in self.tensors:
            if t.name in seen:
                raise self._corrupt(f"tensor name {t.name!r} appears twice")
            seen.add(t.name)
            if t.offset != expected:
                raise self._corrupt(f"tensor {t.name!r} has offset {t.offset}, expected "
                                    f"{expected} (each tensor follows the one before, padded "
                                    f"to {self.alignment} bytes)")
            expected += t.nbytes + (-t.nbytes % self.alignment)
        end = self.data_offset + expected
        if end > self.size:
            raise GGUFFormatError(f"{self.where}: truncated GGUF file: it has {self.size} bytes, "
                                  f"but its tensor data ends at byte {end}")

    def metadata(self) -> dict[str, Any]:
        """Every key's value as a plain Python value (arrays as lists)."""
        return {key: value[1] if kind == GGUFValueType.ARRAY else value
                for key, (kind, value) in self.fields.items()}

    def read_tensor(self, t: _TensorInfo) -> np.ndarray:
        """A native-endian C-contiguous copy of tensor `t`'s data, read straight into it."""
        stored = np.dtype(np.uint16).newbyteorder(self.order) if t.half else t.dtype
        try:
            array = np.empty(t.shape, stored)
        except MemoryError:
            raise GGUFFormatError(f"{self.where}: tensor {t.name!r} needs {t.nbytes} bytes, more "
                                  "memory than there is") from None
        if t.nbytes:
            self.file.seek(self.data_offset + t.offset)
            got = self.file.readinto(memoryview(array.reshape(-1)).cast("B"))
            if got != t.nbytes:
                raise GGUFFormatError(f"{self.where}: truncated GGUF file: tensor {t.name!r} "
                                      f"ended after {got} of its {t.nbytes} bytes")
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        return array.view(t.dtype.newbyteorder("=")) if t.half else array


TensorSelect = Callable[[str, dict[str, Any], dict[str, tuple[tuple[int, ...], np.dtype]]],
                        Iterable[str]]


def load_gguf(path: str | os.PathLike[str], arch: str | None = None,
              expect: Mapping[str, tuple[tuple[int, ...], Any]] | TensorSelect | None = None,
              ) -> GGUFFile:
    """Read a GGUF file; if `arch` is given, its general.architecture must equal it.

    expect: which tensors to read. None reads them all. A spec (name -> (numpy shape, dtype),
    as expect_tensors takes) is checked against the header, missing and unexpected tensors
    included, before any tensor data is read. A function select(arch, metadata, tensors),
    given the file's architecture, its other metadata and name -> (numpy shape, dtype) of every
    tensor in the header, returns the names to read (or raises to refuse the file); the
    others are never read.

    Returns a GGUFFile whose arrays are copies in numpy order (the file's `ne` reversed),
    C-contiguous, writable and native-endian (big-endian files are converted).

    Raises GGUFFormatError naming the file and the problem: missing or unreadable file, not a
    GGUF file (wrong magic), truncated file (including a missing final padding, which ggml
    also refuses), otherwise corrupt file (see the module docstring for the checks), a header
    over the caps, missing or mismatched architecture, a tensor type other than
    F32/F64/I32/I8, metadata that is a nested array, or tensors that do not match `expect`.
    """
    where = os.fsdecode(path)
    try:   # non-blocking, so that a FIFO is refused rather than waited on
        file = os.fdopen(os.open(where, os.O_RDONLY | os.O_NONBLOCK), "rb")
    except FileNotFoundError:
        raise GGUFFormatError(f"{where}: no such file") from None
    except OSError as exc:
        raise GGUFFormatError(f"{where}: cannot be read: {exc.strerror or exc}") from exc
    with file:
        try:
            st = os.fstat(file.fileno())
            if not stat.S_ISREG(st.st_mode):
                kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
                raise GGUFFormatError(f"{where}: cannot be read: it is {kind}")
            reader = _BoundedReader(file, st.st_size, where)
            metadata = reader.metadata()
            file_arch = _file_arch(reader, where)
            if arch is not None and file_arch != arch:
                raise GGUFFormatError(f"{where}: architecture is {file_arch!r}, expected {arch!r}")
            del metadata[ARCH_KEY]
            for key in _READER_HEADER_FIELDS:
                if key in metadata:
                    raise GGUFFormatError(f"{where}: corrupt GGUF file: metadata key {key!r} is "
                                          "reserved for the header")
            header = {t.name: (t.shape, t.dtype.newbyteorder("=")) for t in reader.tensors}
            wanted = _selected(expect, f"{where} (architecture {file_arch!r})", file_arch,
                               metadata, header)
            tensors = {t.name: reader.read_tensor(t) for t in reader.tensors if t.name in wanted}
        except OSError as exc:
            raise GGUFFormatError(f"{where}: cannot be read: {exc.strerror or exc}") from exc
    return GGUFFile(arch=file_arch, tensors=tensors, metadata=metadata, path=where)


def _selected(expect, where: str, file_arch: str, metadata: dict, header: dict) -> set[str]:
    """The names of the tensors to read, after checking `expect` against the header."""
    if expect is None:
        return set(header)
    if isinstance(expect, Mapping):
        check_tensors(where, header, expect)
        return set(expect)
    return set(expect(file_arch, dict(metadata), dict(header)))


def _file_arch(reader: _BoundedReader, where: str) -> str:
    field = reader.fields.get(ARCH_KEY)
    if field is None:
        raise GGUFFormatError(f"{where}: no {ARCH_KEY} key")
    if field[0] != GGUFValueType.STRING:
        raise GGUFFormatError(f"{where}: {ARCH_KEY} is not a string")
    return field[1]


# --- checking --------------------------------------------------------------------------------

def expect_tensors(gf: GGUFFile, spec: Mapping[str, tuple[tuple[int, ...], Any]]) -> None:
    """Check that `gf` holds exactly the tensors in `spec` (name -> (numpy shape, dtype)).

    Raises one GGUFFormatError that names every missing tensor, every unexpected tensor, every
    wrong shape (found and expected) and every wrong dtype (found and expected).
    """
    check_tensors(f"{gf.path or 'GGUF file'} (architecture {gf.arch!r})",
                  {name: (array.shape, array.dtype) for name, array in gf.tensors.items()}, spec)


def check_tensors(where: str, found: Mapping[str, tuple[tuple[int, ...], Any]],
                  spec: Mapping[str, tuple[tuple[int, ...], Any]]) -> None:
    """expect_tensors for name -> (shape, dtype) pairs, such as a header's; `where` opens the
    message."""
    problems = []
    missing = [name for name in spec if name not in found]
    if missing:
        problems.append("missing " + ", ".join(map(repr, missing)))
    for name, (shape, dtype) in spec.items():
        if name not in found:
            continue
        got_shape, got_dtype = tuple(found[name][0]), np.dtype(found[name][1])
        expected_shape = tuple(int(n) for n in shape)
        if got_shape != expected_shape:
            problems.append(f"{name!r} has shape {list(got_shape)}, expected "
                            f"{list(expected_shape)}")
        if got_dtype != np.dtype(dtype):
            problems.append(f"{name!r} has dtype {got_dtype}, expected {np.dtype(dtype)}")
    unexpected = [name for name in found if name not in spec]
    if unexpected:
        problems.append("unexpected " + ", ".join(map(repr, unexpected)))
    if problems:
        raise GGUFFormatError(f"{where}: tensors do not match: " + "; ".join(problems))
