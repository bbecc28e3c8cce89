"""The MNIST commands (`python -m mnist_target train|eval|regress`) on a small subset of real
MNIST written as IDX files: train, eval of files written here and as ggml's scripts write
them, graph files, regress, bad input."""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import pytest

from mnist_target.cli import main

NTRAIN, NTEST = 2000, 1000
SMALL = ["--batch-logical", "100", "--batch-physical", "50", "--no-progress"]


def _write_idx(path, array: np.ndarray, gz: bool) -> None:
    header = struct.pack(">I", 0x0800 | array.ndim) + b"".join(struct.pack(">I", d)
                                                               for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)


@pytest.fixture(scope="module")
def mnist_subset(tmp_path_factory):
    """(IDX directory, train images, train labels, test images, test labels) of the first
    2000 training and 1000 test images of real MNIST."""
    pytest.importorskip("torch")
    from mnist_target.data import MnistDataError, load_mnist
    cache = tmp_path_factory.mktemp("cache")
    try:
        data = load_mnist(cache_dir=cache)
    except MnistDataError as exc:
        pytest.skip(f"no MNIST source: {exc}")
    root = tmp_path_factory.mktemp("idx")
    parts = {"train": (data.train_images[:NTRAIN], data.train_labels[:NTRAIN]),
             "t10k": (data.test_images[:NTEST], data.test_labels[:NTEST])}
    for prefix, (images, labels) in parts.items():
        pixels = np.rint(images * 255).reshape(-1, 28, 28)
        _write_idx(root / f"{prefix}-images-idx3-ubyte", pixels, gz=prefix == "train")
        _write_idx(root / f"{prefix}-labels-idx1-ubyte", labels, gz=False)
    return root, *parts["train"], *parts["t10k"]


def _torch_train(arch, images, labels, epochs=2):
    import torch

    from mnist_target.models import initial_weights
    from mnist_target.torch_ref import torch_model
    torch.manual_seed(0)
    net = torch_model(arch, initial_weights(arch, seed=7))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))
    for _ in range(epochs):
        for i in range(0, len(x), 100):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x[i:i + 100]), y[i:i + 100]).backward()
            opt.step()
    return net


def _accuracy_line(capsys) -> float:
    out = capsys.readouterr().out
    return float(out.split("test accuracy ")[1].split("+-")[0])


def _close_and_eval(writer, path, net, root, test_images, test_labels, capsys) -> float:
    """Finish the GGUF file as ggml's scripts do; `mnist-eval` must report torch's test
    accuracy on it (to one image in a thousand); returns that accuracy."""
    import torch
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with torch.no_grad():
        logits = net(torch.from_numpy(test_images)).numpy()
    expected = float((logits.argmax(1) == test_labels).mean())
    assert main(["eval", str(path), "--data", str(root)]) == 0
    assert _accuracy_line(capsys) == pytest.approx(100 * expected, abs=0.1 + 1e-9)
    return expected


def test_eval_reproduces_torch_on_a_file_written_like_ggmls_fc_script(tmp_path, capsys,
                                                                      mnist_subset):
    import gguf
    root, x, y, tx, ty = mnist_subset
    net = _torch_train("mnist-fc", x, y)
    path = tmp_path / "mnist-fc-f32.gguf"
    writer = gguf.GGUFWriter(str(path), "mnist-fc")          # as mnist-train-fc.py does
    for name, value in zip(("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"),
                           net.state_dict().values(), strict=True):
        writer.add_tensor(name, value.squeeze().cpu().numpy())
    expected = _close_and_eval(writer, path, net, root, tx, ty, capsys)
    assert expected > 0.75


def test_eval_reproduces_torch_on_a_cnn_file_in_the_keras_scripts_layout(tmp_path, capsys,
                                                                         mnist_subset):
    import gguf
    root, x, y, tx, ty = mnist_subset
    net = _torch_train("mnist-cnn", x, y, epochs=1)
    sd = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    path = tmp_path / "mnist-cnn-f32.gguf"
    writer = gguf.GGUFWriter(str(path), "mnist-cnn")         # raw shapes of mnist-train-cnn.py
    writer.add_tensor("conv1.kernel", sd["1.weight"], raw_shape=(8, 1, 3, 3))
    writer.add_tensor("conv1.bias", sd["1.bias"], raw_shape=(1, 8, 1, 1))
    writer.add_tensor("conv2.kernel", sd["4.weight"], raw_shape=(16, 8, 3, 3))
    writer.add_tensor("conv2.bias", sd["4.bias"], raw_shape=(1, 16, 1, 1))
    writer.add_tensor("dense.weight", sd["8.weight"], raw_shape=(10, 7 * 7 * 16))
    writer.add_tensor("dense.bias", sd["8.bias"])
    _close_and_eval(writer, path, net, root, tx, ty, capsys)


def test_train_writes_a_model_and_a_graph_that_both_evaluate(tmp_path, capsys, mnist_subset):
    root = mnist_subset[0]
    model, graph = tmp_path / "fc.gguf", tmp_path / "fc-graph.gguf"
    assert main(["train", "--arch", "fc", "--epochs", "2", "--data", str(root), "--out",
                 str(model), "--graph-out", str(graph), *SMALL]) == 0
    trained = _accuracy_line(capsys)
    assert trained > 80
    assert main(["eval", str(model), "--data", str(root)]) == 0
    assert _accuracy_line(capsys) == trained
    assert main(["eval", str(graph), "--data", str(root)]) == 0
    assert _accuracy_line(capsys) == trained


