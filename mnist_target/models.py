"""The MNIST models of ggml's example, with its GGUF tensor names, shapes and architectures.

    model = Model.new("cnn", init="torch", seed=0)     # or Model.load("mnist-cnn.gguf")
    images, logits = model.build(batch=500)            # images (500, 784), logits (500, 10)
    model.save("mnist-cnn.gguf")
    model = load_model_or_graph("train-graph.gguf")    # a model file or a graph file

Shapes are numpy order (ggml's `ne` reversed, see engine.gguf_io):

    mnist-fc   fc1.weight (500, 784)  fc1.bias (500,)  fc2.weight (10, 500)  fc2.bias (10,)
    mnist-cnn  conv1.kernel (8, 1, 3, 3)   conv1.bias (8, 1, 1)
               conv2.kernel (16, 8, 3, 3)  conv2.bias (16, 1, 1)
               dense.weight (10, 784)      dense.bias (10,)

FC: logits = fc2(relu(fc1(x))) with fc(x) = x W^T + b (ggml's mul_mat, torch's Linear).
CNN: conv 3x3 1->8 (pad 1) + bias, ReLU, max-pool 2x2; conv 3x3 8->16 (pad 1) + bias, ReLU,
max-pool 2x2; flatten in ggml's order (height, width, channel), i.e. NCHW permuted to NHWC
before the reshape; dense 784 -> 10. The engine's graph pools each convolution's output
before adding the bias and taking the ReLU, relu(pool(conv) + b) for ggml's
pool(relu(conv + b)): the same values, exactly (rounding x + b and the ReLU are both
non-decreasing, so they commute with a window's maximum, and b is one number per channel),
with the bias, the ReLU, their backward and the bias gradient's sum on a quarter of the
elements (about 14% of the CNN's training step on one thread, docs/performance.md). The
gradients are the same but where a window holds two values that differ yet round to the
same sum with b: the maximum of the convolution's output is then unique where ggml's order
sees a tie and takes its first.

A tensor matches its expected shape when the two agree after dropping leading 1s: ggml pads
`ne` with trailing 1s, so its own writer stores conv1.bias as (8, 1, 1) while ggml's Keras
script writes (1, 8, 1, 1), and both load in ggml. Only F32 loads, as in ggml's loader.

A graph file (engine.graph_io) of a model's training graph, as `mnist-train --graph-out`
writes it (mnist_target.run.export_training_graph), holds the same params under the same
names and the architecture under the metadata key GRAPH_ARCH_KEY; load_model_or_graph takes
either kind of file.
"""

from __future__ import annotations

import math
import os
import reprlib

import numpy as np

from engine import init, ops
from engine.errors import EngineError
from engine.gguf_io import GGUFFile, GGUFFormatError, load_gguf, save_gguf
from engine.graph_io import graph_from_gguf
from engine.tensor import Tensor, input_tensor, param

NINPUT, NHIDDEN, NCLASSES, HW = 784, 500, 10, 28
CNN_CHANNELS = 8  # ggml's MNIST_CNN_NCB

