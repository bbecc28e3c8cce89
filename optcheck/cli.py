"""`optcheck`: check optimizer steps against closed forms, torch.optim and invariants.

    optcheck --opt adam                       # the three families, float32 and float64
    optcheck --opt all --family torch --steps 200
    optcheck --opt adamw --lr 0.01 --betas 0.9,0.99 --weight-decay 0.1   # also your settings
    optcheck --self-test                      # known kernel bugs, each must be caught
    optcheck --opt all --workers 4            # the same checks on 4 processes (pytest-xdist)

Exit status: 0 every check passed, 1 some check failed, 2 usage error (bad hyperparameter,
unwritable --output, ...), 130 interrupted (Ctrl-C; the rows finished so far are written to
--output).
"""

from __future__ import annotations

import argparse
import sys

from engine.backends import BACKENDS, get_backend
from engine.backends.cpu.threads import environment_problem
from engine.errors import EngineError, HyperparameterError
from gradcheck.interrupted import interrupted_with, report_interrupted, sigterm_interrupts
from gradcheck.usage import ArgumentParser
from optcheck.harness import DTYPES, OPTIMIZER_NAMES, engine_settings, refused_settings
from optcheck.runner import FAMILIES, MAX_STEPS, run_checks, run_user_configs
from optcheck.selftest import TOOL as SELF_TEST_TOOL
from optcheck.selftest import run_self_test
from reports.output import FORMATS, emit, first_unwritable

HP_OPTIONS = {"lr": "lr", "eps": "eps", "weight_decay": "weight_decay",
              "momentum": "momentum", "dampening": "dampening"}
FLAG_OPTIONS = ("nesterov", "amsgrad", "maximize")
# seeds go to numpy's default_rng, which takes whole numbers >= 0; 64-bit ones at most here
MAX_SEED = 2**63 - 1


