"""Graph files (engine.graph_io, engine.graph_format): op params as JSON, and registry and
MNIST round trips (bitwise); every malformed-file error: test_graph_io_malformed."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine
from engine import ops
from engine.graph_format import (
    INT_RANGE,
    MAX_PARAMS_DEPTH,
    GraphFileError,
    decode_params,
    encode_params,
)
from engine.graph_io import load_graph, save_graph
from engine.optim import make_optimizer
from engine.registry import all_ops
from engine.tensor import Flag, input_tensor
from engine.train import Trainer
from mnist_target.models import Model
from tests.engine.ops.op_harness import loss_weights

OPS = all_ops()
SAMPLES = [s for op in OPS.values() if op.samples for s in op.samples()]


def sample_graph(sample):
    """The sample's op on leaves holding its inputs, plus (for differentiable ops) the
    weighted-sum loss and its accumulating backward pass, as in gradcheck."""
    arrays = sample.leaf_arrays(sample.generate_inputs())
    leaves = [engine.param(a.shape, a.dtype, name=s.name) if s.grad and a.dtype.kind == "f"
              else engine.input_tensor(a.shape, a.dtype, name=s.name)
              for s, a in zip(sample.inputs, arrays, strict=True)]
    out = sample.build(*leaves).set_output()
    graph = engine.Graph([out], name=str(sample))
    if OPS[sample.op].differentiable and out.dtype.kind == "f" and \
            any(t.is_param for t in leaves):
        w = engine.constant(loss_weights(out.shape).astype(out.dtype), name="w")
        loss = ops.sum(ops.mul(out, w)).set_loss()
        graph.expand(loss)
        graph.build_backward(loss, accumulate=True)
    for t, a in zip(leaves, arrays, strict=True):
        t.set(a)
    return graph, out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def persistent_values(graph):
    return [t.numpy() for t in graph.nodes if t.persistent] + \
        [a.numpy() for a in graph.grad_accs.values()]


# --- op params encoding ----------------------------------------------------------------------

def same_value(a, b) -> bool:
    """Equal with equal types all the way down; floats by their bits (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a.hex() == b.hex()
    return a == b


def test_every_registry_node_params_round_trip():
    """All samples' forward and backward nodes: decode(encode(params)) is the same value."""
    count = 0
    for sample in SAMPLES:
        graph, _ = sample_graph(sample)
        for t in graph.nodes:
            back = decode_params(encode_params(t.params))
            assert list(back) == list(t.params), t
            assert all(same_value(t.params[k], back[k]) for k in t.params), (t, back)
            count += 1
    assert count > 10_000


scalars = st.none() | st.booleans() | st.integers(*INT_RANGE).filter(
    lambda i: i < INT_RANGE[1]) | st.text() | st.floats(allow_nan=True, allow_infinity=True)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4).map(tuple) |
                      st.lists(inner, max_size=4), max_leaves=12)


def json_depth(v) -> int:
    """How deep encode_params nests `v`: a tuple is an array, a list {"list": [...]}, a
    non-finite float {"float": ...}."""
    if isinstance(v, (tuple, list)):
        return (1 if isinstance(v, tuple) else 2) + max(map(json_depth, v), default=0)
    return int(isinstance(v, float) and not math.isfinite(v))


@given(st.dictionaries(st.text(), values, max_size=5))
def test_encoding_round_trips_any_value(params):
    """Every value round-trips, unless it nests deeper than MAX_PARAMS_DEPTH: then it is
    refused on export (a file could not read it back)."""
    if 1 + max(map(json_depth, params.values()), default=0) > MAX_PARAMS_DEPTH:
        with pytest.raises(GraphFileError, match="nest more than"):
            encode_params(params)
        return
    back = decode_params(encode_params(params))
    assert list(back) == list(params)
    assert all(same_value(params[k], back[k]) for k in params)


@pytest.mark.parametrize("value", [-2**63 - 1, 2**64, 10**5000, ((1, 2**64),)],
                         ids=["below int64", "2^64", "5001 digits", "nested"])
def test_encoding_refuses_integers_outside_int64_and_uint64(value):
    with pytest.raises(GraphFileError, match=r"param 'p': integer of \d+ bits is outside"):
        encode_params({"p": value})


