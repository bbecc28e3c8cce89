"""Graph files (engine.graph_io, engine.graph_format) that cannot be read or written: every
malformed-file error names the problem (and nothing else escapes), and what a graph file
cannot hold is refused before anything is written."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine
from engine import ops
from engine.gguf_io import GGUFFormatError, load_gguf, save_gguf
from engine.graph_format import (
    GraphFileError,
    decode_params,
)
from engine.graph_io import graph_from_gguf, load_graph, save_graph
from engine.tensor import shared_leaf
from mnist_target.models import Model

# --- malformed files -------------------------------------------------------------------------

def small_graph():
    """x (param) -> scale -> sum = loss, with an accumulating backward pass."""
    x = engine.param((2, 3), name="x")
    x.set(np.arange(6).reshape(2, 3))
    loss = ops.sum(ops.scale(x, 2.0)).set_loss()
    graph = engine.Graph([loss], name="small")
    graph.build_backward(loss, accumulate=True)
    return graph, x, loss


@pytest.fixture
def small_file(tmp_path):
    graph, x, loss = small_graph()
    save_graph(tmp_path / "small.gguf", graph, roles={"x": x, "loss": loss})
    return tmp_path / "small.gguf"


def rewrite(path, edit, arch="gradverify-graph"):
    """Load `path`'s tensors and metadata, let `edit(tensors, meta)` change them, save."""
    gf = load_gguf(path)
    tensors, meta = dict(gf.tensors), dict(gf.metadata)
    edit(tensors, meta)
    save_gguf(path, tensors, arch, meta)


def node_edit(key, op, value):
    """Set the first `op` node's entry ("" = the first leaf) of the array `key` to `value`
    (a list replaces as many values; in node.dims and node.srcs, from the node's slice)."""
    def edit(tensors, meta):
        i = meta["graph.node.op"].index(op)
        counts = {"graph.node.dims": "graph.node.ndim", "graph.node.srcs": "graph.node.nsrcs"}
        i = sum(meta[counts[key]][:i]) if key in counts else i
        values = value if isinstance(value, list) else [value]
        meta[key] = [*meta[key][:i], *values, *meta[key][i + len(values):]]
    return edit


def set_key(key, value):
    return lambda tensors, meta: meta.update({key: value})


def put_tensor(name, array):
    return lambda tensors, meta: tensors.update({name: array})


