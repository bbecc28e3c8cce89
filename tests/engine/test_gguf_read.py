"""Reading GGUF: every file that cannot be read as asked is refused with a GGUFFormatError
naming it, crafted headers are checked as ggml checks them before any data is read, and the
caps keep a hostile header cheap."""

from __future__ import annotations

import os
import struct
import tempfile

import gguf
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import gguf_read
from engine.errors import EngineError
from engine.gguf_io import GGUFFormatError, load_gguf, save_gguf
from tests.engine.gguf_samples import (
    F32,
    T,
    craft,
    kv,
    pack_str,
    small_file,
    write,
    write_like_ggml_mnist,
)

# --- errors on loading -----------------------------------------------------------------------

def test_errors_are_engine_errors_and_value_errors():
    assert issubclass(GGUFFormatError, EngineError) and issubclass(GGUFFormatError, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(GGUFFormatError, match=r"nothere.gguf: no such file"):
        load_gguf(tmp_path / "nothere.gguf")


def test_directory_is_not_readable(tmp_path):
    with pytest.raises(GGUFFormatError, match=r"cannot be read"):
        load_gguf(tmp_path)


@pytest.mark.parametrize("content, match", [
    (b"", r"not a GGUF file: it is empty"),
    (b"\x93NUMPY\x01\x00", r"not a GGUF file: it starts with b'\\x93NUM'"),
    (b"GGML" + bytes(64), r"not a GGUF file: it starts with b'GGML', not the magic b'GGUF'"),
    (b"PK", r"not a GGUF file: it starts with b'PK'"),
])
def test_wrong_magic(tmp_path, content, match):
    (tmp_path / "f.gguf").write_bytes(content)
    with pytest.raises(GGUFFormatError, match=match):
        load_gguf(tmp_path / "f.gguf")


def test_truncated_at_every_length(tmp_path):
    whole = small_file(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    for length in range(1, len(whole)):
        cut.write_bytes(whole[:length])
        with pytest.raises(GGUFFormatError, match=r"cut.gguf: truncated GGUF file") as info:
            load_gguf(cut)
        assert "bytes" in str(info.value), length


def test_trailing_bytes_after_the_data_are_ignored(tmp_path):
    path = small_file(tmp_path / "t.gguf")
    path.write_bytes(path.read_bytes() + b"extra")
    assert list(load_gguf(path).tensors) == ["a.b", "c"]


def test_unsupported_version_is_corrupt(tmp_path):
    data = bytearray(small_file(tmp_path / "t.gguf").read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    (tmp_path / "t.gguf").write_bytes(bytes(data))
    with pytest.raises(GGUFFormatError, match=r"t.gguf: corrupt GGUF file: .*version 99"):
        load_gguf(tmp_path / "t.gguf")


def test_absurd_tensor_count_fails_fast(tmp_path):
    data = bytearray(small_file(tmp_path / "t.gguf").read_bytes())
    data[8:16] = (2**62).to_bytes(8, "little")
    (tmp_path / "t.gguf").write_bytes(bytes(data))
    with pytest.raises(GGUFFormatError, match=r"truncated GGUF file"):
        load_gguf(tmp_path / "t.gguf")


def test_arch_mismatch_names_both(tmp_path):
    path = small_file(tmp_path / "t.gguf")
    with pytest.raises(GGUFFormatError, match=r"architecture is 'test-arch', expected 'mnist-fc'"):
        load_gguf(path, arch="mnist-fc")


def test_missing_arch(tmp_path):
    writer = gguf.GGUFWriter(tmp_path / "t.gguf", "x")
    del writer.kv_data[0]["general.architecture"]
    writer.add_tensor("x", np.ones(2, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFFormatError, match=r"no general.architecture key"):
        load_gguf(tmp_path / "t.gguf")


@pytest.mark.parametrize("dtype, type_name", [(np.int64, "I64"), (np.int16, "I16")])
def test_unsupported_tensor_type(tmp_path, dtype, type_name):
    write_like_ggml_mnist(tmp_path / "t.gguf", "arch", {"w.half": np.ones((2, 2), dtype)})
    with pytest.raises(GGUFFormatError, match=rf"tensor 'w.half' has unsupported type {type_name}"):
        load_gguf(tmp_path / "t.gguf")


@pytest.mark.parametrize("dtype, type_name", [(np.float16, "F16"),
                                              (ml_dtypes.bfloat16, "BF16")])
def test_16_bit_floats_round_trip_as_ggml_types(tmp_path, dtype, type_name):
    """float16 and bfloat16 tensors are written as ggml's F16 and BF16 (gguf's own reader
    says so) and read back bit for bit, NaN payloads and negative zero included."""
    bits = np.array([0x0000, 0x8000, 0x3C00, 0x7C01, 0xFFFF, 0x1234], np.uint16)
    array = bits.view(dtype).reshape(2, 3)
    save_gguf(tmp_path / "h.gguf", {"w": array}, "arch")
    (info,) = gguf.GGUFReader(tmp_path / "h.gguf").tensors
    assert info.tensor_type.name == type_name
    back = load_gguf(tmp_path / "h.gguf").tensors["w"]
    assert back.dtype == np.dtype(dtype) and np.array_equal(back.view(np.uint16),
                                                            array.view(np.uint16))


# --- crafted headers: checked as ggml checks them, before any data is read --------------------

def test_crafted_file_of_two_tensors_loads(tmp_path):
    path = write(tmp_path, craft([(b"a", [3], F32, 0), (b"b", [2, 2], F32, 32)]))
    gf = load_gguf(path)
    assert {k: v.shape for k, v in gf.tensors.items()} == {"a": (3,), "b": (2, 2)}


@pytest.mark.parametrize("tensors, match", [
    ([(b"a", [4], F32, 2**64 - 32)], r"tensor 'a' has offset 18446744073709551584, expected 0"),
    ([(b"a", [4], F32, 32), (b"b", [4], F32, 0)], r"tensor 'a' has offset 32, expected 0"),
    ([(b"a", [4], F32, 0), (b"b", [4], F32, 0)], r"tensor 'b' has offset 0, expected 32"),
    ([(b"a", [4], F32, 0), (b"b", [4], F32, 16)], r"tensor 'b' has offset 16, expected 32"),
    ([(b"a", [4], F32, 0), (b"b", [4], F32, 64)], r"tensor 'b' has offset 64, expected 32"),
    ([(b"a", [1, 1, 1, 1, 2], F32, 0)], r"tensor 'a' has 5 dimensions; ggml allows 1 to 4"),
    ([(b"a", [], F32, 0)], r"tensor 'a' has 0 dimensions"),
    ([(b"x" * 64, [1], F32, 0)], r"tensor 0's name is 64 bytes; ggml allows at most 63"),
    ([(b"\xff", [1], F32, 0)], r"the name of tensor 0 is not valid UTF-8"),
    ([(b"a", [1], F32, 0), (b"a", [1], F32, 32)], r"tensor name 'a' appears twice"),
    ([(b"a", [2**63], F32, 0)], r"tensor 'a' has shape ne=\[9223372036854775808\]"),
    ([(b"a", [2**32, 2**32], F32, 0)], r"tensor .a. has shape .*element count does not fit"),
])
def test_tensor_tables_ggml_refuses_are_refused(tmp_path, tensors, match):
    path = write(tmp_path, craft(tensors))
    with pytest.raises(GGUFFormatError, match=r"t.gguf: corrupt GGUF file: " + match):
        load_gguf(path)


def test_tensor_beyond_the_end_is_truncated_before_anything_is_allocated(tmp_path):
    path = write(tmp_path, craft([(b"a", [2**40], F32, 0)], data=b""))
    with pytest.raises(GGUFFormatError, match=r"truncated GGUF file: .*ends at byte 4398046511"):
        load_gguf(path)


@pytest.mark.parametrize("kvs, match", [
    ([kv("k", T.BOOL, b"\x02")], r"corrupt GGUF file: metadata 'k' is a BOOL of byte 2"),
    ([kv("k", T.ARRAY, struct.pack("<IQ", T.BOOL, 2) + b"\x01\x07")], r"neither 0 nor 1"),
    ([kv("k", 13, b"")], r"corrupt GGUF file: metadata 'k' has unknown type 13"),
    ([kv("k", T.ARRAY, struct.pack("<IQ", 99, 1))], r"metadata 'k' is an array of unknown type"),
    ([kv("k", T.ARRAY, struct.pack("<IQ", T.ARRAY, 1))], r"metadata 'k' is a nested array"),
    ([kv("k", T.STRING, pack_str(b"\xff"))], r"metadata 'k' is not valid UTF-8"),
    ([kv("k", T.INT8, b"\x01"), kv("k", T.INT8, b"\x02")], r"metadata key 'k' appears twice"),
    ([kv("GGUF.version", T.INT8, b"\x01")], r"metadata key 'GGUF.version' is reserved"),
    ([kv("general.alignment", T.UINT32, struct.pack("<I", 24))],
     r"general.alignment must be a UINT32 power of two, got 24"),
    ([kv("general.alignment", T.INT64, struct.pack("<q", 64))], r"got 64 of type INT64"),
    ([kv("k", T.ARRAY, struct.pack("<IQ", T.INT64, 2**60))],
     r"truncated GGUF file: .* but metadata 'k' \(1152921504606846976 elements\)"),
    ([kv("k", T.STRING, struct.pack("<Q", 2**62))], r"truncated GGUF file"),
])
def test_metadata_that_cannot_be_read_is_refused(tmp_path, kvs, match):
    path = write(tmp_path, craft(kvs=kvs))
    with pytest.raises(GGUFFormatError, match=match):
        load_gguf(path)


def test_metadata_of_other_writers_types_loads(tmp_path):
    kvs = [kv("u8", T.UINT8, b"\xff"), kv("f32", T.FLOAT32, struct.pack("<f", 0.5)),
           kv("u16s", T.ARRAY, struct.pack("<IQ3H", T.UINT16, 3, 1, 2, 65535)),
           kv("bools", T.ARRAY, struct.pack("<IQ", T.BOOL, 2) + b"\x01\x00"),
           kv("empty", T.ARRAY, struct.pack("<IQ", T.INT32, 0)),
           kv("general.alignment", T.UINT32, struct.pack("<I", 64))]
    path = write(tmp_path, craft([(b"a", [3], F32, 0), (b"b", [1], F32, 64)], kvs, alignment=64))
    gf = load_gguf(path)
    assert gf.metadata == {"u8": 255, "f32": 0.5, "u16s": [1, 2, 65535], "bools": [True, False],
                           "empty": [], "general.alignment": 64}
    assert type(gf.metadata["bools"][0]) is bool and list(gf.tensors) == ["a", "b"]


@pytest.mark.parametrize("cap, kvs, tensors, match", [
    ("MAX_ARRAY_LEN", [kv("k", T.ARRAY, struct.pack("<IQ", T.INT8, 11) + bytes(11))], [],
     r"metadata 'k' has 11 elements; at most 10 in one array"),
    ("MAX_METADATA_ELEMENTS", [kv(f"k{i}", T.ARRAY, struct.pack("<IQ", T.INT8, 4) + bytes(4))
                               for i in range(3)], [], r"metadata 'k2' has 4 elements"),
    ("MAX_KV", [kv(f"k{i}", T.INT8, b"\x00") for i in range(10)], [],
     r"GGUF header holds 11 key/value pairs; at most 10 are read"),
    ("MAX_TENSORS", [], [(f"t{i}".encode(), [1], F32, 32 * i) for i in range(11)],
     r"GGUF header holds 11 tensors; at most 10 are read"),
])
def test_caps_refuse_big_headers(tmp_path, monkeypatch, cap, kvs, tensors, match):
    monkeypatch.setattr(gguf_read, cap, 10)
    path = write(tmp_path, craft(tensors, kvs))
    with pytest.raises(GGUFFormatError, match=r"t.gguf: " + match):
        load_gguf(path)


def test_header_bytes_are_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_read, "MAX_HEADER_BYTES", 200)
    path = write(tmp_path, craft(kvs=[kv("k", T.STRING, pack_str(b"x" * 300))]))
    with pytest.raises(GGUFFormatError, match=r"GGUF header too large: metadata 'k' reaches "
                                              r"byte \d+; at most 200 header bytes"):
        load_gguf(path)


def test_an_array_longer_than_its_file_is_refused_before_it_is_read(tmp_path):
    """A count of 2^62 one-byte elements in a 160-byte file: refused from the count and the
    file's size before any element is read or any room made for them (a reader that
    allocated or read first would fail with another error, or not at all), where a
    wall-clock bound would only measure the machine's load."""
    huge = kv("k", T.ARRAY, struct.pack("<IQ", T.INT8, 2**62))
    path = write(tmp_path, craft([(b"a", [4], F32, 0)], [huge]))
    with pytest.raises(GGUFFormatError, match=r"truncated GGUF file: it has \d+ bytes, but "
                                              r"metadata 'k' \(4611686018427387904 elements\)"):
        load_gguf(path)


def test_a_million_element_array_is_refused(tmp_path):
    million = kv("k", T.ARRAY, struct.pack("<IQ", T.INT8, 10**6) + bytes(10**6))
    path = write(tmp_path, craft([(b"a", [4], F32, 0)], [million]))
    with pytest.raises(GGUFFormatError, match=r"has 1000000 elements; at most 65536"):
        load_gguf(path)


def test_fifo_is_refused_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(GGUFFormatError, match=r"fifo: cannot be read: it is not a regular file"):
        load_gguf(tmp_path / "fifo")


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_corruption_loads_or_raises_the_format_error(data):
    whole = CORRUPTIBLE
    position = data.draw(st.integers(0, len(whole) - 1))
    mutated = bytearray(whole)
    mutated[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(position + 1, len(whole)))
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "t.gguf")
        with open(path, "wb") as file:
            file.write(bytes(mutated[:cut]))
        try:
            gf = load_gguf(path)
        except GGUFFormatError as exc:
            assert str(exc).startswith(path)
        else:
            assert all(a.flags.c_contiguous for a in gf.tensors.values())


CORRUPTIBLE = craft([(b"w", [3, 2], F32, 0), (b"b", [2], F32, 32)],
                    [kv("s", T.STRING, pack_str(b"hello")),
                     kv("a", T.ARRAY, struct.pack("<IQ3q", T.INT64, 3, 1, 2, 3)),
                     kv("names", T.ARRAY, struct.pack("<IQ", T.STRING, 2) + pack_str(b"x")
                        + pack_str(b"yz"))])
