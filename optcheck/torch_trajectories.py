"""optcheck family "torch": engine optimizer trajectories against torch.optim, step for step.

Both sides start from the same parameters, four tensors of shapes (), (7,), (3, 5) and
(2, 3, 4) in one optimizer, drawn from `seed`. At step t both are handed the same gradient,
that of the non-convex objective

    f(p) = sum(p^2 / 2 + cos(2 p) / 2 + c p),      grad f(p) = p - sin(2 p) + c,

(c: small fixed per-element offsets; -f for `maximize`, so that ascent stays bounded),
evaluated in float64 on torch's current parameters and rounded to the dtype under test. The
trajectory thus depends on the updates, while rounding differences between the two sides
never feed back through the gradient. After every step every parameter and every state
tensor (`w0`, `w0.step`, `w0.exp_avg`, ...; see optcheck.harness) is compared within the
dtype's tolerance. torch.optim runs its single-tensor implementation (foreach=False), driven
by optcheck.torch_stepper.

Hyperparameters are crossed by a pairwise covering design (`pairwise_grid`): every pair of
option values, e.g. amsgrad with betas (0, 0) or dampening 0.5 with momentum 0.9, occurs in
at least one row; each learning-rate schedule gets one row more (the warmups and the chained
one against torch's SequentialLR and ChainedScheduler). When a row fails, the
float64 numpy optimizer (optcheck.numpy_optimizers) is run on the same gradients and
learning rates, and the message says which side it agrees with.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from engine.optim import schedules
from optcheck import harness
from optcheck.numpy_optimizers import NUMPY_OPTIMIZERS
from optcheck.torch_stepper import TorchStepper
from reports.record import Result

FAMILY = "torch"
SHAPES = ((), (7,), (3, 5), (2, 3, 4))
INIT_SCALE = 1.5        # std of the initial parameters
OFFSET_SCALE = 0.1      # std of the per-element offsets c of the objective

_ADAM_FACTORS = {
    "lr": (0.01, 0.1),
    # (0.8, 0.5): v forgets fast and shrinks as the gradient does, so AMSGrad's max matters
    "betas": ((0.9, 0.999), (0.0, 0.0), (0.8, 0.5)),
    "eps": (1e-8, 0.1),     # 0.1 is comparable to sqrt(v): where eps sits matters
    "weight_decay": (0.0, 0.1),
    "amsgrad": (False, True),
    "maximize": (False, True),
}
GRID_FACTORS = {
    "sgd": {
        "lr": (0.01, 0.1),
        "momentum": (0.0, 0.9),
        "dampening": (0.0, 0.5),
        "weight_decay": (0.0, 0.1),
        "nesterov": (False, True),
        "maximize": (False, True),
    },
    "adam": _ADAM_FACTORS,
    "adamw": _ADAM_FACTORS,
}
FLAGS = ("nesterov", "amsgrad", "maximize")

# One row per schedule: (engine schedule name, its arguments as functions of `steps`).
# A warmup lasts a quarter of the trajectory and its second phase the rest, several decays
# or most of a cosine: a second phase evaluated at t instead of t - n is off from the
# milestone on (at 100 steps: warmup_cosine's factor 0.78 instead of 1 there, warmup_step's
# 0.5), one whose milestone is a step off by gamma at a decay or up to 0.02 on the cosine.
# `chained` decays during its warmup too, so the product shows in both phases.
SCHEDULES = {
    "step_decay": lambda steps: {"step_size": max(1, steps // 4), "gamma": 0.5},
    "cosine": lambda steps: {"t_max": max(1, steps // 2), "min_factor": 0.1},
    "linear_warmup": lambda steps: {"warmup_steps": max(1, steps // 4), "start_factor": 0.25},
    "warmup_cosine": lambda steps: {"warmup_steps": max(1, steps // 4),
                                    "t_max": max(2, steps),
                                    "start_factor": 0.25, "min_factor": 0.1},
    "warmup_step": lambda steps: {"warmup_steps": max(1, steps // 4),
                                  "step_size": max(1, steps // 6),
                                  "start_factor": 0.25, "gamma": 0.5},
    "chained": lambda steps: {
        "linear_warmup": {"warmup_steps": max(1, steps // 4), "start_factor": 0.25},
        "step_decay": {"step_size": max(1, steps // 6), "gamma": 0.5}},
}
SCHEDULE_BASE = {
    "sgd": {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.01,
            "nesterov": False, "maximize": False},
    "adam": {"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
             "amsgrad": False, "maximize": False},
}
SCHEDULE_BASE["adamw"] = SCHEDULE_BASE["adam"]

INSTALL_HINT = ("torch is not importable; install the CPU build with `pip install torch "
                "--index-url https://download.pytorch.org/whl/cpu`")




def skip_reason(dtype: str) -> str | None:
    """Why this family does not run in `dtype` (None: it does)."""
    if dtype in harness.TOLERANCES:
        return None
    return (f"torch.optim keeps a {dtype} parameter's state in {dtype}, the engine in "
            f"float32: different rounding, not comparable step for step within a tolerance; "
            f"the precision family compares both with the float64 trajectory, the engine "
            f"bounded by torch stepping the {dtype} parameters with float32 state")


# --------------------------------------------------------------------------- the grid

def _sgd_valid(row: dict) -> bool:
    """torch.optim.SGD's rule: Nesterov needs momentum > 0 and dampening = 0."""
    return not row.get("nesterov") or (row["momentum"] > 0 and row["dampening"] == 0)


