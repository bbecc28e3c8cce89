"""GGUF I/O: round trips, ggml's layout and MNIST files, atomic writes, clear errors."""

from __future__ import annotations

import contextlib
import math
import os
import stat
import struct
import tempfile
import threading
import time

import gguf
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import gguf_io
from engine.errors import EngineError
from engine.files import WriteError
from engine.gguf_io import GGUFFile, GGUFFormatError, expect_tensors, load_gguf, save_gguf

FC_SPEC = {"fc1.weight": ((500, 784), np.float32), "fc1.bias": ((500,), np.float32),
           "fc2.weight": ((10, 500), np.float32), "fc2.bias": ((10,), np.float32)}


def sample(shape, dtype, seed=0):
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
    save_gguf(path, {"a.b": sample((2, 3), np.float32), "c": sample((5,), np.int32)},
              "test-arch", {"note": "hello", "n": 7})
    return path


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# --- round trips -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("shape", [(1,), (3,), (2, 3, 4), (2, 1, 3, 5)])
def test_tensors_round_trip_bit_exactly(tmp_path, dtype, shape):
    arrays = {"layer.0.weight": sample(shape, dtype),
              "opt.adam.m.fc1.weight": sample(shape, dtype, 1)}
    save_gguf(tmp_path / "t.gguf", arrays, "arch")
    gf = load_gguf(tmp_path / "t.gguf", arch="arch")
    assert list(gf.tensors) == list(arrays)
    for name, array in arrays.items():
        loaded = gf.tensors[name]
        assert same_bits(loaded, array), name
        assert type(loaded) is np.ndarray
        assert loaded.flags.c_contiguous and loaded.flags.writeable and loaded.dtype.isnative


def test_nan_and_inf_survive(tmp_path):
    values = np.array([np.nan, np.inf, -np.inf, -0.0, 1.0], np.float32)
    save_gguf(tmp_path / "t.gguf", {"x": values}, "arch")
    loaded = load_gguf(tmp_path / "t.gguf").tensors["x"]
    assert np.isnan(loaded[0]) and loaded[1] == np.inf and loaded[2] == -np.inf
    assert np.signbit(loaded[3])


def test_non_contiguous_and_big_endian_inputs_are_written_in_numpy_order(tmp_path):
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    arrays = {"transposed": base.T, "big_endian": base.astype(">f8"), "strided": base[:, ::2]}
    save_gguf(tmp_path / "t.gguf", arrays, "arch")
    gf = load_gguf(tmp_path / "t.gguf")
    for name, array in arrays.items():
        np.testing.assert_array_equal(gf.tensors[name], array)
        assert gf.tensors[name].dtype == np.float64 and gf.tensors[name].flags.c_contiguous


def test_metadata_of_each_type_round_trips(tmp_path):
    metadata = {
        "flag.on": True, "flag.off": False,
        "int.zero": 0, "int.neg": -1, "int.min": -(2**63), "int.max": 2**63 - 1,
        "np.int": np.int32(-5), "np.float": np.float32(0.1), "np.bool": np.bool_(True),
        "float.tenth": 0.1, "float.tiny": 5e-324, "float.inf": math.inf, "float.ninf": -math.inf,
        "str.empty": "", "str.unicode": "héllo wörld ✓",
        "list.str": ["a", "", "ü"], "list.int": [1, -2, 2**40], "list.float": [0.5, math.inf],
        "list.bool": [True, False], "tuple.int": (3, 4),
    }
    save_gguf(tmp_path / "t.gguf", {"x": np.zeros(1, np.float32)}, "arch", metadata)
    loaded = load_gguf(tmp_path / "t.gguf").metadata
    expected = {key: list(v) if isinstance(v, tuple) else v for key, v in metadata.items()}
    expected.update({"np.int": -5, "np.float": float(np.float32(0.1)), "np.bool": True})
    assert loaded == expected
    assert all(type(loaded[k]) is type(expected[k]) for k in expected)
    assert type(loaded["np.int"]) is int and type(loaded["np.bool"]) is bool


