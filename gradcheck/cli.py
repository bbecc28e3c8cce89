"""`gradcheck`: check ops' backward passes against numerical gradients and torch autograd.

    gradcheck --op pool_2d                    every sample case of pool_2d, every dtype
    gradcheck --op conv_2d --dtype f64 -k stride=[2,2]
    gradcheck --all --output report.json       the format follows the extension
    gradcheck --all --show all                every case, not only what failed
    gradcheck --op softmax --random 50 --seed 1
    gradcheck --all --random 200              200 drawn cases per op: a core idle shares them
    gradcheck --all --tier scale              big cases: every threaded, tiled, sparse path
    gradcheck --all --isolate                 every case in a worker process: a crash is a row
    gradcheck --all --boundscheck             our kernels bounds-checked (first run: minutes)
    gradcheck --all --workers 4               the same cases on 4 processes (pytest-xdist)
    gradcheck --self-test                     injected bugs: every one must be caught
    gradcheck --op relu --inject scale:1.01   one known bug: must exit 1
    gradcheck --engine torch --op softmax     torch's autograd under the same checks
    gradcheck --engine jax --op softmax --ad both --order 2   JVPs and Hessian-vector products
    gradcheck --engine ggml --op pool_2d      ggml's own ops (--ggml-lib DIR: your build)
    gradcheck --engine ggml --op pool_2d --random 50   generated cases in ggml, shrunk
    gradcheck --engine ggml --coverage        ggml's backward ops: the registry op checking each
    gradcheck --engine mypkg.adapter:MyAdapter --all     your engine (an Adapter)
    gradcheck --all --output report.html      the format from the extension: a page to read
    gradcheck report ours.json torch.json     several engines' results as one scoreboard

The plain report shows the summary per op (the ops with anything but a pass), every failing
row with its message and repro command, the skip reasons and the totals; --show all every
case too, --verbose every column.

Exit status: 0 all pass, 1 any failure or error (or, with --strict, a vacuous row: one
that could not have failed), 2 usage error, 130 interrupted (Ctrl-C; the rows finished so
far are written to --output).
"""

from __future__ import annotations

import argparse
import os
import sys