def pairwise_grid(factors: dict, valid=lambda row: True) -> list[dict]:
    """A small set of rows of `factors` (name -> values) in which every valid pair of values
    of two factors occurs at least once: greedy, each time the valid row of the full product
    that covers the most pairs not yet covered (the first such row, so the result is fixed).
    """
    names = list(factors)
    candidates = [dict(zip(names, values, strict=True))
                  for values in itertools.product(*factors.values())]
    candidates = [row for row in candidates if valid(row)]

    def pairs(row):
        return {(a, repr(row[a]), b, repr(row[b])) for a, b in itertools.combinations(names, 2)}

    uncovered = set().union(*(pairs(row) for row in candidates))
    grid = []
    while uncovered:
        best = max(candidates, key=lambda row: len(pairs(row) & uncovered))
        grid.append(best)
        uncovered -= pairs(best)
    return grid


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One trajectory: a check name, flat hyperparameters (beta1/beta2, as the engine, the
    numpy optimizers and `TorchStepper` take them), flags, and an optional schedule (engine
    schedule name, arguments)."""

    check: str
    hp: dict
    flags: dict
    schedule: tuple[str, dict] | None = None

    def __str__(self) -> str:
        parts = []
        for k, v in self.hp.items():
            if k == "beta1":
                parts.append(f"betas=({v:g},{self.hp['beta2']:g})")
            elif k != "beta2":
                parts.append(f"{k}={v:g}")
        parts += [k for k, v in self.flags.items() if v]
        if self.schedule is not None:
            parts.append(_schedule_text(*self.schedule))
        return f"{self.check}(" + ",".join(parts) + ")"


def _schedule_text(name: str, args: dict) -> str:
    """`name(k=v,...)`; a chained schedule's parts written the same way inside it."""
    return name + "(" + ",".join(_schedule_text(k, v) if isinstance(v, dict) else f"{k}={v:g}"
                                 for k, v in args.items()) + ")"


def scenario_of(check: str, row: dict, schedule=None) -> Scenario:
    """The Scenario of a row of settings as torch names them (betas, flags among them)."""
    hp = {k: float(v) for k, v in row.items() if k not in FLAGS and k != "betas"}
    if "betas" in row:
        hp = {"lr": hp.pop("lr"), "beta1": float(row["betas"][0]),
              "beta2": float(row["betas"][1]), **hp}
    flags = {k: bool(v) for k, v in row.items() if k in FLAGS}
    return Scenario(check, hp, flags, schedule)


def scenarios(optimizer: str, steps: int) -> list[Scenario]:
    """The grid rows of `optimizer`, then one row per learning-rate schedule."""
    valid = _sgd_valid if optimizer == "sgd" else (lambda row: True)
    rows = [scenario_of("grid", row) for row in pairwise_grid(GRID_FACTORS[optimizer], valid)]
    for name, args in SCHEDULES.items():
        rows.append(scenario_of(f"schedule_{name}", SCHEDULE_BASE[optimizer],
                              (name, args(steps))))
    return rows