def test_nan_metadata_round_trips(tmp_path):
    save_gguf(tmp_path / "t.gguf", {}, "arch", {"nan": math.nan, "nans": [math.nan, 1.0]})
    loaded = load_gguf(tmp_path / "t.gguf").metadata
    assert math.isnan(loaded["nan"]) and math.isnan(loaded["nans"][0])


def test_metadata_gguf_types_are_chosen_for_exact_round_trips(tmp_path):
    save_gguf(tmp_path / "t.gguf", {}, "arch", {"b": True, "i": 1, "f": 1.0, "s": "x",
                                                "li": [1], "lf": [1.0], "ls": ["x"]})
    fields = gguf.GGUFReader(tmp_path / "t.gguf").fields
    t = gguf.GGUFValueType
    assert fields["general.architecture"].types == [t.STRING]
    assert fields["b"].types == [t.BOOL] and fields["i"].types == [t.INT64]
    assert fields["f"].types == [t.FLOAT64] and fields["s"].types == [t.STRING]
    assert fields["li"].types == [t.ARRAY, t.INT64] and fields["lf"].types == [t.ARRAY, t.FLOAT64]
    assert fields["ls"].types == [t.ARRAY, t.STRING]


# --- ggml layout and files -------------------------------------------------------------------

def test_file_has_ggml_ne_order(tmp_path):
    arrays = {"fc1.weight": np.zeros((500, 784), np.float32), "k": np.zeros((8, 1, 3, 3), np.int32),
              "v": np.zeros((7,), np.float64)}
    save_gguf(tmp_path / "t.gguf", arrays, "mnist-fc")
    reader = gguf.GGUFReader(tmp_path / "t.gguf")
    by_name = {t.name: t for t in reader.tensors}
    assert by_name["fc1.weight"].shape.tolist() == [784, 500]
    assert by_name["k"].shape.tolist() == [3, 3, 1, 8]
    assert by_name["v"].shape.tolist() == [7]
    q = gguf.GGMLQuantizationType
    assert [by_name[n].tensor_type for n in ("fc1.weight", "k", "v")] == [q.F32, q.I32, q.F64]
    assert reader.get_field("general.architecture").contents() == "mnist-fc"


def test_element_order_matches_ggml(tmp_path):
    # ggml element (i0, i1) of ne = [3, 2] is numpy element [i1, i0]: same bytes, C order.
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    save_gguf(tmp_path / "t.gguf", {"x": array}, "arch")
    tensor = gguf.GGUFReader(tmp_path / "t.gguf").tensors[0]
    assert tensor.shape.tolist() == [3, 2]
    assert np.asarray(tensor.data).ravel().tolist() == [0, 1, 2, 3, 4, 5]


