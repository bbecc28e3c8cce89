"""mnist-train stopped by Ctrl-C or SIGTERM (raised as checkkit.interrupted.Terminated,
which the console scripts' handler raises): the model after the last completed epoch is
written, one line says which signal stopped it, and the exit status is 128 + the signal."""

from __future__ import annotations

import pytest

from checkkit.interrupted import Terminated
from engine import train
from mnist_target.cli import train_main
from mnist_target.models import read_model
from tests.mnist_target.data_files import write_idx_dir

TWO_EPOCHS = ["--epochs", "2", "--batch-logical", "4", "--batch-physical", "4",
              "--no-progress"]


@pytest.mark.parametrize("stop, code, word", [(KeyboardInterrupt, 130, "interrupted"),
                                              (Terminated, 143, "terminated")])
def test_a_stopped_training_keeps_its_last_epoch_and_says_which_signal(
        tmp_path, monkeypatch, capsys, stop, code, word):
    write_idx_dir(tmp_path / "idx")
    out = tmp_path / "m.gguf"
    original, calls = train.Trainer.fit, []

    def stopping_in_the_second_epoch(self, *args, on_epoch=None, **kwargs):
        def after(index, *results):
            on_epoch(index, *results)
            calls.append(index)
            monkeypatch.setattr(train.Trainer, "eval_batch", _raise(stop))
        return original(self, *args, on_epoch=after, **kwargs)

    monkeypatch.setattr(train.Trainer, "fit", stopping_in_the_second_epoch)
    status = train_main(["--arch", "fc", "--out", str(out), "--data",
                         str(tmp_path / "idx"), *TWO_EPOCHS])
    err = capsys.readouterr().err
    assert status == code, err
    assert f"mnist-train: {word}; keeping the model after epoch 1" in err.splitlines()
    assert calls == [0] and read_model(str(out))[0] == "mnist-fc"


def _raise(stop):
    def eval_batch(self, *args, **kwargs):
        raise stop("SIGTERM") if stop is Terminated else stop()
    return eval_batch
