"""Select sample cases from the registry and check them in an engine.

    check_ops(["pool_2d"], dtype="f64", random=50)   # what `gradcheck --op pool_2d
                                                      #   --dtype f64 --random 50` runs
    run_checks(select_samples(["relu"]))              # given cases
    list_ops()                                        # the table of `gradcheck --list`
"""

from __future__ import annotations

import contextlib

from tabulate import tabulate
from tqdm import tqdm

from engine.registry import all_ops, get_op
from engine.tensor import FLOAT_NAMES
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.check import case_labels, check_sample
from gradcheck.cotangents import tier_cases
from gradcheck.forward_only import forward_only_rows
from gradcheck.generated import generated_results
from gradcheck.interrupted import interrupted_with
from gradcheck.isolated import IsolatedAdapter
from gradcheck.repro import with_repro
from gradcheck.worker import DEFAULT_CASE_TIMEOUT

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


def list_ops() -> str:
    """Every registered op as a table: kind, whether it has a backward rule, its number of
    sample cases and the dtypes they come in, whether it has a strategy for generated
    cases, its description."""
    rows = []
    for name, op in all_ops().items():
        samples = op.samples() if op.samples else []
        rows.append([name, op.kind, _gradient_column(op), len(samples), _dtypes(samples),
                     "yes" if op.strategy else "", op.doc])
    return tabulate(rows, headers=["op", "kind", "backward", "cases", "dtypes", "generated",
                                   "description"])


def _dtypes(samples) -> str:
    """The float dtypes an op's cases come in, least precise first ("f16,bf16,f32,f64")."""
    have = {s.dtype for s in samples}
    return ",".join(d for d in FLOAT_NAMES if d in have)


def describe_engines(adapter, backends) -> str:
    """The engine under test, for the report's metadata: `adapter`'s description, or (None)
    ours on each of `backends`."""
    if adapter is not None:
        return adapter.describe()
    return ", ".join(EngineAdapter(b).describe() for b in backends)


def run_checks(samples, inject: str | None = None, progress: bool = False, mode="auto",
               backends=("cpu",), use_torch: bool = True, adapter=None,
               case_timeout: float = DEFAULT_CASE_TIMEOUT):
    """Check every sample; a list of Results in the same order. The engine is `adapter`, or
    by default ours on every backend of `backends` with the mutation `inject` in place.
    An adapter with `isolated` set runs in one worker process shared by all cases (a fresh
    one after a crash); `case_timeout`: seconds an engine call may take there. A failing,
    erroring or crashing row carries its repro command (gradcheck.repro.with_repro).
    Ctrl-C raises gradcheck.interrupted.Interrupted with the rows finished before it.
    An engine's forward-only variants of a case (gradcheck.forward_only: ggml's flash
    attention) add their rows after the case's."""
    if adapter is None:
        engines = [EngineAdapter(b, inject) for b in backends]
    elif inject or tuple(backends) != ("cpu",):
        raise ValueError("inject and backends apply to our engine only, not to engine "
                         f"{adapter.name!r}")
    else:
        engines = [adapter]
    jobs = [(s, e) for s in samples for e in engines]
    with contextlib.ExitStack() as stack:
        running = {}
        for e in engines:
            running[id(e)] = e
            if e.isolated and not isinstance(e, IsolatedAdapter):
                running[id(e)] = stack.enter_context(IsolatedAdapter(e, case_timeout))
        results = []
        try:
            with tqdm(jobs, desc="gradcheck", unit="case", disable=not progress,
                      leave=False) as it:
                for s, e in it:
                    results.append(with_repro(check_sample(s, mode=mode, use_torch=use_torch,
                                                           adapter=running[id(e)]),
                                              s, e, mode))
                    results += _forward_only_rows(s, running[id(e)], e, mode)
        except KeyboardInterrupt as exc:   # Ctrl-C: the finished rows go with it
            raise interrupted_with(results, exc) from None
        return results


def _forward_only_rows(case, engine, adapter, mode):
    """The rows of the engine's forward-only variants of `case` (gradcheck.forward_only:
    ggml's flash attention), each with its repro command where it fails."""
    return [with_repro(row, case, adapter, mode)
            for row in forward_only_rows(case, engine, case_labels(case, engine, mode))]


def check_ggml_coverage(adapter, dtype: str = "all", *, progress: bool = False, mode="auto",
                        use_torch: bool = True, case_timeout: float = DEFAULT_CASE_TIMEOUT,
                        tier: str = "fast"):
    """ggml's backward switch against the registry (gradcheck.adapters.ggml.coverage): the
    cases of every registry op that checks one of its entries, run in `adapter` (ggml's),
    summed up as one Result per entry."""
    # imported here: gradcheck.adapters.ggml loads only when ggml is asked for
    from gradcheck.adapters.ggml.coverage import coverage_ops, coverage_rows
    names = [op for op in coverage_ops() if op in all_ops()]
    results = check_ops(names, dtype, tier=tier, progress=progress, mode=mode,
                        use_torch=use_torch, adapter=adapter, case_timeout=case_timeout)
    return coverage_rows(results, all_ops())


def check_ops(op_names=None, dtype: str = "all", pattern: str | None = None, *,
              random: int = 0, seed: int = 0, inject: str | None = None,
              progress: bool = False, mode="auto", backends=("cpu",),
              use_torch: bool = True, adapter=None,
              case_timeout: float = DEFAULT_CASE_TIMEOUT, tier: str = "fast"):
    """The registry's cases of `tier` (tier_cases) of `op_names` (None: every checkable
    op) that match `dtype` and `pattern`, checked as run_checks does, then `random`
    generated cases per op (gradcheck.generated) with `seed`: in `adapter`'s engine, or in
    ours on each of `backends` with `inject` in place. Raises UnknownOpError for an unknown
    op, and LookupError for an optimizer step (no gradient: optcheck checks it) or when no
    case matches and none is generated."""
    names = checkable_ops() if op_names is None else list(op_names)
    updates = [n for n in names if get_op(n).kind == "update"]
    if updates:
        raise LookupError(f"{', '.join(updates)}: optimizer steps have no gradient to check; "
                          f"check them with optcheck (optcheck --opt all)")
    samples = select_samples(names, dtype, pattern, tier)
    if not samples and not random:
        raise LookupError(f"no sample case of {', '.join(names)} matches "
                          f"dtype={dtype} filter={pattern!r} tier={tier}")
    results = run_checks(samples, inject, progress, mode, backends, use_torch, adapter,
                         case_timeout)
    if not random:
        return results
    try:
        for name in names:
            if adapter is not None:       # one engine, its cases in one worker if isolated
                results += generated_results(name, random, seed, dtype, mode,
                                             use_torch=use_torch, adapter=adapter,
                                             case_timeout=case_timeout)
                continue
            for backend in backends:
                results += generated_results(name, random, seed, dtype, mode, backend,
                                             inject, use_torch)
    except KeyboardInterrupt as exc:       # Ctrl-C: the finished rows go with it
        raise interrupted_with(results, exc) from None
    return results