from checkkit.ahead import environment_problem as ahead_problem
from checkkit.console import stoppable
from checkkit.interrupted import Interrupted, report_interrupted
from checkkit.jobs import UsageProblem
from checkkit.loading import AdapterError
from checkkit.options import (
    add_report_options,
    argv_of,
    compiling,
    refused,
    rows_of,
    settle_format,
)
from checkkit.share import environment_problem as share_problem
from checkkit.usage import ArgumentParser, unknown_name
from checkkit.worker import DEFAULT_CASE_TIMEOUT
from engine.backends import BACKENDS
from engine.backends.cpu.threads import environment_problem
from gradcheck.cotangents import TIERS
from gradcheck.derivatives import AD_MODES, ORDERS
from gradcheck.injection import describe_injections
from gradcheck.modes import MODES
from gradcheck.request import COVERAGE_AS_IS, GradcheckRequest, run_plan
from gradcheck.runner import DTYPES, list_ops
from reports import emit, first_unwritable


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="gradcheck",
        description="Compare each op's backprop gradients with float64 numerical gradients "
                    "and torch autograd on the registry's sample cases.",
        epilog="Exit status: 0 all cases pass, 1 any case fails, errors or crashes (or, "
               "with --strict, is vacuous), 2 usage error. Several engines' JSON results "
               "merged into one scoreboard: gradcheck report a.json b.json (or "
               "gradcheck-report).")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--op", action="append", metavar="NAME",
                      help="op to check (repeatable); see --list")
    what.add_argument("--all", action="store_true", help="check every op with sample cases")
    what.add_argument("--coverage", action="store_true",
                      help="with --engine ggml: every op of ggml's backward pass with the "
                           "registry op that checks it, its cases run in ggml and their "
                           "verdicts (one row per ggml op)")
    what.add_argument("--list", action="store_true", help="list the ops and exit")
    what.add_argument("--self-test", action="store_true",
                      help="inject known bugs into backward rules and kernels (fast and "
                           "scale tier); each must be caught, and a control must pass")
    what.add_argument("--repro", metavar="CASE",
                      help="re-run one case given as printed by a failing generated case")
    p.add_argument("--engine", default="engine", metavar="NAME",
                   help="engine under test: engine (ours, default), torch, ggml, jax, "
                        "tinygrad, or module:attribute naming your own adapter")
    p.add_argument("--ggml-lib", metavar="DIR",
                   help="with --engine ggml: load ggml's libraries from DIR (default: those "
                        "of the libggml-python wheel)")
    p.add_argument("--ggml-threads", type=int, metavar="N",
                   help="with --engine ggml: ggml's compute threads (default: up to 4 of "
                        "this machine's cores); its CPU kernels split rows over them")
    p.add_argument("--case-timeout", type=float, default=DEFAULT_CASE_TIMEOUT,
                   metavar="SECONDS",
                   help="an engine call run in a worker process (see --isolate) that "
                        f"takes longer is a crash (default {DEFAULT_CASE_TIMEOUT:g})")
    p.add_argument("--isolate", action="store_true",
                   help="run every case in a worker process, so that a segfault, an abort "
                        "or heap corruption in the engine is a crash row naming the case "
                        "and the report is still written (the default for our engine's "
                        "scale tier and the self-test, and for ggml)")
    p.add_argument("--no-isolate", action="store_true",
                   help="run our engine in this process, its scale tier and the self-test "
                        "too (faster; a crash then ends the run without a report)")
    p.add_argument("--boundscheck", action="store_true",
                   help="compile our engine's CPU kernels with numba's bounds checks, in a "
                        "worker process with a kernel cache of its own: an out-of-bounds "
                        "index is an error row naming the op, node and kernel (the first "
                        "such run compiles every kernel again: minutes)")
    p.add_argument("--backend", action="append", choices=BACKENDS, metavar="NAME",
                   help=f"backend of our engine to check on (repeatable; "
                        f"{', '.join(BACKENDS)}; default cpu)")
    p.add_argument("--dtype", choices=(*DTYPES, "all"), default="all",
                   help="dtype of the cases to run (default: all)")
    p.add_argument("--tier", choices=TIERS, default="fast",
                   help="fast (default): the registry's small cases, every element checked; "
                        "scale: sizes that take every threaded, chunked, tiled and "
                        "zero-skipping kernel path, judged against a float64 reference, "
                        "directional derivatives and every thread count; all: both")
    p.add_argument("--mode", choices=MODES, default="auto",
                   help="full: every element; fast: random projections; auto (default): "
                        "full for small cases, fast for large ones")
    p.add_argument("--ad", choices=AD_MODES, default="rev",
                   help="rev (default): the engine's VJP against numerical gradients; fwd: "
                        "its JVP along random tangents against directional derivatives, "
                        "and against its VJP by the adjoint identity; both: a row of each")
    p.add_argument("--order", type=int, choices=ORDERS, default=1,
                   help="2: also a row per case for the second derivative, the engine's "
                        "Hessian-vector products (reverse over reverse, forward over "
                        "reverse) against float64 differences of the first derivative")
    p.add_argument("-k", "--filter", metavar="TEXT",
                   help="only cases whose name contains TEXT, e.g. 'mode=max'")
    p.add_argument("--random", type=int, default=0, metavar="N",
                   help="also check N hypothesis-generated cases per op in the engine "
                        "under test (a failing or crashing one is shrunk; cases the engine "
                        "cannot run are assumed away and counted in an unsupported row). "
                        "A run of at least 1000 cases of our CPU engine (sample cases, and "
                        "N per op generated), with a core idle, shares its jobs with a "
                        "helper process on that core: "
                        "the same rows in the same order, sooner (a few generated cases "
                        "may be drawn with other values, as between two runs; "
                        "GRADVERIFY_SHARE=0: never, 1: whatever the load; --workers N: "
                        "pytest-xdist instead)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the generated cases (default 0)")
    p.add_argument("--inject", metavar="MUTATION[:FACTOR]",
                   help=f"inject a known bug into the backward rules, to see it caught "
                        f"({describe_injections()})")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 on a vacuous row too: one that passed but could not have "
                        "seen a 10%% error (25%% in 16 bits) in some gradient, such as a "
                        "zero reference gradient (see the power and power_of columns)")
    p.add_argument("--no-torch", action="store_true",
                   help="leave out the torch autograd reference (starts faster: no torch "
                        "import)")
    add_report_options(p, "gradcheck", "cases")
    return p


def request_of(args) -> GradcheckRequest:
    """The request these command-line arguments make."""
    return GradcheckRequest(
        op=tuple(args.op or ()), dtype=args.dtype, filter=args.filter, tier=args.tier,
        random=args.random, seed=args.seed, engine=args.engine,
        backend=tuple(args.backend or ()), mode=args.mode, ad=args.ad, order=args.order,
        inject=args.inject,
        no_torch=args.no_torch, ggml_lib=args.ggml_lib, ggml_threads=args.ggml_threads,
        case_timeout=args.case_timeout, isolate=args.isolate, no_isolate=args.no_isolate,
        boundscheck=args.boundscheck, coverage=args.coverage, self_test=args.self_test,
        repro=args.repro)


