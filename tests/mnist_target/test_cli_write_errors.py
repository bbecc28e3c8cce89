"""The MNIST commands when an output cannot be written, at write time (after training): one
line on stderr naming the command and the file, exit status 2, no traceback, the previous
file byte for byte as it was and no temporary file left beside it. Also: every message
opens with the name of the command that was run (mnist-train, mnist-eval, mnist-regress).

In-process through the console scripts' main functions, on tiny IDX files (one epoch of
three batches of four images)."""

from __future__ import annotations

import errno
import os
import re

import pytest

from engine import gguf_io
from mnist_target import cli
from mnist_target.cli import eval_main, regress_main, train_main
from mnist_target.data import MnistCacheWarning, load_mnist
from mnist_target.models import Model
from tests.mnist_target.data_files import write_idx_dir

TINY = ["--epochs", "1", "--batch-logical", "4", "--batch-physical", "4", "--no-progress"]
# what the commands print on the way (progress, not an error)
STATUS = re.compile(r"^(mnist-(train|eval|regress): (data from|training|wrote) |epoch +\d+:"
                    r"|\S+, seed \d+: |  (engine|torch|ggml) +epoch)")
HAS_DEV_FULL = os.path.exists("/dev/full")


def _code(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def _error_line(capsys, code, command: str) -> str:
    """The one error line of a run that exited 2 (status lines aside)."""
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and not STATUS.match(line)]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"mnist-{command}: "), err
    return lines[0]


def _no_temp_files(directory) -> None:
    left = [n for n in os.listdir(directory) if n.endswith(".tmp")]
    assert not left, left


@pytest.fixture
def idx(tmp_path):
    write_idx_dir(tmp_path / "idx")
    return str(tmp_path / "idx")


@pytest.mark.skipif(not HAS_DEV_FULL, reason="needs /dev/full")
def test_train_to_a_full_device_is_one_line_and_exit_2(idx, capsys):
    """The defect: `mnist-train --out /dev/full` trained, then died with a traceback."""
    code = _code(train_main, ["--arch", "fc", "--out", "/dev/full", "--data", idx, *TINY])
    line = _error_line(capsys, code, "train")
    assert line == "mnist-train: cannot write /dev/full: No space left on device"


@pytest.mark.skipif(not HAS_DEV_FULL, reason="needs /dev/full")
def test_graph_out_to_a_full_device_is_one_line_and_exit_2(idx, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    code = _code(train_main, ["--arch", "fc", "--out", str(out), "--graph-out", "/dev/full",
                              "--data", idx, *TINY])
    assert _error_line(capsys, code, "train") == \
        "mnist-train: cannot write /dev/full: No space left on device"
    Model.load(out)                      # the model, written before, is whole


@pytest.mark.parametrize("failing", ["data", "fsync", "replace"])
def test_train_io_error_keeps_the_previous_model(idx, tmp_path, capsys, monkeypatch, failing):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"the previous model")
    owner, name = (gguf_io, "_write_tensor_data") if failing == "data" else (os, failing)
    real = getattr(owner, name)

    def eio(*args, **kwargs):
        if failing == "data":
            args[0].write(b"half a tensor")
        raise OSError(errno.EIO, "Input/output error")

    def after_training(*args, **kwargs):
        run = train_model(*args, **kwargs)
        monkeypatch.setattr(owner, name, eio)      # the disk fails now, not before
        return run

    train_model = cli.train_model
    monkeypatch.setattr(cli, "train_model", after_training)
    try:
        code = _code(train_main, ["--arch", "fc", "--out", str(out), "--data", idx, *TINY])
    finally:
        monkeypatch.setattr(owner, name, real)
    line = _error_line(capsys, code, "train")
    assert line == f"mnist-train: cannot write {out}: Input/output error"
    assert out.read_bytes() == b"the previous model"
    _no_temp_files(tmp_path)


def _after_training(monkeypatch, then) -> None:
    """mnist-train's training, then `then()`: the world changes before the model is
    written."""
    train_model = cli.train_model

    def train_then(*args, **kwargs):
        run = train_model(*args, **kwargs)
        then()
        return run

    monkeypatch.setattr(cli, "train_model", train_then)


