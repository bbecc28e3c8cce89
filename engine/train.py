"""Datasets, training results, and a trainer with epoch and fit (as ggml-opt's, in Python).

    trainer = Trainer(inputs, outputs, loss_type="cross_entropy", labels=labels,
                      optimizer="adamw", opt_params={"lr": 1e-3}, batch_logical=1000)
    history = trainer.fit(dataset, epochs=30, val_split=0.05)

A `Trainer` holds three graphs over the same model: the forward graph (loss and, for
classification, predictions) for evaluation; the training graph (forward + backward with
persistent gradient accumulators); and the optimizer's graph, whose sources are all
persistent. Each evaluation computes exactly the graph it asks for, with that graph's own
plan, so evaluating after training never reruns the training graph.

Gradient accumulation: a logical batch of `batch_logical` datapoints is `k = batch_logical /
batch_physical` physical batches. Gradients add up in the accumulators over the k physical
batches (for per-datapoint losses, mean and cross-entropy, each physical loss is scaled by
1/k so that the sum is the logical batch's mean); the optimizer steps after the k-th, and the
accumulators are zeroed when the next logical batch starts.
"""

from __future__ import annotations

import dataclasses
import math
import signal

import numpy as np

from engine import ops
from engine.errors import EngineError, ShapeError
from engine.graph import Graph
from engine.optim import make_optimizer
from engine.tensor import Tensor

LOSS_TYPES = ("sum", "mean", "cross_entropy", "mse")


class Dataset:
    """Datapoints (axis 0 of `data`) with optional labels, in an order that `shuffle`
    permutes with a seeded generator; `batch(i, size)` gives the i-th batch in that order."""

    def __init__(self, data, labels=None):
        self.data = np.asarray(data)
        self.labels = None if labels is None else np.asarray(labels)
        if self.data.ndim < 1 or len(self.data) == 0:
            raise ShapeError(f"a dataset needs at least one datapoint, got data of shape "
                             f"{list(self.data.shape)}")
        if self.labels is not None and len(self.labels) != len(self.data):
            raise ShapeError(f"{len(self.data)} datapoints but {len(self.labels)} labels")
        self.order = np.arange(len(self.data))

    def __len__(self) -> int:
        return len(self.data)

    def shuffle(self, rng: np.random.Generator, upto: int | None = None) -> None:
        """Permute the first `upto` positions of the order (default all), leaving the rest
        (a validation part) in place."""
        upto = len(self) if upto is None else upto
        self.order[:upto] = self.order[:upto][rng.permutation(upto)]

    def batch(self, index: int, size: int):
        """(data, labels) of the `index`-th batch of `size` datapoints in the current order."""
        if size < 1 or (index + 1) * size > len(self):
            raise ShapeError(f"batch {index} of size {size} lies outside a dataset of "
                             f"{len(self)} datapoints")
        idx = self.order[index * size:(index + 1) * size]
        return self.data[idx], None if self.labels is None else self.labels[idx]


@dataclasses.dataclass
class EpochResult:
    """Per-physical-batch losses and correct predictions of one pass over some batches.

    loss(): for loss_type "sum" the total over the datapoints, otherwise the mean per
    datapoint; its uncertainty is the standard error from the spread of the batch losses
    (sqrt(n) s for the total and s / sqrt(n) for the mean, s the batches' sample standard
    deviation; ggml-opt reports s for the total). accuracy(): share of correct predictions
    with the binomial standard error sqrt(a (1 - a) / (N - 1)). NaN where undefined.
    """

    loss_type: str = "sum"
    losses: list[float] = dataclasses.field(default_factory=list)
    ndata: int = 0
    ncorrect: int | None = None

    def loss(self) -> tuple[float, float]:
        n = len(self.losses)
        if n == 0:
            return (0.0 if self.loss_type == "sum" else math.nan), math.nan
        a = np.asarray(self.losses, np.float64)
        s = float(a.std(ddof=1)) if n > 1 else math.nan
        if self.loss_type == "sum":
            return float(a.sum()), s * math.sqrt(n)
        return float(a.mean()), s / math.sqrt(n)

    def accuracy(self) -> tuple[float, float]:
        if self.ncorrect is None or self.ndata == 0:
            return math.nan, math.nan
        acc = self.ncorrect / self.ndata
        unc = math.sqrt(acc * (1 - acc) / (self.ndata - 1)) if self.ndata > 1 else math.nan
        return acc, unc