# --------------------------------------------------------------------------- the two sides

def initial_params(seed: int, dtype: str) -> tuple[dict, dict]:
    """(parameters rounded to `dtype`, float64 offsets c of the objective), by name w0..w3."""
    rng = np.random.default_rng(seed)
    np_dtype = np.float32 if dtype == "f32" else np.float64
    init, offsets = {}, {}
    for i, shape in enumerate(SHAPES):
        init[f"w{i}"] = (INIT_SCALE * rng.standard_normal(shape)).astype(np_dtype)
        offsets[f"w{i}"] = OFFSET_SCALE * rng.standard_normal(shape)
    return init, offsets


def objective_grad(params: dict, offsets: dict, sign: float) -> dict:
    """sign * (p - sin(2 p) + c) per tensor, in float64."""
    out = {}
    for k, p in params.items():
        p = np.asarray(p, np.float64)
        out[k] = sign * (p - np.sin(2.0 * p) + offsets[k])
    return out


# --------------------------------------------------------------------------- one row

@dataclasses.dataclass
class Trajectories:
    """What one row recorded: the comparison and, per step, the gradients handed to both
    sides, torch's learning rate and both snapshots (for the numpy optimizer's verdict)."""

    comparison: harness.Comparison
    init: dict
    grads: list
    lrs: list
    engine: list
    torch: list


def engine_schedule(scenario: Scenario):
    """The engine's schedule of `scenario` (engine.optim.schedules), or None."""
    return None if scenario.schedule is None else _engine_schedule(*scenario.schedule)


def _engine_schedule(name: str, args: dict):
    """Schedule `name` of engine.optim.schedules with `args`; `chained` takes its parts as
    {part name: part arguments}."""
    if name == "chained":
        return schedules.chained([_engine_schedule(*part) for part in args.items()])
    return getattr(schedules, name)(**args)


def compare_trajectories(optimizer: str, scenario: Scenario, dtype: str, backend: str,
                         steps: int, seed: int) -> Trajectories:
    """Step the engine and torch side by side for `steps` steps; compare after each."""
    init, offsets = initial_params(seed, dtype)
    schedule = engine_schedule(scenario)
    engine_side = harness.EngineStepper(optimizer, init, scenario.hp, scenario.flags, dtype,
                                        backend, schedule)
    torch_side = TorchStepper(optimizer, init, scenario.hp, scenario.flags, scenario.schedule)
    state_names = sorted({k.split(".", 1)[1] for k in engine_side.snapshot() if "." in k})
    sign = -1.0 if scenario.flags.get("maximize") else 1.0
    np_dtype = init["w0"].dtype
    out = Trajectories(harness.Comparison(), init, [], [], [], [])
    for step in range(1, steps + 1):
        grads = {k: g.astype(np_dtype)
                 for k, g in objective_grad(torch_side.numpy_params(), offsets, sign).items()}
        out.lrs.append(torch_side.lr)
        engine_side.step(grads)
        torch_side.step(grads)
        got, want = engine_side.snapshot(), torch_side.snapshot(state_names)
        if set(got) != set(want):
            raise RuntimeError(f"the engine's tensors {sorted(got)} differ from torch's "
                               f"{sorted(want)}")
        out.comparison.add(step, got, want, dtype, tol=harness.tolerance(dtype, steps))
        out.grads.append(grads)
        out.engine.append(got)
        out.torch.append(want)
    return out