def test_encoding_of_floats_and_tuples_is_explicit():
    text = encode_params({"a": (1, 2.0), "b": -0.0, "c": math.inf, "d": [True, None]})
    assert text == ('{"a": [1, 2.0], "b": -0.0, "c": {"float": "inf"}, '
                    '"d": {"list": [true, null]}}')


@pytest.mark.parametrize("value", [np.float32(1.0), np.int64(3), {"a": 1}, b"x", 1j])
def test_encoding_refuses_other_types(value):
    with pytest.raises(GraphFileError, match="cannot be stored"):
        encode_params({"p": value})


@pytest.mark.parametrize("text, match", [
    ("{", "not valid JSON"), ("[1]", "JSON object"), ('{"a": NaN}', "bare NaN"),
    ('{"a": {"float": "1.5"}}', "unknown tagged"), ('{"a": {"eval": "1"}}', "unknown tagged"),
    ('\n"a": 1}', r"not valid JSON .*: '\\n\"a\": 1}'"),   # the text quoted: one line
])
def test_decoding_refuses_malformed_text(text, match):
    with pytest.raises(GraphFileError, match=match) as info:
        decode_params(text)
    assert "\n" not in str(info.value)


# --- registry round trip ---------------------------------------------------------------------

# the first 3 samples of every (op, dtype) run by default, the others with -m slow
FAST_SAMPLES = [s for _, run in itertools.groupby(SAMPLES, lambda s: (s.op, s.dtype))
                for s in list(run)[:3]]


@pytest.mark.parametrize("sample", FAST_SAMPLES + [
    pytest.param(s, marks=pytest.mark.slow) for s in SAMPLES if s not in FAST_SAMPLES], ids=str)
def test_registry_sample_round_trips_bitwise(sample, tmp_path):
    """Export, import, compute both: every output, gradient and accumulator has the same
    bits, and the nodes keep their ops, shapes, dtypes, names and flags."""
    graph, _ = sample_graph(sample)
    save_graph(tmp_path / "g.gguf", graph)
    loaded = load_graph(tmp_path / "g.gguf").graph
    assert [(t.op, t.shape, t.dtype, t.name, t.flags, t.params) for t in loaded.nodes] == \
        [(t.op, t.shape, t.dtype, t.name, t.flags, t.params) for t in graph.nodes]
    graph.compute()
    loaded.compute()
    want, got = persistent_values(graph), persistent_values(loaded)
    assert len(want) == len(got)
    assert all(same_bits(w, g) for w, g in zip(want, got, strict=True))


# --- MNIST training graphs -------------------------------------------------------------------

def mnist_trainer(arch, batch=4, period=2):
    model = Model.new(arch, seed=0)
    images, logits = model.build(batch=batch)
    labels = input_tensor((batch, 10), "f32", name="labels")
    trainer = Trainer(images, logits, loss_type="cross_entropy", labels=labels,
                      optimizer="adamw", opt_params={"lr": 1e-2},
                      batch_logical=batch * period)
    roles = {"images": images, "logits": logits, "labels": labels, "loss": trainer.loss}
    return model, trainer, roles


def batches(n, batch=4, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield (rng.uniform(0, 1, (batch, 784)).astype(np.float32),
               np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)])


@pytest.mark.parametrize("arch", ["fc", "cnn"])
def test_imported_training_graph_trains_bitwise_like_the_original(arch, tmp_path):
    model, trainer, roles = mnist_trainer(arch)
    start = model.weights()
    save_graph(tmp_path / "train.gguf", trainer.training, roles, metadata={"run": "test"})
    loaded = load_graph(tmp_path / "train.gguf")
    assert loaded.metadata == {"run": "test"}
    assert [p.name for p in loaded.params] == list(model.params)
    opt = make_optimizer("adamw", loaded.graph, lr=1e-2)
    accumulated = 0
    for data, labels in batches(6):
        trainer.eval_batch(data, labels)
        loaded.roles["images"].set(data)
        loaded.roles["labels"].set(labels)
        if accumulated == 0:
            loaded.graph.reset()
        loaded.graph.compute()
        accumulated += 1
        if accumulated == trainer.opt_period:
            opt.step()
            accumulated = 0
        assert loaded.roles["loss"].item() == trainer.loss.item()
    assert opt.step_count == 3
    for p in loaded.params:
        assert not same_bits(p.numpy(), start[p.name]), f"{p.name} did not train"
        assert same_bits(p.numpy(), model.params[p.name].numpy()), p.name