def test_regress_on_a_subset_writes_every_format(tmp_path, capsys, mnist_subset):
    root = mnist_subset[0]
    out = tmp_path / "report.json"
    code = main(["regress", "--arch", "fc", "--epochs", "2", "--data", str(root),
                 "--output", str(out), *SMALL])
    doc = json.loads(out.read_text())
    names = [r["case"] for r in doc["results"]]
    assert doc["meta"]["history"]["mnist-fc"]["torch"][1]["epoch"] == 2
    assert "fc, engine: test accuracy floor" in names
    assert "fc, engine: test accuracy vs torch" in names
    assert "fc, engine: seconds per epoch" in names
    assert "fc, engine: training loss, epoch 2" in names
    assert "fc, engine: validation loss, epoch 2" in names
    assert code == 0, capsys.readouterr()
    html = tmp_path / "report.html"
    assert main(["regress", "--arch", "fc", "--epochs", "1", "--data", str(root),
                 "--output", str(html), *SMALL]) == 0
    assert "fc, engine: test accuracy vs torch" in html.read_text()


def test_regress_seeds_reports_mean_and_spread(tmp_path, capsys, mnist_subset):
    root = mnist_subset[0]
    out = tmp_path / "report.json"
    assert main(["regress", "--arch", "fc", "--epochs", "1", "--seeds", "2", "--data",
                 str(root), "--output", str(out), *SMALL]) == 0, capsys.readouterr()
    doc = json.loads(out.read_text())
    names = [r["case"] for r in doc["results"]]
    assert "fc, engine, seed 1: test accuracy vs torch" in names
    assert "fc, engine: test accuracy over 2 seeds" in names
    assert "fc, torch: test accuracy over 2 seeds" in names
    assert set(doc["meta"]["history"]["seeds"]["mnist-fc"]) == {"0", "1"}


@pytest.mark.parametrize("args, message", [
    (["--engine", "tensorflow"], "unknown engine tensorflow (known: engine, ggml;"),
    (["--engine", "ggm"], "unknown engine ggm; did you mean ggml? (known: engine, ggml;"),
    (["--seeds", "0"], "--seeds must lie in [1, 100]"),
    (["--format", "json", "--output", "r.html"],
     "mnist-regress: --format json contradicts --output r.html (html); drop one"),
    (["--engine", "ggml", "--ggml-lib", "/nonexistent/ggml"],
     "ggml: --ggml-lib /nonexistent/ggml does not exist"),
    (["--ggml-lib", "/nonexistent/ggml"], "--ggml-lib applies to --engine ggml only"),
])
def test_regress_refuses_bad_options_in_one_line(tmp_path, capsys, args, message):
    """Refused before any data is read (tmp_path holds no MNIST files)."""
    try:
        code = main(["regress", "--arch", "fc", "--data", str(tmp_path), *args])
    except SystemExit as exc:               # argparse's usage error
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert message in err[-1]


@pytest.mark.parametrize("content, message", [
    (b"", "truncated|GGUF"),
    (b"GGUX" + b"\0" * 64, "magic|GGUF"),
])
def test_eval_of_a_broken_file_exits_2(tmp_path, capsys, content, message):
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    assert main(["eval", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mnist-eval: ") and str(path) in err


def test_eval_of_a_missing_file_and_wrong_architecture_exit_2(tmp_path, capsys):
    from engine.gguf_io import save_gguf
    assert main(["eval", str(tmp_path / "none.gguf")]) == 2
    assert "no such file" in capsys.readouterr().err
    path = tmp_path / "llama.gguf"
    save_gguf(path, {"w": np.zeros(3, np.float32)}, arch="llama")
    assert main(["eval", str(path)]) == 2
    assert "llama" in capsys.readouterr().err


def test_train_refuses_bad_settings_before_work(tmp_path, capsys):
    assert main(["train", "--arch", "fc", "--out", str(tmp_path / "no" / "x.gguf")]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert main(["train", "--arch", "fc", "--out", str(tmp_path / "x.gguf"),
                 "--batch-logical", "300", "--batch-physical", "200"]) == 2
    assert "multiple of the physical batch" in capsys.readouterr().err
    assert main(["train", "--arch", "fc", "--out", str(tmp_path / "x.gguf"), "--data",
                 str(tmp_path)]) == 2
    assert "train-images-idx3-ubyte" in capsys.readouterr().err
    assert main(["train", "--arch", "fc", "--out", str(tmp_path / "x.gguf"), "--threads",
                 "0"]) == 2
    assert "--threads must lie in [1, 512], got 0" in capsys.readouterr().err
    # a huge count used to start threads until the process ran out of address space
    assert main(["eval", str(tmp_path / "x.gguf"), "--threads", "9" * 100]) == 2
    assert f"--threads must lie in [1, 512], got {'9' * 100}" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def test_threads_option_sets_the_engines_threads(tmp_path, capsys):
    from engine.backends.cpu import threads
    before = threads.get_num_threads()
    try:
        assert main(["eval", str(tmp_path / "none.gguf"), "--threads", "3"]) == 2
        assert threads.get_num_threads() == 3
    finally:
        threads.set_num_threads(before)
