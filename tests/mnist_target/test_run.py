"""Training the MNIST models on small random sets: gradient accumulation, Ctrl-C, the batch
order shared with the torch reference, and agreement with torch over a few steps."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import EngineError
from engine.train import Dataset
from mnist_target.models import Model
from mnist_target.run import TrainConfig, batch_orders, evaluate, logits_of, train_model


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    images = (rng.random((n, 784)) * (rng.random((n, 784)) < 0.2)).astype(np.float32)
    labels = rng.integers(0, 10, n).astype(np.int32)
    return images, labels


def _dataset(images, labels):
    return Dataset(images, np.eye(10, dtype=np.float32)[labels])


@pytest.mark.parametrize("arch", ["fc", "cnn"])
def test_accumulation_equals_the_logical_batch(arch):
    """Logical batch 16 as 4 physical batches of 4 trains like physical batches of 16."""
    images, labels = _data(64)
    runs = []
    for physical in (16, 4):
        model = Model.new(arch, seed=1)
        cfg = TrainConfig(epochs=2, batch_logical=16, batch_physical=physical, val_split=0.25)
        runs.append((model, train_model(model, _dataset(images, labels), cfg)))
    (a, run_a), (b, run_b) = runs
    for name, value in a.weights().items():
        np.testing.assert_allclose(b.params[name].numpy(), value, rtol=2e-4, atol=2e-6)
    for ra, rb in zip(run_a.history, run_b.history, strict=True):
        assert rb.train_loss == pytest.approx(ra.train_loss, rel=1e-4)
        assert rb.val_acc == ra.val_acc


def test_ctrl_c_keeps_the_last_completed_epoch(monkeypatch):
    import engine.train as train
    images, labels = _data(64)
    cfg = TrainConfig(epochs=3, batch_logical=16, batch_physical=16, val_split=0.25)
    reference = Model.new("fc", seed=2)
    train_model(reference, _dataset(images, labels), TrainConfig(**{**cfg.__dict__,
                                                                    "epochs": 1}))
    model = Model.new("fc", seed=2)
    original = train.Trainer.eval_batch
    seen = []

    def raising(self, *args, **kwargs):      # Ctrl-C after a batch that trained (and stepped)
        original(self, *args, **kwargs)
        raise KeyboardInterrupt

    def interrupt_next_epoch(record):
        seen.append(record.epoch)
        monkeypatch.setattr(train.Trainer, "eval_batch", raising)

    run = train_model(model, _dataset(images, labels), cfg, on_epoch=interrupt_next_epoch)
    assert run.interrupted and len(run.history) == 1 and seen == [1]
    assert not np.array_equal(model.params["fc1.weight"].numpy(),
                              Model.new("fc", seed=2).params["fc1.weight"].numpy())
    for name, value in reference.weights().items():
        np.testing.assert_array_equal(model.params[name].numpy(), value)


def test_batch_orders_are_the_trainers():
    images, labels = _data(48)
    cfg = TrainConfig(epochs=3, batch_logical=8, batch_physical=8, val_split=0.25, seed=5)
    dataset = _dataset(images, labels)
    model = Model.new("fc", seed=0)
    from mnist_target.run import make_trainer
    trainer = make_trainer(model, cfg)
    orders = []
    trainer.fit(dataset, cfg.epochs, cfg.val_split,
                on_epoch=lambda *_: orders.append(dataset.order.copy()))
    expected = batch_orders(len(dataset), cfg)
    assert len(expected) == 3
    for got, want in zip(orders, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert (expected[0][40:] == np.arange(40, 48)).all()     # the validation part stays put


@pytest.mark.parametrize("arch", ["fc", "cnn"])
def test_training_loss_follows_torch_on_the_same_batches(arch):
    pytest.importorskip("torch")
    from mnist_target.torch_ref import torch_model, train_torch
    images, labels = _data(96, seed=3)
    cfg = TrainConfig(epochs=3, batch_logical=16, batch_physical=8, val_split=0.2)
    model = Model.new(arch, seed=3)
    net = torch_model(model.arch, model.weights())
    ours = train_model(model, _dataset(images, labels), cfg).history
    theirs = train_torch(net, images, labels, cfg, batch_orders(len(images), cfg))
    for e, t in zip(ours, theirs, strict=True):
        assert e.train_loss == pytest.approx(t.train_loss, rel=1e-3)
        assert e.val_loss == pytest.approx(t.val_loss, rel=1e-3)
    trained = {n: p.detach().numpy() for n, p in net.state_dict().items()}
    key = "0.weight" if arch == "fc" else "1.weight"
    ours_w = model.params["fc1.weight" if arch == "fc" else "conv1.kernel"].numpy()
    np.testing.assert_allclose(ours_w, trained[key], rtol=1e-3, atol=1e-4)


def test_evaluate_pads_the_last_batch():
    images, labels = _data(10)
    model = Model.new("fc", seed=0)
    whole = logits_of(model, images, batch=10)
    np.testing.assert_allclose(logits_of(model, images, batch=4), whole, rtol=1e-6, atol=1e-6)
    loss, loss_unc, acc, acc_unc = evaluate(model, images, labels, batch=3)
    assert 0 < loss and loss_unc > 0 and 0 <= acc <= 1
    assert acc == np.mean(whole.argmax(1) == labels)


@pytest.mark.parametrize("change, message", [
    ({"epochs": 0}, "epochs must be at least 1"),
    ({"lr": -1.0}, "positive number"),
    ({"batch_logical": 12, "batch_physical": 8}, "multiple of the physical batch"),
    ({"val_split": 1.0}, r"lie in \[0, 1\)"),
    ({"batch_logical": 128, "batch_physical": 128}, "no whole logical batch"),
])
def test_config_errors(change, message):
    with pytest.raises(EngineError, match=message):
        TrainConfig(**{"batch_logical": 8, "batch_physical": 8, **change}).validate(64)
