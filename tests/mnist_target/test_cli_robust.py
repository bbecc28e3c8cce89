"""The MNIST commands on bad input: one line on stderr and exit status 2, never a traceback,
a hang or a file of the user's replaced; every output checked before training; no made-up
uncertainties. In-process through the console scripts' main functions, on tiny IDX files."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from engine import ops
from engine.graph import Graph
from engine.graph_io import save_graph
from mnist_target import run as run_module
from mnist_target.cli import eval_main, regress_main, train_main
from mnist_target.models import GRAPH_ARCH_KEY, Model
from mnist_target.run import MAX_SEED, EpochRecord, TrainConfig, evaluate
from tests.mnist_target.data_files import idx_images, idx_labels, write_idx_dir
from tests.mnist_target.special_files import SPECIAL, make_special

TINY = ["--epochs", "1", "--batch-logical", "4", "--batch-physical", "4", "--no-progress"]


@pytest.fixture
def no_training(monkeypatch):
    """Makes training fail loudly: a refusal must come before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("trained before checking the arguments")
    monkeypatch.setattr("mnist_target.cli.train_model", refuse)
    monkeypatch.setattr("mnist_target.regress.run_arch", refuse)


def _one_error_line(capsys, code) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and re.match(r"mnist-(train|eval|regress): ", lines[0]), err
    assert "Traceback" not in err
    return lines[0]


def _main_code(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:   # an argparse usage error
        return exc.code


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.gguf"
    Model.new("fc").save(path)
    return path


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "loop", "broken link", "none"])
def test_eval_of_a_file_that_is_not_one_says_what_it_is(tmp_path, capsys, no_hang, kind):
    path = make_special(tmp_path / "m.gguf", kind)
    message = {**SPECIAL, "none": "no such file"}[kind]
    line = _one_error_line(capsys, eval_main([str(path)]))
    assert line.startswith(f"mnist-eval: {path}: {message}")


def test_eval_with_a_fifo_in_the_data_directory(tmp_path, capsys, no_hang, model_file):
    write_idx_dir(tmp_path / "idx")
    (tmp_path / "idx" / "t10k-labels-idx1-ubyte").unlink()
    os.mkfifo(tmp_path / "idx" / "t10k-labels-idx1-ubyte")
    line = _one_error_line(capsys, eval_main([str(model_file), "--data", str(tmp_path / "idx")]))
    assert line.endswith("t10k-labels-idx1-ubyte: not a regular file (it is a FIFO)")


def test_eval_parses_the_model_file_once(tmp_path, capsys, monkeypatch, model_file):
    from engine import gguf_io
    write_idx_dir(tmp_path / "idx")
    parses = []
    parse = gguf_io._BoundedReader.__init__
    monkeypatch.setattr(gguf_io._BoundedReader, "__init__",
                        lambda self, *a, **k: parses.append(a) or parse(self, *a, **k))
    assert eval_main([str(model_file), "--data", str(tmp_path / "idx")]) == 0
    assert len(parses) == 1
    assert "(7 images)" in capsys.readouterr().out


def test_eval_of_an_empty_test_set_says_no_images(tmp_path, capsys, model_file):
    write_idx_dir(tmp_path / "idx", replace={"t10k-images-idx3-ubyte": idx_images(
        np.zeros((0, 784), np.uint8)), "t10k-labels-idx1-ubyte": idx_labels([])})
    line = _one_error_line(capsys, eval_main([str(model_file), "--data", str(tmp_path / "idx")]))
    assert "t10k-images-idx3-ubyte: no images" in line


@pytest.mark.parametrize("replace, message", [
    ({"t10k-labels-idx1-ubyte": idx_labels([1] * 6)}, "holds 7 images but"),
    ({"t10k-images-idx3-ubyte": idx_labels([1] * 20)}, "IDX magic 0x00000801, expected"),
])
def test_eval_with_inconsistent_idx_files(tmp_path, capsys, model_file, replace, message):
    write_idx_dir(tmp_path / "idx", replace=replace)
    line = _one_error_line(capsys, eval_main([str(model_file), "--data", str(tmp_path / "idx")]))
    assert message in line


def test_evaluate_refuses_no_images():
    with pytest.raises(Exception, match="no images to evaluate"):
        evaluate(Model.new("fc"), np.zeros((0, 784), np.float32), np.zeros(0, np.int32))


