"""The CUDA backend through the engine: plans across backends, device-resident persistent
tensors (16-bit ones included), CPU fallback, and ggml's train/evaluate failure, under the
simulator."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import engine
from engine import ops
from engine.registry import all_ops, get_op
from engine.train import Dataset, EpochResult, Trainer
from tests.engine.backends.cuda.kernel_harness import needs_cuda, sample_graph
from tests.engine.ops.op_harness import TOL

pytestmark = [pytest.mark.cudasim]


@pytest.fixture(autouse=True, scope="module")
def _cuda():
    needs_cuda()


def _small_samples(per_op=1):
    out = []
    for op in all_ops().values():
        if not op.samples or op.kind == "backward":
            continue
        for dtype in ("f32", "f64", "f16", "bf16"):
            fits = [s for s in op.samples() if s.dtype == dtype]
            out += sorted(fits, key=lambda s: sum(np.prod(i.shape) for i in s.inputs))[:per_op]
    return out


def _values(graph, backend):
    graph.compute(backend)
    return {t.name: t.numpy() for t in graph.nodes if t.persistent and not t.is_leaf}


@pytest.mark.parametrize("sample", _small_samples(), ids=str)
def test_graph_on_cuda_equals_cpu(sample):
    graph = sample_graph(sample)
    want = _values(graph, "cpu")
    got = _values(graph, "cuda")
    assert set(got) == set(want)
    assert not graph.plan.fallbacks          # 16-bit nodes included: all on the device
    tol = TOL[sample.dtype]
    for name, w in want.items():
        np.testing.assert_allclose(got[name].astype(np.float64), w.astype(np.float64), **tol,
                                   err_msg=f"{name} in {sample}")


def test_ops_without_a_cuda_kernel_fall_back_to_the_cpu_and_are_reported():
    relu = get_op("relu")
    saved = relu.kernels.pop("cuda", None)
    try:
        x = engine.param((4, 5), "f64", name="x")
        x.set(np.linspace(-1, 1, 20).reshape(4, 5))
        loss = ops.sum(ops.mul(ops.relu(ops.scale(x, 2.0)), 3.0)).set_loss()
        g = engine.Graph([loss])
        grads = g.build_backward(loss)
        g.compute("cuda")
        assert "relu" in g.plan.fallbacks
        assert "relu" in repr(g.plan)
        got = grads[x].numpy()
        g.compute("cpu")
        np.testing.assert_array_equal(got, grads[x].numpy())
    finally:
        if saved is not None:
            relu.kernels["cuda"] = saved


def _trainer(backend, seed=0):
    x = engine.input_tensor((4, 6), "f32", name="x")
    y = engine.input_tensor((4, 3), "f32", name="y")
    w = engine.param((6, 3), "f32", name="w")
    w.set(np.random.default_rng(seed).normal(0, 0.5, (6, 3)))
    out = ops.matmul(ops.tanh(x), w)
    return Trainer(x, out, "cross_entropy", labels=y, optimizer="adamw",
                   opt_params={"lr": 0.05}, backend=backend, batch_logical=8), w


def test_training_alternating_with_evaluation_on_cuda_matches_a_fresh_forward_pass():
    """ggml's failure: evaluation after training ran the training graph; here the validation
    loss after each epoch must equal a fresh trainer's forward pass with the same weights."""
    rng = np.random.default_rng(1)
    ds = Dataset(rng.normal(size=(16, 6)).astype(np.float32),
                 np.eye(3, dtype=np.float32)[rng.integers(0, 3, 16)])
    trainer, w = _trainer("cuda")
    for _ in range(2):
        _, val = trainer.epoch(ds, idata_split=8)
        assert w.device is not None      # the parameter lives on the device between runs
        fresh, w2 = _trainer("cpu", seed=5)
        w2.set(w.numpy())
        ref = EpochResult("cross_entropy")
        for i in range(2, 4):
            fresh.eval_batch(*ds.batch(i, 4), backward=False, result=ref)
        np.testing.assert_allclose(val.losses, ref.losses, rtol=1e-5)


def test_cpu_and_cuda_trajectories_agree():
    rng = np.random.default_rng(2)
    ds = Dataset(rng.normal(size=(16, 6)).astype(np.float32),
                 np.eye(3, dtype=np.float32)[rng.integers(0, 3, 16)])
    (a, wa), (b, wb) = _trainer("cpu"), _trainer("cuda")
    a.epoch(ds)
    b.epoch(ds)
    np.testing.assert_allclose(wb.numpy(), wa.numpy(), rtol=1e-5, atol=1e-6)


def test_without_gpu_or_simulator_the_message_says_how_to_enable_either():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    code = ("import engine\nfrom engine.backends import get_backend\n"
            "try:\n    get_backend('cuda')\nexcept engine.BackendError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    if "GPU" not in out.stdout and out.returncode == 0 and not out.stdout:
        pytest.skip("this machine has a CUDA GPU")
    assert "NUMBA_ENABLE_CUDASIM=1" in out.stdout and "GPU" in out.stdout


def test_a_stale_plan_never_runs_on_cuda_and_reset_stays_on_the_device():
    x = engine.param((3,), "f32", name="x")
    x.set([1.0, -2.0, 3.0])
    loss = ops.sum(ops.sqr(x)).set_loss()
    g = engine.Graph([loss])
    g.build_backward(loss, accumulate=True)
    g.compute("cuda")
    plan = g.plan
    acc = g.grad(x)
    g.reset()                       # zeroes the device accumulator in place
    assert acc.device is not None and acc._fresh == engine.tensor.DEVICE
    g.compute("cuda")
    np.testing.assert_array_equal(acc.numpy(), [2.0, -4.0, 6.0])
    g.expand(ops.sum(x))
    with pytest.raises(engine.StalePlanError):
        plan.run(g)
    g.compute("cuda")
    assert g.plan is not plan