ARCHS = {"fc": "mnist-fc", "cnn": "mnist-cnn"}
SHAPES = {
    "mnist-fc": {"fc1.weight": (NHIDDEN, NINPUT), "fc1.bias": (NHIDDEN,),
                 "fc2.weight": (NCLASSES, NHIDDEN), "fc2.bias": (NCLASSES,)},
    "mnist-cnn": {"conv1.kernel": (CNN_CHANNELS, 1, 3, 3), "conv1.bias": (CNN_CHANNELS, 1, 1),
                  "conv2.kernel": (2 * CNN_CHANNELS, CNN_CHANNELS, 3, 3),
                  "conv2.bias": (2 * CNN_CHANNELS, 1, 1),
                  "dense.weight": (NCLASSES, (HW // 4) ** 2 * 2 * CNN_CHANNELS),
                  "dense.bias": (NCLASSES,)},
}
# the weight each bias belongs to (torch's bias init reads the weight's fan_in)
_BIAS_OF = {"fc1.bias": "fc1.weight", "fc2.bias": "fc2.weight", "conv1.bias": "conv1.kernel",
            "conv2.bias": "conv2.kernel", "dense.bias": "dense.weight"}
INITS = ("torch", "ggml")
GRAPH_ARCH_KEY = "mnist.arch"  # a graph file's metadata: the architecture of its model


class ModelFileError(GGUFFormatError):
    """A model file that is not an MNIST model of ggml's layout."""


def arch_name(arch: str) -> str:
    """'fc' / 'cnn' / 'mnist-fc' / 'mnist-cnn' -> the GGUF architecture."""
    full = ARCHS.get(arch, arch)
    if full not in SHAPES:
        raise EngineError(f"unknown MNIST architecture {arch!r}; known: fc, cnn "
                          f"({', '.join(SHAPES)})")
    return full


def initial_weights(arch: str, init_kind: str = "torch", seed=0) -> dict[str, np.ndarray]:
    """Fresh float32 weights. "torch": as torch's Linear/Conv2d (Kaiming-uniform with
    a = sqrt(5) for weights, U(+-1/sqrt(fan_in)) for biases); "ggml": N(0, 0.01) for all, as
    ggml's mnist_model_init_random. Drawn in the order of the architecture's tensor list."""
    arch = arch_name(arch)
    if init_kind not in INITS:
        raise EngineError(f"unknown init {init_kind!r}; known: {', '.join(INITS)}")
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in SHAPES[arch].items():
        if init_kind == "ggml":
            weights[name] = init.normal(shape, 0.0, 0.01, seed=rng)
        elif name in _BIAS_OF:
            fan_in = init.fans(SHAPES[arch][_BIAS_OF[name]])[0]
            weights[name] = init.bias_uniform(shape, fan_in, seed=rng)
        else:
            weights[name] = init.kaiming_uniform(shape, a=math.sqrt(5), seed=rng)
    return weights


class Model:
    """An MNIST model: its architecture and its params (engine tensors named as in ggml)."""

    def __init__(self, arch: str, weights: dict[str, np.ndarray]):
        self.arch = arch_name(arch)
        _check_weights(self.arch, weights, "weights")
        self.params: dict[str, Tensor] = {}
        for name, shape in SHAPES[self.arch].items():
            t = param(shape, "f32", name=name)
            t.set(np.asarray(weights[name], np.float32).reshape(shape))
            self.params[name] = t

    @classmethod
    def new(cls, arch: str, init: str = "torch", seed=0) -> Model:
        return cls(arch, initial_weights(arch, init, seed))

    @classmethod
    def load(cls, path, arch: str | None = None) -> Model:
        """A model from a GGUF file written here or by ggml's MNIST example."""
        return cls(*read_model(path, arch))

    @property
    def short(self) -> str:
        return self.arch.removeprefix("mnist-")

    def weights(self) -> dict[str, np.ndarray]:
        return {name: t.numpy().copy() for name, t in self.params.items()}

    def save(self, path) -> None:
        save_gguf(path, self.weights(), arch=self.arch)

    def build(self, batch: int) -> tuple[Tensor, Tensor]:
        """The forward graph's input (batch, 784) float32 images and (batch, 10) logits."""
        images = input_tensor((batch, NINPUT), "f32", name="images")
        p = self.params
        if self.arch == "mnist-fc":
            hidden = ops.relu(ops.add(ops.matmul(images, ops.transpose(p["fc1.weight"])),
                                      p["fc1.bias"]))
            logits = ops.add(ops.matmul(hidden, ops.transpose(p["fc2.weight"])), p["fc2.bias"])
        else:
            x = ops.reshape(images, (batch, 1, HW, HW))
            for conv in ("conv1", "conv2"):
                # pooled before the bias and the ReLU (module doc): the same values
                x = ops.pool_2d(ops.conv_2d(x, p[f"{conv}.kernel"], padding=1), "max", 2)
                x = ops.relu(ops.add(x, p[f"{conv}.bias"]))
            flat = ops.reshape(ops.cont(ops.permute(x, (0, 2, 3, 1))), (batch, -1))
            logits = ops.add(ops.matmul(flat, ops.transpose(p["dense.weight"])),
                             p["dense.bias"])
        return images, logits.set_output()


def _strip_leading_ones(shape) -> tuple[int, ...]:
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def _check_layout(arch: str, layout, where: str) -> None:
    """ModelFileError unless `layout` (name -> (shape, dtype)) is exactly `arch`'s tensors,
    in F32, shapes compared after dropping leading 1s."""
    expected = SHAPES[arch]
    missing = [n for n in expected if n not in layout]
    extra = [n for n in layout if n not in expected]
    if missing or extra:
        raise ModelFileError(
            f"{where}: {arch} needs exactly the tensors {', '.join(expected)}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unexpected {', '.join(map(repr, extra))}" if extra else ""))  # any bytes
    for name, shape in expected.items():
        got, dtype = layout[name]
        if _strip_leading_ones(got) != _strip_leading_ones(shape):
            raise ModelFileError(f"{where}: tensor {name} has shape {list(got)}, expected "
                                 f"{list(shape)} for {arch}")
        if np.dtype(dtype) != np.float32:
            raise ModelFileError(f"{where}: tensor {name} is {np.dtype(dtype)}, expected "
                                 "float32 (F32), as ggml's MNIST loader requires")


def _check_weights(arch: str, weights, where: str) -> None:
    _check_layout(arch, {name: (np.shape(w), np.asarray(w).dtype)
                         for name, w in weights.items()}, where)
    for name in SHAPES[arch]:
        if not np.all(np.isfinite(weights[name])):
            raise ModelFileError(f"{where}: tensor {name} holds NaN or infinite values")


def _model_tensors(where: str):
    """load_gguf's `expect` for a model or graph file: a model's header is checked against
    its architecture before any data is read (an extra or oversized tensor is never read);
    a graph file's tensors are all read (engine.graph_io checks them)."""
    def select(arch, metadata, layout):
        if arch in SHAPES:
            _check_layout(arch, layout, where)
        return layout
    return select


def read_model(path, arch: str | None = None) -> tuple[str, dict[str, np.ndarray]]:
    """(architecture, weights) of a GGUF model file, checked against ggml's layout."""
    return _model_of(load_gguf(path, expect=_model_tensors(os.fsdecode(path))), arch)


def load_model_or_graph(path) -> Model:
    """The model in a GGUF file: a model file (as Model.load), or a graph file that holds a
    model's params and names its architecture under GRAPH_ARCH_KEY. The file is read and
    parsed once. Raises GGUFFormatError (ModelFileError, engine.graph_io's GraphFileError)
    naming the file and the problem."""
    gf = load_gguf(path, expect=_model_tensors(os.fsdecode(path)))
    if gf.arch in SHAPES:
        return Model(*_model_of(gf))
    loaded = graph_from_gguf(gf)
    arch = loaded.metadata.get(GRAPH_ARCH_KEY)
    if arch is None:
        raise ModelFileError(f"{gf.path}: a graph file, but not of an MNIST model (no "
                             f"{GRAPH_ARCH_KEY} in its metadata)")
    if not isinstance(arch, str) or arch not in SHAPES:
        raise ModelFileError(f"{gf.path}: a graph file whose {GRAPH_ARCH_KEY} is "
                             f"{reprlib.repr(arch)} ({type(arch).__name__}), expected one of "
                             f"{', '.join(SHAPES)}")
    weights = {p.name: p.numpy() for p in loaded.params}
    _check_weights(arch, weights, gf.path)
    return Model(arch, weights)


def _model_of(gf: GGUFFile, arch: str | None = None) -> tuple[str, dict[str, np.ndarray]]:
    """read_model for a GGUF file already read."""
    where = gf.path
    if gf.arch not in SHAPES:
        raise ModelFileError(f"{where}: general.architecture is {gf.arch!r}, not an MNIST "
                             f"model ({', '.join(SHAPES)})")
    if arch is not None and gf.arch != arch_name(arch):
        raise ModelFileError(f"{where}: holds a {gf.arch} model, expected {arch_name(arch)}")
    _check_weights(gf.arch, gf.tensors, where)
    return gf.arch, {name: np.array(gf.tensors[name], np.float32) for name in SHAPES[gf.arch]}
