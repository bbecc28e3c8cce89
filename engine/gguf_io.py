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
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from engine.errors import EngineError

ARCH_KEY = "general.architecture"
MAX_DIMS = 4  # GGML_MAX_DIMS: ggml refuses tensors with more dimensions
MAX_NAME_BYTES = 63  # GGML_MAX_NAME = 64 bytes, the terminating NUL included
GGUF_MAGIC = b"GGUF"

# Keys a caller may not set: the architecture has its own argument, the alignment must match
# the layout the writer produces, and the reader reports the header under the GGUF.* names.
_RESERVED_KEYS = (ARCH_KEY, "general.alignment")
_READER_HEADER_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")

_TENSOR_TYPES = {
    np.dtype(np.float32): GGMLQuantizationType.F32,
    np.dtype(np.float64): GGMLQuantizationType.F64,
    np.dtype(np.int32): GGMLQuantizationType.I32,
    np.dtype(np.int8): GGMLQuantizationType.I8,
}
_NUMPY_DTYPES = {ggml_type: dtype for dtype, ggml_type in _TENSOR_TYPES.items()}
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

    Everything is checked before anything touches the disk. The file is written to a temporary
    file in the same directory, synced, and moved onto `path` with os.replace, so `path` holds
    either its old contents or the complete new file; on any error the temporary file is
    removed and an existing file at `path` is left as it was.

    Raises GGUFFormatError naming the tensor or key for anything GGUF cannot hold; OSError
    from the file system passes through.
    """
    if not isinstance(arch, str) or not arch:
        raise GGUFFormatError(f"arch must be a non-empty string, got {arch!r}")
    entries = {key: _metadata_entry(key, value) for key, value in (metadata or {}).items()}
    arrays = {name: _tensor_for_writing(name, array) for name, array in tensors.items()}

    target = os.path.abspath(os.fsdecode(path))
    temp_path = _create_temp_beside(target)
    writer = None
    try:
        writer = GGUFWriter(temp_path, arch)
        for key, (value, value_type, element_type) in entries.items():
            writer.add_key_value(key, value, value_type, element_type)
        for name, array in arrays.items():
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        for out in writer.fout or ():
            out.flush()
            os.fsync(out.fileno())
        writer.close()
        os.replace(temp_path, target)
    except BaseException:
        if writer is not None:
            writer.close()
        _remove_if_present(temp_path)
        raise
    _fsync_directory(os.path.dirname(target))


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
                              "here hold float32, float64, int32 and int8")
    if array.ndim == 0:
        raise GGUFFormatError(f"tensor {name!r}: 0-d arrays are not stored; reshape it to (1,)")
    if array.ndim > MAX_DIMS:
        raise GGUFFormatError(f"tensor {name!r}: shape {list(array.shape)} has {array.ndim} "
                              f"dimensions; ggml allows at most {MAX_DIMS}")
    return np.ascontiguousarray(array, dtype=dtype)


def _create_temp_beside(target: str) -> str:
    """Create an empty file next to `target` (mode 0o666 less the umask) and return its path."""
    directory, base = os.path.split(target)
    for _ in range(100):
        candidate = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return candidate
    raise FileExistsError(f"could not create a temporary file next to {target}")


def _remove_if_present(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_directory(directory: str) -> None:
    """Make the rename durable where the platform allows it (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- reading ---------------------------------------------------------------------------------

class _ReadPastEnd(Exception):
    """Raised inside the reader when the file ends before the data it describes."""


class _BoundedReader(GGUFReader):
    """gguf's reader, except that a read past the end of the file raises.

    The stock reader slices its memory map, so a read past the end returns a short array; a
    truncated file then fails somewhere later with an unrelated message, or a corrupt count
    makes it loop over empty reads.
    """

    def _get(self, offset, dtype, count=1, override_order=None):
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > len(self.data):
            raise _ReadPastEnd(f"it has {len(self.data)} bytes, but a read at byte {int(offset)} "
                               f"needs {end}")
        return super()._get(offset, dtype, count, override_order)


def load_gguf(path: str | os.PathLike[str], arch: str | None = None) -> GGUFFile:
    """Read a GGUF file; if `arch` is given, its general.architecture must equal it.

    Returns a GGUFFile whose arrays are copies in numpy order (the file's `ne` reversed),
    C-contiguous, writable and native-endian (big-endian files are converted).

    Raises GGUFFormatError naming the file and the problem: missing or unreadable file, not a
    GGUF file (wrong magic), truncated file (including a missing final padding, which ggml
    also refuses), otherwise corrupt file, missing or mismatched architecture, a tensor type
    other than F32/F64/I32/I8, or metadata that is a nested array.
    """
    where = os.fsdecode(path)
    _check_magic(where)
    try:
        reader = _BoundedReader(where)
    except _ReadPastEnd as exc:
        raise GGUFFormatError(f"{where}: truncated GGUF file: {exc}") from None
    except (ValueError, KeyError, IndexError, OverflowError, TypeError) as exc:
        raise GGUFFormatError(f"{where}: corrupt GGUF file: {exc}") from exc
    _check_data_section(reader, where)

    file_arch = _file_arch(reader, where)
    if arch is not None and file_arch != arch:
        raise GGUFFormatError(f"{where}: architecture is {file_arch!r}, expected {arch!r}")
    metadata = {
        key: _metadata_value(field, key, where)
        for key, field in reader.fields.items()
        if key != ARCH_KEY and key not in _READER_HEADER_FIELDS
    }
    tensors = {}
    for tensor in reader.tensors:
        dtype = _NUMPY_DTYPES.get(tensor.tensor_type)
        if dtype is None:
            raise GGUFFormatError(f"{where}: tensor {tensor.name!r} has unsupported type "
                                  f"{tensor.tensor_type.name}; only F32, F64, I32 and I8 are read")
        tensors[tensor.name] = np.array(tensor.data, dtype=dtype, order="C", copy=True)
    return GGUFFile(arch=file_arch, tensors=tensors, metadata=metadata, path=where)


def _check_magic(where: str) -> None:
    try:
        with open(where, "rb") as file:
            head = file.read(len(GGUF_MAGIC))
    except FileNotFoundError:
        raise GGUFFormatError(f"{where}: no such file") from None
    except OSError as exc:
        raise GGUFFormatError(f"{where}: cannot be read: {exc.strerror or exc}") from exc
    if not head:
        raise GGUFFormatError(f"{where}: not a GGUF file: it is empty")
    if not GGUF_MAGIC.startswith(head):
        raise GGUFFormatError(f"{where}: not a GGUF file: it starts with {head!r}, "
                              f"not the magic {GGUF_MAGIC!r}")
    if len(head) < len(GGUF_MAGIC):
        raise GGUFFormatError(f"{where}: truncated GGUF file: it has only {len(head)} bytes")


def _check_data_section(reader: GGUFReader, where: str) -> None:
    """The file must reach the end of the last tensor's data, padded to the alignment."""
    alignment = int(reader.alignment)
    end = int(reader.data_offset)
    for tensor in reader.tensors:
        padded = -(-int(tensor.n_bytes) // alignment) * alignment
        end = max(end, int(tensor.data_offset) + padded)
    if len(reader.data) < end:
        raise GGUFFormatError(f"{where}: truncated GGUF file: it has {len(reader.data)} bytes, "
                              f"but its tensor data ends at byte {end}")


def _file_arch(reader: GGUFReader, where: str) -> str:
    field = reader.get_field(ARCH_KEY)
    if field is None:
        raise GGUFFormatError(f"{where}: no {ARCH_KEY} key")
    if field.types != [GGUFValueType.STRING]:
        raise GGUFFormatError(f"{where}: {ARCH_KEY} is not a string")
    return _metadata_value(field, ARCH_KEY, where)


def _metadata_value(field: Any, key: str, where: str) -> Any:
    if field.types[0] == GGUFValueType.ARRAY and len(field.types) > 2:
        raise GGUFFormatError(f"{where}: metadata {key!r} is a nested array, which is not read")
    try:
        return field.contents()
    except UnicodeDecodeError as exc:
        raise GGUFFormatError(f"{where}: metadata {key!r} is not valid UTF-8: {exc}") from None


# --- checking --------------------------------------------------------------------------------

def expect_tensors(gf: GGUFFile, spec: Mapping[str, tuple[tuple[int, ...], Any]]) -> None:
    """Check that `gf` holds exactly the tensors in `spec` (name -> (numpy shape, dtype)).

    Raises one GGUFFormatError that names every missing tensor, every unexpected tensor, every
    wrong shape (found and expected) and every wrong dtype (found and expected).
    """
    problems = []
    missing = [name for name in spec if name not in gf.tensors]
    if missing:
        problems.append("missing " + ", ".join(map(repr, missing)))
    for name, (shape, dtype) in spec.items():
        array = gf.tensors.get(name)
        if array is None:
            continue
        expected_shape = tuple(int(n) for n in shape)
        if array.shape != expected_shape:
            problems.append(f"{name!r} has shape {list(array.shape)}, expected "
                            f"{list(expected_shape)}")
        if array.dtype != np.dtype(dtype):
            problems.append(f"{name!r} has dtype {array.dtype}, expected {np.dtype(dtype)}")
    unexpected = [name for name in gf.tensors if name not in spec]
    if unexpected:
        problems.append("unexpected " + ", ".join(map(repr, unexpected)))
    if problems:
        raise GGUFFormatError(f"{gf.path or 'GGUF file'} (architecture {gf.arch!r}): tensors do "
                              "not match: " + "; ".join(problems))
