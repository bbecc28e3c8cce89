"""What the GGUF I/O tests share (test_gguf_io, test_gguf_read, test_gguf_write): sample
arrays with every special value, a small file, MNIST's fc spec, and crafted GGUF bytes (a
header written by hand, to check the reader against what ggml refuses)."""

from __future__ import annotations

import math
import struct

import gguf
import numpy as np

from engine.gguf_io import save_gguf

FC_SPEC = {"fc1.weight": ((500, 784), np.float32), "fc1.bias": ((500,), np.float32),
           "fc2.weight": ((10, 500), np.float32), "fc2.bias": ((10,), np.float32)}


def sample(shape, dtype, seed=0):
    """Random values of `dtype` with its extremes (ints) or NaN, +-inf and -0.0 (floats) first."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        values = rng.integers(-1000, 1000, size=shape).astype(dtype)
        values.flat[0] = np.iinfo(dtype).min
        values.flat[-1] = np.iinfo(dtype).max
        return values
    values = rng.normal(size=shape).astype(dtype)
    specials = [np.nan, np.inf, -np.inf, -0.0]
    values.flat[: min(values.size, 4)] = specials[: values.size]
    return values


def small_file(path):
    """A small GGUF file of two tensors and two keys at `path`."""
    save_gguf(path, {"a.b": sample((2, 3), np.float32), "c": sample((5,), np.int32)},
              "test-arch", {"note": "hello", "n": 7})
    return path


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def write_like_ggml_mnist(path, arch, arrays, **writer_options):
    """A file written as ggml's MNIST script writes one (gguf's writer, its own calls)."""
    writer = gguf.GGUFWriter(path, arch, **writer_options)
    writer.add_architecture()
    for name, array in arrays.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# --- crafted headers ---------------------------------------------------------------------------

T = gguf.GGUFValueType


def kv(key, value_type, payload):
    """One key/value pair: the key, its GGUF type and the value's raw bytes."""
    return pack_str(key.encode()) + struct.pack("<I", value_type) + payload


def pack_str(raw):
    return struct.pack("<Q", len(raw)) + raw


def craft(tensors=(), kvs=(), data=None, alignment=32, arch=b"arch"):
    """GGUF v3 bytes: tensors as (name bytes, ne, ggml type, offset); the data section is
    zeros of the size the offsets imply unless `data` is given."""
    pairs = [kv("general.architecture", T.STRING, pack_str(arch)), *kvs]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(pairs)) + b"".join(pairs)
    end = 0
    for name, ne, type_id, offset in tensors:
        head += pack_str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", type_id, offset)
        if offset + 4 * math.prod(ne) < 2**20:   # larger ones get no data
            end = max(end, offset + 4 * math.prod(ne))
    if tensors:
        head += bytes(-len(head) % alignment)
    return head + (bytes(end + (-end % alignment)) if data is None else data)


def write(tmp_path, content, name="t.gguf"):
    path = tmp_path / name
    path.write_bytes(content)
    return path


F32 = 0