def test_export_mid_accumulation_resumes_bitwise(tmp_path):
    """Exported after the first of two physical batches: the accumulated gradients travel
    with the file, and the next batch completes the same logical batch."""
    model, trainer, roles = mnist_trainer("fc")
    (data1, labels1), (data2, labels2) = batches(2)
    trainer.eval_batch(data1, labels1)
    save_graph(tmp_path / "train.gguf", trainer.training, roles)
    loaded = load_graph(tmp_path / "train.gguf")
    assert all(same_bits(a.numpy(), b.numpy()) for a, b in zip(
        loaded.graph.grad_accs.values(), trainer.training.grad_accs.values(), strict=True))
    trainer.eval_batch(data2, labels2)
    loaded.roles["images"].set(data2)
    loaded.roles["labels"].set(labels2)
    loaded.graph.compute()
    make_optimizer("adamw", loaded.graph, lr=1e-2).step()
    for p in loaded.params:
        assert same_bits(p.numpy(), model.params[p.name].numpy()), p.name


def test_flags_roles_and_backward_bookkeeping_survive(tmp_path):
    """Names, flags, roles, loss, seed, gradients and accumulators come back; a forward graph
    over the imported roles (what `mnist-eval` does with a graph file) evaluates the same."""
    _, trainer, roles = mnist_trainer("fc")
    graph = trainer.training
    save_graph(tmp_path / "train.gguf", graph, roles)
    loaded = load_graph(tmp_path / "train.gguf")
    g = loaded.graph
    assert (g.name, [(t.name, t.flags) for t in g.nodes]) == \
        (graph.name, [(t.name, t.flags) for t in graph.nodes])
    assert {k: (t.name, t.flags) for k, t in loaded.roles.items()} == \
        {k: (t.name, t.flags) for k, t in roles.items()}
    assert [loaded.roles[k].flags for k in ("images", "labels")] == [Flag.INPUT] * 2
    assert [p.flags for p in loaded.params] == [Flag.PARAM] * 4
    position = {t.id: i for i, t in enumerate(graph.nodes)}
    at = lambda t: g.nodes[position[t.id]]   # the imported node of an original one
    assert loaded.loss is at(next(t for t in graph.nodes if t.flags & Flag.LOSS))
    assert g.loss_grad is at(graph.loss_grad)
    assert [(p.name, d) for p, d in g.grads.items()] == \
        [(p.name, at(d)) for p, d in graph.grads.items()]
    assert [(p.name, a.name, a.flags) for p, a in g.grad_accs.items()] == \
        [(p.name, a.name, a.flags) for p, a in graph.grad_accs.items()]

    forward = engine.Graph([loaded.roles["loss"], loaded.roles["logits"]], name="eval")
    assert len(forward.nodes) < len(g.nodes)
    data, labels = next(batches(1))
    trainer.eval_batch(data, labels, backward=False)
    loaded.roles["images"].set(data)
    loaded.roles["labels"].set(labels)
    forward.compute()
    assert loaded.roles["loss"].item() == trainer.loss.item()
    assert same_bits(loaded.roles["logits"].numpy(), roles["logits"].numpy())


def test_special_shapes_and_values_round_trip(tmp_path):
    """0-d and 5-d leaves (stored flat), an empty one, and NaN/-0.0 data and params."""
    a = engine.input_tensor((), "f64", name="a").set(np.nan)
    b = engine.input_tensor((1, 2, 1, 2, 1), "f32", name="b").set([[[[[-0.0], [1]]], [[[2],
                                                                    [np.inf]]]]])
    c = engine.input_tensor((0, 3), "i32", name="c")
    d = ops.clamp(ops.reshape(b, (4,)), -math.inf, 1.0)
    graph = engine.Graph([a, c, d])
    save_graph(tmp_path / "g.gguf", graph)
    loaded = load_graph(tmp_path / "g.gguf").graph
    assert [t.shape for t in loaded.nodes] == [t.shape for t in graph.nodes]
    assert same_bits(loaded.nodes[0].numpy(), a.numpy())
    assert same_bits(loaded.nodes[2].numpy(), b.numpy())
    assert loaded.nodes[-1].params == {"min": -math.inf, "max": 1.0}
