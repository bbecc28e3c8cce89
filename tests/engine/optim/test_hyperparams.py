"""The layout of the hyperparameter tensors (engine.hyperparams) is the one the optimizers
write and the kernels read."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import hyperparams
from engine.optim import SGD, Adam, AdamW


@pytest.mark.parametrize("prefix, names", [("SGD", hyperparams.SGD_HPARAMS),
                                           ("ADAM", hyperparams.ADAM_HPARAMS)])
def test_positions_name_the_values_they_index(prefix, names):
    for i, name in enumerate(names):
        assert getattr(hyperparams, f"{prefix}_{name.upper()}") == i


SGD_KWARGS = dict(lr=0.1, momentum=0.5, dampening=0.25, weight_decay=0.125)
ADAM_KWARGS = dict(lr=0.1, betas=(0.75, 0.875), eps=1e-3, weight_decay=0.125)


@pytest.mark.parametrize("cls, kwargs, want", [
    (SGD, SGD_KWARGS, {"lr": 0.1, "momentum": 0.5, "dampening": 0.25, "weight_decay": 0.125}),
    (Adam, ADAM_KWARGS, {"lr": 0.1, "beta1": 0.75, "beta2": 0.875, "eps": 1e-3,
                         "weight_decay": 0.125}),
    (AdamW, ADAM_KWARGS, {"lr": 0.1, "beta1": 0.75, "beta2": 0.875, "eps": 1e-3,
                          "weight_decay": 0.125})])
def test_optimizers_write_the_layout(cls, kwargs, want):
    """Each value sits at its position in engine.hyperparams."""
    x = engine.param((2,), "f64", name="x")
    opt = cls([x], grads={x: engine.input_tensor((2,), "f64")}, **kwargs)
    names = hyperparams.SGD_HPARAMS if cls is SGD else hyperparams.ADAM_HPARAMS
    assert opt.HPARAMS == names
    np.testing.assert_array_equal(opt.hp.buffer(), [want[k] for k in names])
