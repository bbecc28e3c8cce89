"""optcheck family "precision": is the engine's optimizer as accurate as a good
implementation at its dtype?

For float16, bfloat16 and float32 parameters (the state in float32, see
engine.ops.optimizer_steps.state_dtype), three trajectories start from the same parameters
rounded to the dtype d and see the same gradients, the torch family's objective
`p - sin(2 p) + c` evaluated in float64 at the float64 trajectory's parameters and rounded
to d (so the three see identical inputs and no rounding feeds back through the gradient):

    truth     the float64 numpy optimizer (optcheck.numpy_optimizers) on those gradients
    engine    the engine's optimizer with d parameters
    ref       torch.optim (foreach=False) stepping float32 copies whose values are rounded to
              d after every step (optcheck.torch_stepper, round_to=d): d parameters, float32
              state, the update rounded once, on store, which is what the engine promises.
              torch.optim cannot be told to keep float32 state for a 16-bit parameter (it
              keeps it in the parameter's dtype), so this is the fair same-precision
              reference; in float32 it is plain torch.optim.

Every parameter and state tensor is judged, over all steps, by gradcheck's precision rule
(gradcheck.precision): err = max |engine - truth|, ref_err = max |ref - truth|, pass when
err <= PRECISION_RATIO * ref_err + FLOOR_ULPS ulps (of d for a parameter, of float32 for
state) of the tensor's largest |truth|. The row reports its worst tensor's err_vs_f64,
ref_err and ratio (scaled so that PRECISION_RATIO is the bar), and, as information,
torch.optim as it is in d (state in d): its parameters' error (`native_err`) and ratio
(`native_ratio`) under the same rule.

The rows are the torch family's (its pairwise hyperparameter grid and its schedules).
float64 is the truth itself: its rows skip.

Any optimizer adapter (optcheck.adapters) takes the engine's place the same way, on the grid
rows (an adapter takes no schedule), judged over the tensors its snapshot exposes: an
implementation that keeps 16-bit moments for a 16-bit parameter (torch.optim's for-loop,
optax#1552) errs far beyond torch with float32 state, and the row says so.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from checkkit.precision import FLOOR_ULPS, PRECISION_RATIO, magnitude, max_abs_error, ratio
from engine.ops.optimizer_steps import state_dtype
from engine.tensor import dtype_name
from optcheck import harness
from optcheck.adapters.torch_adapter import state_names as torch_state_names
from optcheck.numpy_optimizers import NUMPY_OPTIMIZERS
from optcheck.torch_stepper import TorchStepper
from optcheck.torch_trajectories import (
    INSTALL_HINT,
    Scenario,
    engine_schedule,
    initial_params,
    objective_grad,
    scenarios,
)
from reports.record import Result

FAMILY = "precision"
JUDGED = ("f16", "bf16", "f32")
REFERENCE = "torch, {dtype} params, f32 state"


def skip_reason(dtype: str) -> str | None:
    """Why this family does not run in `dtype` (None: it does)."""
    if dtype in JUDGED:
        return None
    return "float64 is the truth the precision family judges f16, bf16 and f32 against"


@dataclasses.dataclass
class TensorErrors:
    """One tensor's errors over a trajectory: the engine's and the references' largest
    |value - truth| over every step and element, the largest |truth| and the dtype whose
    ulps make the floor."""

    dtype: str
    err: float = 0.0
    ref_err: float = 0.0
    native_err: float = 0.0
    size: float = 0.0

    @classmethod
    def of(cls, dtype: str, engine, ref, native, truth) -> TensorErrors:
        """From the stacked per-step values of the engine, the reference, torch.optim as it
        is (None: not run) and the truth."""
        return cls(dtype, max_abs_error(engine, truth), max_abs_error(ref, truth),
                   0.0 if native is None else max_abs_error(native, truth), magnitude(truth))

    @property
    def ratio(self) -> float:
        return ratio(self.err, self.ref_err, self.size, self.dtype)

    @property
    def native_ratio(self) -> float:
        return ratio(self.native_err, self.ref_err, self.size, self.dtype)


def _rounded(grads: dict, np_dtype) -> dict:
    return {k: np.asarray(g).astype(np_dtype) for k, g in grads.items()}


def measure(optimizer: str, scenario: Scenario, dtype: str, backend: str = "cpu",
            steps: int = 100, seed: int = 0, native: bool = True,
            adapter=None) -> dict[str, TensorErrors]:
    """The errors of every parameter and state tensor (by name: `w0`, `w0.exp_avg`, ...) of
    the engine (or of the optimizer adapter `adapter`: the tensors it exposes), the
    reference and (`native`, 16-bit dtypes) torch.optim as it is, against the float64
    trajectory (module doc). The step counters are not judged: they must equal the truth's
    exactly, or this raises."""
    np_dtype = harness.DTYPE_OF[dtype]
    init64, offsets = initial_params(seed, "f64")
    init = {k: np.asarray(v).astype(np_dtype) for k, v in init64.items()}
    truth = {k: np.asarray(v, np.float64) for k, v in init.items()}
    init_fn, update_fn = NUMPY_OPTIMIZERS[optimizer]
    truth_state = {k: init_fn(p, scenario.hp, scenario.flags) for k, p in truth.items()}
    schedule = engine_schedule(scenario)
    if adapter is None:
        engine_side = harness.EngineStepper(optimizer, init, scenario.hp, scenario.flags,
                                            dtype, backend, schedule)
    else:
        engine_side = adapter.stepper(optimizer, init, scenario.hp, scenario.flags, dtype)
    ref = TorchStepper(optimizer, init, scenario.hp, scenario.flags, scenario.schedule,
                       dtype="f32", round_to=None if dtype == "f32" else dtype)
    as_is = (TorchStepper(optimizer, init, scenario.hp, scenario.flags, scenario.schedule)
             if native and dtype != "f32" else None)
    sign = -1.0 if scenario.flags.get("maximize") else 1.0
    state_names = None
    seen: dict[str, tuple[str, list, list, list, list]] = {}  # name -> dtype, 4 trajectories
    for _ in range(steps):
        grads = _rounded(objective_grad(truth, offsets, sign), np_dtype)
        hp = {**scenario.hp, "lr": ref.lr}
        for k in truth:
            truth[k], truth_state[k] = update_fn(truth[k], np.asarray(grads[k], np.float64),
                                                 truth_state[k], hp, scenario.flags)
        engine_side.step(grads)
        ref.step(grads)
        if as_is is not None:
            as_is.step(grads)
        got = engine_side.snapshot()
        if state_names is None:     # what the side under test exposes, and all torch keeps
            state_names = sorted({k.split(".", 1)[1] for k in got if "." in k}
                                 | set(torch_state_names(optimizer, scenario.flags)))
        want = ref.snapshot(state_names)
        plain = as_is.snapshot(state_names) if as_is is not None else None
        for k in truth:
            if k not in got:
                raise ValueError(f"the adapter's snapshot lacks the parameter {k}")
            if f"{k}.step" in got and \
                    float(got[f"{k}.step"][0]) != float(truth_state[k]["step"][0]):
                raise RuntimeError(f"{k}.step is {got[f'{k}.step'][0]}, expected "
                                   f"{truth_state[k]['step'][0]}")
            names = [(k, truth[k], dtype)] + [
                (f"{k}.{s}", v, dtype_name(state_dtype(np_dtype)))
                for s, v in truth_state[k].items() if s != "step" and f"{k}.{s}" in got]
            for name, t, judged_in in names:
                _, e, r, n, w = seen.setdefault(name, (judged_in, [], [], [], []))
                e.append(got[name])
                r.append(want[name])
                n.append(None if plain is None else plain[name])
                w.append(t)
    return {name: TensorErrors.of(judged_in, e, r, None if n[0] is None else n, w)
            for name, (judged_in, e, r, n, w) in seen.items()}


def verdict(errors: dict[str, TensorErrors], dtype: str) -> tuple[bool, dict, str]:
    """(pass, metrics, message) of a row from its tensors' errors: the worst tensor by
    ratio decides; `native_*` are torch.optim's as it is, over the parameters."""
    worst_name, worst = max(errors.items(), key=lambda kv: kv[1].ratio)
    params = [e for name, e in errors.items() if "." not in name]
    metrics = {"max_abs_err": max(e.err for e in errors.values()),
               "err_vs_f64": worst.err, "ref_err": worst.ref_err,
               "ratio": round(worst.ratio, 3), "worst": worst_name,
               "precision_ref": REFERENCE.format(dtype=dtype)}
    if dtype != "f32":
        native = max(params, key=lambda e: e.native_ratio)
        metrics.update({"native_err": native.native_err,
                        "native_ratio": round(native.native_ratio, 3)})
    ok = worst.ratio <= PRECISION_RATIO
    message = "" if ok else (
        f"precision: {worst_name} ({worst.dtype}) errs {worst.err:.3g} against float64, "
        f"{worst.ratio:.3g} (bar {PRECISION_RATIO:g}) times as far as torch with float32 "
        f"state ({worst.ref_err:.3g}) plus {FLOOR_ULPS:g} ulps allows")
    return ok, metrics, message


