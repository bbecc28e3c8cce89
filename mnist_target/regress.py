"""`mnist-regress`: train both models on the engine and in torch from the same initial weights
on the same batches, and check the regression bars.

Bars (issue 6; ggml's example reports 97.94% and 98.46%):
- test accuracy: FC >= 97.8%, CNN >= 98.4% (default init, 30 epochs);
- the engine's training loss per epoch within 2% (relative) of torch's over the first 5
  epochs (same initial weights, same batch order);
- the time per epoch is reported against torch's (median over epochs, same run), not a bar.

Each bar is one reports.Result (tool "mnist"); the per-epoch curves of both go to the JSON
metadata and, with matplotlib installed, to the HTML page as plots.
"""

from __future__ import annotations

import dataclasses
import statistics

from mnist_target.models import Model
from mnist_target.run import EpochRecord, TrainConfig, batch_orders, evaluate, train_model
from reports.record import Result

ACCURACY_BARS = {"mnist-fc": 0.978, "mnist-cnn": 0.984}
LOSS_TOLERANCE = 0.02
LOSS_EPOCHS = 5


@dataclasses.dataclass
class ArchRun:
    """One architecture's engine and torch runs."""

    arch: str
    engine: list[EpochRecord]
    torch: list[EpochRecord]
    engine_test_acc: float
    torch_test_acc: float
    interrupted: bool = False


def run_arch(arch: str, data, config: TrainConfig, init: str = "torch", limit: int | None = None,
             progress: bool = False, log=None) -> ArchRun:
    """Train `arch` on the engine and in torch from the same initial weights; `data` is an
    mnist_target.data.MnistData."""
    from mnist_target.data import to_dataset
    from mnist_target.torch_ref import evaluate_torch, torch_model, train_torch

    images, labels = data.train_images, data.train_labels
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    model = Model.new(arch, init=init, seed=config.seed)
    net = torch_model(model.arch, model.weights())   # the same initial weights
    dataset = to_dataset(images, labels)
    say = log or (lambda _text: None)
    say(f"{model.arch}: engine ({config.backend})")
    run = train_model(model, dataset, config, progress=progress,
                      on_epoch=lambda r: say(f"  engine {r.line()}"))
    say(f"{model.arch}: torch")
    orders = batch_orders(len(images), config)[:len(run.history)]
    torch_history = train_torch(net, images, labels, config, orders,
                                on_epoch=lambda r: say(f"  torch  {r.line()}"))
    test_images, test_labels = data.test_images[:limit], data.test_labels[:limit]
    engine_acc = evaluate(model, test_images, test_labels, backend=config.backend)[2]
    torch_acc = evaluate_torch(net, test_images, test_labels)[0]
    return ArchRun(model.arch, run.history, torch_history, engine_acc, torch_acc,
                   run.interrupted)


def median_epoch_seconds(history: list[EpochRecord]) -> float:
    """Median wall time per epoch, leaving out the first (numba compiles, caches warm) when
    there are more."""
    times = [r.seconds for r in history[1:]] or [r.seconds for r in history]
    return statistics.median(times) if times else float("nan")


def results_of(run: ArchRun, check_accuracy: bool = True) -> list[Result]:
    """The bars of one architecture as Results."""
    short = run.arch.removeprefix("mnist-")
    labels = {"arch": run.arch}
    out = []
    bar = ACCURACY_BARS[run.arch]
    acc_ok = run.engine_test_acc >= bar
    both = (f"engine {100 * run.engine_test_acc:.2f}%, torch {100 * run.torch_test_acc:.2f}% "
            f"from the same initial weights on the same batches")
    if acc_ok:
        message = both
    else:
        message = (f"engine test accuracy {100 * run.engine_test_acc:.2f}% is below "
                   f"{100 * bar:.1f}% ({both})"
                   + ("" if check_accuracy else "; not a bar for this shortened run"))
    out.append(Result(
        "mnist", f"{short}: test accuracy", "pass" if acc_ok or not check_accuracy else "fail",
        {"engine": run.engine_test_acc, "torch": run.torch_test_acc, "bar": bar}, message,
        {**labels, "check": "accuracy"}))
    n = min(LOSS_EPOCHS, len(run.engine), len(run.torch))
    for e, t in zip(run.engine[:n], run.torch[:n], strict=True):
        rel = abs(e.train_loss - t.train_loss) / abs(t.train_loss)
        ok = rel <= LOSS_TOLERANCE
        out.append(Result(
            "mnist", f"{short}: training loss, epoch {e.epoch}", "pass" if ok else "fail",
            {"engine": e.train_loss, "torch": t.train_loss, "rel_diff": rel,
             "bar": LOSS_TOLERANCE},
            "" if ok else f"training loss differs from torch's by {100 * rel:.2f}% "
                          f"(more than {100 * LOSS_TOLERANCE:.0f}%)",
            {**labels, "check": "loss curve"}))
    engine_s, torch_s = median_epoch_seconds(run.engine), median_epoch_seconds(run.torch)
    out.append(Result(
        "mnist", f"{short}: seconds per epoch", "pass",
        {"engine": engine_s, "torch": torch_s, "ratio": engine_s / torch_s},
        "reported, not a bar: median over epochs after the first, measured in this run",
        {**labels, "check": "time"}))
    if run.interrupted:
        out.append(Result("mnist", f"{short}: run", "error", {},
                          "interrupted (Ctrl-C) before all epochs", {**labels, "check": "run"}))
    return out


def history_meta(runs: list[ArchRun]) -> dict:
    """Per-epoch curves of every run, for the JSON report's metadata."""
    return {run.arch: {side: [dataclasses.asdict(r) for r in history]
                       for side, history in (("engine", run.engine), ("torch", run.torch))}
            for run in runs}


def curves_html(runs: list[ArchRun]) -> list[str]:
    """HTML figures (inline SVG from matplotlib) of training/validation loss and validation
    accuracy per epoch, engine and torch; one message paragraph if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["<p>Install the optional extra for plots (<code>pip install "
                "'gradverify[plots]'</code>, matplotlib) to see the loss and accuracy "
                "curves here.</p>"]
    import io
    figures = []
    for run in runs:
        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.6))
        for side, history, style in (("engine", run.engine, "-"), ("torch", run.torch, "--")):
            epochs = [r.epoch for r in history]
            ax_loss.plot(epochs, [r.train_loss for r in history], style, label=f"{side} train")
            ax_loss.plot(epochs, [r.val_loss for r in history], style, label=f"{side} val")
            ax_acc.plot(epochs, [100 * r.val_acc for r in history], style, label=f"{side} val")
        ax_loss.set(xlabel="epoch", ylabel="cross-entropy", yscale="log",
                    title=f"{run.arch}: loss")
        ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title=f"{run.arch}: accuracy")
        for ax in (ax_loss, ax_acc):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
        plt.close(fig)
        svg = buf.getvalue()
        svg = svg[svg.index("<svg"):]
        figures.append(f"<figure>{svg}<figcaption>{run.arch}: engine (solid) and torch "
                       f"(dashed) from the same initial weights</figcaption></figure>")
    return figures
