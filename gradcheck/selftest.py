"""gradcheck's self-test: every known bug of `gradcheck.mutants` must be caught.

For each mutant, the sample cases of its ops that exercise the bug (smallest first, a few
per op and dtype, plus the mutant's extra cases) are checked by `check_sample` with the
mutant in place. One Result per mutant: "pass" when at least one case failed or errored (the
bug was caught), "fail" when every case passed (the checker missed a bug; a self-test that
could never say so would prove nothing), "error" when the mutant had no case to run or could
not be put in place. `caught_by` says which check caught it, from the failing cases'
messages: numerical (backprop vs finite differences), torch (vs torch autograd), NaN/Inf,
shape check (a ShapeError while building the backward graph), error (any other raised error).
The power of the checker is the share of mutants caught.
"""

from __future__ import annotations

import math
import time
from collections import Counter

from tqdm import tqdm

from engine.registry import get_op
from gradcheck.check import check_sample
from gradcheck.cotangents import registry_cases
from gradcheck.mutants import MUTANTS, Mutant
from reports import Result

TOOL = "gradcheck-selftest"
DTYPES = ("f64",)
# message prefixes of check_sample's failing Results -> the check that failed
CHECKS = {"numerical": "numerical", "torch": "torch", "NaN/Inf": "NaN/Inf",
          "kinks": "kinks", "determinism": "determinism", "forward": "forward"}


def _size(case) -> int:
    return sum(math.prod(spec.shape) for spec in case.inputs)


def mutant_cases(mutant: Mutant, dtypes=DTYPES, max_cases: int | None = None) -> list:
    """The cases `mutant` is checked on: per op and dtype, the registry's samples that
    exercise the bug (`mutant.where`), smallest first, at most `max_cases` (default the
    mutant's own); then the mutant's extra cases of each dtype."""
    limit = mutant.max_cases if max_cases is None else max_cases
    cases = []
    for op_name in mutant.ops:
        op = get_op(op_name)
        samples = registry_cases(op) if mutant.cotangents else (op.samples() or [])
        for dtype in dtypes:
            fits = [s for s in samples if s.dtype == dtype and mutant.where(s)]
            cases += sorted(fits, key=_size)[:limit]
    for dtype in dtypes:
        cases += mutant.extra(dtype)
    return cases


def caught_by(result: Result) -> list[str]:
    """The checks that failed in one case's Result (empty when it passed)."""
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


def run_mutant(mutant: Mutant, cases=None, progress: bool = False) -> Result:
    """Check `cases` (default `mutant_cases(mutant)`) with `mutant` in place; one Result."""
    t0 = time.perf_counter()
    labels = {"ops": ", ".join(mutant.ops)}
    try:
        cases = mutant_cases(mutant) if cases is None else list(cases)
    except Exception as exc:
        return Result(TOOL, mutant.name, "error", labels=labels,
                      message=f"could not select cases: {type(exc).__name__}: {exc}")
    if not cases:
        return Result(TOOL, mutant.name, "error", {"cases": 0}, labels=labels,
                      message="no sample case exercises this bug")
    kinds: Counter[str] = Counter()
    caught, first = 0, None
    it = tqdm(cases, desc=mutant.name, unit="case", disable=not progress, leave=False)
    for case in it:
        try:
            with mutant.patch():
                result = check_sample(case)
        except Exception as exc:  # the patch itself broke: the self-test's fault, not a catch
            return Result(TOOL, mutant.name, "error", labels=labels,
                          message=f"mutant could not be applied: {type(exc).__name__}: {exc}")
        found = caught_by(result)
        if found:
            caught += 1
            kinds.update(found)
            first = first or f"{case}: {result.message}"
    metrics = {"cases": len(cases), "caught": caught,
               "caught_by": ", ".join(f"{k} {n}" for k, n in kinds.most_common()),
               "seconds": round(time.perf_counter() - t0, 2)}
    if caught:
        message = f"first caught by {_shorten(first)}"
        return Result(TOOL, mutant.name, "pass", metrics, message, labels)
    return Result(TOOL, mutant.name, "fail", metrics,
                  f"SURVIVED all {len(cases)} cases: the checker misses this bug "
                  f"({mutant.description})", labels)


def run_self_test(progress: bool = False, mutants=None, dtypes=DTYPES,
                  max_cases: int | None = None) -> list[Result]:
    """One Result per mutant (default: every one of MUTANTS), in order; see the module doc.
    `dtypes` and `max_cases` choose the cases (see `mutant_cases`)."""
    mutants = list(MUTANTS.values()) if mutants is None else list(mutants)
    results = []
    for mutant in tqdm(mutants, desc="self-test", unit="mutant", disable=not progress,
                       leave=False):
        try:
            cases = mutant_cases(mutant, dtypes, max_cases)
        except Exception:
            cases = None       # run_mutant selects again and reports the error
        results.append(run_mutant(mutant, cases))
    return results


def power(results) -> float:
    """The share of mutants caught (status pass), 0 to 1."""
    results = list(results)
    return sum(r.status == "pass" for r in results) / len(results) if results else 0.0


def _shorten(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
