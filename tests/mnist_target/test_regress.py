"""The regression run's bars (conformance against torch, floors, seeds) on made-up runs, and
on real training: a correct engine passes, a stale evaluation plan is flagged."""

from __future__ import annotations

import math

import pytest

from mnist_target import regress
from mnist_target.run import EpochRecord, TrainConfig


def _record(epoch, train_loss, val_loss=0.5, seconds=1.0):
    return EpochRecord(epoch, train_loss, 0.01, 0.9, 0.01, val_loss, 0.01, 0.9, 0.01, seconds)


def _run(engine_losses, torch_losses, engine_acc=0.981, torch_acc=0.982, arch="mnist-fc",
         val=None, torch_val=None, seed=0):
    val = val or [0.5] * len(engine_losses)
    torch_val = torch_val or [0.5] * len(torch_losses)
    mine = [_record(i + 1, loss, v)
            for i, (loss, v) in enumerate(zip(engine_losses, val, strict=True))]
    ref = [_record(i + 1, loss, v)
           for i, (loss, v) in enumerate(zip(torch_losses, torch_val, strict=True))]
    return regress.ArchRun(arch, seed, ref, torch_acc, [regress.EngineRun("engine", mine,
                                                                          engine_acc)], 10000)


def _status(results):
    return {r.name: r.status for r in results}


def test_a_run_within_every_bar_passes():
    results = regress.results_of(_run([1.0, 0.5, 0.3, 0.2, 0.1, 0.05], [1.01, 0.5, 0.3, 0.2,
                                                                        0.1, 0.08]))
    assert all(r.status == "pass" for r in results)
    names = [r.name for r in results]
    # epochs 1-5 judged, the sixth not: its 60% difference passes
    assert "fc, engine: training loss, epoch 5" in names
    assert "fc, engine: training loss, epoch 6" not in names
    assert "fc, engine: validation loss, epoch 5" in names
    assert {r.labels["check"] for r in results} == {"floor", "conformance", "time"}


@pytest.mark.parametrize("change, failing", [
    ({"engine_losses": [1.0, 0.53]}, "fc, engine: training loss, epoch 2"),
    ({"val": [0.5, 0.48]}, "fc, engine: validation loss, epoch 2"),
    ({"engine_acc": 0.979}, "fc, engine: test accuracy vs torch"),
    ({"engine_acc": 0.977, "torch_acc": 0.977}, "fc, engine: test accuracy floor"),
    ({"arch": "mnist-cnn", "engine_acc": 0.979, "torch_acc": 0.9795},
     "cnn, engine: test accuracy floor"),
])
def test_each_bar_fails_alone(change, failing):
    args = {"engine_losses": [1.0, 0.5], "torch_losses": [1.0, 0.5], **change}
    failed = [name for name, status in _status(regress.results_of(_run(**args))).items()
              if status == "fail"]
    assert failed == [failing]


def test_floors_are_reported_but_not_judged_on_shortened_runs():
    results = regress.results_of(_run([1.0], [1.0], engine_acc=0.5, torch_acc=0.5),
                                 floors=False)
    floor = next(r for r in results if r.labels["check"] == "floor")
    assert floor.status == "skip" and "not a bar" in floor.message
    assert floor.metrics["measured"] == 0.5


def test_no_validation_split_gives_no_validation_rows():
    nan = math.nan
    results = regress.results_of(_run([1.0, 0.5], [1.0, 0.5], val=[nan, nan],
                                      torch_val=[nan, nan]))
    assert not [r for r in results if "validation" in r.name]


def test_seed_summary_gives_mean_and_spread_against_ggmls_figure():
    runs = [_run([1.0], [1.0], engine_acc=acc, torch_acc=acc + 0.001, seed=s)
            for s, acc in enumerate([0.978, 0.980, 0.982])]
    rows = {r.name: r for r in regress.seed_summary(runs)}
    engine = rows["fc, engine: test accuracy over 3 seeds"]
    assert engine.metrics["mean"] == pytest.approx(0.980)
    assert engine.metrics["sd"] == pytest.approx(0.002)
    assert engine.metrics["ggml_published"] == 0.9794
    assert rows["fc, torch: test accuracy over 3 seeds"].metrics["mean"] == pytest.approx(0.981)
    assert all(r.status == "pass" for r in rows.values())
    assert regress.seed_summary(runs[:1]) == []


# --- real training ---------------------------------------------------------------------------

# 3000 images, 20% validating: 12 logical batches of 200 train, 3 validate (6 physical)
SHORT = TrainConfig(epochs=3, batch_logical=200, batch_physical=100, val_split=0.2)


def _conformance(run):
    return {r.name: r.status for r in regress.results_of(run, floors=False)
            if r.labels["check"] == "conformance"}


def test_the_engine_conforms_to_torch(mnist):
    run = regress.run_arch("fc", mnist, SHORT, regress.Options(limit=3000))
    assert set(_conformance(run).values()) == {"pass"}
    assert len(_conformance(run)) == 7          # accuracy, 3 training and 3 validation losses


def test_a_stale_evaluation_plan_is_flagged_by_the_validation_loss(mnist, monkeypatch):
    """ggml's bug: the scheduler, given the validation graph, re-ran the training graph it
    had allocated (forward, backward and the optimizer step), so validation trained on the
    validation batches. The same fault in our trainer: every validation batch runs the
    training path. Epoch 1's training loss is still right (validation comes after it), and
    the validation loss of that very epoch is already flagged."""
    from engine.train import Trainer
    evaluate = Trainer.eval_batch

    def stale(self, data, labels=None, backward=True, result=None):
        return evaluate(self, data, labels, True, result)

    monkeypatch.setattr(Trainer, "eval_batch", stale)
    status = _conformance(regress.run_arch("fc", mnist, SHORT, regress.Options(limit=3000)))
    assert status["fc, engine: training loss, epoch 1"] == "pass"
    assert status["fc, engine: validation loss, epoch 1"] == "fail"
    assert {status[f"fc, engine: validation loss, epoch {e}"] for e in (2, 3)} == {"fail"}
