"""Training and evaluating the MNIST models on the engine, with ggml's example's defaults.

    run = train_model(Model.new("fc"), dataset, TrainConfig(epochs=30))
    run.history[-1].val_acc, run.interrupted
    loss, loss_unc, acc, acc_unc = evaluate(run.model, test_images, test_labels)
    export_training_graph(run.model, run.config, "train-graph.gguf")   # engine.graph_io

Defaults (ggml's MNIST example): AdamW with lr 1e-3, betas (0.9, 0.999), eps 1e-8 and no
weight decay; 30 epochs; the last 5% of the training data validates; logical batch 1000
made of physical batches of 500 (gradient accumulation).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from engine.errors import EngineError
from engine.graph_io import save_graph
from engine.tensor import input_tensor
from engine.train import Dataset, EpochResult, Trainer
from mnist_target.models import GRAPH_ARCH_KEY, NCLASSES, Model

MAX_SEED = 2**32 - 1  # seeds numpy's generators; the range every seed consumer accepts


@dataclasses.dataclass
class TrainConfig:
    epochs: int = 30
    lr: float = 1e-3
    batch_logical: int = 1000
    batch_physical: int = 500
    val_split: float = 0.05
    backend: str = "cpu"
    seed: int = 0

    def training_split(self, ndata: int) -> int:
        """How many of `ndata` datapoints train each epoch (whole logical batches, as
        engine.train.Trainer.fit splits them); the rest validate."""
        nbatches = int((1.0 - self.val_split) * (ndata // self.batch_logical))
        return nbatches * self.batch_logical

    def validate(self, ndata: int | None = None) -> None:
        """Clear errors for settings that cannot train (on `ndata` datapoints, if given)."""
        if self.epochs < 1:
            raise EngineError(f"epochs must be at least 1, got {self.epochs}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise EngineError(f"the learning rate must be a positive number, got {self.lr}")
        if self.batch_physical < 1 or self.batch_logical < 1:
            raise EngineError(f"batch sizes must be positive, got logical "
                              f"{self.batch_logical} and physical {self.batch_physical}")
        if self.batch_logical % self.batch_physical:
            raise EngineError(f"the logical batch ({self.batch_logical}) must be a multiple of "
                              f"the physical batch ({self.batch_physical})")
        if not 0.0 <= self.val_split < 1.0:
            raise EngineError(f"the validation split must lie in [0, 1), got {self.val_split}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) \
                or not 0 <= self.seed <= MAX_SEED:
            raise EngineError(f"the seed must be an integer in [0, {MAX_SEED}], got "
                              f"{self.seed!r}")
        if ndata is None:
            return
        if self.training_split(ndata) < 1:
            raise EngineError(f"{ndata} datapoints hold no whole logical batch of "
                              f"{self.batch_logical} to train on with a validation split of "
                              f"{self.val_split}; use a smaller batch or more data")


@dataclasses.dataclass
class EpochRecord:
    """One epoch: training and validation loss and accuracy with their uncertainties
    (standard errors; see engine.train.EpochResult), and its wall time in seconds."""

    epoch: int
    train_loss: float
    train_loss_unc: float
    train_acc: float
    train_acc_unc: float
    val_loss: float
    val_loss_unc: float
    val_acc: float
    val_acc_unc: float
    seconds: float

    @classmethod
    def from_results(cls, epoch: int, train: EpochResult, val: EpochResult,
                     seconds: float) -> EpochRecord:
        return cls(epoch, *train.loss(), *train.accuracy(), *val.loss(), *val.accuracy(),
                   seconds)

    def line(self) -> str:
        text = (f"epoch {self.epoch:3d}: train loss {self.train_loss:.5f} "
                f"acc {100 * self.train_acc:6.2f}%")
        if not math.isnan(self.val_loss):
            one_batch = " (one batch)" if math.isnan(self.val_loss_unc) else ""
            text += (f"  val loss {estimate(self.val_loss, self.val_loss_unc, '.5f')}"
                     f"{one_batch} acc "
                     f"{estimate(self.val_acc, self.val_acc_unc, '6.2f', '.2f', 100)}%")
        return text + f"  ({self.seconds:.2f} s)"


def estimate(value: float, unc: float, fmt: str, unc_fmt: str | None = None,
             scale: float = 1.0) -> str:
    """`value`+-`unc` formatted (each times `scale`); the value alone when the uncertainty is
    NaN (one batch or one datapoint has no spread), rather than a made-up "+-nan"."""
    text = format(scale * value, fmt)
    if math.isnan(unc):
        return text
    return f"{text}+-{format(scale * unc, unc_fmt or fmt)}"


@dataclasses.dataclass
class TrainRun:
    model: Model
    config: TrainConfig
    history: list[EpochRecord]
    interrupted: int = 0       # the signal that stopped training (2: Ctrl-C), 0: none


def make_trainer(model: Model, config: TrainConfig) -> Trainer:
    """A Trainer over `model` with physical batch `config.batch_physical`."""
    images, logits = model.build(config.batch_physical)
    labels = input_tensor((config.batch_physical, NCLASSES), "f32", name="labels")
    return Trainer(images, logits, "cross_entropy", labels=labels, optimizer="adamw",
                   opt_params={"lr": config.lr, "betas": (0.9, 0.999), "eps": 1e-8,
                               "weight_decay": 0.0},
                   batch_logical=config.batch_logical, backend=config.backend,
                   seed=config.seed)


def export_training_graph(model: Model, config: TrainConfig, path) -> None:
    """Write the training graph of make_trainer(model, config) to the graph file `path`
    (engine.graph_io: nodes, flags, param data), with the roles images, logits, labels and
    loss, and the architecture under GRAPH_ARCH_KEY (models.load_model_or_graph reads the
    model back from it)."""
    trainer = make_trainer(model, config)
    save_graph(path, trainer.training,
               roles={"images": trainer.inputs, "logits": trainer.outputs,
                      "labels": trainer.labels, "loss": trainer.loss},
               metadata={GRAPH_ARCH_KEY: model.arch})


def train_model(model: Model, dataset: Dataset, config: TrainConfig, progress: bool = False,
                on_epoch=None) -> TrainRun:
    """Train `model` in place. on_epoch(record) after each epoch. Ctrl-C stops cleanly and
    leaves the model as after its last completed epoch (TrainRun.interrupted)."""
    config.validate(len(dataset))
    trainer = make_trainer(model, config)
    history: list[EpochRecord] = []
    clock = [time.perf_counter()]

    def record(index, train, val):
        now = time.perf_counter()
        history.append(EpochRecord.from_results(index + 1, train, val, now - clock[0]))
        clock[0] = now
        if on_epoch is not None:
            on_epoch(history[-1])

    trainer.fit(dataset, config.epochs, config.val_split, bar=progress, on_epoch=record)
    return TrainRun(model, config, history, trainer.interrupted)


def batch_orders(ndata: int, config: TrainConfig) -> list[np.ndarray]:
    """The datapoint order of each epoch that `train_model` uses with this config: the same
    seeded shuffles of the training part as engine.train.Trainer.fit, for a reference run
    (torch) on the same batches."""
    dataset = Dataset(np.zeros(ndata, np.int8))
    rng = np.random.default_rng(config.seed)
    split = config.training_split(ndata)
    orders = []
    for _ in range(config.epochs):
        dataset.shuffle(rng, split)
        orders.append(dataset.order.copy())
    return orders


def logits_of(model: Model, images: np.ndarray, batch: int = 1000,
              backend: str = "cpu") -> np.ndarray:
    """The model's logits for `images` (n, 784), computed on the engine in batches of
    `batch` (the last one padded with zeros)."""
    from engine.graph import Graph
    n = len(images)
    batch = max(1, min(batch, n))
    x, logits = model.build(batch)
    graph = Graph([logits], name="eval")
    out = np.empty((n, NCLASSES), np.float32)
    for start in range(0, n, batch):
        part = images[start:start + batch]
        if len(part) < batch:
            part = np.concatenate([part, np.zeros((batch - len(part), part.shape[1]),
                                                  part.dtype)])
        x.set(part)
        graph.compute(backend)
        out[start:start + batch] = logits.numpy()[:min(batch, n - start)]
    return out


def evaluate(model: Model, images: np.ndarray, labels: np.ndarray, batch: int = 1000,
             backend: str = "cpu") -> tuple[float, float, float, float]:
    """(loss, its standard error, accuracy, its standard error) on a labelled set. Logits come
    from the engine; the mean cross-entropy is taken in float64 from them. The standard
    errors are NaN for one image. EngineError for no images."""
    if len(images) == 0:
        raise EngineError("no images to evaluate")
    if len(images) != len(labels):
        raise EngineError(f"{len(images)} images but {len(labels)} labels to evaluate")
    logits = logits_of(model, images, batch, backend).astype(np.float64)
    labels = np.asarray(labels).astype(np.int64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    losses = -logp[np.arange(len(labels)), labels]
    n = len(labels)
    acc = float(np.mean(np.argmax(logits, axis=1) == labels))
    loss_unc = float(losses.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    acc_unc = math.sqrt(acc * (1 - acc) / (n - 1)) if n > 1 else math.nan
    return float(losses.mean()), loss_unc, acc, acc_unc