def write_like_ggml_mnist(path, arch, arrays, **writer_options):
    writer = gguf.GGUFWriter(path, arch, **writer_options)
    writer.add_architecture()
    for name, array in arrays.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_file_written_like_ggml_mnist_script_loads(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {name: rng.normal(size=shape).astype(np.float32)
              for name, (shape, _) in FC_SPEC.items()}
    write_like_ggml_mnist(tmp_path / "mnist-fc-f32.gguf", "mnist-fc", arrays)
    gf = load_gguf(tmp_path / "mnist-fc-f32.gguf", arch="mnist-fc")
    expect_tensors(gf, FC_SPEC)
    for name, array in arrays.items():
        assert same_bits(gf.tensors[name], array)
    assert gf.metadata == {}


def test_cnn_model_shapes_round_trip(tmp_path):
    spec = {"conv1.kernel": ((8, 1, 3, 3), np.float32), "conv1.bias": ((8, 1, 1), np.float32),
            "conv2.kernel": ((16, 8, 3, 3), np.float32), "conv2.bias": ((16, 1, 1), np.float32),
            "dense.weight": ((10, 784), np.float32), "dense.bias": ((10,), np.float32)}
    arrays = {name: sample(shape, dtype) for name, (shape, dtype) in spec.items()}
    save_gguf(tmp_path / "cnn.gguf", arrays, "mnist-cnn")
    expect_tensors(load_gguf(tmp_path / "cnn.gguf", arch="mnist-cnn"), spec)


def test_big_endian_file_loads_as_native(tmp_path):
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_like_ggml_mnist(tmp_path / "be.gguf", "arch", {"x": array},
                          endianess=gguf.GGUFEndian.BIG)
    loaded = load_gguf(tmp_path / "be.gguf").tensors["x"]
    assert loaded.dtype == np.float32 and loaded.dtype.isnative
    np.testing.assert_array_equal(loaded, array)


# --- atomic writes ---------------------------------------------------------------------------

def test_unsupported_dtype_midway_leaves_existing_file_and_no_temp_files(tmp_path):
    path = small_file(tmp_path / "model.gguf")
    before = path.read_bytes()
    arrays = {"first": np.ones(3, np.float32), "bad.half": np.ones(3, np.int16),
              "last": np.ones(3, np.float32)}
    with pytest.raises(GGUFFormatError, match=r"tensor 'bad.half': unsupported dtype int16"):
        save_gguf(path, arrays, "test-arch")
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.gguf"]


def test_failure_while_writing_leaves_existing_file_and_no_temp_files(tmp_path, monkeypatch):
    path = small_file(tmp_path / "model.gguf")
    before = path.read_bytes()

    def fail_midway(out, arrays, alignment):
        out.write(b"partial tensor data")
        raise OSError("disk full")

    monkeypatch.setattr(gguf_io, "_write_tensor_data", fail_midway)
    with pytest.raises(WriteError, match=r"cannot write .*model.gguf: disk full"):
        save_gguf(path, {"x": np.ones(4, np.float32)}, "test-arch")
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.gguf"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_device_is_a_write_error_naming_it():
    with pytest.raises(WriteError, match=r"^cannot write /dev/full: No space left on device$"):
        save_gguf("/dev/full", {"x": np.ones(4, np.float32)}, "test-arch")


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_io_error_at_sync_or_rename_keeps_the_old_file(tmp_path, monkeypatch, failing):
    import errno
    path = small_file(tmp_path / "model.gguf")
    before = path.read_bytes()

    def eio(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, failing, eio)
    with pytest.raises(WriteError, match=r"model.gguf: Input/output error") as info:
        save_gguf(path, {"x": np.ones(4, np.float32)}, "test-arch")
    assert info.value.errno == errno.EIO and isinstance(info.value, (OSError, EngineError))
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.gguf"]


def test_directory_that_vanishes_before_the_write_is_a_write_error(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    gone.rmdir()
    with pytest.raises(WriteError, match=r"gone/m.gguf: directory .*gone does not exist"):
        save_gguf(gone / "m.gguf", {"x": np.ones(4, np.float32)}, "test-arch")
    with pytest.raises(WriteError, match=r"is not a directory"):
        save_gguf(small_file(tmp_path / "f.gguf") / "m.gguf", {"x": np.ones(1)}, "arch")
    assert os.listdir(tmp_path) == ["f.gguf"]


def test_save_replaces_existing_file_with_umask_permissions(tmp_path):
    path = small_file(tmp_path / "model.gguf")
    save_gguf(path, {"y": np.ones(2, np.float64)}, "other")
    assert list(load_gguf(path, arch="other").tensors) == ["y"]
    assert sorted(os.listdir(tmp_path)) == ["model.gguf"]
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


# --- errors on saving ------------------------------------------------------------------------

@pytest.mark.parametrize("tensors, match", [
    ({"x": np.ones(3, np.int64)}, r"tensor 'x': unsupported dtype int64"),
    ({"x": np.ones(3, bool)}, r"tensor 'x': unsupported dtype bool"),
    ({"x": np.array([None])}, r"tensor 'x': unsupported dtype object"),
    ({"x": np.float32(1.0)}, r"tensor 'x': expected a numpy array, got float32"),
    ({"x": np.array(1.0, np.float32)}, r"tensor 'x': 0-d arrays are not stored; reshape it"),
    ({"x": np.ones((1,) * 5, np.float32)}, r"tensor 'x': shape \[1, 1, 1, 1, 1\] has 5 dim"),
    ({"x" * 64: np.ones(1, np.float32)}, r"name is 64 bytes; ggml allows at most 63"),
    ({"": np.ones(1, np.float32)}, r"tensor names must be non-empty strings"),
    ({"x": [1.0, 2.0]}, r"tensor 'x': expected a numpy array, got list"),
])
def test_tensors_gguf_cannot_hold_are_refused(tmp_path, tensors, match):
    with pytest.raises(GGUFFormatError, match=match):
        save_gguf(tmp_path / "t.gguf", tensors, "arch")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("metadata, match", [
    ({"k": []}, r"metadata 'k': an empty list cannot be stored"),
    ({"k": [1, 2.0]}, r"metadata 'k': list mixes element types \['FLOAT64', 'INT64'\]"),
    ({"k": [True, 1]}, r"metadata 'k': list mixes element types"),
    ({"k": [[1]]}, r"metadata 'k': unsupported value \[1\] of type list"),
    ({"k": None}, r"metadata 'k': unsupported value None of type NoneType"),
    ({"k": {"a": 1}}, r"metadata 'k': unsupported value .* of type dict"),
    ({"k": 2**63}, r"metadata 'k': int 9223372036854775808 does not fit in INT64"),
    ({"k": "\ud800"}, r"metadata 'k': string is not encodable as UTF-8"),
    ({"general.architecture": "x"}, r"metadata key 'general.architecture' is reserved"),
    ({"general.alignment": 64}, r"metadata key 'general.alignment' is reserved"),
    ({"GGUF.version": 3}, r"metadata key 'GGUF.version' is reserved"),
    ({3: "x"}, r"metadata keys must be non-empty strings, got 3"),
])
def test_metadata_gguf_cannot_hold_is_refused(tmp_path, metadata, match):
    with pytest.raises(GGUFFormatError, match=match):
        save_gguf(tmp_path / "t.gguf", {}, "arch", metadata)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("arch", ["", None, 3])
def test_bad_arch_is_refused(tmp_path, arch):
    with pytest.raises(GGUFFormatError, match="arch must be a non-empty string"):
        save_gguf(tmp_path / "t.gguf", {}, arch)


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


# --- expect_tensors --------------------------------------------------------------------------

def fc_file(**overrides):
    tensors = {name: np.zeros(shape, dtype) for name, (shape, dtype) in FC_SPEC.items()}
    tensors.update(overrides)
    return GGUFFile("mnist-fc", {k: v for k, v in tensors.items() if v is not None}, {}, "m.gguf")


def test_expect_tensors_accepts_a_match():
    expect_tensors(fc_file(), FC_SPEC)


@pytest.mark.parametrize("gf, match", [
    (fc_file(**{"fc2.bias": None}), r"m.gguf .*missing 'fc2.bias'$"),
    (fc_file(extra=np.zeros(1, np.float32)), r"unexpected 'extra'$"),
    (fc_file(**{"fc1.weight": np.zeros((784, 500), np.float32)}),
     r"'fc1.weight' has shape \[784, 500\], expected \[500, 784\]"),
    (fc_file(**{"fc1.bias": np.zeros(500, np.float64)}),
     r"'fc1.bias' has dtype float64, expected float32"),
])
def test_expect_tensors_names_each_problem(gf, match):
    with pytest.raises(GGUFFormatError, match=match):
        expect_tensors(gf, FC_SPEC)


def test_expect_tensors_names_every_problem_at_once():
    gf = fc_file(**{"fc1.bias": None, "fc2.bias": None, "fc2.weight": np.zeros((10,), np.int32)},
                 extra=np.zeros(1, np.float32))
    with pytest.raises(GGUFFormatError) as info:
        expect_tensors(gf, FC_SPEC)
    message = str(info.value)
    for part in ("missing 'fc1.bias', 'fc2.bias'",
                 "'fc2.weight' has shape [10], expected [10, 500]",
                 "'fc2.weight' has dtype int32, expected float32", "unexpected 'extra'",
                 "architecture 'mnist-fc'"):
        assert part in message


# --- crafted headers: checked as ggml checks them, before any data is read --------------------

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
    monkeypatch.setattr(gguf_io, cap, 10)
    path = write(tmp_path, craft(tensors, kvs))
    with pytest.raises(GGUFFormatError, match=r"t.gguf: " + match):
        load_gguf(path)


def test_header_bytes_are_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_io, "MAX_HEADER_BYTES", 200)
    path = write(tmp_path, craft(kvs=[kv("k", T.STRING, pack_str(b"x" * 300))]))
    with pytest.raises(GGUFFormatError, match=r"GGUF header too large: metadata 'k' reaches "
                                              r"byte \d+; at most 200 header bytes"):
        load_gguf(path)


def test_a_million_element_array_is_refused_in_milliseconds(tmp_path):
    million = kv("k", T.ARRAY, struct.pack("<IQ", T.INT8, 10**6) + bytes(10**6))
    path = write(tmp_path, craft([(b"a", [4], F32, 0)], [million]))
    start = time.perf_counter()
    with pytest.raises(GGUFFormatError, match=r"has 1000000 elements; at most 65536"):
        load_gguf(path)
    assert time.perf_counter() - start < 0.25


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


# --- reading only what the caller asks for ----------------------------------------------------

def recording_reads(monkeypatch):
    reads = []
    read = gguf_io._BoundedReader.read_tensor
    monkeypatch.setattr(gguf_io._BoundedReader, "read_tensor",
                        lambda self, t: reads.append(t.name) or read(self, t))
    return reads


def test_expect_is_checked_against_the_header_before_any_tensor_is_read(tmp_path, monkeypatch):
    arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in FC_SPEC.items()}
    save_gguf(tmp_path / "m.gguf", {**arrays, "extra": np.zeros(3, np.float32)}, "mnist-fc")
    reads = recording_reads(monkeypatch)
    with pytest.raises(GGUFFormatError, match=r"m.gguf \(architecture 'mnist-fc'\): tensors do "
                                              r"not match: unexpected 'extra'$"):
        load_gguf(tmp_path / "m.gguf", expect=FC_SPEC)
    wrong = {**FC_SPEC, "fc1.bias": ((501,), np.float32)}
    with pytest.raises(GGUFFormatError, match=r"'fc1.bias' has shape \[500\], expected \[501\]"):
        load_gguf(tmp_path / "m.gguf", expect=wrong)
    assert reads == []
    save_gguf(tmp_path / "m.gguf", arrays, "mnist-fc")
    gf = load_gguf(tmp_path / "m.gguf", "mnist-fc", expect=FC_SPEC)
    expect_tensors(gf, FC_SPEC)
    assert reads == list(FC_SPEC)