F32, F64 = np.float32, np.float64
PARAMS, SRCS, DIMS = "graph.node.params", "graph.node.srcs", "graph.node.dims"
MALFORMED = {   # case: (edit, the error message, a regex)
    "unknown op": (node_edit("graph.node.op", "scale", "os.system"), "unknown op 'os.system'"),
    "op name with a newline": (node_edit("graph.node.op", "scale", "sc\nale"),
                               r"op 'sc\\nale'\): unknown op 'sc\\nale'"),
    "composite op": (node_edit("graph.node.op", "scale", "mean"), "composite"),
    "source out of range": (node_edit(SRCS, "scale", 99), "source index 99"),
    "source not earlier": (node_edit(SRCS, "sum", 3), "index 3 is out of range or not earlier"),
    "negative source": (node_edit(SRCS, "scale", -1), r"node 1: graph.node.srcs gives it \[-1\]"),
    "negative dimension": (node_edit(DIMS, "", -2), r"node 0: graph.node.dims gives it \[-2, 3\]"),
    "params not JSON": (node_edit(PARAMS, "scale", "{'scale': 2.0"),
                        r"node 1 \('scale_\d+', op 'scale'\): params are not valid JSON"),
    "params not an object": (node_edit(PARAMS, "scale", "[2.0]"), "JSON object"),
    "python code in params": (node_edit(PARAMS, "scale", '{"scale": "__import__(\'os\')"}'),
                              "scale: parameter scale must be a number"),
    "params the op lacks": (node_edit(PARAMS, "scale", '{"factor": 2.0}'), "rejects its"),
    "stored shape disagrees": (node_edit(DIMS, "scale", [3, 2]),
                               r"stored as \[3, 2\] f32, but the op infers \[2, 3\] f32"),
    "stored dtype disagrees": (node_edit("graph.node.dtype", "scale", "f64"),
                               r"stored as \[2, 3\] f64, but the op infers \[2, 3\] f32"),
    "unknown dtype": (node_edit("graph.node.dtype", "scale", "f8"), "unknown dtype 'f8'"),
    "unknown flag": (node_edit("graph.node.flags", "scale", "OUTPUT|ROOT"), "unknown flag"),
    "param flag on an op node": (node_edit("graph.node.flags", "scale", "PARAM"),
                                 "only leaves may be flagged PARAM"),
    "leaf without flags": (node_edit("graph.node.flags", "", ""), "must be persistent"),
    "leaf with sources": (lambda t, m: m.update({SRCS: [*m[SRCS], 0], "graph.node.nsrcs": [
        *m["graph.node.nsrcs"][:-1], 1]}), "with no sources"),
    "counts disagree": (node_edit("graph.node.nsrcs", "", 1), "disagree"),
    "missing param data": (lambda t, m: t.pop("node.0"), r"node 0 \('x', flags PARAM\): no data"),
    "data shape mismatch": (put_tensor("node.0", np.zeros((3, 2), F32)),
                            r"data is \[3, 2\] float32, the node is \[2, 3\] float32"),
    "data dtype mismatch": (put_tensor("node.0", np.zeros((2, 3), F64)), r"\[2, 3\] float64"),
    "data for no leaf": (put_tensor("node.1", np.zeros((2, 3), F32)), "no persistent leaf"),
    "unsupported version": (set_key("graph.format_version", 2), "format version 2"),
    "version missing": (lambda t, m: m.pop("graph.format_version"), "version is missing"),
    "version not an int": (set_key("graph.format_version", "1"), "must be of type int"),
    "node table missing": (lambda t, m: m.pop("graph.node.op"), "graph.node.op is missing"),
    "node table too short": (lambda t, m: m.update({"graph.node.op": m["graph.node.op"][1:]}),
                             "has 7 values for 8 entries"),
    "node count too large": (set_key("graph.node_count", 99), "node_count 99"),
    "op among the detached leaves": (set_key("graph.node_count", 5), "must be leaves"),
    "output out of range": (set_key("graph.outputs", [50]), "graph.outputs holds 50"),
    "outputs miss a node": (set_key("graph.outputs", [3]), "not the graph of the stored"),
    "gradient of the wrong shape": (set_key("graph.backward.grads", [3]), "cannot belong to"),
    "accumulate disagrees": (set_key("graph.backward.accumulate", False), "disagrees"),
    "role out of range": (set_key("graph.role.nodes", [0, 77]), "graph.role.nodes holds 77"),
    # issue 18: params that made the load raise RecursionError or ValueError, or that loaded
    # and made compute raise TypeError
    "params nested 600 deep": (node_edit(PARAMS, "scale", '{"scale": ' + "[" * 600 +
                                         "]" * 600 + "}"),
                               r"node 1 \('scale_\d+', op 'scale'\): params nest more than 8"),
    "params too long": (node_edit(PARAMS, "scale", '{"scale": 2.0, "pad": "' + "x" * 70000 +
                                  '"}'), "params are 70025 characters long, more than 65536"),
    "5000-digit integer": (node_edit(PARAMS, "scale", '{"scale": ' + "9" * 5000 + "}"),
                           r"op 'scale'\): param 'scale': integer 9+\.\.\. \(5000 digits\) is "
                           "outside"),
    "integer beyond uint64": (node_edit(PARAMS, "sum", '{"axes": [18446744073709551616], '
                                        '"keepdims": false}'), "param 'axes': integer 1844"),
    "bare 1e400": (node_edit(PARAMS, "scale", '{"scale": 1e400}'),
                   "param 'scale': number 1e400 is not a finite float"),
    "bools as axes": (node_edit(PARAMS, "sum", '{"axes": [true, false], "keepdims": false}'),
                      r"op 'sum'\): the op rejects .*sum: axes must be a sequence of ints"),
    "float axes": (node_edit(PARAMS, "sum", '{"axes": [0.0, 1], "keepdims": false}'),
                   "sum: axes must be a sequence of ints"),
    "0 as a bool": (node_edit(PARAMS, "sum", '{"axes": [0, 1], "keepdims": 0}'),
                    "sum: keepdims must be True or False, got 0"),
    "a bool as a float": (node_edit(PARAMS, "scale", '{"scale": true}'),
                          "scale: parameter scale must be a number, got True"),
    "undeclared param": (node_edit(PARAMS, "sum", '{"axes": [0, 1], "keepdims": false, '
                                   '"x": 1}'), r"sum: takes parameters \['axes', 'keepdims'\]"),
    "70 axes": (lambda t, m: m.update({"graph.node.ndim": [70, *m["graph.node.ndim"][1:]],
                                       DIMS: [1] * 70 + m[DIMS][2:]}),
                r"node 0 \('x'\) has 70 axes; at most 32"),
    "bools as counts": (lambda t, m: m.update({"graph.node.nsrcs": [True] * 8}),
                        "graph.node.nsrcs must be an array of int"),
    "a string as an index": (set_key("graph.backward.loss", "2"), "must be of type int"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=str)
def test_malformed_graph_files_raise_naming_the_problem(case, small_file):
    edit, match = MALFORMED[case]
    rewrite(small_file, edit)
    with pytest.raises(GraphFileError, match=match) as info:
        load_graph(small_file)
    assert "\n" not in str(info.value)   # names from the file are quoted


def shaped_graph():
    """x (param, [2, 3]) -> reshape [6] -> broadcast_to [4, 6] -> sum = loss."""
    x = engine.param((2, 3), name="x")
    x.set(np.arange(6).reshape(2, 3))
    loss = ops.sum(ops.broadcast_to(ops.reshape(x, (6,)), (4, 6))).set_loss()
    return engine.Graph([loss], name="shaped")


def test_float_shape_in_a_file_is_refused_on_load_not_in_compute(tmp_path):
    """{"shape": [6.0]} used to load (6.0 == 6) and raise TypeError in compute."""
    path = tmp_path / "g.gguf"
    save_graph(path, shaped_graph())
    rewrite(path, node_edit(PARAMS, "reshape", '{"shape": [6.0]}'))
    with pytest.raises(GraphFileError, match=r"g.gguf: node 1 \('reshape_\d+', op 'reshape'\): "
                                             r"the op rejects .*reshape: shape must be a "
                                             r"sequence of ints .*6\.0"):
        load_graph(path)


def test_huge_inferred_shapes_are_refused(tmp_path):
    """A [6] node broadcast to [2^33, 6] is a valid node, but computing it would take 200 GB:
    the file's shapes together are bounded (MAX_GRAPH_ELEMENTS)."""
    path = tmp_path / "g.gguf"
    save_graph(path, shaped_graph())
    rewrite(path, lambda t, m: (node_edit(PARAMS, "broadcast_to", '{"shape": [8589934592, 6]}')(
        t, m), node_edit(DIMS, "broadcast_to", [2 ** 33, 6])(t, m)))
    with pytest.raises(GraphFileError, match=r"node 2 \('broadcast_to_\d+'\) of shape "
                                             r"\[8589934592, 6\] brings the graph past 4294967296"):
        load_graph(path)


def test_deep_params_never_recurse():
    """Nesting far beyond the recursion limit is refused by a linear scan, not a
    RecursionError; brackets inside strings do not count."""
    with pytest.raises(GraphFileError, match="nest more than 8"):
        decode_params('{"a": ' + "[" * 30_000 + "]" * 30_000 + "}")
    assert decode_params('{"a": "' + "[{" * 100 + '", "b": [[1], [2, "]]]]]]]]]"]]}') == \
        {"a": "[{" * 100, "b": ((1,), (2, "]]]]]]]]]"))}


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    """The small graph's file, read once, for the metadata fuzzing below."""
    graph, x, loss = small_graph()
    path = tmp_path_factory.mktemp("fuzz") / "small.gguf"
    save_graph(path, graph, roles={"x": x, "loss": loss})
    return load_gguf(path)


wrong_values = st.one_of(
    st.integers(-2 ** 63, 2 ** 64 - 1), st.sampled_from([0, 1, -1, 2, 7, 8, 2 ** 40]),
    st.booleans(), st.floats(), st.text(max_size=8),
    st.lists(st.integers(-3, 2 ** 40) | st.booleans() | st.text(max_size=3), max_size=6))


@given(data=st.data())
def test_any_metadata_value_loads_or_raises_graph_file_error(small_gguf, data):
    """One graph.* key (or one element of an array key) set to a value of a wrong type or out
    of range: the file loads, or raises GraphFileError; never another exception."""
    meta = dict(small_gguf.metadata)
    key = data.draw(st.sampled_from(sorted(k for k in meta if k.startswith("graph."))))
    value = data.draw(wrong_values)
    if isinstance(meta[key], list) and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(meta[key]) - 1))
        value = [*meta[key][:i], value, *meta[key][i + 1:]]
    meta[key] = value
    gf = dataclasses.replace(small_gguf, metadata=meta,
                             tensors={k: v.copy() for k, v in small_gguf.tensors.items()})
    try:
        graph_from_gguf(gf)
    except GraphFileError:
        pass


