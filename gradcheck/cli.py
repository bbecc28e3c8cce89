"""`gradcheck`: check ops' backward passes against numerical gradients and torch autograd.

    gradcheck --op pool_2d                    every sample case of pool_2d, every dtype
    gradcheck --op conv_2d --dtype f64 -k stride=[2,2]
    gradcheck --all --format json --output report.json
    gradcheck --op softmax --random 50 --seed 1
    gradcheck --all --tier scale              big cases: every threaded, tiled, sparse path
    gradcheck --all --workers 4               the same cases on 4 processes (pytest-xdist)
    gradcheck --self-test                     injected bugs: every one must be caught
    gradcheck --op relu --inject scale:1.01   one known bug: must exit 1
    gradcheck --engine torch --op softmax     torch's autograd under the same checks
    gradcheck --engine ggml --op pool_2d      ggml's own ops (--ggml-lib DIR: your build)
    gradcheck --engine ggml --op pool_2d --random 50   generated cases in ggml, shrunk
    gradcheck --engine ggml --coverage        ggml's backward ops: the registry op checking each
    gradcheck --engine mypkg.adapter:MyAdapter --all     your engine (an Adapter)

Exit status: 0 all pass, 1 any failure or error, 2 usage error, 130 interrupted (Ctrl-C;
the rows finished so far are written to --output).
"""

from __future__ import annotations

import argparse
import os
import sys

