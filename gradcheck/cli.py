"""`gradcheck`: check ops' backward passes against numerical gradients and torch autograd.

    gradcheck --op pool_2d                    every sample case of pool_2d, f32 and f64
    gradcheck --op conv_2d --dtype f64 -k stride=[2,2]
    gradcheck --all --format json --output report.json
    gradcheck --op softmax --random 50 --seed 1
    gradcheck --self-test                     injected bugs: every one must be caught
    gradcheck --op relu --inject scale:1.01   one known bug: must exit 1
    gradcheck --engine torch --op softmax     torch's autograd under the same checks
    gradcheck --engine ggml --op pool_2d      ggml's own ops (--ggml-lib DIR: your build)
    gradcheck --engine ggml --op pool_2d --random 50   generated cases in ggml, shrunk
    gradcheck --engine mypkg.adapter:MyAdapter --all     your engine (an Adapter)

Exit status: 0 all pass, 1 any failure or error, 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import sys

from tabulate import tabulate

from engine.backends import BACKENDS, get_backend
from engine.errors import BackendError, UnknownOpError
from engine.registry import all_ops, get_op
from gradcheck.adapters import AdapterError, get_adapter
from gradcheck.check import MODES
from gradcheck.mutants import MUTANTS
from gradcheck.mutations import MUTATIONS, parse
from gradcheck.runner import checkable_ops, run_checks, select_samples
from gradcheck.worker import DEFAULT_CASE_TIMEOUT
from reports import exit_status
from reports.output import FORMATS, OutputError, render, unwritable, write_atomic


def build_parser() -> argparse.ArgumentParser:
    mutations = "; ".join(f"{k}: {v[2]}" for k, v in MUTATIONS.items())
    mutations += "; or a self-test mutant: " + ", ".join(MUTANTS)
    p = argparse.ArgumentParser(
        prog="gradcheck",
        description="Compare each op's backprop gradients with float64 numerical gradients "
                    "and torch autograd on the registry's sample cases.",
        epilog="Exit status: 0 all cases pass, 1 any case fails, errors or crashes, "
               "2 usage error.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--op", action="append", metavar="NAME",
                      help="op to check (repeatable); see --list")
    what.add_argument("--all", action="store_true", help="check every op with sample cases")
    what.add_argument("--list", action="store_true", help="list the ops and exit")
    what.add_argument("--self-test", action="store_true",
                      help="inject known bugs into backward rules; each must be caught")
    what.add_argument("--repro", metavar="CASE",
                      help="re-run one case given as printed by a failing generated case")
    p.add_argument("--engine", default="engine", metavar="NAME",
                   help="engine under test: engine (ours, default), torch, ggml, or "
                        "module:attribute naming your own adapter")
    p.add_argument("--ggml-lib", metavar="DIR",
                   help="with --engine ggml: load ggml's libraries from DIR (default: those "
                        "of the libggml-python wheel)")
    p.add_argument("--case-timeout", type=float, default=DEFAULT_CASE_TIMEOUT,
                   metavar="SECONDS",
                   help="an engine run in a worker process (ggml) that takes longer is a "
                        f"crash (default {DEFAULT_CASE_TIMEOUT:g})")
    p.add_argument("--backend", action="append", choices=BACKENDS, metavar="NAME",
                   help=f"backend of our engine to check on (repeatable; "
                        f"{', '.join(BACKENDS)}; default cpu)")
    p.add_argument("--dtype", choices=("f32", "f64", "all"), default="all",
                   help="dtype of the cases to run (default: all)")
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
                        f"({mutations})")
    p.add_argument("--format", choices=FORMATS, default="plain",
                   help="output format (default plain)")
    p.add_argument("--output", metavar="FILE",
                   help="write the report to FILE (atomically) instead of standard output")
    p.add_argument("--no-torch", action="store_true",
                   help="leave out the torch autograd reference (starts faster: no torch "
                        "import)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def list_ops() -> str:
    rows = []
    for name, op in all_ops().items():
        if op.kind == "composite":
            grad = "through its parts"
        elif op.backward is not None:
            grad = "yes"
        else:
            grad = f"no ({op.no_grad})"
        rows.append([name, op.kind, grad, len(op.samples()) if op.samples else 0,
                     "yes" if op.strategy else "", op.doc])
    return tabulate(rows, headers=["op", "kind", "backward", "cases", "generated",
                                   "description"])


def _engine_usage_error(args) -> str | None:
    """What makes these arguments unusable with the chosen engine (None if nothing)."""
    ours = args.engine == "engine"
    if args.ggml_lib and args.engine != "ggml":
        return f"--ggml-lib applies to --engine ggml, not to --engine {args.engine}"
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
    if ":" in args.engine and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())   # like `python -m`: your adapter beside you
    options = {"lib_dir": os.path.abspath(args.ggml_lib)} if args.ggml_lib else {}
    return get_adapter(args.engine, **options)


def describe_engines(adapter, backends) -> str:
    if adapter is not None:
        return adapter.describe()
    from gradcheck.adapters.engine_adapter import EngineAdapter
    return ", ".join(EngineAdapter(b).describe() for b in backends)


def _results(args, parser, adapter):
    progress = not args.no_progress and sys.stderr.isatty()
    backends = args.backend or ["cpu"]
    if args.self_test:
        from gradcheck.selftest import run_self_test
        return run_self_test(progress=progress)
    if args.repro:
        from gradcheck.generated import parse_case
        try:
            case = parse_case(args.repro)
        except ValueError as exc:
            parser.error(f"--repro: {exc}")
        return run_checks([case], args.inject, False, args.mode, backends, not args.no_torch,
                          adapter, args.case_timeout)
    names = checkable_ops() if args.all else args.op
    updates = [n for n in names if get_op(n).kind == "update"]
    if updates:
        raise LookupError(f"{', '.join(updates)}: optimizer steps have no gradient to check; "
                          f"check them with optcheck (optcheck --opt all)")
    samples = select_samples(names, args.dtype, args.filter)
    if not samples and not args.random:
        raise LookupError(f"no sample case of {', '.join(names)} matches "
                          f"dtype={args.dtype} filter={args.filter!r}")
    results = run_checks(samples, args.inject, progress, args.mode, backends,
                         not args.no_torch, adapter, args.case_timeout)
    if args.random:
        from gradcheck.generated import generated_results
        for name in names:
            if adapter is not None:       # one engine, its cases in one worker if isolated
                results += generated_results(name, args.random, args.seed, args.dtype,
                                             args.mode, use_torch=not args.no_torch,
                                             adapter=adapter, case_timeout=args.case_timeout)
                continue
            for backend in backends:
                results += generated_results(name, args.random, args.seed, args.dtype,
                                             args.mode, backend, args.inject,
                                             not args.no_torch)
    return results


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        print(list_ops())
        return 0
    if args.inject:
        try:
            parse(args.inject)
        except ValueError as exc:
            parser.error(str(exc))
    if args.random < 0:
        parser.error(f"--random must be a non-negative number of cases, got {args.random}")
    problem = _engine_usage_error(args)
    if problem:
        parser.error(problem)
    if args.output:
        problem = unwritable(args.output)
        if problem:
            print(f"gradcheck: cannot write {args.output}: {problem}", file=sys.stderr)
            return 2
    try:
        for name in args.backend or ["cpu"]:
            get_backend(name)
    except BackendError as exc:
        print(f"gradcheck: {exc}", file=sys.stderr)
        return 2
    try:
        adapter = make_adapter(args)
    except AdapterError as exc:
        print(f"gradcheck: {exc}", file=sys.stderr)
        return 2
    described = describe_engines(adapter, args.backend or ["cpu"])
    print(f"gradcheck: engine under test: {described}", file=sys.stderr)
    try:
        results = _results(args, parser, adapter)
    except (UnknownOpError, LookupError, AdapterError) as exc:
        print(f"gradcheck: {exc}", file=sys.stderr)
        return 2
    meta = {"argv": list(sys.argv[1:] if argv is None else argv), "engine": described}
    if args.inject:
        meta["injected"] = args.inject
    text = render(results, args.format, "gradcheck", meta)
    if args.output:
        try:
            write_atomic(args.output, text)
        except OutputError as exc:
            print(f"gradcheck: {exc}", file=sys.stderr)
            return 2
        print(f"gradcheck: wrote {args.output} ({len(results)} results)", file=sys.stderr)
    else:
        sys.stdout.write(text)
        if args.inject:
            print(f"(injected: {args.inject})")
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