def test_sparse_huge_extra_tensor_costs_nothing_with_expect(tmp_path, monkeypatch):
    path = write(tmp_path, craft([(b"a", [4], F32, 0), (b"big", [2**28], F32, 32)], data=b""))
    os.truncate(path, path.stat().st_size + 32 + 2**30)   # sparse: no disk, no memory
    reads = recording_reads(monkeypatch)
    with pytest.raises(GGUFFormatError, match=r"unexpected 'big'"):
        load_gguf(path, expect={"a": ((4,), np.float32)})
    assert reads == []


def test_select_sees_arch_metadata_and_header_and_reads_only_its_names(tmp_path, monkeypatch):
    path = small_file(tmp_path / "t.gguf")
    seen = []

    def select(arch, metadata, tensors):
        seen.append((arch, metadata, tensors))
        return ["c"]

    reads = recording_reads(monkeypatch)
    gf = load_gguf(path, expect=select)
    assert list(gf.tensors) == ["c"] and reads == ["c"]
    assert seen == [("test-arch", {"note": "hello", "n": 7},
                     {"a.b": ((2, 3), np.dtype(np.float32)), "c": ((5,), np.dtype(np.int32))})]


# --- writing through links, into streams, never over read-only files -------------------------

def test_symlink_output_stays_a_link_and_its_target_is_replaced(tmp_path):
    real = small_file(tmp_path / "real.gguf")
    (tmp_path / "link.gguf").symlink_to("real.gguf")
    save_gguf(tmp_path / "link.gguf", {"y": np.ones(2, np.float64)}, "other")
    assert (tmp_path / "link.gguf").is_symlink()
    assert list(load_gguf(real, arch="other").tensors) == ["y"]
    assert sorted(os.listdir(tmp_path)) == ["link.gguf", "real.gguf"]


