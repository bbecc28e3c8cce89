"""GGUF I/O: round trips, ggml's layout and MNIST files, atomic writes, clear errors."""

from __future__ import annotations

import math
import os

import gguf
import numpy as np
import pytest

from engine import gguf_io
from engine.errors import EngineError
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
    arrays = {"first": np.ones(3, np.float32), "bad.half": np.ones(3, np.float16),
              "last": np.ones(3, np.float32)}
    with pytest.raises(GGUFFormatError, match=r"tensor 'bad.half': unsupported dtype float16"):
        save_gguf(path, arrays, "test-arch")
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.gguf"]


def test_failure_while_writing_leaves_existing_file_and_no_temp_files(tmp_path, monkeypatch):
    path = small_file(tmp_path / "model.gguf")
    before = path.read_bytes()

    def fail_midway(writer, **_):
        writer.fout[0].write(b"partial tensor data")
        raise OSError("disk full")

    monkeypatch.setattr(gguf_io.GGUFWriter, "write_tensors_to_file", fail_midway)
    with pytest.raises(OSError, match="disk full"):
        save_gguf(path, {"x": np.ones(4, np.float32)}, "test-arch")
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.gguf"]


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


@pytest.mark.parametrize("dtype, type_name", [(np.float16, "F16"), (np.int64, "I64"),
                                              (np.int16, "I16")])
def test_unsupported_tensor_type(tmp_path, dtype, type_name):
    write_like_ggml_mnist(tmp_path / "t.gguf", "arch", {"w.half": np.ones((2, 2), dtype)})
    with pytest.raises(GGUFFormatError, match=rf"tensor 'w.half' has unsupported type {type_name}"):
        load_gguf(tmp_path / "t.gguf")


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
