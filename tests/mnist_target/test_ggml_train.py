"""ggml's own MNIST training through ggml-opt (mnist_target.ggml_train) against torch, and the
ggml defect that its CNN training runs into."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import EngineError
from mnist_target import regress
from mnist_target.run import TrainConfig, batch_orders


@pytest.fixture(scope="module")
def lib():
    from mnist_target.ggml_train import load_training_lib
    try:
        return load_training_lib()
    except EngineError as exc:
        pytest.skip(f"no ggml libraries: {exc}")


SHORT = TrainConfig(epochs=3, batch_logical=200, batch_physical=100, val_split=0.2)


def test_ggml_trains_the_fc_as_torch_does(lib, mnist):
    run = regress.run_arch("fc", mnist, SHORT, regress.Options(engines=("ggml",), limit=3000,
                                                               threads=2))
    (ggml,) = run.engines
    assert ggml.engine == "ggml" and len(ggml.history) == 3
    for mine, ref in zip(ggml.history, run.torch, strict=True):
        assert mine.train_loss == pytest.approx(ref.train_loss, rel=1e-5)
        assert mine.val_loss == pytest.approx(ref.val_loss, rel=1e-5)
        assert mine.val_acc == ref.val_acc
    assert ggml.test_acc == run.torch_test_acc
    assert run.test_images == 3000
    assert {r.status for r in regress.results_of(run, floors=False)} == {"pass", "skip"}


def test_ggml_leaves_the_model_alone_and_returns_its_trained_weights(lib, mnist):
    from mnist_target.ggml_train import evaluate_ggml, train_ggml
    from mnist_target.models import Model
    model = Model.new("fc", seed=1)
    before = {k: v.copy() for k, v in model.weights().items()}
    config = TrainConfig(epochs=1, batch_logical=100, batch_physical=100, val_split=0.0)
    images, labels = mnist.train_images[:500], mnist.train_labels[:500]
    run = train_ggml(model, images, labels, config, batch_orders(len(images), config),
                     threads=1)
    assert all(np.array_equal(model.weights()[k], v) for k, v in before.items())
    assert not any(np.array_equal(run.weights[k], v) for k, v in before.items())
    assert np.isnan(run.history[0].val_loss) and not run.interrupted
    acc, _, used = evaluate_ggml("fc", run.weights, mnist.test_images[:250],
                                 mnist.test_labels[:250], config, threads=1)
    assert used == 200 and 0.3 < acc <= 1.0        # whole batches of 100 only


def test_ctrl_c_in_the_progress_callback_stops_after_that_epoch(lib, mnist, monkeypatch):
    """Ctrl-C lands in the progress callback (Python code ggml calls) or between epochs;
    either way the run stops after that epoch, marked interrupted, with its weights."""
    from mnist_target import ggml_train
    from mnist_target.models import Model
    calls = []
    real_result_of = ggml_train._result_of

    def result_of(lib, result):           # the callback's first Python call: Ctrl-C lands
        calls.append(result)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_result_of(lib, result)

    monkeypatch.setattr(ggml_train, "_result_of", result_of)
    config = TrainConfig(epochs=3, batch_logical=100, batch_physical=100, val_split=0.2)
    images, labels = mnist.train_images[:500], mnist.train_labels[:500]
    run = ggml_train.train_ggml(Model.new("fc"), images, labels, config,
                                batch_orders(len(images), config), threads=1, progress=True)
    assert run.interrupted and len(run.history) == 1
    assert len(calls) == 5 + 2     # 4 training batches and 1 validating, then the epoch's
    assert not np.isnan(run.history[0].val_loss)


def test_ggml_refuses_sizes_it_would_abort_on(lib, mnist):
    from mnist_target.ggml_train import evaluate_ggml, train_ggml
    from mnist_target.models import Model
    model = Model.new("fc")
    bad = TrainConfig(epochs=1, batch_logical=150, batch_physical=100)
    with pytest.raises(EngineError, match="multiple"):
        train_ggml(model, mnist.train_images[:600], mnist.train_labels[:600], bad, [], 1)
    with pytest.raises(EngineError, match="whole batches"):
        evaluate_ggml("fc", model.weights(), mnist.test_images[:50], mnist.test_labels[:50],
                      TrainConfig(batch_physical=100), threads=1)


def test_a_struct_layout_other_than_ggml_020s_is_refused(lib):
    from mnist_target.ggml_train import LOSS_CROSS_ENTROPY, _check_default_params
    params = lib.ggml_opt_default_params(None, LOSS_CROSS_ENTROPY)
    _check_default_params(lib, params, None)
    params.opt_period = 7                     # what a shifted field would read
    with pytest.raises(EngineError, match="layout of ggml 0.20"):
        _check_default_params(lib, params, None)


def test_missing_libraries_are_one_clear_error(tmp_path):
    from mnist_target.ggml_train import load_training_lib
    with pytest.raises(EngineError, match="libggml-base.so"):
        load_training_lib(str(tmp_path))


def test_ggml_cnn_gradients_before_the_last_pooling_are_wrong(lib, mnist):
    """ggml's MNIST CNN graph (as ggml_train builds it, in a plain context) on 4 images:
    the loss and the dense layer's gradient agree with torch's, the convolutions' do not
    (the next test shows why)."""
    torch = pytest.importorskip("torch")
    from gradcheck.adapters.ggml.graph import Context
    from mnist_target.models import Model
    from mnist_target.torch_ref import torch_model
    n = 4
    images, labels = mnist.train_images[:n], mnist.train_labels[:n]
    weights = Model.new("cnn", seed=0).weights()
    with Context(lib, 1 << 26) as g:
        w = {name: g.from_numpy(value) for name, value in weights.items()}
        for t in w.values():
            lib.ggml_set_param(t)
        x = g.reshape_4d(g.from_numpy(images), 28, 28, 1, n)
        for conv in ("conv1", "conv2"):
            x = g.relu(g.add(g.conv_2d(w[f"{conv}.kernel"], x, 1, 1, 1, 1, 1, 1),
                             w[f"{conv}.bias"]))
            x = g.pool_2d(x, 0, 2, 2, 2, 2, 0.0, 0.0)
        x = g.reshape_2d(g.cont(g.permute(x, 1, 2, 0, 3)), 784, n)
        logits = g.add(g.mul_mat(w["dense.weight"], x), w["dense.bias"])
        loss = g.cross_entropy_loss(logits, g.from_numpy(np.eye(10, dtype=np.float32)[labels]))
        g.build(loss)
        g.compute(1)
        ggml_loss = float(g.to_numpy(loss, ()))
        grads = {name: g.to_numpy(g.grad(t), weights[name].shape) for name, t in w.items()}
    net = torch_model("cnn", weights)
    ref = torch.nn.functional.cross_entropy(net(torch.from_numpy(images)),
                                            torch.from_numpy(labels.astype(np.int64)))
    ref.backward()
    assert ggml_loss == pytest.approx(float(ref.detach()), rel=1e-5)
    names = ["conv1.kernel", "conv1.bias", "conv2.kernel", "conv2.bias", "dense.weight",
             "dense.bias"]
    err = {}
    for name, p in zip(names, net.parameters(), strict=True):
        truth = p.grad.numpy().reshape(weights[name].shape)
        err[name] = np.linalg.norm(grads[name] - truth) / np.linalg.norm(truth)
    assert min(err[name] for name in names[:4]) > 0.5, err
    assert max(err["dense.weight"], err["dense.bias"]) < 1e-3, err


def test_ggml_pool_2d_backward_reads_a_permuted_gradient_as_contiguous(lib):
    """Why ggml's CNN training differs from torch's (docs/guides/mnist.md): ggml 0.20.2's pool_2d
    backward reads its incoming gradient as if it were contiguous. The MNIST CNN's flatten,
    cont(permute(pool_2d(x))), hands it a permuted one, so every gradient before the last
    pooling is wrong while the forward pass and the dense layer's gradient are right. When
    this test fails, ggml fixed it: the regression run's CNN row should then pass."""
    torch = pytest.importorskip("torch")
    from gradcheck.adapters.ggml.graph import Context
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    weights = rng.standard_normal((2, 2, 2, 3)).astype(np.float32)   # NHWC after the permute

    def ggml_grad(permuted):
        with Context(lib, 1 << 24) as g:
            x = g.from_numpy(x0)
            lib.ggml_set_param(x)
            y = g.pool_2d(x, 0, 2, 2, 2, 2, 0.0, 0.0)
            if permuted:
                y = g.cont(g.permute(y, 1, 2, 0, 3))
                r = g.from_numpy(weights)
            else:
                r = g.from_numpy(weights.transpose(0, 3, 1, 2))
            g.build(g.sum(g.mul(y, r)))
            g.compute(1)
            return g.to_numpy(g.grad(x), x0.shape)

    xt = torch.from_numpy(x0).requires_grad_()
    y = torch.nn.functional.max_pool2d(xt, 2)
    (y.permute(0, 2, 3, 1) * torch.from_numpy(weights)).sum().backward()
    truth = xt.grad.numpy()
    np.testing.assert_allclose(ggml_grad(permuted=False), truth, rtol=1e-6, atol=1e-7)
    wrong = ggml_grad(permuted=True)
    assert np.linalg.norm(wrong - truth) > 0.5 * np.linalg.norm(truth)
