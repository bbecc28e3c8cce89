"""optcheck's self-test: every mutant of `optcheck.mutants` must be caught by some family.

For each mutant, every family runs on each optimizer the mutant touches, with the mutant's
kernels in place. One Result per mutant: "pass" when at least one row failed or errored
(caught; `caught_by` lists the families that caught it), "fail" when every row passed (the
checker missed a known bug). A control row runs the same numpy kernels without a bug and
must pass every family: otherwise a "caught" mutant might have been caught for the rewrite,
not for its bug. Power = share of mutants caught.
"""

from __future__ import annotations

from tqdm import tqdm

from optcheck.mutants import CONTROL, MUTANTS, Mutant, mutated
from optcheck.runner import FAMILIES, run_family
from reports.record import Result

TOOL = "optcheck-selftest"


def _run_mutant(mutant: Mutant, families, dtype, steps, seed, backend):
    caught: dict[str, int] = {}
    rows = 0
    first = ""
    with mutated(mutant, backend):
        for optimizer in mutant.optimizers:
            for family in families:
                for r in run_family(family, optimizer, dtype, backend, steps, seed):
                    rows += 1
                    if not r.ok:
                        caught[family] = caught.get(family, 0) + 1
                        first = first or f"{r.name}: {r.message}"
    return caught, rows, first


def run_self_test(families=tuple(FAMILIES), dtype: str = "f64", steps: int = 100,
                  seed: int = 0, backend: str = "cpu", progress: bool = False) -> list[Result]:
    results = []
    labels = {"backend": backend, "dtype": dtype}
    for mutant in tqdm([CONTROL, *MUTANTS.values()], desc="optcheck self-test",
                       unit="mutant", disable=not progress, leave=False):
        caught, rows, first = _run_mutant(mutant, families, dtype, steps, seed, backend)
        by = ", ".join(f"{f} ({n})" for f, n in caught.items())
        metrics = {"rows": rows, "failed_rows": sum(caught.values()), "caught_by": by}
        opt_labels = {"optimizer": ",".join(mutant.optimizers), **labels}
        if mutant is CONTROL:
            ok = not caught
            msg = "" if ok else f"the bug-free numpy kernels fail: {first}"
        else:
            ok = bool(caught)
            msg = (f"caught; first: {first}" if ok else
                   "MISSED: every check passed with this bug in place")
        results.append(Result(TOOL, f"{mutant.name}: {mutant.description}",
                              "pass" if ok else "fail", metrics, msg, opt_labels))
    return results


def power(results) -> tuple[int, int]:
    """(mutants caught, mutants) from run_self_test's results, the control left out."""
    rows = [r for r in results if not r.name.startswith(CONTROL.name + ":")]
    return sum(r.status == "pass" for r in rows), len(rows)
