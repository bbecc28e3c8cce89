"""Closed-form scenarios of the training loop: ggml's tests/test-opt.cpp toy model trained
by the engine's Trainer, where every value is a small integer (or a sixth of one).

The model: out = x + w (as scale(x + w, 1)), w0 = 3, data x = 0..5, lr 1; Adam/AdamW with
betas (0, 0), eps 0, wd 0, whose every step is -sign(gradient) = -1; SGD without momentum,
whose step is -(accumulated gradient).

toy_forward       forward only: loss = sum(x + 3) = 33, w stays 3.
toy_epoch         one epoch, physical batch 1: each batch's gradient is 1 (d/dw of a sum
                  over one datapoint), so for every optimizer w = 2 - i after batch i, and
                  every batch loss is i + (3 - i) = 3: epoch loss 18 with 0 spread.
toy_split         4 epochs trained on x = 0..3, validated on 4, 5: after epoch e w = 3 - 4e,
                  train loss 4 (3 - 4(e-1)) = 28 - 16e (0 spread), validation loss
                  (4 + w) + (5 + w) = 15 - 8e.
toy_accumulation  logical batch 6 of physical batches of 1 or 2, loss sum or mean: the
                  accumulator holds n (sum) or n / 6 (mean) after n datapoints; one step per
                  epoch by d = 1 (Adam: a sign step; SGD on the mean: the gradient 1) or
                  d = 6 (SGD on the sum): w = 3 - d e, epoch loss 15 + 6 (3 - d (e-1)) (sum;
                  / 6 for mean), i.e. 39 - 6e when d = 1 and 69 - 36e for SGD on the sum.
Values involving 1/6 (mean-loss gradients, and SGD's w that steps by them) are compared
within the dtype's float error; everything else exactly.

    toy_cases(optimizer, dtype, backend) -> [(check, case, compare)]   compare() -> Comparison
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import engine
from engine import ops
from engine.train import Dataset, Trainer
from optcheck.harness import EXACT, Comparison


def toy_cases(optimizer: str, dtype: str,
              backend: str) -> list[tuple[str, str, Callable[[], Comparison]]]:
    """The toy rows of `optimizer`: (check, one-line case, compare() -> Comparison)."""
    ctx = (optimizer, dtype, backend)
    out = [("toy_forward", "toy_forward(w0=3,x=0..5,loss=sum,batch=1)",
            lambda: _toy_forward(*ctx)),
           ("toy_epoch", "toy_epoch(w0=3,x=0..5,loss=sum,batch=1,lr=1)",
            lambda: _toy_epoch(*ctx)),
           ("toy_split", "toy_split(w0=3,x=0..5,loss=sum,batch=1,lr=1,split=4,epochs=4)",
            lambda: _toy_split(*ctx))]
    for physical in (1, 2):
        for loss in ("sum", "mean"):
            case = f"toy_accumulation(w0=3,x=0..5,loss={loss},batch={physical},logical=6,lr=1)"
            out.append(("toy_accumulation", case,
                        lambda p=physical, lo=loss: _toy_accumulation(*ctx, p, lo)))
    return out


def _toy(optimizer, dtype, backend, physical=1, loss="sum", logical=None):
    x = engine.input_tensor((physical,), dtype, name="x")
    w = engine.param((1,), dtype, name="w")
    w.set(3.0)
    params = (dict(lr=1.0, momentum=0.0) if optimizer == "sgd"
              else dict(lr=1.0, betas=(0.0, 0.0), eps=0.0, weight_decay=0.0))
    trainer = Trainer(x, ops.scale(x + w, 1.0), loss, optimizer=optimizer, opt_params=params,
                      batch_logical=logical, backend=backend)
    return trainer, w, Dataset(np.arange(6))


def _toy_forward(optimizer, dtype, backend) -> Comparison:
    trainer, w, data = _toy(optimizer, dtype, backend)
    _, val = trainer.epoch(data, idata_split=0)
    comp = Comparison()
    comp.add(0, {"loss": val.loss()[0], "w": w.item()}, {"loss": 33.0, "w": 3.0}, dtype, tol=EXACT)
    return comp


def _toy_epoch(optimizer, dtype, backend) -> Comparison:
    trainer, w, data = _toy(optimizer, dtype, backend)
    comp = Comparison()
    train, _ = trainer.epoch(data, progress=lambda i, tr, va: comp.add(
        i + 1, {"w": w.item()}, {"w": 2.0 - i}, dtype, tol=EXACT))
    loss, spread = train.loss()
    comp.add(6, {"loss": loss, "spread": spread}, {"loss": 18.0, "spread": 0.0}, dtype,
             tol=EXACT)
    return comp


def _toy_split(optimizer, dtype, backend) -> Comparison:
    trainer, w, data = _toy(optimizer, dtype, backend)
    comp = Comparison()
    for e in range(1, 5):
        train, val = trainer.epoch(data, idata_split=4)
        (tl, ts), (vl, _) = train.loss(), val.loss()
        comp.add(e, {"w": w.item(), "train_loss": tl, "train_spread": ts, "val_loss": vl},
                 {"w": 3.0 - 4 * e, "train_loss": 28.0 - 16 * e, "train_spread": 0.0,
                  "val_loss": 15.0 - 8 * e}, dtype, tol=EXACT)
    return comp


def _toy_accumulation(optimizer, dtype, backend, physical, loss) -> Comparison:
    trainer, w, data = _toy(optimizer, dtype, backend, physical, loss, logical=6)
    per = 1.0 if loss == "sum" else 1.0 / 6.0       # gradient per datapoint
    d = 6.0 if (optimizer == "sgd" and loss == "sum") else 1.0
    grad_tol = EXACT if loss == "sum" else None
    w_tol = None if (optimizer == "sgd" and loss == "mean") else EXACT
    nb = 6 // physical
    comp = Comparison()
    for e in range(1, 5):
        def after_batch(i, train, val, e=e):
            got = float(trainer.training.grad(w).numpy()[0])
            comp.add((e - 1) * nb + i + 1, {"grad_w": got}, {"grad_w": (i + 1) * physical * per},
                     dtype, tol=grad_tol)
        train, _ = trainer.epoch(data, progress=after_batch)
        want_loss = (15.0 + 6.0 * (3.0 - d * (e - 1))) / (1.0 if loss == "sum" else 6.0)
        comp.add(e * nb, {"w": w.item()}, {"w": 3.0 - d * e}, dtype, tol=w_tol)
        comp.add(e * nb, {"epoch_loss": train.loss()[0]}, {"epoch_loss": want_loss}, dtype,
                 tol=EXACT)
    return comp
