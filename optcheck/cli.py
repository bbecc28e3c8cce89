"""`optcheck`: check optimizer steps against closed forms, torch.optim and invariants.

    optcheck --opt adam                       # the three families, float32 and float64
    optcheck --opt all --family torch --steps 200
    optcheck --opt adamw --lr 0.01 --betas 0.9,0.99 --weight-decay 0.1   # also your settings
    optcheck --self-test                      # known kernel bugs, each must be caught
    optcheck --opt all --workers 4            # the same checks on 4 processes (pytest-xdist)
    optcheck --opt adam --output report.html  # the format follows the extension
    optcheck --opt adam --show all            # every check, not only what failed

The plain report shows the summary per family, every failing check with its message, the
skip reasons and the totals; --show all every check too, --verbose every column.

Exit status: 0 every check passed, 1 some check failed, 2 usage error (bad hyperparameter,
unwritable --output, ...), 130 interrupted (Ctrl-C; the rows finished so far are written to
--output).
"""

from __future__ import annotations

import argparse
import sys

from checkkit.ahead import environment_problem as ahead_problem
from checkkit.console import stoppable
from checkkit.interrupted import Interrupted, report_interrupted
from checkkit.jobs import UsageProblem
from checkkit.options import (
    add_report_options,
    argv_of,
    compiling,
    refused,
    rows_of,
    settle_format,
)
from checkkit.usage import ArgumentParser, unknown_name
from engine.backends import BACKENDS
from engine.backends.cpu.threads import environment_problem
from optcheck.harness import DTYPES, OPTIMIZER_NAMES
from optcheck.request import FLAG_FIELDS, HP_FIELDS, OptcheckRequest, run_plan
from optcheck.runner import FAMILIES
from optcheck.selftest import TOOL as SELF_TEST_TOOL
from reports.output import emit, first_unwritable


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
                        "torch.optim trajectories over a hyperparameter grid, invariants, "
                        "16-bit precision, the float64 reference, cases made from known "
                        "optimizer bugs")
    p.add_argument("--dtype", choices=[*DTYPES, "all"], default="all",
                   help="parameter dtype (default all)")
    p.add_argument("--steps", type=int, default=100, metavar="N",
                   help="steps per trajectory (default 100)")
    p.add_argument("--backend", choices=BACKENDS, default="cpu", help="backend (default cpu)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of initial parameters and data (default 0)")
    p.add_argument("--engine", default="engine", metavar="NAME",
                   help="optimizer under test: engine (ours, default), torch (torch.optim's "
                        "for-loop implementation), torch-foreach, torch-fused, ggml (ggml's "
                        "ggml_opt_step_adamw and ggml_opt_step_sgd), optax (the extra "
                        "gradverify[optax]), or module:attribute naming your own adapter "
                        "(optcheck.adapters.base)")
    p.add_argument("--ggml-lib", metavar="DIR",
                   help="with --engine ggml: load ggml's libraries from DIR (default: those "
                        "of the libggml-python wheel)")
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
    for flag in FLAG_FIELDS:
        hp.add_argument(f"--{flag}", action="store_true")
    add_report_options(p, "optcheck", "checks")
    return p


def request_of(args) -> OptcheckRequest:
    """The request these command-line arguments make."""
    return OptcheckRequest(
        opt=tuple(args.opt or ()), family=tuple(args.family or ()), dtype=args.dtype,
        steps=args.steps, backend=args.backend, seed=args.seed, engine=args.engine,
        ggml_lib=args.ggml_lib,
        self_test=args.self_test,
        betas=args.betas, **{k: getattr(args, k) for k in (*HP_FIELDS, *FLAG_FIELDS)})


def unknown_engine(engine: str) -> str | None:
    """An --engine that is neither a built-in name nor module:attribute, refused with the
    closest built-in names (None when it is one of those)."""
    from optcheck.adapters import ENGINES
    if ":" in engine or engine in ENGINES:
        return None
    return unknown_name("engine", engine, ENGINES,
                        f"known: {', '.join(ENGINES)}, or module:attribute naming your own "
                        f"adapter")


def main(argv=None) -> int:
    """Run the command line on `argv` (default sys.argv[1:]); the exit status. Ctrl-C
    anywhere (or SIGTERM): one line and 130 (143), a sweep's finished rows written to
    --output."""
    return stoppable("optcheck", lambda: _main(argv))


def _main(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if refused("optcheck", environment_problem() or ahead_problem() or settle_format(args)
               or unknown_engine(args.engine)):
        return 2
    if not args.opt and not args.self_test:
        parser.error("say which optimizer to check: --opt sgd|adam|adamw|all (or --self-test)")
    request = request_of(args)
    problem = request.problem()
    if not problem and args.workers is not None and args.self_test:
        problem = "--workers applies to --opt, not to --self-test"
    if problem:
        parser.error(problem)
    if refused("optcheck", first_unwritable(args.output)):
        return 2
    meta = {"argv": argv_of(argv)}
    tool = SELF_TEST_TOOL if args.self_test else "optcheck"
    try:
        with compiling(args, "optcheck") as listener, request.plan() as plan:
            results = rows_of(request, plan, args, run_plan, "optcheck", listener)
    except UsageProblem as exc:
        print(f"optcheck: {exc}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        return report_interrupted("optcheck", exc, args.format, args.output, meta,
                                  group_by="family", verbose=args.verbose)
    return emit(results, tool=tool, fmt=args.format, output=args.output, meta=meta,
                group_by="family", verbose=args.verbose, show=args.show)


if __name__ == "__main__":
    sys.exit(main())
