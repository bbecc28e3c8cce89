"""Select sample cases from the registry and check them in an engine (a whole command
line's request, with generated cases and the rest, is gradcheck.request's).

    run_checks(select_samples(["relu"]))              # given cases, in ours on the CPU
    run_checks(cases, EngineUnderTest(get_adapter("ggml")))   # in ggml
    list_ops()                                        # the table of `gradcheck --list`
    list_rows()                                       # its rows, as dicts (the docs' too)
"""

from __future__ import annotations

import re

from tabulate import tabulate
from tqdm import tqdm

from checkkit.interrupted import interrupted_with
from engine.registry import all_ops, get_op
from engine.tensor import FLOAT_NAMES
from gradcheck.check import case_labels, check_case
from gradcheck.cotangents import tier_cases
from gradcheck.engine_under_test import EngineUnderTest
from gradcheck.forward_only import forward_only_rows
from gradcheck.repro import with_repro

DTYPES = FLOAT_NAMES      # f16, bf16, f32, f64
# generated cases per op at most (--random): 200 per op over every op take two minutes on
# two cores; 10,000 take hours, and more is a typo, not a sweep
MAX_RANDOM = 10_000


def select_samples(op_names, dtype: str = "all", pattern: str | None = None,
                   tier: str = "fast"):
    """The cases of `tier` (tier_cases) of `op_names` (unknown names raise
    UnknownOpError), of one dtype or both, whose string contains `pattern`."""
    samples = []
    for name in op_names:
        samples += tier_cases(get_op(name), tier)
    if dtype != "all":
        samples = [s for s in samples if s.dtype == dtype]
    if pattern:
        samples = [s for s in samples if pattern in str(s)]
    return samples


def checkable_ops() -> list[str]:
    """Ops with sample cases, less the dedicated backward ops that declare no `vjp_of`: the
    others are checked against their forward op's VJP (gradcheck.backward_ops); those
    without it only through their forward op (`--op NAME` still runs them)."""
    return [name for name, op in all_ops().items()
            if op.samples and (op.kind != "backward" or op.vjp_of is not None)]


def _gradient_column(op) -> str:
    """What `--list` says of an op's gradient and, for a backward op, how it is checked."""
    if op.kind == "composite":
        return "through its parts"
    grad = "yes" if op.backward is not None else f"no ({op.no_grad})"
    if op.kind != "backward":
        return grad
    if op.vjp_of is not None:
        return f"{grad}; checked vs {op.vjp_of.op}'s VJP"
    return f"{grad}; not in --all: no vjp_of to check it against"


LIST_HEADERS = ("op", "kind", "backward", "order 2", "cases", "in --all", "scale", "dtypes",
                "generated", "description")


def list_rows() -> list[dict]:
    """The rows of `gradcheck --list`, one per registered op, as dicts keyed by LIST_HEADERS:
    kind, whether it has a backward rule, whether our engine takes its second order (and so
    its forward mode, gradcheck.derivatives), its number of registry sample cases, the rows
    `gradcheck --all` runs for it (the samples and their cotangent variants: the fast tier;
    empty for an op --all leaves out) and `--tier scale` adds, the dtypes of its samples,
    whether it has a strategy for generated cases, its description. The documentation's
    ops table is built from these rows too, so the two cannot differ."""
    rows = []
    checked = set(checkable_ops())
    for name, op in all_ops().items():
        samples = op.samples() if op.samples else []
        fast = len(tier_cases(op, "fast")) if name in checked else ""
        scale = len(tier_cases(op, "scale")) if name in checked and op.scale else ""
        rows.append(dict(zip(LIST_HEADERS, (
            name, op.kind, _gradient_column(op), _second_order_column(op, samples),
            len(samples), fast, scale, _dtypes(samples), "yes" if op.strategy else "",
            op.doc), strict=True)))
    return rows


def list_ops() -> str:
    """Every registered op as a table (list_rows): what `gradcheck --list` prints."""
    return tabulate([list(row.values()) for row in list_rows()], headers=list(LIST_HEADERS))


def _second_order_column(op, samples) -> str:
    """Whether our engine differentiates the op's backward graph (its first float64 case's):
    "yes", "no: <the dedicated backward op in the way>", or "" (no gradient)."""
    from gradcheck.adapters.engine_adapter import second_order_blocker
    case = next((s for s in samples if s.dtype == "f64"), None)
    if case is None or not op.differentiable:
        return ""
    blocker = second_order_blocker(case)
    if blocker is None:
        return "yes"
    found = re.search(r"op (\w+) has no backward", blocker)
    return f"no: {found.group(1)}" if found else "no"


def _dtypes(samples) -> str:
    """The float dtypes an op's cases come in, least precise first ("f16,bf16,f32,f64")."""
    have = {s.dtype for s in samples}
    return ",".join(d for d in FLOAT_NAMES if d in have)


def run_checks(samples, engine=None, *, mode: str = "auto", use_torch: bool = True,
               progress: bool = False, ad: str = "rev", order: int = 1):
    """Check every sample; a list of Results in the same order. `engine`: an
    EngineUnderTest (gradcheck.engine_under_test: ours on its backends with its mutation,
    or an adapter; the cases it isolates in a worker kept across cases), an adapter, or
    None (ours on the CPU, its scale-tier cases in a worker). A failing, erring or
    crashing row carries its repro command (gradcheck.repro.with_repro). Ctrl-C raises
    checkkit.interrupted.Interrupted with the rows finished before it. An engine's
    forward-only variants of a case (gradcheck.forward_only: ggml's flash attention) add
    their rows after the case's. `ad` and `order` (gradcheck.check.check_case):
    forward-mode and second-order rows of each case, after its reverse-mode row."""
    engine, own = EngineUnderTest.of(engine)
    try:
        jobs = [(s, running, local) for s in samples for running, local in engine.pairs(s)]
        results = []
        try:
            with tqdm(jobs, desc="gradcheck", unit="case", disable=not progress,
                      leave=False) as it:
                for s, running, local in it:
                    rows = check_case(s, ad, order, mode=mode, use_torch=use_torch,
                                      adapter=running)
                    results += [with_repro(row, s, local, mode, ad=_ad_of(row),
                                           order=_order_of(row)) for row in rows]
                    if ad != "fwd":
                        results += _forward_only_rows(s, running, local, mode)
        except KeyboardInterrupt as exc:   # Ctrl-C: the finished rows go with it
            raise interrupted_with(results, exc) from None
        return results
    finally:
        if own:
            engine.close()


def _ad_of(row) -> str:
    """The --ad that re-runs `row`: fwd for a forward-mode row, else rev."""
    return "fwd" if row.labels.get("ad") == "fwd" else "rev"


def _order_of(row) -> int:
    """The --order that re-runs `row`: 2 for a second-order row, else 1."""
    return 2 if row.labels.get("order") == "2" else 1


def _forward_only_rows(case, engine, adapter, mode):
    """The rows of the engine's forward-only variants of `case` (gradcheck.forward_only:
    ggml's flash attention), each with its repro command where it fails."""
    return [with_repro(row, case, adapter, mode)
            for row in forward_only_rows(case, engine, case_labels(case, engine, mode))]