def numpy_verdict(optimizer: str, scenario: Scenario, traj: Trajectories, dtype: str) -> str:
    """Which side the float64 numpy optimizer agrees with, on the same gradients and
    learning rates (the message calls it "the float64 reference")."""
    init_fn, update_fn = NUMPY_OPTIMIZERS[optimizer]
    params = {k: np.asarray(v, np.float64) for k, v in traj.init.items()}
    states = {k: init_fn(p, scenario.hp, scenario.flags) for k, p in params.items()}
    vs_engine, vs_torch = harness.Comparison(), harness.Comparison()
    for step, (grads, lr) in enumerate(zip(traj.grads, traj.lrs, strict=True), start=1):
        hp = {**scenario.hp, "lr": lr}
        by_numpy = {}
        for k in params:
            params[k], states[k] = update_fn(params[k], grads[k], states[k], hp, scenario.flags)
            by_numpy[k] = params[k]
            by_numpy.update({f"{k}.{s}": v for s, v in states[k].items()})
        vs_engine.add(step, traj.engine[step - 1], by_numpy, dtype)
        vs_torch.add(step, traj.torch[step - 1], by_numpy, dtype)
    if vs_engine.ok and vs_torch.ok:
        return "the float64 reference agrees with both within tolerance"
    if vs_engine.ok:
        return f"the float64 reference agrees with the engine; torch {vs_torch.describe()}"
    if vs_torch.ok:
        return "the float64 reference agrees with torch"
    return (f"the float64 reference agrees with neither: the engine {vs_engine.describe()}, "
            f"torch {vs_torch.describe()}")


def _row(optimizer, scenario, dtype, backend, steps, seed, grid_size) -> Result:
    metrics = {"steps": steps}
    if scenario.check == "grid":
        metrics["grid"] = grid_size
    label = dict(optimizer=optimizer, family=FAMILY, check=scenario.check, case=str(scenario),
                 dtype=dtype, backend=backend)
    try:
        traj = compare_trajectories(optimizer, scenario, dtype, backend, steps, seed)
    except Exception as exc:  # a row that cannot run is reported, never raised
        row = harness.result(**label, ok=False, message=f"{type(exc).__name__}: {exc}",
                             **metrics)
        return dataclasses.replace(row, status="error")
    message = ""
    if not traj.comparison.ok:
        message = traj.comparison.describe()
        try:
            verdict = numpy_verdict(optimizer, scenario, traj, dtype)
        except Exception as exc:  # the verdict is a courtesy; its failure must not hide the row
            verdict = f"the float64 reference could not run ({type(exc).__name__}: {exc})"
        message += "; " + verdict
    return harness.result(**label, comparison=traj.comparison, message=message, **metrics)


def run(optimizer: str, dtype: str = "f64", backend: str = "cpu", steps: int = 100,
        seed: int = 0) -> list[Result]:
    """The torch family for one optimizer ('sgd', 'adam', 'adamw') and dtype ('f32',
    'f64'): one Result per grid row and per schedule, each comparing `steps` steps of the
    engine on `backend` with torch.optim on the CPU. Without torch: one "skip" Result."""
    if optimizer not in GRID_FACTORS:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(GRID_FACTORS)}")
    if dtype not in harness.TOLERANCES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(harness.TOLERANCES)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    try:
        import torch  # noqa: F401
    except ImportError:
        row = harness.result(optimizer, FAMILY, "torch_available", "torch_available()", dtype,
                             backend, message=INSTALL_HINT)
        return [dataclasses.replace(row, status="skip")]
    rows = scenarios(optimizer, steps)
    grid_size = sum(s.check == "grid" for s in rows)
    return [_row(optimizer, s, dtype, backend, steps, seed, grid_size) for s in rows]


def run_config(optimizer: str, hp: dict, flags: dict, dtype: str = "f64",
               backend: str = "cpu", steps: int = 100, seed: int = 0) -> list[Result]:
    """One row: the trajectory of the user's own hyperparameters (`hp` with lr, beta1,
    beta2, eps, weight_decay or lr, momentum, dampening, weight_decay; `flags`) against
    torch.optim, as the grid rows are checked."""
    try:
        import torch  # noqa: F401
    except ImportError:
        row = harness.result(optimizer, FAMILY, "user", "user()", dtype, backend,
                             message=INSTALL_HINT)
        return [dataclasses.replace(row, status="skip")]
    scenario = Scenario("user", {k: float(v) for k, v in hp.items()},
                        {k: bool(v) for k, v in flags.items()}, None)
    return [_row(optimizer, scenario, dtype, backend, steps, seed, 1)]