from engine.backends import BACKENDS, get_backend
from engine.backends.cpu.threads import environment_problem
from engine.errors import BackendError, UnknownOpError
from gradcheck.adapters import MAX_GGML_THREADS, AdapterError, describe, get_adapter
from gradcheck.cotangents import TIERS
from gradcheck.injection import describe_injections, parse
from gradcheck.interrupted import Interrupted, report_interrupted, sigterm_interrupts
from gradcheck.modes import MODES
from gradcheck.repro import parse_case
from gradcheck.runner import (
    DTYPES,
    MAX_RANDOM,
    check_ggml_coverage,
    check_ops,
    describe_engines,
    list_ops,
    run_checks,
)
from gradcheck.selftest import run_self_test
from gradcheck.usage import ArgumentParser
from gradcheck.worker import DEFAULT_CASE_TIMEOUT
from reports import emit, first_unwritable
from reports.output import FORMATS


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="gradcheck",
        description="Compare each op's backprop gradients with float64 numerical gradients "
                    "and torch autograd on the registry's sample cases.",
        epilog="Exit status: 0 all cases pass, 1 any case fails, errors or crashes, "
               "2 usage error.")
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
                   help="engine under test: engine (ours, default), torch, ggml, or "
                        "module:attribute naming your own adapter")
    p.add_argument("--ggml-lib", metavar="DIR",
                   help="with --engine ggml: load ggml's libraries from DIR (default: those "
                        "of the libggml-python wheel)")
    p.add_argument("--ggml-threads", type=int, metavar="N",
                   help="with --engine ggml: ggml's compute threads (default: up to 4 of "
                        "this machine's cores); its CPU kernels split rows over them")
    p.add_argument("--case-timeout", type=float, default=DEFAULT_CASE_TIMEOUT,
                   metavar="SECONDS",
                   help="an engine run in a worker process (ggml) that takes longer is a "
                        f"crash (default {DEFAULT_CASE_TIMEOUT:g})")
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
    p.add_argument("-k", "--filter", metavar="TEXT",
                   help="only cases whose name contains TEXT, e.g. 'mode=max'")
    p.add_argument("--random", type=int, default=0, metavar="N",
                   help="also check N hypothesis-generated cases per op in the engine "
                        "under test (a failing or crashing one is shrunk; cases the engine "
                        "cannot run are assumed away and counted in an unsupported row)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the generated cases (default 0)")
    p.add_argument("--inject", metavar="MUTATION[:FACTOR]",
                   help=f"inject a known bug into the backward rules, to see it caught "
                        f"({describe_injections()})")
    p.add_argument("--format", choices=FORMATS, default="plain",
                   help="output format (default plain)")
    p.add_argument("--output", metavar="FILE",
                   help="write the report to FILE (atomically) instead of standard output")
    p.add_argument("--no-torch", action="store_true",
                   help="leave out the torch autograd reference (starts faster: no torch "
                        "import)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true",
                   help="plain table: every column (default: the few a person reads, fitted "
                        "to the terminal)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="run the cases as pytest items on N local processes (pytest-xdist; "
                        "the same report); across hosts: see pytest --gradcheck")
    return p




def _engine_usage_error(args) -> str | None:
    """What makes these arguments unusable with the chosen engine (None if nothing)."""
    ours = args.engine == "engine"
    if args.ggml_lib and args.engine != "ggml":
        return f"--ggml-lib applies to --engine ggml, not to --engine {args.engine}"
    if args.ggml_threads is not None and args.engine != "ggml":
        return f"--ggml-threads applies to --engine ggml, not to --engine {args.engine}"
    if args.ggml_threads is not None and not 1 <= args.ggml_threads <= MAX_GGML_THREADS:
        return (f"--ggml-threads must lie in [1, {MAX_GGML_THREADS}], got "
                f"{args.ggml_threads}")
    if args.coverage and args.engine != "ggml":
        return f"--coverage applies to --engine ggml, not to --engine {args.engine}"
    if args.coverage and (args.random or args.filter or args.workers is not None):
        return "--coverage runs the registry's cases as they are: no --random, -k or --workers"
    if not args.case_timeout > 0:
        return f"--case-timeout must be a positive number of seconds, got {args.case_timeout}"
    if ours:
        return None
    for given, flag, why in ((args.inject, "--inject", "injected bugs patch our engine's "
                              "backward rules"),
                             (args.backend, "--backend", "backends are our engine's"),
                             (args.self_test, "--self-test", "the self-test injects bugs "
                              "into our engine")):
        if given:
            return f"{flag} applies to our engine only ({why}), not to --engine {args.engine}"
    return None


def make_adapter(args):
    """The adapter of --engine (None: ours, made per backend by the runner). Raises
    AdapterError when it cannot be set up."""
    if args.engine == "engine":
        return None
    options = {"lib_dir": os.path.abspath(args.ggml_lib)} if args.ggml_lib else {}
    if args.ggml_threads is not None:
        options["n_threads"] = args.ggml_threads
    return get_adapter(args.engine, **options)


def _distributed(args, parser, progress, backends):
    """The cases of --op/--all as the pytest plugin's items on --workers N processes."""
    if args.self_test or args.repro is not None:
        parser.error("--workers applies to --op and --all, not to --self-test or --repro")
    from gradcheck.pytest_plugin import SweepError, gradcheck_args, run_items  # pytest only here
    plugin_args = gradcheck_args(
        None if args.all else args.op, args.dtype, args.filter, random=args.random,
        seed=args.seed, inject=args.inject, mode=args.mode, backends=backends,
        use_torch=not args.no_torch, engine=args.engine, ggml_lib=args.ggml_lib,
        ggml_threads=args.ggml_threads, case_timeout=args.case_timeout, tier=args.tier)
    try:
        return run_items("gradcheck", plugin_args, args.workers, progress)
    except SweepError as exc:
        parser.exit(2, f"gradcheck: {exc}\n")


def _results(args, parser, adapter, case):
    progress = not args.no_progress and sys.stderr.isatty()
    backends = args.backend or ["cpu"]
    if args.workers is not None:
        return _distributed(args, parser, progress, backends)
    if args.self_test:
        return run_self_test(progress=progress)
    if args.coverage:
        return check_ggml_coverage(adapter, args.dtype, progress=progress, mode=args.mode,
                                   use_torch=not args.no_torch,
                                   case_timeout=args.case_timeout, tier=args.tier)
    if case is not None:
        return run_checks([case], args.inject, False, args.mode, backends, not args.no_torch,
                          adapter, args.case_timeout)
    return check_ops(None if args.all else args.op, args.dtype, args.filter,
                     random=args.random, seed=args.seed, inject=args.inject,
                     progress=progress, mode=args.mode, backends=backends,
                     use_torch=not args.no_torch, adapter=adapter,
                     case_timeout=args.case_timeout, tier=args.tier)


def main(argv=None) -> int:
    """Run the command line on `argv` (default sys.argv[1:]); the exit status. Ctrl-C
    anywhere (or SIGTERM): one line and 130 (143), a sweep's finished rows written to
    --output."""
    try:
        with sigterm_interrupts():
            return _main(argv)
    except KeyboardInterrupt as exc:
        return report_interrupted("gradcheck", exc, "plain")


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
    problem = environment_problem()
    if problem:
        print(f"gradcheck: {problem}", file=sys.stderr)
        return 2
    if args.list:
        print(list_ops())
        return 0
    if args.inject:
        try:
            parse(args.inject)
        except ValueError as exc:
            parser.error(str(exc))
    if not 0 <= args.random <= MAX_RANDOM:
        parser.error(f"--random must be a number of cases per op in [0, {MAX_RANDOM}], got "
                     f"{args.random}")
    problem = _engine_usage_error(args)
    if problem:
        parser.error(problem)
    try:
        case = None if args.repro is None else parse_case(args.repro)
    except ValueError as exc:
        print(f"gradcheck: --repro: {exc}", file=sys.stderr)
        return 2
    problem = first_unwritable(args.output)
    if problem:
        print(f"gradcheck: {problem}", file=sys.stderr)
        return 2
    try:
        for name in args.backend or ["cpu"]:
            get_backend(name)
        adapter = make_adapter(args)
        described = (describe_engines(None, args.backend or ["cpu"]) if adapter is None
                     else describe(adapter, args.engine))
    except (BackendError, AdapterError) as exc:
        print(f"gradcheck: {exc}", file=sys.stderr)
        return 2
    print(f"gradcheck: engine under test: {described}", file=sys.stderr)
    try:
        results = _results(args, parser, adapter, case)
    except Interrupted as exc:
        meta = {"argv": list(sys.argv[1:] if argv is None else argv), "engine": described}
        return report_interrupted("gradcheck", exc, args.format, args.output, meta,
                                  verbose=args.verbose)
    except (UnknownOpError, LookupError, AdapterError) as exc:
        print(f"gradcheck: {exc}", file=sys.stderr)
        return 2
    meta = {"argv": list(sys.argv[1:] if argv is None else argv), "engine": described}
    if args.inject:
        meta["injected"] = args.inject
    return emit(results, tool="gradcheck", fmt=args.format, output=args.output, meta=meta,
                footer=f"(injected: {args.inject})" if args.inject else None,
                verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
