"""optcheck family "invariant": properties every correct optimizer and training loop has,
checked by running the engine twice and comparing the runs (no expected values needed).

    run("adam", dtype="f32") -> list[Result]          one row per invariant

Two kinds, each stated with its math in its module:

optcheck.training_loop_invariants   the Trainer: grad_accumulation (k physical batches make
                                    one logical batch), determinism (same seed, same bits),
                                    epoch_vs_fit (epoch after a shuffle == fit for one epoch).
optcheck.step_invariants            the optimizer stepped on given gradients:
                                    checkpoint_resume, checkpoint_resume_schedule (save, load,
                                    resume bit for bit; wrong targets refused), gradient_scale
                                    (g -> c g), weight_decay_l2 (decay == L2 term, or not, for
                                    AdamW), schedule_no_replan (schedules and set() without a
                                    new plan, against the float64 numpy optimizer).

Tolerances: the dtype's (`harness.TOLERANCES`) where the two runs round differently, zero
where they must not. The settings every invariant runs with are in optcheck.invariant_setup.
"""

from __future__ import annotations

import dataclasses

from optcheck import step_invariants as step
from optcheck import training_loop_invariants as loop
from optcheck.harness import OPTIMIZER_NAMES, TOLERANCES, result
from optcheck.invariant_setup import InvariantConfig
from reports.record import Result

FAMILY = "invariant"
DTYPES = tuple(TOLERANCES)      # float32, float64


def skip_reason(dtype: str) -> str | None:
    """Why this family does not run in `dtype` (None: it does)."""
    if dtype in DTYPES:
        return None
    return (f"the invariants are built in float32 and float64 (training graphs, data, their "
            f"tolerances); a {dtype} parameter's step is judged by the precision family")

INVARIANTS = {   # check -> (describe(cfg): the case's parameters, evaluate(cfg) -> Outcome)
    "grad_accumulation": (loop.describe_accumulation, loop.check_accumulation),
    "checkpoint_resume": (step.describe_checkpoint, step.check_checkpoint),
    "checkpoint_resume_schedule": (step.describe_checkpoint_schedule,
                                   step.check_checkpoint_schedule),
    "determinism": (loop.describe_determinism, loop.check_determinism),
    "gradient_scale": (step.describe_scale, step.check_scale),
    "weight_decay_l2": (step.describe_decay, step.check_decay),
    "epoch_vs_fit": (loop.describe_epoch_vs_fit, loop.check_epoch_vs_fit),
    "schedule_no_replan": (step.describe_schedule, step.check_schedule),
}


def run(optimizer: str, dtype: str = "f64", backend: str = "cpu", steps: int = 100,
        seed: int = 0, checks=None) -> list[Result]:
    """Every invariant of `optimizer` ('sgd', 'adam', 'adamw'), or those named in `checks`,
    one Result each in the order of INVARIANTS; an invariant that raises becomes an "error"
    row carrying the exception."""
    if optimizer not in OPTIMIZER_NAMES:
        raise ValueError(f"invariant: unknown optimizer {optimizer!r}; known: "
                         f"{', '.join(OPTIMIZER_NAMES)}")
    if skip_reason(dtype):
        raise ValueError(f"invariant: dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if steps < 2:
        raise ValueError(f"invariant: steps must be >= 2, got {steps}")
    unknown = sorted(set(checks or ()) - set(INVARIANTS))
    if unknown:
        raise ValueError(f"invariant: unknown check(s) {unknown}; known: {', '.join(INVARIANTS)}")
    cfg = InvariantConfig(optimizer, dtype, backend, steps, seed)
    rows = []
    for check, (describe, evaluate) in INVARIANTS.items():
        if checks is not None and check not in checks:
            continue
        case = f"{check}({describe(cfg)})"
        try:
            out = evaluate(cfg)
        except Exception as exc:  # noqa: BLE001 - an invariant that cannot run is an error row
            row = result(optimizer, FAMILY, check, case, dtype, backend, ok=False,
                         message=f"{type(exc).__name__}: {exc}")
            rows.append(dataclasses.replace(row, status="error"))
            continue
        ok = out.comparison.ok and not out.problems
        message = "; ".join(filter(None, [out.comparison.describe(), *out.problems]))
        rows.append(result(optimizer, FAMILY, check, case, dtype, backend, out.comparison, ok,
                           message, **out.metrics))
    return rows