def unknown_names(args) -> str | None:
    """An op, engine or injected mutation that gradcheck does not know, refused with the
    closest known names (checkkit.usage.unknown_name); None when all are known."""
    from engine.registry import all_ops
    from gradcheck.adapters import ENGINES
    from gradcheck.injection import FACTOR_MUTATIONS
    from gradcheck.mutants import MUTANTS
    ops = all_ops()
    for op in args.op or ():
        if op not in ops:
            return unknown_name("op", op, ops, "gradcheck --list shows all")
    if ":" not in args.engine and args.engine not in ENGINES:
        return unknown_name("engine", args.engine, ENGINES,
                            f"known: {', '.join(ENGINES)}, or module:attribute naming your "
                            f"own adapter")
    mutation = (args.inject or "").partition(":")[0]
    known = [*FACTOR_MUTATIONS, *MUTANTS]
    if args.inject is not None and mutation not in known:
        return unknown_name("mutation", mutation, known,
                            "gradcheck --help lists all")
    return None


def _workers_problem(args) -> str | None:
    """What --workers cannot run (None if nothing)."""
    if args.workers is None:
        return None
    if args.coverage:
        return COVERAGE_AS_IS
    if args.self_test or args.repro is not None:
        return "--workers applies to --op and --all, not to --self-test or --repro"
    return None


def main(argv=None) -> int:
    """Run the command line on `argv` (default sys.argv[1:]); the exit status. Ctrl-C
    anywhere (or SIGTERM): one line and 130 (143), a sweep's finished rows written to
    --output. `gradcheck report FILE...` is gradcheck-report (gradcheck.report_cli)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["report"]:
        from gradcheck.report_cli import main as report
        return report(args[1:], prog="gradcheck report")
    return stoppable("gradcheck", lambda: _main(argv))


def keep_hypothesis_out_of_cwd(environ=os.environ) -> None:
    """--random draws its cases with hypothesis, which keeps what it learns (constants found in
    the source, Unicode tables) in ./.hypothesis unless told otherwise: a command line must not
    write into the user's working directory, so that goes to the user's cache directory
    (HYPOTHESIS_STORAGE_DIRECTORY, when set, is kept)."""
    if not environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        environ["HYPOTHESIS_STORAGE_DIRECTORY"] = os.path.join(cache, "gradverify", "hypothesis")


def _main(argv) -> int:
    keep_hypothesis_out_of_cwd()
    parser = build_parser()
    args = parser.parse_args(argv)
    if refused("gradcheck", environment_problem() or ahead_problem() or share_problem()
                            or settle_format(args)):
        return 2
    if args.list:
        print(list_ops())
        return 0
    if refused("gradcheck", unknown_names(args)):
        return 2
    request = request_of(args)
    problem = request.problem() or _workers_problem(args)
    if problem:
        parser.error(problem)
    if refused("gradcheck", first_unwritable(args.output)):
        return 2
    try:
        # the plan checks the engine and the cases before any runs; made inside the compile
        # progress, so that a worker process it starts reports its compilations there
        with compiling(args, "gradcheck") as listener, request.plan() as plan:
            print(f"gradcheck: {plan.describe}", file=sys.stderr)
            if request.boundscheck:
                from gradcheck.engine_under_test import boundscheck_note
                print(f"gradcheck: {boundscheck_note()}", file=sys.stderr)
            meta = {"argv": argv_of(argv), **plan.meta}
            try:
                results = rows_of(request, plan, args, run_plan, "gradcheck", listener)
            except Interrupted as exc:
                return report_interrupted("gradcheck", exc, args.format, args.output, meta,
                                          verbose=args.verbose)
    except (UsageProblem, AdapterError) as exc:   # an isolated engine's worker cannot start
        print(f"gradcheck: {exc}", file=sys.stderr)
        return 2
    if args.self_test:
        from gradcheck.selftest import mutation_score
        meta["mutation_score"] = mutation_score(results)
    return emit(results, tool="gradcheck", fmt=args.format, output=args.output, meta=meta,
                footer=f"(injected: {args.inject})" if args.inject else None,
                verbose=args.verbose, strict=args.strict, show=args.show)


if __name__ == "__main__":
    sys.exit(main())