def test_dangling_symlink_output_creates_its_target(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.gguf").symlink_to(tmp_path / "sub" / "new.gguf")
    save_gguf(tmp_path / "link.gguf", {"y": np.ones(2, np.float64)}, "other")
    assert (tmp_path / "link.gguf").is_symlink()
    assert sorted(os.listdir(tmp_path / "sub")) == ["new.gguf"]


def test_pipe_and_fifo_outputs_are_written_straight_into(tmp_path):
    small_file(tmp_path / "plain.gguf")
    expected = (tmp_path / "plain.gguf").read_bytes()
    read_end, write_end = os.pipe()
    try:
        small_file(f"/dev/fd/{write_end}")   # a pipe: no tell(), no seek, nothing to replace
        os.close(write_end)
        with os.fdopen(read_end, "rb") as reader:
            assert reader.read() == expected
    finally:
        for fd in (read_end, write_end):
            with contextlib.suppress(OSError):
                os.close(fd)
    os.mkfifo(tmp_path / "fifo")
    got = []
    reader = threading.Thread(target=lambda: got.append((tmp_path / "fifo").read_bytes()))
    reader.start()
    small_file(tmp_path / "fifo")
    reader.join(5)
    assert got == [expected] and stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode)
    assert sorted(os.listdir(tmp_path)) == ["fifo", "plain.gguf"]