def test_train_into_a_directory_that_vanished_during_training(idx, tmp_path, capsys,
                                                               monkeypatch):
    where = tmp_path / "runs"
    where.mkdir()
    _after_training(monkeypatch, where.rmdir)
    code = _code(train_main, ["--arch", "fc", "--out", str(where / "m.gguf"), "--data", idx,
                              *TINY])
    line = _error_line(capsys, code, "train")
    assert line == f"mnist-train: cannot write {where / 'm.gguf'}: directory {where} does " \
                   "not exist"


def test_train_onto_a_directory_that_appeared_during_training(idx, tmp_path, capsys,
                                                              monkeypatch):
    out = tmp_path / "m.gguf"
    _after_training(monkeypatch, out.mkdir)
    code = _code(train_main, ["--arch", "fc", "--out", str(out), "--data", idx, *TINY])
    assert _error_line(capsys, code, "train") == \
        f"mnist-train: cannot write {out}: it is a directory"
    assert out.is_dir() and os.listdir(out) == []


@pytest.mark.parametrize("kind", ["directory", "under a file", "missing directory"])
def test_train_refuses_an_unwritable_out_before_training(idx, tmp_path, capsys, monkeypatch,
                                                         kind):
    monkeypatch.setattr(cli, "train_model", lambda *a, **k: pytest.fail("trained first"))
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_bytes(b"x")
    out = {"directory": tmp_path / "dir", "under a file": tmp_path / "file" / "m.gguf",
           "missing directory": tmp_path / "none" / "m.gguf"}[kind]
    code = _code(train_main, ["--arch", "fc", "--out", str(out), "--data", idx, *TINY])
    assert f"mnist-train: cannot write {out}: " in _error_line(capsys, code, "train")


@pytest.mark.skipif(not HAS_DEV_FULL, reason="needs /dev/full")
def test_regress_report_to_a_full_device_is_one_line_and_exit_2(idx, capsys):
    pytest.importorskip("torch")
    code = _code(regress_main, ["--arch", "fc", "--format", "json", "--output", "/dev/full",
                                "--data", idx, *TINY])
    assert _error_line(capsys, code, "regress") == \
        "mnist-regress: cannot write /dev/full: No space left on device"


def test_regress_report_io_error_keeps_the_previous_report(idx, tmp_path, capsys,
                                                           monkeypatch):
    pytest.importorskip("torch")
    report = tmp_path / "report.json"
    report.write_text("the previous report")
    real = os.fsync

    def eio(fd):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".report.json."):
            raise OSError(errno.EIO, "Input/output error")
        return real(fd)

    monkeypatch.setattr(os, "fsync", eio)
    code = _code(regress_main, ["--arch", "fc", "--output", str(report), "--data", idx, *TINY])
    assert _error_line(capsys, code, "regress") == \
        f"mnist-regress: cannot write {report}: Input/output error"
    assert report.read_text() == "the previous report"
    _no_temp_files(tmp_path)


def test_eval_messages_name_the_command(tmp_path, capsys):
    code = _code(eval_main, [str(tmp_path / "none.gguf")])
    assert _error_line(capsys, code, "eval") == \
        f"mnist-eval: {tmp_path / 'none.gguf'}: no such file"


def test_every_status_line_names_the_command(idx, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert train_main(["--arch", "fc", "--out", str(out), "--data", idx, *TINY]) == 0
    err = capsys.readouterr().err.splitlines()
    messages = [line for line in err if not line.startswith("epoch")]
    assert messages and all(line.startswith("mnist-train: ") for line in messages), err
    assert eval_main([str(out), "--data", idx]) == 0
    assert capsys.readouterr().err.startswith("mnist-eval: data from ")


def test_a_cache_that_cannot_be_written_is_a_warning_and_leaves_no_temp_file(
        idx, tmp_path, monkeypatch):
    """The data cache (the writer mnist-eval and every training command use): a failing
    write warns, the data is used anyway, nothing is left in the cache directory."""
    cache = tmp_path / "cache"
    cache.mkdir()

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", eio)
    with pytest.warns(MnistCacheWarning, match=r"could not be written \(cannot write .*: "
                                               r"Input/output error\)"):
        data = load_mnist(idx, cache_dir=cache)
    assert len(data.train_labels) == 12 and os.listdir(cache) == []