@pytest.mark.parametrize("arch", [["mnist-fc"], 7, "mnist-gpt"])
def test_eval_of_a_graph_whose_arch_is_not_a_known_string(tmp_path, capsys, arch):
    path = tmp_path / "g.gguf"
    bias = Model.new("fc").params["fc1.bias"]
    save_graph(path, Graph([ops.relu(bias).set_output()]), metadata={GRAPH_ARCH_KEY: arch})
    line = _one_error_line(capsys, eval_main([str(path)]))
    assert f"g.gguf: a graph file whose {GRAPH_ARCH_KEY} is {arch!r}" in line


@pytest.mark.parametrize("seed", ["-1", str(MAX_SEED + 1)])
def test_train_seed_out_of_range_is_a_usage_error(tmp_path, capsys, no_training, seed):
    code = train_main(["--arch", "fc", "--out", str(tmp_path / "m.gguf"), f"--seed={seed}"])
    line = _one_error_line(capsys, code)
    assert f"the seed must be an integer in [0, {MAX_SEED}], got {seed}" in line


def test_regress_seeds_past_the_largest_seed(tmp_path, capsys, no_training):
    write_idx_dir(tmp_path / "idx")
    code = regress_main(["--seed", str(MAX_SEED), "--seeds", "2", "--data",
                         str(tmp_path / "idx"), *TINY])
    assert "passes the largest seed" in _one_error_line(capsys, code)


@pytest.mark.parametrize("limit", ["0", "-5"])
def test_train_limit_below_one(tmp_path, capsys, no_training, limit):
    code = train_main(["--arch", "fc", "--out", str(tmp_path / "m.gguf"), "--limit", limit])
    assert f"--limit must be at least 1, got {limit}" in _one_error_line(capsys, code)


def _outputs(tmp_path, case):
    out = tmp_path / "m.gguf"
    if case == "empty out":
        return ["--out", ""]
    if case == "empty graph-out":
        return ["--out", str(out), "--graph-out", ""]
    if case == "same file":
        return ["--out", str(out), "--graph-out", str(out)]
    if case == "same file through a link":
        (tmp_path / "link.gguf").symlink_to(out)
        return ["--out", str(out), "--graph-out", str(tmp_path / "link.gguf")]
    (tmp_path / "dir").mkdir()
    return ["--out", str(out), "--graph-out", str(tmp_path / "dir")]


@pytest.mark.parametrize("case", ["empty out", "empty graph-out", "same file",
                                  "same file through a link", "graph-out a directory"])
def test_train_checks_every_output_before_training(tmp_path, capsys, no_training, case):
    write_idx_dir(tmp_path / "idx")
    argv = ["--arch", "fc", *_outputs(tmp_path, case), "--data", str(tmp_path / "idx"), *TINY]
    line = _one_error_line(capsys, _main_code(train_main, argv))
    assert ("is given as two outputs" if "same" in case else "cannot write") in line
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("output", ["", "dir"])
def test_regress_checks_its_report_before_training(tmp_path, capsys, no_training, output):
    (tmp_path / "dir").mkdir()
    write_idx_dir(tmp_path / "idx")
    monkey = ["--output", str(tmp_path / output) if output else ""]
    code = regress_main(["--arch", "fc", "--data", str(tmp_path / "idx"), *monkey, *TINY])
    assert "cannot write" in _one_error_line(capsys, code)


def test_one_validation_batch_prints_no_made_up_uncertainty(tmp_path, capsys):
    """12 images, batches of 4, a validation split of 0.3: 8 train and 4 validate, one batch."""
    write_idx_dir(tmp_path / "idx")
    out = tmp_path / "m.gguf"
    code = train_main(["--arch", "fc", "--out", str(out), "--data", str(tmp_path / "idx"),
                       "--val-split", "0.3", *TINY])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    (epoch,) = [line for line in captured.err.splitlines() if line.startswith("epoch")]
    assert "nan" not in epoch and "val loss" in epoch and "(one batch)" in epoch
    assert "nan" not in captured.out and "(7 images)" in captured.out and out.is_file()


def test_epoch_line_and_estimates_without_spread():
    nan = float("nan")
    record = EpochRecord(1, 0.5, 0.01, 0.9, 0.01, 0.25, nan, 0.75, 0.2, 1.0)
    line = record.line()
    assert "val loss 0.25000 (one batch) acc  75.00+-20.00%" in line and "nan" not in line
    assert run_module.estimate(0.5, nan, ".2f", scale=100) == "50.00"
    assert run_module.estimate(0.5, 0.125, ".3f") == "0.500+-0.125"


def test_config_seed_range():
    TrainConfig(seed=MAX_SEED).validate()
    for seed in (-1, MAX_SEED + 1, 1.5, True):
        with pytest.raises(Exception, match=r"the seed must be an integer in \[0, "):
            TrainConfig(seed=seed).validate()
