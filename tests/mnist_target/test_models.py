"""The MNIST models: ggml's tensor names, shapes and architectures; GGUF files as ggml's
scripts write them; the forward pass against torch on the same weights; bad model files;
models read back from model files and graph files alike."""

from __future__ import annotations

import re

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from engine import gguf_io  # noqa: E402
from engine.gguf_io import GGUFFormatError, load_gguf, save_gguf  # noqa: E402
from engine.graph import Graph  # noqa: E402
from mnist_target.models import (  # noqa: E402
    GRAPH_ARCH_KEY,
    SHAPES,
    Model,
    ModelFileError,
    initial_weights,
    load_model_or_graph,
)
from mnist_target.run import TrainConfig, export_training_graph  # noqa: E402

GGML_NE = {  # ggml's own ne per tensor (examples/mnist/mnist-common.cpp), trailing 1s dropped
    "mnist-fc": {"fc1.weight": [784, 500], "fc1.bias": [500], "fc2.weight": [500, 10],
                 "fc2.bias": [10]},
    "mnist-cnn": {"conv1.kernel": [3, 3, 1, 8], "conv1.bias": [1, 1, 8],
                  "conv2.kernel": [3, 3, 8, 16], "conv2.bias": [1, 1, 16],
                  "dense.weight": [784, 10], "dense.bias": [10]},
}


@pytest.mark.parametrize("arch", ["fc", "cnn"])
def test_saved_file_has_ggml_names_shapes_and_arch(tmp_path, arch):
    model = Model.new(arch, seed=1)
    path = tmp_path / "m.gguf"
    model.save(path)
    reader = gguf.GGUFReader(path)
    field = reader.fields["general.architecture"]
    assert bytes(field.parts[field.data[0]]).decode() == model.arch
    ne = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    assert ne == GGML_NE[model.arch]
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)
    again = Model.load(path)
    for name, value in model.weights().items():
        np.testing.assert_array_equal(again.params[name].numpy(), value)


def test_torch_init_bounds_and_ggml_init_spread():
    w = initial_weights("fc", "torch", seed=0)
    assert np.abs(w["fc1.weight"]).max() <= 1 / np.sqrt(784)   # kaiming a=sqrt(5): 1/sqrt(fan)
    assert np.abs(w["fc1.weight"]).max() > 0.9 / np.sqrt(784)
    assert np.abs(w["fc2.bias"]).max() <= 1 / np.sqrt(500)
    c = initial_weights("cnn", "torch", seed=0)
    assert np.abs(c["conv2.bias"]).max() <= 1 / np.sqrt(72)
    g = initial_weights("cnn", "ggml", seed=0)
    assert abs(float(np.concatenate([v.ravel() for v in g.values()]).std()) - 0.01) < 1e-3
    np.testing.assert_array_equal(initial_weights("fc", seed=3)["fc1.weight"],
                                  initial_weights("fc", seed=3)["fc1.weight"])