def _betas(text: str) -> tuple[float, float]:
    try:
        b1, b2 = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers 'beta1,beta2', got {text!r}") \
            from None
    return b1, b2


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="optcheck",
        description="Compare optimizer updates with closed-form trajectories, torch.optim "
                    "reference trajectories and invariants. Exit 0: all pass, 1: a check "
                    "failed, 2: usage error.")
    p.add_argument("--opt", action="append", choices=[*OPTIMIZER_NAMES, "all"],
                   help="optimizer to check (repeatable; 'all' for every one)")
    p.add_argument("--family", action="append", choices=[*FAMILIES, "all"],
                   help="check family (repeatable; default all): closed-form scenarios, "
                        "torch.optim trajectories over a hyperparameter grid, invariants")
    p.add_argument("--dtype", choices=[*DTYPES, "all"], default="all",
                   help="parameter dtype (default all)")
    p.add_argument("--steps", type=int, default=100, metavar="N",
                   help="steps per trajectory (default 100)")
    p.add_argument("--backend", choices=BACKENDS, default="cpu", help="backend (default cpu)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of initial parameters and data (default 0)")
    p.add_argument("--self-test", action="store_true",
                   help="inject known bugs into the step kernels; each must be caught")
    hp = p.add_argument_group(
        "your hyperparameters", "given any of these, the torch family also checks a "
        "trajectory with exactly these settings (validated as the Python API does)")
    hp.add_argument("--lr", type=float)
    hp.add_argument("--betas", type=_betas, metavar="B1,B2")
    hp.add_argument("--eps", type=float)
    hp.add_argument("--weight-decay", type=float, dest="weight_decay")
    hp.add_argument("--momentum", type=float)
    hp.add_argument("--dampening", type=float)
    for flag in FLAG_OPTIONS:
        hp.add_argument(f"--{flag}", action="store_true")
    p.add_argument("--format", choices=FORMATS, default="plain", help="output format")
    p.add_argument("--output", metavar="FILE",
                   help="write the report to FILE (atomically) instead of standard output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true",
                   help="plain table: every column (default: the few a person reads, fitted "
                        "to the terminal)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="run the checks as pytest items on N local processes (pytest-xdist; "
                        "the same report); across hosts: see pytest --optcheck")
    return p


def user_config(args, optimizer: str) -> tuple[dict, dict] | None:
    """The user's hyperparameters for `optimizer` as (hp, flags), defaults filled in; None
    when none was given. An option the optimizer does not take is refused first (the first
    in the order lr, eps, weight_decay, momentum, dampening, betas, flags), then the values
    are validated by building the engine optimizer. Raises HyperparameterError."""
    hp = {k: getattr(args, k) for k in HP_OPTIONS if getattr(args, k) is not None}
    if args.betas is not None:
        hp["beta1"], hp["beta2"] = args.betas
    flags = {f: True for f in FLAG_OPTIONS if getattr(args, f)}
    if not hp and not flags:
        return None
    refused = refused_settings(optimizer, hp, flags)
    if refused:
        raise HyperparameterError(f"{optimizer} takes no --{refused[0].replace('_', '-')}")
    return engine_settings(optimizer, hp, flags)


def _distributed(args, parser, optimizers, families, dtypes, progress):
    """The families' runs as the pytest plugin's items on --workers N processes."""
    from gradcheck.pytest_plugin import SweepError, optcheck_args, run_items  # pytest only here
    plugin_args = optcheck_args(optimizers, families, dtypes, args.backend, args.steps,
                                args.seed)
    try:
        return run_items("optcheck", plugin_args, args.workers, progress)
    except SweepError as exc:
        parser.exit(2, f"optcheck: {exc}\n")


def _selected(values, all_values):
    if not values or "all" in values:
        return tuple(all_values)
    return tuple(dict.fromkeys(values))


def main(argv=None) -> int:
    """Run the command line on `argv` (default sys.argv[1:]); the exit status. Ctrl-C
    anywhere (or SIGTERM): one line and 130 (143), the finished rows written to
    --output."""
    try:
        with sigterm_interrupts():
            return _main(argv)
    except KeyboardInterrupt as exc:
        return report_interrupted("optcheck", exc, "plain")


def _main(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = environment_problem()
    if problem:
        print(f"optcheck: {problem}", file=sys.stderr)
        return 2
    if not args.opt and not args.self_test:
        parser.error("say which optimizer to check: --opt sgd|adam|adamw|all (or --self-test)")
    if not 1 <= args.steps <= MAX_STEPS:
        parser.error(f"--steps must lie in [1, {MAX_STEPS}], got {args.steps}")
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"--seed must lie in [0, {MAX_SEED}], got {args.seed}")
    if args.workers is not None and args.self_test:
        parser.error("--workers applies to --opt, not to --self-test")
    families = _selected(args.family, FAMILIES)
    dtypes = _selected([args.dtype], DTYPES)
    optimizers = _selected(args.opt, OPTIMIZER_NAMES)
    progress = not args.no_progress and sys.stderr.isatty()
    problem = first_unwritable(args.output)
    if problem:
        print(f"optcheck: {problem}", file=sys.stderr)
        return 2
    try:
        get_backend(args.backend)
        configs = {o: user_config(args, o) for o in optimizers}
    except EngineError as exc:
        print(f"optcheck: {exc}", file=sys.stderr)
        return 2
    meta = {"argv": list(sys.argv[1:] if argv is None else argv)}
    if args.self_test:
        results = run_self_test(families, "f64", args.steps, args.seed, args.backend, progress)
        tool = SELF_TEST_TOOL
    else:
        try:
            results = []
            if args.workers is not None:
                results = _distributed(args, parser, optimizers, families, dtypes, progress)
            else:
                results = run_checks(optimizers, families, dtypes, args.backend, args.steps,
                                     args.seed, progress)
            results += run_user_configs(configs, dtypes, args.backend, args.steps, args.seed)
        except KeyboardInterrupt as exc:
            return report_interrupted("optcheck", interrupted_with(results, exc),
                                      args.format, args.output, meta, group_by="family",
                                      verbose=args.verbose)
        tool = "optcheck"
    return emit(results, tool=tool, fmt=args.format, output=args.output, meta=meta,
                group_by="family", verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
