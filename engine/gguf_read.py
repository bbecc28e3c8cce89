"""Reading GGUF files: `load_gguf` and the bounded parser of a file's header behind it
(engine.gguf_io, the public face of GGUF I/O, describes the checks and the caps).

The header (metadata and tensor table) is parsed with struct and numpy from the first bytes,
every count and length checked against the bytes left and the caps MAX_* before it is used;
only then is any tensor data read, and only that of the tensors a caller asks for.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from engine.gguf_format import (
    ARCH_KEY,
    HALF_DTYPES,
    HEADER_FIELDS,
    MAX_DIMS,
    MAX_NAME_BYTES,
    NUMPY_DTYPES,
    GGUFFile,
    GGUFFormatError,
    check_tensors,
)

GGUF_MAGIC = b"GGUF"
READ_VERSIONS = (2, 3)  # GGUF v1 had 32-bit counts; ggml refuses it too
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
MAX_HEADER_BYTES = 16 * 2**20
MAX_KV = 4096
MAX_TENSORS = 65536
MAX_ARRAY_LEN = 65536
MAX_METADATA_ELEMENTS = 262144

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
        dtype = NUMPY_DTYPES.get(type_id)
        if dtype is None:
            type_name = (GGMLQuantizationType(type_id).name
                         if type_id in GGMLQuantizationType._value2member_map_ else str(type_id))
            raise GGUFFormatError(f"{self.where}: tensor {name!r} has unsupported type "
                                  f"{type_name}; only F16, BF16, F32, F64, I32 and I8 are "
                                  "read")
        (offset,) = self._unpack("Q", at)
        return _TensorInfo(name, tuple(reversed(ne)), dtype.newbyteorder(self.order), offset,
                           count * dtype.itemsize, dtype in HALF_DTYPES)

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
            for key in HEADER_FIELDS:
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
