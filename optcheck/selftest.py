"""optcheck's self-test: every mutant of `optcheck.mutants` must be caught by some family.

For each mutant, every family runs on each optimizer the mutant touches, with the mutant's
kernels (or schedule factors) in place. One Result per mutant: "pass" when at least one row
failed or errored (caught; `caught_by` lists the families that caught it), "fail" when every
row passed (the checker missed a known bug). A control row runs the same numpy kernels without
a bug, under the engine's own schedules, and must pass every family: otherwise a "caught"
mutant might have been caught for the rewrite, not for its bug. A mutant for 16-bit
parameters runs in its dtype, beside a control in that dtype. Power = share of mutants
caught.

With `diagnosis`, it also proves the reference family's diagnosis (optcheck.diagnosis): every
variant of its library runs as a buggy optimizer (its own chain as a numpy update,
optcheck.adapters.numpy_adapter) in one reference trajectory at the variant's demo settings
(chosen so that it differs from the correct rule and from every other variant there), and
passes when the failing row's diagnosis names it. `momentum buffer started at zero` and
`dampening applied on the first step` give identical updates at every setting (both make the
first buffer (1 - dampening) g_1), so no setting tells them apart: either passes when the
diagnosis names both, and its row says so. A control per rule (the correct chain as a numpy
update, at every setting its variants use) must pass the reference family.
"""

from __future__ import annotations

from tqdm import tqdm

from optcheck import reference
from optcheck.adapters.numpy_adapter import NumpyUpdate
from optcheck.diagnosis import VARIANTS, Variant, numpy_update
from optcheck.harness import TOLERANCES
from optcheck.mutants import CONTROL, MUTANTS, Mutant, control, mutated
from optcheck.runner import FAMILIES, run_family
from optcheck.update_pieces import Chain
from reports.record import Result

TOOL = "optcheck-selftest"
DIAGNOSIS = "diagnosis"     # the prefix of the diagnosis rows' names


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
                  mutants=None, diagnosis: bool = False) -> list[Result]:
    """One Result per control and mutant (module doc); `mutants`: the names to run (None:
    all). A mutant that names a dtype runs in it, the others in `dtype`. With `diagnosis`
    (and the reference family among `families`), then the diagnosis rows
    (run_diagnosis_self_test)."""
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
    if diagnosis and reference.FAMILY in families:
        results += run_diagnosis_self_test(dtype, steps, seed, backend, progress)
    return results


def _settings(flat: dict) -> tuple[dict, dict]:
    """(hp, flags) of flat demo settings."""
    return ({k: v for k, v in flat.items() if not isinstance(v, bool)},
            {k: v for k, v in flat.items() if isinstance(v, bool)})


def _reference_row(chain: Chain, rule: str, flat: dict, dtype, steps, seed, backend):
    adapter = NumpyUpdate(*numpy_update(chain, rule), rule, "numpy-chain")
    return reference.user_row(adapter, rule, *_settings(flat), dtype, steps, seed, backend)


def _diagnosis_row(variant: Variant, dtype, steps, seed, backend) -> Result:
    rule, flat = variant.demo
    row = _reference_row(variant.chain(rule), rule, flat, dtype, steps, seed, backend)
    named = [n for n in row.metrics.get("diagnosis", "").split(" or ") if n]
    others = [n for n in named if n != variant.name]
    if row.status != "fail":
        ok, msg = False, f"MISSED: the reference row did not fail ({row.status}) {row.message}"
    elif variant.name not in named:
        ok, msg = False, f"MISNAMED: {row.message}"
    elif others and others != [variant.same_as]:
        ok, msg = False, (f"indistinguishable at these settings from {others}: choose "
                          f"settings that tell them apart; {row.message}")
    else:
        ok, msg = True, f"named; {row.message}"
        if others:
            msg += (f"; `{variant.same_as}` gives identical updates at every setting, so no "
                    f"setting tells the two apart")
    metrics = {"rows": 1, "failed_rows": int(not row.ok), "caught_by": "reference",
               "diagnosis": row.metrics.get("diagnosis", "")}
    return Result(TOOL, f"{DIAGNOSIS}: {variant.name} ({rule}, {row.name.split(': ', 1)[1]})",
                  "pass" if ok else "fail", metrics, msg,
                  {"optimizer": rule, "backend": backend, "dtype": dtype})


def _control_row(rule: str, settings: list[dict], dtype, steps, seed, backend) -> Result:
    rows = [_reference_row(Chain.of(rule), rule, flat, dtype, steps, seed, backend)
            for flat in settings]
    bad = [r for r in rows if not r.ok]
    msg = "" if not bad else f"the correct chain fails: {bad[0].name}: {bad[0].message}"
    return Result(TOOL, f"{DIAGNOSIS}: control ({rule}, the correct chain at "
                  f"{len(settings)} settings)", "fail" if bad else "pass",
                  {"rows": len(rows), "failed_rows": len(bad), "caught_by": ""}, msg,
                  {"optimizer": rule, "backend": backend, "dtype": dtype})


def run_diagnosis_self_test(dtype: str = "f64", steps: int = 100, seed: int = 0,
                            backend: str = "cpu", progress: bool = False,
                            variants=None) -> list[Result]:
    """A control row per rule, then one row per variant of optcheck.diagnosis (`variants`:
    names, None for all), each in one reference trajectory at its demo settings in `dtype`
    (float64 when the reference family does not judge `dtype`): module doc."""
    dtype = dtype if dtype in TOLERANCES else "f64"
    chosen = [v for v in VARIANTS.values() if variants is None or v.name in variants]
    settings: dict[str, list[dict]] = {}
    for v in chosen:
        rule, flat = v.demo
        if flat not in settings.setdefault(rule, []):
            settings[rule].append(dict(flat))
    jobs = [(_control_row, rule, found) for rule, found in settings.items()]
    jobs += [(_diagnosis_row, v) for v in chosen]
    return [job[0](*job[1:], dtype, steps, seed, backend)
            for job in tqdm(jobs, desc="optcheck diagnosis self-test", unit="row",
                            disable=not progress, leave=False)]


def power(results) -> tuple[int, int]:
    """(mutants caught, mutants) from run_self_test's results, the controls and the
    diagnosis rows left out."""
    rows = [r for r in results if not r.name.startswith((CONTROL.name, DIAGNOSIS))]
    return sum(r.status == "pass" for r in rows), len(rows)