class Trainer:
    """Trains `outputs` (a function of the input tensor `inputs` and of params) with one of
    the optimizers of engine.optim.

    loss_type: "sum" or "mean" of the outputs, or "cross_entropy" / "mse" of the outputs
    against `labels` (an input tensor of the outputs' shape). Classification accuracy is
    counted for cross_entropy (argmax of outputs against argmax of labels).
    """

    def __init__(self, inputs: Tensor, outputs: Tensor, loss_type: str = "sum",
                 labels: Tensor | None = None, optimizer: str = "adamw",
                 opt_params: dict | None = None, batch_logical: int | None = None,
                 backend: str = "cpu", seed: int = 0, schedule=None):
        if loss_type not in LOSS_TYPES:
            raise EngineError(f"unknown loss type {loss_type!r}; known: {LOSS_TYPES}")
        if (loss_type in ("cross_entropy", "mse")) != (labels is not None):
            raise EngineError(f"loss type {loss_type!r} "
                              + ("needs labels" if labels is None else "takes no labels"))
        self.inputs, self.outputs, self.labels = inputs, outputs, labels
        self.loss_type, self.backend = loss_type, backend
        self.batch_physical = inputs.shape[0]
        batch_logical = batch_logical or self.batch_physical
        if batch_logical % self.batch_physical:
            raise ShapeError(f"the logical batch ({batch_logical}) must be a multiple of the "
                             f"physical batch ({self.batch_physical}, the inputs' first axis)")
        self.batch_logical = batch_logical
        self.opt_period = batch_logical // self.batch_physical
        self.rng = np.random.default_rng(seed)

        if loss_type == "sum":
            self.loss = ops.sum(outputs)
        elif loss_type == "mean":
            self.loss = ops.mean(outputs)
        elif loss_type == "cross_entropy":
            self.loss = ops.cross_entropy_loss(outputs, labels)
        else:
            self.loss = ops.mse_loss(outputs, labels)
        self.pred = ops.argmax(outputs) if loss_type == "cross_entropy" else None
        self.truth = ops.argmax(labels) if self.pred is not None else None
        extra = [self.pred, self.truth] if self.pred is not None else []
        self.forward = Graph([self.loss, *extra], name="forward")
        per_datapoint = loss_type != "sum" and self.opt_period > 1
        train_loss = ops.scale(self.loss, 1.0 / self.opt_period) if per_datapoint else self.loss
        self.training = Graph([self.loss, train_loss, *extra], name="training")
        self.training.build_backward(train_loss, accumulate=True)
        self.optimizer = make_optimizer(optimizer, self.training, schedule=schedule,
                                        **(opt_params or {}))
        self._accumulated = 0
        self.interrupted = 0        # set by fit: the signal that stopped it (2: Ctrl-C)

    # --- one physical batch ---------------------------------------------------------------
    def eval_batch(self, data, labels=None, backward: bool = True,
                   result: EpochResult | None = None) -> float:
        """Evaluate one physical batch (training on it when `backward`); returns its loss."""
        self.inputs.set(data)
        if self.labels is not None:
            if labels is None:
                raise EngineError("this trainer's loss needs labels for every batch")
            self.labels.set(labels)
        if backward:
            if self._accumulated == 0:
                self.training.reset()
            self.training.compute(self.backend)
            self._accumulated += 1
            if self._accumulated == self.opt_period:
                self.optimizer.step(self.backend)
                self._accumulated = 0
        else:
            self.forward.compute(self.backend)
        loss = self.loss.item()
        if result is not None:
            result.losses.append(loss)
            result.ndata += self.batch_physical
            if self.pred is not None:
                correct = int(np.sum(self.pred.numpy() == self.truth.numpy()))
                result.ncorrect = (result.ncorrect or 0) + correct
        return loss

    # --- epochs ---------------------------------------------------------------------------
    def epoch(self, dataset: Dataset, train: EpochResult | None = None,
              val: EpochResult | None = None, idata_split: int | None = None,
              progress=None) -> tuple[EpochResult, EpochResult]:
        """Train on the datapoints before `idata_split` (default: all) in the dataset's
        current order, then evaluate on the rest; whole physical batches only."""
        train = train if train is not None else EpochResult(self.loss_type)
        val = val if val is not None else EpochResult(self.loss_type)
        n = len(dataset)
        idata_split = n if idata_split is None else idata_split
        if not 0 <= idata_split <= n:
            raise ShapeError(f"idata_split {idata_split} outside a dataset of {n}")
        b = self.batch_physical
        split = idata_split // b
        for i in range(n // b):
            data, labels = dataset.batch(i, b)
            self.eval_batch(data, labels, backward=i < split, result=train if i < split else val)
            if progress is not None:
                progress(i, train, val)
        return train, val

    def fit(self, dataset: Dataset, epochs: int = 1, val_split: float = 0.0,
            shuffle: bool = True, progress=None, bar: bool = False,
            on_epoch=None) -> list[tuple[EpochResult, EpochResult]]:
        """`epochs` epochs; the first (1 - val_split) of the data, rounded down to whole
        logical batches, trains (shuffled each epoch when `shuffle`), the rest validates.

        bar: a tqdm progress bar per epoch (on stderr) with the running training loss and
        accuracy. on_epoch(index, train, val): called after each completed epoch.
        Ctrl-C (KeyboardInterrupt) during an epoch stops training cleanly: the params are
        put back to their values after the last completed epoch (the initial values if none
        completed), `self.interrupted` is set to the signal behind it (SIGINT, 2; SIGTERM,
        15, where a handler turned it into a KeyboardInterrupt with `signum`, as the console
        scripts do), and the completed epochs are returned. The
        optimizer's state is not rolled back.
        """
        if not 0.0 <= val_split < 1.0:
            raise EngineError(f"val_split must lie in [0, 1), got {val_split}")
        nbatches_logical = len(dataset) // self.batch_logical
        idata_split = int((1.0 - val_split) * nbatches_logical) * self.batch_logical
        if idata_split == 0:
            raise ShapeError(f"no whole logical batch of {self.batch_logical} datapoints to "
                             f"train on in {len(dataset)} with val_split={val_split}")
        history = []
        self.interrupted = 0
        params = self.optimizer.params
        snapshot = [p.numpy().copy() for p in params]
        nbatches = len(dataset) // self.batch_physical
        for index in range(epochs):
            try:
                if shuffle:
                    dataset.shuffle(self.rng, idata_split)
                with _epoch_bar(bar, index, epochs, nbatches, self.batch_physical) as tick:
                    def report(i, train, val):
                        tick(train, val)
                        if progress is not None:
                            progress(i, train, val)
                    result = self.epoch(dataset, idata_split=idata_split, progress=report)
            except KeyboardInterrupt as exc:
                for p, value in zip(params, snapshot, strict=True):
                    p.set(value)
                self._accumulated = 0
                self.interrupted = int(getattr(exc, "signum", signal.SIGINT))
                break
            history.append(result)
            snapshot = [p.numpy().copy() for p in params]
            if on_epoch is not None:
                on_epoch(index, *result)
        return history


class _epoch_bar:
    """A tqdm bar over one epoch's physical batches (a no-op when disabled); the context
    value is tick(train, val), called after each batch."""

    def __init__(self, enabled: bool, index: int, epochs: int, nbatches: int, batch: int):
        self.bar, self.batch = None, batch
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=nbatches * batch, desc=f"epoch {index + 1}/{epochs}",
                            unit="img", unit_scale=True, leave=False, dynamic_ncols=True)

    def __enter__(self):
        return self.tick

    def tick(self, train: EpochResult, val: EpochResult) -> None:
        if self.bar is None:
            return
        part = val if val.losses else train
        loss, _ = part.loss()
        acc, _ = part.accuracy()
        text = f"{'val' if part is val else 'train'} loss {loss:.4f}"
        if not math.isnan(acc):
            text += f" acc {100 * acc:.2f}%"
        self.bar.set_postfix_str(text, refresh=False)
        self.bar.update(self.batch)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
        return False