@pytest.mark.parametrize("arch", ["fc", "cnn"])
def test_forward_matches_torch_on_the_same_weights(arch):
    torch = pytest.importorskip("torch")
    from mnist_target.torch_ref import torch_model
    model = Model.new(arch, seed=2)
    x = np.random.default_rng(0).random((6, 784), dtype=np.float32)
    images, logits = model.build(6)
    images.set(x)
    Graph([logits]).compute()
    with torch.no_grad():
        expected = torch_model(model.arch, model.weights())(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(logits.numpy(), expected, rtol=1e-5, atol=1e-5)


def _cnn_in_ggml_order(model, batch):
    """The CNN's graph in ggml's order, pool(relu(conv + b)), on `model`'s params."""
    from engine import ops
    from engine.tensor import input_tensor
    p = model.params
    images = input_tensor((batch, 784), "f32", name="images")
    x = ops.reshape(images, (batch, 1, 28, 28))
    for conv in ("conv1", "conv2"):
        x = ops.add(ops.conv_2d(x, p[f"{conv}.kernel"], padding=1), p[f"{conv}.bias"])
        x = ops.pool_2d(ops.relu(x), "max", 2)
    flat = ops.reshape(ops.cont(ops.permute(x, (0, 2, 3, 1))), (batch, -1))
    logits = ops.add(ops.matmul(flat, ops.transpose(p["dense.weight"])), p["dense.bias"])
    return images, logits.set_output()


def test_cnn_pooling_first_is_ggml_order_exactly():
    """The engine pools before the bias and the ReLU (models.py): the logits and every
    gradient are ggml's order's, bit for bit, on sparse images (windows whose convolution is
    0 tie, and biases of both signs switch ReLUs off)."""
    from engine import ops
    from engine.tensor import constant
    rng = np.random.default_rng(5)
    model = Model.new("cnn", seed=4)
    for name in ("conv1.bias", "conv2.bias"):          # biases of both signs, not zeros
        model.params[name].set(rng.uniform(-0.3, 0.3, model.params[name].shape)
                               .astype(np.float32))
    x = (rng.random((8, 784)) < 0.2) * rng.integers(1, 256, (8, 784)) / 256
    w = rng.standard_normal((8, 10)).astype(np.float32)
    results = []
    for build in (model.build, lambda b: _cnn_in_ggml_order(model, b)):
        images, logits = build(8)
        loss = ops.sum(ops.mul(logits, constant(w)))
        g = Graph([loss])
        grads = g.build_backward(loss)
        images.set(x.astype(np.float32))
        g.compute()
        results.append([logits.numpy().copy()]
                       + [grads[p].numpy().copy() for p in model.params.values()])
    active = [np.count_nonzero(r) for r in results[0][1:]]
    assert all(active), active                          # every gradient reached
    for ours, ggml in zip(*results, strict=True):
        np.testing.assert_array_equal(ours, ggml)


def test_cnn_flattens_in_ggml_order():
    """dense.weight column h*112 + w*16 + c reads channel c at (h, w) of the last pool."""
    weights = {k: np.zeros_like(v) for k, v in initial_weights("cnn", seed=0).items()}
    weights["conv1.kernel"][:, 0, 1, 1] = 1.0           # identity on every channel
    weights["conv2.kernel"][:, 0, 1, 1] = 1.0           # every channel copies channel 0
    h, w, c = 3, 5, 7
    weights["dense.weight"][4, h * 112 + w * 16 + c] = 1.0
    model = Model("cnn", weights)
    x = np.zeros((1, 784), np.float32)
    x[0, (4 * h) * 28 + 4 * w] = 0.5                   # lands on pooled cell (h, w)
    images, logits = model.build(1)
    images.set(x)
    Graph([logits]).compute()
    assert logits.numpy()[0, 4] == pytest.approx(0.5)
    assert np.count_nonzero(logits.numpy()) == 1


def _write_like_ggml_scripts(path, arch, weights):
    """As ggml's mnist-train-fc.py (state_dict squeezed) and mnist-train-cnn.py (raw_shape,
    4-D biases (1, C, 1, 1)) write their files."""
    writer = gguf.GGUFWriter(str(path), arch)
    for name, value in weights.items():
        if name.startswith("conv") and name.endswith(".bias"):
            writer.add_tensor(name, value.ravel(), raw_shape=(1, value.shape[0], 1, 1))
        else:
            writer.add_tensor(name, value, raw_shape=value.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch", ["mnist-fc", "mnist-cnn"])
def test_reads_files_written_as_ggml_scripts_do(tmp_path, arch):
    weights = initial_weights(arch, seed=4)
    path = tmp_path / "ggml.gguf"
    _write_like_ggml_scripts(path, arch, weights)
    model = Model.load(path)
    assert model.arch == arch
    for name, value in weights.items():
        np.testing.assert_array_equal(model.params[name].numpy(), value)


def _save(path, arch, weights):
    save_gguf(path, weights, arch=arch)
    return path


@pytest.mark.parametrize("change, message", [
    (lambda w: w.pop("fc2.bias"), "missing fc2.bias"),
    (lambda w: w.update(extra=np.zeros(3, np.float32)), "unexpected 'extra'"),
    (lambda w: w.update({"fc1\nbias": np.zeros(3, np.float32)}), "unexpected 'fc1\\nbias'"),
    (lambda w: w.update({"fc1.weight": np.zeros((784, 500), np.float32)}),
     "fc1.weight has shape [784, 500], expected [500, 784]"),
    (lambda w: w.update({"fc1.bias": np.zeros(500, np.float64)}), "expected float32"),
    (lambda w: w["fc2.bias"].__setitem__(0, np.nan), "NaN or infinite"),
])
def test_bad_model_files_are_named(tmp_path, change, message):
    weights = initial_weights("fc", seed=0)
    change(weights)
    path = _save(tmp_path / "bad.gguf", "mnist-fc", weights)
    with pytest.raises(ModelFileError, match=re.escape(message)):
        Model.load(path)


def test_wrong_architecture_and_truncated_and_magic(tmp_path):
    path = _save(tmp_path / "m.gguf", "mnist-fc", initial_weights("fc", seed=0))
    with pytest.raises(ModelFileError, match="holds a mnist-fc model, expected mnist-cnn"):
        Model.load(path, arch="cnn")
    other = _save(tmp_path / "o.gguf", "llama", initial_weights("fc", seed=0))
    with pytest.raises(ModelFileError, match="'llama', not an MNIST model"):
        Model.load(other)
    data = path.read_bytes()
    for cut in (3, 100, len(data) // 2, len(data) - 1):
        (tmp_path / "t.gguf").write_bytes(data[:cut])
        with pytest.raises(GGUFFormatError):
            Model.load(tmp_path / "t.gguf")
    (tmp_path / "magic.gguf").write_bytes(b"GGUX" + data[4:])
    with pytest.raises(GGUFFormatError, match="magic|GGUF"):
        Model.load(tmp_path / "magic.gguf")


def test_every_arch_shape_table_is_what_load_checks():
    for arch, shapes in SHAPES.items():
        weights = {n: np.zeros(s, np.float32) for n, s in shapes.items()}
        Model(arch, weights)          # exact shapes load
    assert load_gguf  # the module under test reads through engine.gguf_io


@pytest.mark.parametrize("arch", ["fc", "cnn"])
def test_model_or_graph_file_gives_the_model_parsing_the_file_once(tmp_path, monkeypatch, arch):
    model = Model.new(arch, seed=3)
    model.save(tmp_path / "model.gguf")
    export_training_graph(model, TrainConfig(batch_logical=4, batch_physical=2),
                          tmp_path / "graph.gguf")
    parses = []
    parse = gguf_io._BoundedReader.__init__
    monkeypatch.setattr(gguf_io._BoundedReader, "__init__",
                        lambda self, *a, **k: parses.append(a) or parse(self, *a, **k))
    for name in ("model.gguf", "graph.gguf"):
        parses.clear()
        loaded = load_model_or_graph(tmp_path / name)
        assert len(parses) == 1, name
        assert loaded.arch == model.arch
        for weight, value in model.weights().items():
            np.testing.assert_array_equal(loaded.params[weight].numpy(), value)


def test_model_or_graph_refuses_other_files(tmp_path):
    from engine import ops
    from engine.graph_format import GraphFileError
    from engine.graph_io import save_graph
    weights = Model.new("fc").params["fc1.bias"]
    save_graph(tmp_path / "g.gguf", Graph([ops.relu(weights).set_output()]))
    with pytest.raises(ModelFileError, match=rf"g\.gguf: a graph file, but not of an MNIST model "
                                             rf"\(no {GRAPH_ARCH_KEY} in its metadata\)"):
        load_model_or_graph(tmp_path / "g.gguf")
    other = _save(tmp_path / "o.gguf", "llama", initial_weights("fc", seed=0))
    with pytest.raises(GraphFileError, match="'llama', expected 'gradverify-graph'"):
        load_model_or_graph(other)


@pytest.mark.parametrize("load", [Model.load, load_model_or_graph])
@pytest.mark.parametrize("change", ["extra tensor", "wrong shape", "wrong dtype"])
def test_a_model_file_is_checked_from_its_header_before_any_tensor_is_read(
        tmp_path, monkeypatch, load, change):
    # a model with a huge extra tensor must cost nothing: its layout is refused first
    weights = initial_weights("fc", seed=0)
    if change == "extra tensor":
        weights["extra"] = np.zeros(8, np.float32)
    elif change == "wrong shape":
        weights["fc1.bias"] = np.zeros(499, np.float32)
    else:
        weights["fc1.bias"] = weights["fc1.bias"].astype(np.float64)
    path = _save(tmp_path / "m.gguf", "mnist-fc", weights)
    reads = []
    monkeypatch.setattr(gguf_io._BoundedReader, "read_tensor",
                        lambda self, t: reads.append(t.name))
    with pytest.raises(ModelFileError):
        load(path)
    assert reads == []