def test_character_device_output_is_written_straight_into(tmp_path):
    # a node of its own for the null device: a regression must not replace the real /dev/null
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError as exc:
        pytest.skip(f"cannot create a device node here: {exc}")
    save_gguf(device, {"x": np.ones(3, np.float32)}, "arch")
    assert stat.S_ISCHR(os.stat(device).st_mode)
    assert os.listdir(tmp_path) == ["null"]


def test_block_device_output_is_refused_before_it_is_opened(tmp_path):
    # a node of its own (a loop device's numbers): never opened, since it is refused first
    device = tmp_path / "disk"
    try:
        os.mknod(device, stat.S_IFBLK | 0o600, os.makedev(7, 0))
    except OSError as exc:
        pytest.skip(f"cannot create a device node here: {exc}")
    with pytest.raises(WriteError, match="not a regular file, FIFO or character device"):
        save_gguf(device, {"x": np.ones(3, np.float32)}, "arch")
    assert stat.S_ISBLK(os.stat(device).st_mode) and os.listdir(tmp_path) == ["disk"]


@pytest.mark.parametrize("through_link", [False, True])
def test_read_only_file_is_refused_even_as_root(tmp_path, through_link):
    path = small_file(tmp_path / "model.gguf")
    before = path.read_bytes()
    path.chmod(0o444)
    target = path
    if through_link:
        target = tmp_path / "link.gguf"
        target.symlink_to(path)
    with pytest.raises(WriteError, match=rf"cannot write .*{target.name}: it is read-only"):
        save_gguf(target, {"y": np.ones(2)}, "other")
    assert path.read_bytes() == before
    assert len(os.listdir(tmp_path)) == 1 + through_link


def test_directory_output_is_refused_before_writing(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(WriteError, match=r"cannot write .*d: it is a directory"):
        save_gguf(tmp_path / "d", {"y": np.ones(2)}, "other")
    assert os.listdir(tmp_path) == ["d"]


def test_empty_and_zero_size_tensors_round_trip(tmp_path):
    arrays = {"empty": np.zeros((0, 3), np.float32), "one": np.ones(1, np.int8)}
    save_gguf(tmp_path / "t.gguf", arrays, "arch")
    gf = load_gguf(tmp_path / "t.gguf")
    assert gf.tensors["empty"].shape == (0, 3) and gf.tensors["one"].tolist() == [1]