def _row(optimizer: str, scenario: Scenario, dtype: str, backend: str, steps: int,
         seed: int, adapter=None) -> Result:
    label = dict(optimizer=optimizer, family=FAMILY, check=scenario.check,
                 case=str(scenario), dtype=dtype, backend=backend)
    reason = adapter and adapter.unsupported(optimizer, dtype, scenario.hp, scenario.flags)
    if reason:
        return harness.result(**label, status="unsupported", message=reason, steps=steps)
    try:
        errors = measure(optimizer, scenario, dtype, backend, steps, seed, adapter=adapter)
    except Exception as exc:  # a row that cannot run is reported, never raised
        return harness.result(**label, status=harness.status_of(exc),
                              message=f"{type(exc).__name__}: {exc}", steps=steps)
    ok, metrics, message = verdict(errors, dtype)
    return harness.result(**label, ok=ok, message=message, steps=steps, **metrics)


def _torch_missing(optimizer, check, dtype, backend) -> list[Result]:
    try:
        import torch  # noqa: F401
    except ImportError:
        return [harness.result(optimizer, FAMILY, check, f"{check}()", dtype, backend,
                               status="skip", message=INSTALL_HINT)]
    return []


def run(optimizer: str, dtype: str = "bf16", backend: str = "cpu", steps: int = 100,
        seed: int = 0, adapter=None) -> list[Result]:
    """The precision family for one optimizer ('sgd', 'adam', 'adamw') and dtype ('f16',
    'bf16', 'f32'): one Result per row of the torch family's grid and schedules (an
    optimizer adapter, which takes no schedule: the grid rows). Without torch: one "skip"
    Result."""
    if optimizer not in NUMPY_OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(NUMPY_OPTIMIZERS)}")
    if skip_reason(dtype):
        raise ValueError(f"precision: dtype must be one of {list(JUDGED)}, got {dtype!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    missing = _torch_missing(optimizer, "torch_available", dtype, backend)
    if missing:
        return missing
    return [_row(optimizer, s, dtype, backend, steps, seed, adapter)
            for s in scenarios(optimizer, steps) if adapter is None or s.schedule is None]


def run_config(optimizer: str, hp: dict, flags: dict, dtype: str = "bf16",
               backend: str = "cpu", steps: int = 100, seed: int = 0) -> list[Result]:
    """One row: the user's own hyperparameters (as torch_trajectories.run_config takes them)
    judged as the grid rows are."""
    missing = _torch_missing(optimizer, "user", dtype, backend)
    if missing:
        return missing
    scenario = Scenario("user", {k: float(v) for k, v in hp.items()},
                        {k: bool(v) for k, v in flags.items()}, None)
    return [_row(optimizer, scenario, dtype, backend, steps, seed)]
