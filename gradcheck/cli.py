"""`gradcheck`: check an op's backward pass against numerical gradients.

    gradcheck --op pool_2d            every sample case of pool_2d, f32 and f64
    gradcheck --op conv_2d --dtype f64 -k stride=[2,2]
    gradcheck --all
    gradcheck --list
    gradcheck --op relu --inject scale:1.01   a known bug: must exit 1

Exit status: 0 all pass, 1 any failure or error, 2 usage error.
"""

from __future__ import annotations

import argparse
import sys

from tabulate import tabulate

from engine.errors import UnknownOpError
from engine.registry import all_ops
from gradcheck.mutations import MUTATIONS, parse
from gradcheck.runner import checkable_ops, run_checks, select_samples
from reports import exit_status, render_table
from reports.table import FORMATS, summary_line


def build_parser() -> argparse.ArgumentParser:
    mutations = "; ".join(f"{k}: {v[2]}" for k, v in MUTATIONS.items())
    p = argparse.ArgumentParser(
        prog="gradcheck",
        description="Compare each op's backprop gradients with float64 numerical gradients "
                    "on the registry's sample cases.",
        epilog="Exit status: 0 all cases pass, 1 any case fails or errors, 2 usage error.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--op", action="append", metavar="NAME",
                      help="op to check (repeatable); see --list")
    what.add_argument("--all", action="store_true", help="check every op with sample cases")
    what.add_argument("--list", action="store_true", help="list the ops and exit")
    p.add_argument("--dtype", choices=("f32", "f64", "all"), default="all",
                   help="dtype of the cases to run (default: all)")
    p.add_argument("-k", "--filter", metavar="TEXT",
                   help="only cases whose name contains TEXT, e.g. 'mode=max'")
    p.add_argument("--inject", metavar="MUTATION[:FACTOR]",
                   help=f"inject a known bug into the backward rules, to see it caught "
                        f"({mutations})")
    p.add_argument("--format", choices=FORMATS, default="simple", help="table style")
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
        rows.append([name, op.kind, grad, len(op.samples()) if op.samples else 0, op.doc])
    return tabulate(rows, headers=["op", "kind", "backward", "cases", "description"])


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
    names = checkable_ops() if args.all else args.op
    try:
        samples = select_samples(names, args.dtype, args.filter)
    except UnknownOpError as exc:
        print(f"gradcheck: {exc}", file=sys.stderr)
        return 2
    if not samples:
        print(f"gradcheck: no sample case of {', '.join(names)} matches "
              f"dtype={args.dtype} filter={args.filter!r}", file=sys.stderr)
        return 2
    results = run_checks(samples, args.inject,
                         progress=not args.no_progress and sys.stderr.isatty())
    print(render_table(results, args.format))
    print(summary_line(results) + (f"  (injected: {args.inject})" if args.inject else ""))
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
