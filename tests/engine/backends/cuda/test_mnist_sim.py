"""The MNIST CNN trains on the cuda backend, under numba's CUDA simulator in about a minute:
one training step (batch 2) gives the CPU backend's params, and `python -m mnist_target
train` on a tiny IDX data set writes a model that loads.

That is affordable because the simulator, which runs every CUDA thread as a Python thread
and every syncthreads as a polling barrier, launches large products and sums with kernels
of its own (no tiles, no barriers, few threads). Those give the bits of the kernels a GPU
runs, checked here; and the registry's samples stay below the size at which they take over,
so the other cudasim tests exercise the GPU's kernels.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from tests.engine.backends.cuda.kernel_harness import cuda, cuda_cases, needs_cuda, to_device

pytestmark = pytest.mark.cudasim

CNN_RTOL, CNN_ATOL = 1e-4, 1e-6


@pytest.fixture(autouse=True, scope="module")
def _needs_cuda():
    needs_cuda()


def _simulator_only():
    from engine.backends.cuda.arrays import SIMULATED
    if not SIMULATED:
        pytest.skip("the simulator's own kernels run under NUMBA_ENABLE_CUDASIM=1 only")


# --- the MNIST CNN ------------------------------------------------------------------------
def _one_step(backend: str) -> dict[str, np.ndarray]:
    """The CNN's params after one AdamW step on a batch of 2 random images."""
    from mnist_target.models import Model
    from mnist_target.run import TrainConfig, make_trainer
    rng = np.random.default_rng(11)
    x = rng.random((2, 784), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[[3, 7]]
    model = Model.new("cnn")
    trainer = make_trainer(model, TrainConfig(batch_logical=2, batch_physical=2,
                                              backend=backend))
    trainer.eval_batch(x, y)
    return model.weights()


def test_cnn_training_step_on_cuda_gives_the_cpu_params():
    from mnist_target.models import Model
    start = Model.new("cnn").weights()
    want, got = _one_step("cpu"), _one_step("cuda")
    assert set(got) == set(want)
    for name in want:
        assert not np.array_equal(want[name], start[name]), name
        np.testing.assert_allclose(got[name], want[name], rtol=CNN_RTOL, atol=CNN_ATOL,
                                   err_msg=name)


def _write_idx(path, array: np.ndarray) -> None:
    """An IDX file of unsigned bytes: magic 0x0800 | ndim, the sizes (big-endian), data."""
    header = struct.pack(">I", 0x0800 | array.ndim)
    header += b"".join(struct.pack(">I", n) for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_train_command_on_cuda_writes_a_loadable_model(tmp_path, monkeypatch, capsys):
    from mnist_target.cli import main
    from mnist_target.models import Model
    monkeypatch.setenv("GRADVERIFY_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(12)
    data = tmp_path / "idx"
    data.mkdir()
    for prefix in ("train", "t10k"):
        _write_idx(data / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (4, 28, 28)))
        _write_idx(data / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, 4))
    out = tmp_path / "cnn.gguf"
    code = main(["train", "--arch", "cnn", "--backend", "cuda", "--data", str(data),
                 "--epochs", "1", "--limit", "4", "--batch-logical", "2",
                 "--batch-physical", "2", "--val-split", "0.5", "--out", str(out),
                 "--no-progress"])
    assert code == 0, capsys.readouterr()
    assert "test accuracy" in capsys.readouterr().out
    model = Model.load(out)
    assert model.arch == "mnist-cnn"
    start = Model.new("cnn").weights()
    assert any(not np.array_equal(w, start[k]) for k, w in model.weights().items())


# --- the simulator's own kernels give the GPU kernels' bits -------------------------------
def _mixed(rng, shape, dtype):
    """Values of mixed sign and magnitude, so that the order of additions shows."""
    return (rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 4, shape)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_matmul_gives_the_tiled_bits(dtype, monkeypatch):
    """A batch of two against a broadcast, transposed b; k = 9 is no whole number of
    tiles, so the tiled kernel adds zero padding that the direct one does not."""
    _simulator_only()
    from engine.backends.cuda import matmul
    rng = np.random.default_rng(13)
    a = _mixed(rng, (2, 5, 9), dtype)
    b = _mixed(rng, (6, 9), dtype).T

    def product(max_work):
        monkeypatch.setattr(matmul, "SIM_TILED_MAX_WORK", max_work)
        out = cuda.device_array((2, 5, 6), dtype)
        matmul.cuda_matmul(out, [to_device(a), to_device(b)])
        return out.copy_to_host()

    tiled, direct = product(math.inf), product(0)
    np.testing.assert_allclose(direct, a @ b, rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert direct.tobytes() == tiled.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", [   # shape, transposed to order, axes, segment width cap
    ((70, 5), (1, 0), (1,), 16),        # a strided input; each lane adds 4 or 5 elements
    ((3, 4, 10), (0, 1, 2), (0, 2), 16),    # reduced axes on both sides of a kept one
    ((6, 11), (0, 1), (0, 1), 16),      # everything to one number
    ((2, 300), (0, 1), (1,), None),     # the widest segment, MAX_THREADS lanes
], ids=["strided", "split-axes", "scalar", "widest"])
def test_serial_sum_gives_the_tree_bits(case, dtype, monkeypatch):
    _simulator_only()
    from engine.backends.cuda import launch, reduce
    shape, order, axes, max_threads = case
    if max_threads is not None:     # segments narrower than the rows, at a simulator's cost
        monkeypatch.setattr(launch, "MAX_THREADS", max_threads)
    x = _mixed(np.random.default_rng(14), shape, dtype).transpose(order)
    kept = tuple(n for i, n in enumerate(x.shape) if i not in axes)

    def total(max_work):
        monkeypatch.setattr(reduce, "SIM_TREE_MAX_WORK", max_work)
        out = cuda.device_array(kept, dtype)
        reduce.cuda_sum(out, [to_device(x)], axes=axes, keepdims=False)
        return out.copy_to_host()

    tree, serial = total(math.inf), total(0)
    np.testing.assert_allclose(serial, x.astype(np.float64).sum(axis=axes), rtol=1e-6)
    assert serial.tobytes() == tree.tobytes()


def test_registry_samples_run_the_gpu_kernels_under_the_simulator():
    """Every sample of matmul and of the sums is below the work at which the simulator
    switches to its own kernel, so replaying them checks the tiled and the tree kernels."""
    from engine.backends.cuda.matmul import SIM_TILED_MAX_WORK
    from engine.backends.cuda.reduce import SIM_TREE_MAX_WORK
    from engine.registry import OPS
    for sample in cuda_cases(OPS["matmul"].samples()):
        a, b = (np.zeros(s.shape) for s in sample.inputs)
        assert np.matmul(a, b).size * a.shape[-1] <= SIM_TILED_MAX_WORK, sample
    for op in ("sum", "mean", "sum_rows"):
        for sample in cuda_cases(OPS[op].samples()):
            assert math.prod(sample.inputs[0].shape) <= SIM_TREE_MAX_WORK, sample
