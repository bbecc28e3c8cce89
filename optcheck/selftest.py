"""optcheck's self-test: every mutant of `optcheck.mutants` must be caught by some family.

For each mutant, every family runs on each optimizer the mutant touches, with the mutant's
kernels in place. One Result per mutant: "pass" when at least one row failed or errored
(caught; `caught_by` lists the families that caught it), "fail" when every row passed (the
checker missed a known bug). A control row runs the same numpy kernels without a bug and
must pass every family: otherwise a "caught" mutant might have been caught for the rewrite,
not for its bug. A mutant for 16-bit parameters runs in its dtype, beside a control in that
dtype. Power = share of mutants caught.
"""

from __future__ import annotations

from tqdm import tqdm

from optcheck.mutants import CONTROL, MUTANTS, Mutant, control, mutated
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


def plan(dtype: str = "f64", mutants=None) -> list[tuple[Mutant, str, bool]]:
    """(mutant, the dtype it runs in, whether it is a control) in the self-test's order: the
    control in `dtype`, then a control in each other dtype a mutant names, then the
    mutants (`mutants`: names, None for all)."""
    chosen = [m for m in MUTANTS.values() if mutants is None or m.name in mutants]
    dtypes = list(dict.fromkeys([dtype] + [m.dtype for m in chosen if m.dtype]))
    controls = [(CONTROL if d == dtype else control(d), d, True) for d in dtypes]
    return controls + [(m, m.dtype or dtype, False) for m in chosen]


def run_self_test(families=tuple(FAMILIES), dtype: str = "f64", steps: int = 100,
                  seed: int = 0, backend: str = "cpu", progress: bool = False,
                  mutants=None) -> list[Result]:
    """One Result per control and mutant (module doc); `mutants`: the names to run (None:
    all). A mutant that names a dtype runs in it, the others in `dtype`."""
    results = []
    for mutant, run_dtype, is_control in tqdm(plan(dtype, mutants), desc="optcheck self-test",
                                              unit="mutant", disable=not progress,
                                              leave=False):
        caught, rows, first = _run_mutant(mutant, families, run_dtype, steps, seed, backend)
        by = ", ".join(f"{f} ({n})" for f, n in caught.items())
        metrics = {"rows": rows, "failed_rows": sum(caught.values()), "caught_by": by}
        opt_labels = {"optimizer": ",".join(mutant.optimizers), "backend": backend,
                      "dtype": run_dtype}
        if is_control:
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
    rows = [r for r in results if not r.name.startswith(CONTROL.name)]
    return sum(r.status == "pass" for r in rows), len(rows)
