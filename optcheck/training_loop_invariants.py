"""Training-loop invariants of the invariant family: the Trainer (physical and logical
batches, shuffling, fit) run twice, and the runs compared.

The model is x (B, 4) -> tanh(x W1 + b1) W2 (B, 3), its parameters drawn from the seed.

grad_accumulation   A logical batch of B = 8 as k = 2, 4 physical batches of B/k: after every
                    logical batch of an epoch the accumulator holds the logical gradient,
                    sum_j grad L_j = grad L (sum loss), sum_j grad (L_j / k) = grad L (mean,
                    cross-entropy), and weights and state agree (to float error: the summation
                    order differs). The sum loss trains with lr / (3 B), its mean's step size.
determinism         Two complete runs (fit: shuffle, accumulation, validation, 2 epochs) with
                    one seed give the same bits; another shuffle seed gives other weights.
epoch_vs_fit        Trainer.epoch after dataset.shuffle(trainer.rng) == fit(copy, epochs=1,
                    val_split=0) of a trainer with the same seed, bit for bit (ggml's
                    test_epoch_vs_fit): weights, state and every batch loss.

Each invariant is a pair describe_*(cfg) (the row's parameters) and check_*(cfg) -> Outcome.
"""

from __future__ import annotations

import numpy as np

import engine
from engine import ops
from engine.train import Dataset, Trainer
from optcheck.harness import EXACT, Comparison, to_engine_kwargs
from optcheck.invariant_setup import InvariantConfig, Outcome, compare_traces, hp_text


def _trainer(cfg: InvariantConfig, loss_type: str, batch_physical: int, batch_logical: int,
             seed: int | None = None) -> Trainer:
    """The model on a trainer of cfg's optimizer, parameters drawn from cfg.seed. A sum
    loss's gradient is 3 B times its mean's, so it trains with lr / (3 B): steps of the
    mean's size keep the two runs of an invariant from drifting apart by more than their
    rounding."""
    rng = np.random.default_rng(cfg.seed)
    x = engine.input_tensor((batch_physical, 4), cfg.dtype, name="x")
    w1 = engine.param((4, 5), cfg.dtype, name="w1").set(rng.uniform(-1, 1, (4, 5)))
    b1 = engine.param((5,), cfg.dtype, name="b1").set(rng.uniform(-0.5, 0.5, (5,)))
    w2 = engine.param((5, 3), cfg.dtype, name="w2").set(rng.uniform(-1, 1, (5, 3)))
    out = ops.matmul(ops.tanh(ops.add(ops.matmul(x, w1), b1)), w2)
    labels = None
    if loss_type == "cross_entropy":
        labels = engine.input_tensor((batch_physical, 3), cfg.dtype, name="y")
    hp = cfg.hp
    if loss_type == "sum":
        hp["lr"] /= 3 * batch_logical
    return Trainer(x, out, loss_type, labels, cfg.optimizer,
                   to_engine_kwargs(cfg.optimizer, hp, cfg.flags), batch_logical,
                   cfg.backend, cfg.seed if seed is None else seed)


def _dataset(cfg: InvariantConfig, n: int) -> Dataset:
    rng = np.random.default_rng(cfg.seed + 1)
    return Dataset(rng.standard_normal((n, 4)).astype(cfg.ftype),
                   np.eye(3, dtype=cfg.ftype)[rng.integers(0, 3, n)])


def _trainer_snapshot(trainer: Trainer) -> dict[str, np.ndarray]:
    return {**{p.name: p.numpy() for p in trainer.optimizer.params},
            **trainer.optimizer.state_arrays()}


# --- grad_accumulation ----------------------------------------------------------------------

def describe_accumulation(cfg: InvariantConfig) -> str:
    return (f"loss=mean|sum|cross_entropy,B=8,k=2|4,batches={cfg.batches},"
            f"{hp_text(cfg.hp, cfg.flags)}")


def _accumulation_trace(cfg, loss_type, batch_logical, k) -> list[dict]:
    """Parameters, state and accumulated gradients after each logical batch of one epoch
    (dataset order, physical batch batch_logical / k)."""
    trainer = _trainer(cfg, loss_type, batch_logical // k, batch_logical)
    trace = []

    def after_batch(i, train, val):
        if (i + 1) % k == 0:
            trace.append({**_trainer_snapshot(trainer),
                          **{f"{p.name}.grad": trainer.training.grad(p).numpy()
                             for p in trainer.optimizer.params}})

    trainer.epoch(_dataset(cfg, batch_logical * cfg.batches), progress=after_batch)
    return trace


def check_accumulation(cfg: InvariantConfig) -> Outcome:
    comparison = Comparison()
    for loss_type in ("mean", "sum", "cross_entropy"):
        want = _accumulation_trace(cfg, loss_type, 8, 1)
        for k in (2, 4):
            compare_traces(comparison, f"{loss_type},k={k}",
                           _accumulation_trace(cfg, loss_type, 8, k), want, cfg.dtype)
    return Outcome(comparison)


# --- determinism ----------------------------------------------------------------------------

def describe_determinism(cfg: InvariantConfig) -> str:
    return f"fit,epochs=2,val_split=0.2,B=4,logical=8,seed={cfg.seed},{hp_text(cfg.hp, cfg.flags)}"


def _training_run(cfg: InvariantConfig, shuffle_seed: int) -> dict[str, np.ndarray]:
    trainer = _trainer(cfg, "cross_entropy", 4, 8, seed=shuffle_seed)
    history = trainer.fit(_dataset(cfg, 8 * cfg.batches + 8), epochs=2, val_split=0.2)
    losses = [x for train, val in history for x in train.losses + val.losses]
    return {**_trainer_snapshot(trainer), "losses": np.array(losses)}


def check_determinism(cfg: InvariantConfig) -> Outcome:
    first, second = _training_run(cfg, cfg.seed), _training_run(cfg, cfg.seed)
    comparison = Comparison()
    comparison.add(0, second, first, cfg.dtype, tol=EXACT)
    other = _training_run(cfg, cfg.seed + 1)
    seed_diff = max(float(np.max(np.abs(other[k] - first[k])))
                    for k in first if "." not in k and k != "losses")
    problems = [] if seed_diff > 0 else [f"shuffle seed {cfg.seed + 1} gave the weights of "
                                         f"seed {cfg.seed}: the seed does not reach the shuffle"]
    return Outcome(comparison, problems, {"seed_diff": seed_diff})


# --- epoch_vs_fit ---------------------------------------------------------------------------

def describe_epoch_vs_fit(cfg: InvariantConfig) -> str:
    return f"cross_entropy,B=4,logical=8,batches={cfg.batches},{hp_text(cfg.hp, cfg.flags)}"


def check_epoch_vs_fit(cfg: InvariantConfig) -> Outcome:
    dataset = _dataset(cfg, 8 * cfg.batches)
    copy = Dataset(dataset.data.copy(), dataset.labels.copy())
    by_epoch = _trainer(cfg, "cross_entropy", 4, 8)
    dataset.shuffle(by_epoch.rng)
    train, _ = by_epoch.epoch(dataset)
    by_fit = _trainer(cfg, "cross_entropy", 4, 8)
    (fit_train, _), = by_fit.fit(copy, epochs=1, val_split=0.0)
    comparison = Comparison()
    comparison.add(0, {**_trainer_snapshot(by_fit), "losses": np.array(fit_train.losses)},
                   {**_trainer_snapshot(by_epoch), "losses": np.array(train.losses)},
                   cfg.dtype, tol=EXACT)
    return Outcome(comparison)
