"""gradcheck's self-test: every known bug of `gradcheck.mutants` must be caught (the mutants
declared beside their ops in engine/ops and registered in engine.mutation).

For each mutant, the cases of its tier that exercise the bug are checked by `check_sample`
with the mutant in place: for a fast-tier mutant the registry samples of its ops (smallest
first, a few per op and dtype), for a scale-tier one the ops' scale cases (gradcheck.scale:
one or two, each about a second), plus the mutant's extra cases. One Result per mutant:
"pass" when at least one case failed or errored (the bug was caught), "fail" when every
case passed (the checker missed a bug; a self-test that could never say so would prove
nothing), "error" when the mutant had no case to run or could not be put in place. Its row
says the mutant's kind and tier, the case that caught it first (`caught_in`) and the check
that did (`check`), read from the failing case's message: numerical (backprop vs finite
differences), torch (vs torch autograd), NaN/Inf, shape check (a ShapeError while building
the backward graph), error (any other raised error), and the scale tier's forward, vjp,
directions, precision, threads and nondeterministic (see gradcheck.scale). Two columns
set the precision verdict (gradcheck.precision) beside the rest: `fixed`, whether any check
but it flagged a case (the fixed tolerances, torch, the numerical gradient, ...), and
`precision`, whether it did ("-" when no case is of a dtype it judges). The 16-bit mutants
and the float32 accumulator are there to show the second catching what the first misses.

The control (gradcheck.mutants.CONTROL: the patching machinery with no bug) runs first,
with the verdict inverted: its row passes when no case flagged it, and fails when one did
(then a catch would prove nothing). The power of the checker is the share of mutants
caught, the control left out.

Isolated (`gradcheck --self-test`'s default; `--no-isolate` turns it off), our engine runs
every mutant's cases in one worker process (gradcheck.engine_under_test), the mutant put in
place there for each call and nowhere else: a mutant that crashes the engine is a `crash`
case (caught, by "crash"), not the end of the self-test. The float64 references stay in
this process, unmutated. That changes what catches a mutant of a forward kernel on the
fast tier: in this process it changes the float64 reference too (our float64 graph runs the
same kernels), so the forward check cannot see it (torch, the numerical gradients of the
changed forward or a NaN do); isolated, the engine's forward is judged against a right
reference, and the `forward` check catches it too. Only registered
mutants (and the control) can be isolated: the worker finds them by name. The mutants of
forward mode and second order (gradcheck.mode_mutants) run in this process.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter

from tqdm import tqdm

from engine.mutation import Mutant
from engine.registry import get_op
from gradcheck.check import check_sample
from gradcheck.cotangents import registry_cases
from gradcheck.engine_under_test import EngineUnderTest
from gradcheck.mode_mutants import run_mode_mutants
from gradcheck.mutants import CONTROL, MUTANTS
from gradcheck.precision import JUDGED
from reports import Result

TOOL = "gradcheck-selftest"
DTYPES = ("f64",)
# message prefixes of check_sample's failing Results -> the check that failed
CHECKS = {"numerical": "numerical", "torch": "torch", "NaN/Inf": "NaN/Inf",
          "kinks": "kinks", "determinism": "determinism", "forward": "forward",
          "propagation": "propagation",
          # the scale tier's (gradcheck.scale)
          "vjp": "vjp", "directions": "directions", "precision": "precision",
          "threads": "threads", "nondeterministic": "nondeterministic"}


def _size(case) -> int:
    return sum(math.prod(spec.shape) for spec in case.inputs)


def mutant_cases(mutant: Mutant, dtypes=DTYPES, max_cases: int | None = None) -> list:
    """The cases `mutant` is checked on, per op: for a fast-tier mutant the registry's
    samples of each of `dtypes` that exercise the bug (`mutant.where`), smallest first, at
    most `max_cases` (default the mutant's own) per dtype; for a scale-tier one the op's
    scale cases that exercise it, in the registry's order, at most `max_cases`. Then the
    mutant's extra cases of each dtype."""
    limit = mutant.max_cases if max_cases is None else max_cases
    cases = []
    for op_name in mutant.ops:
        op = get_op(op_name)
        if mutant.tier == "scale":
            cases += [s for s in (op.scale() if op.scale else []) if mutant.where(s)][:limit]
            continue
        samples = registry_cases(op) if mutant.cotangents else (op.samples() or [])
        for dtype in mutant.dtypes or dtypes:
            fits = [s for s in samples if s.dtype == dtype and mutant.where(s)]
            cases += sorted(fits, key=_size)[:limit]
    for dtype in dtypes:
        cases += mutant.extra(dtype)
    return cases


def caught_by(result: Result) -> list[str]:
    """The checks that failed in one case's Result (empty when it passed); "crash" when
    the engine's worker died (an isolated run)."""
    if result.status == "crash":
        return ["crash"]
    if result.status == "error":
        return ["shape check" if "ShapeError" in result.message else "error"]
    if result.status != "fail":
        return []
    found = []
    for part in result.message.split("; "):   # problems; a problem may hold "; worst ..."
        kind = CHECKS.get(part.split(":", 1)[0].strip())
        if kind and kind not in found:
            found.append(kind)
    if not found:   # a message without a known prefix: name what it mentions
        found = [next((k for k in ("torch", "numerical") if k in result.message), "fail")]
    return found


def _isolation_problem(mutant: Mutant) -> str | None:
    """Why `mutant` cannot run in a worker process (None: it can): a worker finds it by
    name, so it must be the registered mutant of that name (or the control), and its patch
    must go in place (tried here, where it is the same code)."""
    known = CONTROL if mutant.name == CONTROL.name else MUTANTS.get(mutant.name)
    if known is not mutant:
        return (f"mutant {mutant.name} is not registered (gradcheck.mutants): a worker "
                "process cannot put it in place; run it in this process")
    try:
        with mutant.patch():
            pass
    except Exception as exc:
        return f"mutant could not be applied: {type(exc).__name__}: {exc}"
    return None


def run_mutant(mutant: Mutant, cases=None, progress: bool = False,
               engine: EngineUnderTest | None = None) -> Result:
    """Check `cases` (default `mutant_cases(mutant)`) with `mutant` in place; one Result
    (the verdict inverted for a control, see the module doc). `engine`: ours, isolated,
    whose worker runs the cases with the mutant in place there only
    (EngineUnderTest.mutated); None: in this process, the mutant in place around each
    whole check, the float64 references included."""
    t0 = time.perf_counter()
    labels = {"ops": ", ".join(mutant.ops), "kind": mutant.kind, "tier": mutant.tier}
    try:
        cases = mutant_cases(mutant) if cases is None else list(cases)
    except Exception as exc:
        return Result(TOOL, mutant.name, "error", labels=labels,
                      message=f"could not select cases: {type(exc).__name__}: {exc}")
    if not cases:
        return Result(TOOL, mutant.name, "error", {"cases": 0}, labels=labels,
                      message="no sample case exercises this bug")
    problem = _isolation_problem(mutant) if engine is not None else None
    if problem:
        return Result(TOOL, mutant.name, "error", labels=labels, message=problem)
    kinds: Counter[str] = Counter()
    caught, first = 0, None
    it = tqdm(cases, desc=mutant.name, unit="case", disable=not progress, leave=False)
    for case in it:
        if engine is not None:
            result = check_sample(case, adapter=engine.mutated(mutant.name))
        else:
            try:
                with mutant.patch():
                    result = check_sample(case)
            except Exception as exc:  # the patch broke: the self-test's fault, not a catch
                return Result(TOOL, mutant.name, "error", labels=labels,
                              message=f"mutant could not be applied: "
                                      f"{type(exc).__name__}: {exc}")
        found = caught_by(result)
        if found:
            caught += 1
            kinds.update(found)
            first = first or (case, found, result.message)
    missed = "not flagged" if mutant.control else "-"
    judged = any(getattr(c, "precision", None) in JUDGED for c in cases)
    unseen = "not flagged" if mutant.control else "missed"
    metrics = {"cases": len(cases), "caught": caught,
               "fixed": "caught" if set(kinds) - {"precision"} else unseen,
               "precision": "caught" if kinds["precision"] else unseen if judged else "-",
               "caught_in": str(first[0]) if first else missed,
               "check": ", ".join(first[1]) if first else missed,
               "caught_by": ", ".join(f"{k} {n}" for k, n in kinds.most_common()),
               "seconds": round(time.perf_counter() - t0, 2)}
    if mutant.control:
        if caught:
            return Result(TOOL, mutant.name, "fail", metrics,
                          f"CONTROL FLAGGED in {caught} of {len(cases)} cases: the machinery "
                          f"alone changes results, so a catch proves nothing; first "
                          f"{_shorten(f'{first[0]}: {first[2]}')}", labels)
        return Result(TOOL, mutant.name, "pass", metrics,
                      f"control: no bug, and none of its {len(cases)} cases flagged it "
                      f"(as it must be)", labels)
    if caught:
        message = f"first caught by {_shorten(f'{first[0]}: {first[2]}')}"
        return Result(TOOL, mutant.name, "pass", metrics, message, labels)
    return Result(TOOL, mutant.name, "fail", metrics,
                  f"SURVIVED all {len(cases)} cases: the checker misses this bug "
                  f"({mutant.description})", labels)


def run_self_test(progress: bool = False, mutants=None, dtypes=DTYPES,
                  max_cases: int | None = None, isolate: bool = False,
                  boundscheck: bool = False) -> list[Result]:
    """One Result per mutant, in order (default: the control, then every one of
    MUTANTS, then the mutants of forward mode and second order, gradcheck.mode_mutants);
    see the module doc. `dtypes` and `max_cases` choose the cases (see
    `mutant_cases`). `isolate`: our engine in one worker process (module doc);
    `boundscheck`: its kernels bounds-checked there (gradcheck.engine_under_test)."""
    modes = mutants is None
    mutants = [CONTROL, *MUTANTS.values()] if mutants is None else list(mutants)
    results = []
    with contextlib.ExitStack() as stack:
        engine = (stack.enter_context(EngineUnderTest(isolate=True, boundscheck=boundscheck))
                  if isolate or boundscheck else None)
        for mutant in tqdm(mutants, desc="self-test", unit="mutant", disable=not progress,
                           leave=False):
            try:
                cases = mutant_cases(mutant, dtypes, max_cases)
            except Exception:
                cases = None       # run_mutant selects again and reports the error
            results.append(run_mutant(mutant, cases, engine=engine))
    if modes:      # the bugs of forward mode and second order (gradcheck.mode_mutants)
        results += run_mode_mutants()
    return results


def mutation_score(results) -> dict[str, dict]:
    """Per op (sorted), what the self-test's rows say of it: `mutants`, how many mutants
    name it, `caught`, how many of those were caught, and per tier the same pair as
    "caught/mutants" (`fast`, `scale`, and the mode mutants' tiers); the control and rows
    without ops are left out. In `gradcheck --self-test --format json`, under
    meta.mutation_score."""
    score: dict[str, dict] = {}
    for r in results:
        if r.labels.get("kind") == "control" or not r.labels.get("ops"):
            continue
        caught = r.status == "pass"
        tier = str(r.labels.get("tier", "fast"))
        for op in str(r.labels["ops"]).split(", "):
            entry = score.setdefault(op, {"mutants": 0, "caught": 0, "tiers": {}})
            entry["mutants"] += 1
            entry["caught"] += caught
            n, k = entry["tiers"].get(tier, (0, 0))
            entry["tiers"][tier] = (n + 1, k + caught)
    return {op: {"mutants": e["mutants"], "caught": e["caught"]} |
            {tier: f"{k}/{n}" for tier, (n, k) in sorted(e["tiers"].items())}
            for op, e in sorted(score.items())}


def power(results) -> float:
    """The share of mutants caught (status pass), 0 to 1; control rows left out."""
    results = [r for r in results if r.labels.get("kind") != "control"]
    return sum(r.status == "pass" for r in results) / len(results) if results else 0.0


def _shorten(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
