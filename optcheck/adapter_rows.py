"""What the families that step any optimizer adapter share (optcheck.adapter_invariants,
optcheck.known_bugs): a check's settings, chosen among candidates the adapter can run; the
float64 reference stepped beside it; and one row per check, where an adapter that lacks
what a check needs gives an `unsupported` row with the reason and a check that raises an
`error` row (a `crash` row when the adapter's worker process died).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from engine.tensor import DTYPES as NP_DTYPES
from optcheck import harness
from optcheck.numpy_optimizers import NUMPY_OPTIMIZERS
from reports.record import Result


class Unsupported(Exception):
    """The adapter cannot run what this check needs; the message says what."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a check found: whether it held, what to say, and its figures."""

    ok: bool
    message: str = ""
    metrics: dict = dataclasses.field(default_factory=dict)
    comparison: harness.Comparison | None = None


def first_supported(adapter, optimizer: str, dtype: str, candidates) -> tuple[dict, dict]:
    """The first (hp, flags) among `candidates` the adapter can run in `dtype`; Unsupported
    with the first candidate's reason when it runs none."""
    reasons = []
    for hp, flags in candidates:
        reason = adapter.unsupported(optimizer, dtype, hp, flags)
        if reason is None:
            return hp, flags
        reasons.append(reason)
    raise Unsupported(reasons[0])


def needs(stepper_or_adapter, *methods: str, what: str) -> None:
    """Unsupported unless every one of `methods` is there (optional parts of the protocol)."""
    missing = [m for m in methods if not callable(getattr(stepper_or_adapter, m, None))]
    if missing:
        raise Unsupported(f"the adapter has no {' or '.join(missing)} ({what}; "
                          f"optcheck.adapters.base)")


def cast(arrays: dict, dtype: str) -> dict:
    """The arrays rounded to `dtype` (float64 first: ml_dtypes' 16-bit floats included)."""
    return {k: np.asarray(v, np.float64).astype(NP_DTYPES[dtype]) for k, v in arrays.items()}


class Reference:
    """The float64 numpy optimizers over named tensors, each with its own (hp, flags)."""

    def __init__(self, optimizer: str, init: dict, settings: dict):
        self.init_fn, self.update_fn = NUMPY_OPTIMIZERS[optimizer]
        self.settings = settings                    # name -> (hp, flags)
        self.params = {k: np.asarray(v, np.float64) for k, v in init.items()}
        self.states = {k: self.init_fn(p, *settings[k]) for k, p in self.params.items()}

    def step(self, grads: dict) -> dict:
        """One step on `grads` (taken as float64); the snapshot, named as adapters name it."""
        snap = {}
        for k in self.params:
            hp, flags = self.settings[k]
            self.params[k], self.states[k] = self.update_fn(
                self.params[k], np.asarray(grads[k], np.float64), self.states[k], hp, flags)
            snap[k] = self.params[k]
            snap.update({f"{k}.{s}": v for s, v in self.states[k].items()})
        return snap


def compared_names(got: dict, want: dict, params) -> list[str]:
    """The names both snapshots have; ValueError when the adapter's lacks a parameter."""
    missing = sorted(set(params) - set(got))
    if missing:
        raise ValueError(f"the adapter's snapshot lacks the parameters {missing}")
    return [n for n in want if n in got]


def row(adapter, optimizer: str, family: str, check: str, case: str, dtype: str,
        backend: str, evaluate) -> Result:
    """The row of one check: `evaluate()` -> Outcome, with Unsupported and exceptions made
    rows (module doc); labelled with the adapter's name."""
    label = dict(optimizer=optimizer, family=family, check=check, case=case, dtype=dtype,
                 backend=backend)
    try:
        out = evaluate()
    except Unsupported as exc:
        res = harness.result(**label, message=str(exc), status="unsupported")
    except Exception as exc:  # noqa: BLE001  (a check that cannot run is a row, never raised)
        res = harness.result(**label, ok=False, message=f"{type(exc).__name__}: {exc}")
        res = dataclasses.replace(res, status=harness.status_of(exc))
    else:
        res = harness.result(**label, comparison=out.comparison, ok=out.ok,
                             message=out.message, **out.metrics)
    res.labels["engine"] = getattr(adapter, "name", "adapter")
    return res
