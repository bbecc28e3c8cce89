"""optcheck family "reference": any optimizer adapter's trajectory against the float64 numpy
optimizers (optcheck.numpy_optimizers), step for step, over the torch family's
hyperparameter grid (a pairwise covering design: betas away from 0 and at 0, eps comparable
to sqrt(v), decay on and off, amsgrad, maximize, Nesterov, dampening).

The adapter starts from the torch family's four tensors, drawn from the seed and rounded to
the dtype; at step t it is handed the gradient of the same non-convex objective at its own
current parameters, rounded to the dtype, and the float64 reference takes the very same
gradient. After every step every parameter and every state tensor the adapter exposes
(optcheck.adapters.base: `w0.exp_avg`, ...) is compared with the reference within the
dtype's tolerance; the row names the first step and tensor that diverge. A rule, dtype or
setting the adapter cannot run is an `unsupported` row with its reason. A failing row also
says which known bug its trajectory matches, if any: the gradients and snapshots are replayed
through optcheck.diagnosis's variants of the rule (metric `diagnosis`: the variants named,
"none", or "failed" when the diagnosis itself could not run).

Unlike the torch family, which compares our engine with torch.optim at the same precision,
this one needs nothing of the implementation but its updates: it is how optcheck judges
torch.optim's own implementations, a numpy update, or yours.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from optcheck import harness
from optcheck.numpy_optimizers import NUMPY_OPTIMIZERS
from optcheck.torch_trajectories import initial_params, objective_grad, scenarios
from reports.record import Result

FAMILY = "reference"


def skip_reason(dtype: str) -> str | None:
    """Why this family does not run in `dtype` (None: it does)."""
    if dtype in harness.TOLERANCES:
        return None
    return (f"a {dtype} parameter is rounded by up to half its ulp at every step, beyond the "
            f"tolerance of a step-for-step comparison with float64; the precision family "
            f"judges {dtype} trajectories")


@dataclasses.dataclass
class Trace:
    """What `follow` handed the adapter and saw, for the diagnosis of a failing row: the
    initial parameters, and per step the gradients and the adapter's snapshot (float64)."""

    init: dict = dataclasses.field(default_factory=dict)
    grads: list = dataclasses.field(default_factory=list)
    observed: list = dataclasses.field(default_factory=list)


def follow(adapter, optimizer: str, scenario, dtype: str, steps: int,
           seed: int, trace: Trace | None = None) -> harness.Comparison:
    """`steps` steps of `adapter` and of the float64 reference on the same gradients,
    compared after each (module doc); `trace`, when given, records them."""
    init, offsets = initial_params(seed, dtype)
    if trace is not None:
        trace.init = {k: np.asarray(v, np.float64) for k, v in init.items()}
    stepper = adapter.stepper(optimizer, init, scenario.hp, scenario.flags, dtype)
    init_fn, update_fn = NUMPY_OPTIMIZERS[optimizer]
    params = {k: np.asarray(v, np.float64) for k, v in init.items()}
    states = {k: init_fn(p, scenario.hp, scenario.flags) for k, p in params.items()}
    sign = -1.0 if scenario.flags.get("maximize") else 1.0
    np_dtype = init["w0"].dtype
    comparison = harness.Comparison()
    current = {k: np.asarray(v, np.float64) for k, v in init.items()}
    for step in range(1, steps + 1):
        grads = {k: g.astype(np_dtype)
                 for k, g in objective_grad(current, offsets, sign).items()}
        stepper.step(grads)
        want = {}
        for k in params:
            params[k], states[k] = update_fn(params[k], np.asarray(grads[k], np.float64),
                                             states[k], scenario.hp, scenario.flags)
            want[k] = params[k]
            want.update({f"{k}.{s}": v for s, v in states[k].items()})
        got = stepper.snapshot()
        missing = sorted(set(params) - set(got))
        if missing:
            raise ValueError(f"the adapter's snapshot lacks the parameters {missing}")
        if trace is not None:
            trace.grads.append({k: np.asarray(g, np.float64) for k, g in grads.items()})
            trace.observed.append({k: np.array(v, np.float64) for k, v in got.items()})
        names = [n for n in want if n in got]
        comparison.add(step, got, want, dtype, names, tol=harness.tolerance(dtype, steps))
        current = {k: got[k] for k in params}
    return comparison


def run(optimizer: str, dtype: str = "f64", backend: str = "cpu", steps: int = 100,
        seed: int = 0, adapter=None) -> list[Result]:
    """One row per grid row of `optimizer`: `adapter` (default: our engine on `backend`)
    against the float64 reference."""
    if adapter is None:
        from optcheck.adapters.engine_adapter import EngineOptimizer
        adapter = EngineOptimizer(backend)
    grid = [s for s in scenarios(optimizer, steps) if s.schedule is None]
    return [_row(adapter, optimizer, s, dtype, backend, steps, seed, len(grid)) for s in grid]


def user_row(adapter, optimizer: str, hp: dict, flags: dict, dtype: str, steps: int = 100,
             seed: int = 0, backend: str = "cpu") -> Result:
    """The row of one trajectory at the user's own settings (flat `hp`, `flags`)."""
    from optcheck.torch_trajectories import Scenario
    return _row(adapter, optimizer, Scenario("user", hp, flags), dtype, backend, steps, seed, 1)


def _row(adapter, optimizer, scenario, dtype, backend, steps, seed, grid_size) -> Result:
    label = dict(optimizer=optimizer, family=FAMILY, check=scenario.check, case=str(scenario),
                 dtype=dtype, backend=backend)
    metrics = {"steps": steps, "grid": grid_size}
    reason = adapter.unsupported(optimizer, dtype, scenario.hp, scenario.flags)
    if reason:
        return harness.result(**label, message=reason, status="unsupported", **metrics)
    trace = Trace()
    try:
        comparison = follow(adapter, optimizer, scenario, dtype, steps, seed, trace)
    except Exception as exc:  # a row that cannot run is reported, never raised
        row = harness.result(**label, ok=False, message=f"{type(exc).__name__}: {exc}",
                             **metrics)
        return dataclasses.replace(row, status=harness.status_of(exc))
    message = ""
    if not comparison.ok:
        sentence, metrics["diagnosis"] = _diagnosis(optimizer, scenario, dtype, trace)
        message = f"{comparison.describe()} from the float64 reference; {sentence}"
    return harness.result(**label, comparison=comparison, message=message, **metrics)


def _diagnosis(optimizer, scenario, dtype, trace: Trace) -> tuple[str, str]:
    """(the sentence, the metric) of optcheck.diagnosis on a failing row's trace: the
    variants named ("none" when it matches none), or "failed" with why; never raises."""
    try:
        from optcheck.diagnosis import diagnose
        found = diagnose(optimizer, scenario.hp, scenario.flags, dtype, trace.init,
                         trace.grads, trace.observed)
    except Exception as exc:  # noqa: BLE001  (the diagnosis is a courtesy to a failed row)
        return f"diagnosis failed: {type(exc).__name__}: {exc}", "failed"
    return found.message, " or ".join(found.named) or "none"