def test_model_file_and_other_architectures_are_not_graphs(tmp_path, small_file):
    rewrite(small_file, lambda t, m: None, arch="llama")
    with pytest.raises(GraphFileError, match="'llama', expected 'gradverify-graph'"):
        load_graph(small_file)
    Model.new("fc").save(tmp_path / "fc.gguf")
    with pytest.raises(GraphFileError, match="this is an MNIST model file .mnist-fc., not a "
                                             "graph file"):
        load_graph(tmp_path / "fc.gguf")


@pytest.mark.parametrize("keep", [0.3, 0.9, 0.999])
def test_truncated_file(small_file, keep):
    data = small_file.read_bytes()
    small_file.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(GGUFFormatError, match="truncated"):
        load_graph(small_file)


# --- what cannot be exported -----------------------------------------------------------------

def test_export_refuses_what_a_graph_file_cannot_hold(tmp_path):
    path = tmp_path / "g.gguf"
    y = ops.scale(engine.param((2,), name="x"), 2.0)
    y.params["scale"] = np.float32(2.0)   # as a builder that forgot float() would store it
    with pytest.raises(GraphFileError, match=r"param 'scale': value .*2.0.* of type float32"):
        save_graph(path, engine.Graph([y]))
    x = engine.param((2,), name="x").set_output()
    with pytest.raises(GraphFileError, match="reads the buffer of 'x' in another graph"):
        save_graph(path, engine.Graph([ops.scale(shared_leaf(x, name="x@other"), 2.0)]))
    with pytest.raises(GraphFileError, match="a leaf must hold its own data"):
        save_graph(path, engine.Graph([ops.scale(engine.Tensor((2,), "f32"), 2.0)]))
    graph, _, _ = small_graph()
    with pytest.raises(GraphFileError, match=r"metadata keys \['graph.name'\] are reserved"):
        save_graph(path, graph, metadata={"graph.name": "x"})
    with pytest.raises(GraphFileError, match="role 'y'"):
        save_graph(path, graph, roles={"y": engine.param((1,))})
    assert list(tmp_path.iterdir()) == []   # nothing written, no temporary file left
