"""What GGUF reading and writing share (engine.gguf_io is the public face of both): the
format's constants (ggml's limits on names and dims, the reserved keys), the tensor types
stored and read, the error both raise, the loaded file, and the check of a file's tensors
against a spec.

Kept apart from the writer (engine.gguf_io) and the reader (engine.gguf_read) so that each
imports it and neither imports the other; callers import all of it from engine.gguf_io.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType

from engine.errors import EngineError

ARCH_KEY = "general.architecture"
MAX_DIMS = 4  # GGML_MAX_DIMS: ggml refuses tensors with more dimensions
MAX_NAME_BYTES = 63  # GGML_MAX_NAME = 64 bytes, the terminating NUL included

# Keys a caller may not set: the architecture has its own argument, the alignment must match
# the layout the writer produces, and the reader reports the header under the GGUF.* names.
RESERVED_KEYS = (ARCH_KEY, "general.alignment")
HEADER_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")

TENSOR_TYPES = {
    np.dtype(np.float32): GGMLQuantizationType.F32,
    np.dtype(np.float64): GGMLQuantizationType.F64,
    np.dtype(np.int32): GGMLQuantizationType.I32,
    np.dtype(np.int8): GGMLQuantizationType.I8,
    np.dtype(np.float16): GGMLQuantizationType.F16,
    np.dtype(ml_dtypes.bfloat16): GGMLQuantizationType.BF16,
}
NUMPY_DTYPES = {ggml_type: dtype for dtype, ggml_type in TENSOR_TYPES.items()}
# the 16-bit floats go through the file as their bit patterns (uint16 in the file's byte
# order: ml_dtypes' bfloat16 has no byte order of its own)
HALF_DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


class GGUFFormatError(EngineError, ValueError):
    """A GGUF file that cannot be read as asked, or data that cannot be written as GGUF."""

    __module__ = "engine.gguf_io"   # its public home, where callers import and name it


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
