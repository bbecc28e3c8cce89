"""Datasets, epoch results and the trainer (ggml-opt's epoch/fit in the engine)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import engine
from engine import ops
from engine.errors import EngineError, ShapeError
from engine.train import Dataset, EpochResult, Trainer


def _classifier(batch=4, seed=0, **kw):
    x = engine.input_tensor((batch, 6), "f64", name="x")
    y = engine.input_tensor((batch, 3), "f64", name="y")
    w = engine.param((6, 3), "f64", name="w")
    b = engine.param((3,), "f64", name="b")
    rng = np.random.default_rng(seed)
    w.set(rng.normal(0, 0.5, (6, 3)))
    out = ops.matmul(ops.tanh(x), w) + b
    return Trainer(x, out, "cross_entropy", labels=y, optimizer="adamw",
                   opt_params={"lr": 0.05}, seed=seed, **kw), w


def _data(n=24, seed=1):
    rng = np.random.default_rng(seed)
    data = rng.normal(size=(n, 6))
    labels = np.eye(3)[rng.integers(0, 3, n)]
    return Dataset(data, labels)


def test_validation_after_training_equals_a_fresh_forward_pass():
    """ggml's scheduler once ran the training graph when asked for the validation graph;
    here evaluation alternates with training and must see exactly the current weights."""
    trainer, _ = _classifier()
    ds = _data()
    for _ in range(3):
        _, val = trainer.epoch(ds, idata_split=16)     # trains on 16, validates on 8
        fresh, _ = _classifier(seed=9)
        for p, q in zip(trainer.training.params(), fresh.training.params(), strict=True):
            q.set(p.numpy())
        ours, ref = EpochResult("cross_entropy"), EpochResult("cross_entropy")
        for i in range(16 // 4, 24 // 4):
            trainer.eval_batch(*ds.batch(i, 4), backward=False, result=ours)
            fresh.eval_batch(*ds.batch(i, 4), backward=False, result=ref)
        assert ours.losses == ref.losses and ours.ncorrect == ref.ncorrect
        assert val.losses == ours.losses     # the epoch's own validation saw the same weights


def test_accuracy_and_uncertainties():
    r = EpochResult("mean", losses=[1.0, 2.0, 3.0], ndata=10, ncorrect=7)
    assert r.loss() == (2.0, pytest.approx(1.0 / math.sqrt(3)))
    acc, unc = r.accuracy()
    assert acc == 0.7 and unc == pytest.approx(math.sqrt(0.7 * 0.3 / 9))
    s = EpochResult("sum", losses=[1.0, 2.0, 3.0])
    assert s.loss() == (6.0, pytest.approx(math.sqrt(3)))
    empty = EpochResult("mean")
    assert math.isnan(empty.loss()[0]) and math.isnan(empty.accuracy()[0])


def test_cross_entropy_training_counts_correct_predictions_and_learns():
    trainer, _ = _classifier()
    ds = _data()
    first = None
    for _ in range(15):
        train, _ = trainer.epoch(ds)
        first = first or train.loss()[0]
    assert train.ndata == 24 and 0 <= train.ncorrect <= 24
    assert train.loss()[0] < first


def test_dataset_shuffle_is_seeded_and_keeps_the_validation_part():
    ds1, ds2 = _data(), _data()
    ds1.shuffle(np.random.default_rng(5), upto=16)
    ds2.shuffle(np.random.default_rng(5), upto=16)
    assert np.array_equal(ds1.order, ds2.order)
    assert np.array_equal(ds1.order[16:], np.arange(16, 24))
    assert sorted(ds1.order[:16]) == list(range(16))
    with pytest.raises(ShapeError, match="outside"):
        ds1.batch(6, 4)


def test_trainer_errors_are_clear():
    x = engine.input_tensor((4, 2), "f64", name="x")
    w = engine.param((2,), "f64", name="w")
    out = x * w
    with pytest.raises(ShapeError, match="multiple of the physical batch"):
        Trainer(x, out, "sum", batch_logical=6)
    with pytest.raises(EngineError, match="unknown loss type"):
        Trainer(x, out, "hinge")
    with pytest.raises(EngineError, match="needs labels"):
        Trainer(x, out, "cross_entropy")
    with pytest.raises(ShapeError, match="5 datapoints but 4 labels"):
        Dataset(np.zeros(5), np.zeros(4))
    trainer = Trainer(x, out, "sum")
    with pytest.raises(ShapeError, match="no whole logical batch"):
        trainer.fit(Dataset(np.zeros((3, 2))))
