"""GGUF I/O: round trips, ggml's layout and MNIST files, checking tensors against a spec,
and reading only the tensors a caller asks for (errors on reading: test_gguf_read; writing
safely and its errors: test_gguf_write)."""

from __future__ import annotations

import math
import os

import gguf
import numpy as np
import pytest

from engine import gguf_io
from engine.gguf_io import GGUFFile, GGUFFormatError, expect_tensors, load_gguf, save_gguf
from tests.engine.gguf_samples import (
    F32,
    FC_SPEC,
    craft,
    same_bits,
    sample,
    small_file,
    write,
    write_like_ggml_mnist,
)

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


def test_empty_and_zero_size_tensors_round_trip(tmp_path):
    arrays = {"empty": np.zeros((0, 3), np.float32), "one": np.ones(1, np.int8)}
    save_gguf(tmp_path / "t.gguf", arrays, "arch")
    gf = load_gguf(tmp_path / "t.gguf")
    assert gf.tensors["empty"].shape == (0, 3) and gf.tensors["one"].tolist() == [1]
