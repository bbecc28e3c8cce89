"""optcheck family "invariant" for any optimizer adapter: properties every correct SGD, Adam
and AdamW has, checked by stepping the adapter more than once and comparing the runs, bit
for bit (no expected values needed, so no tolerance can hide anything):

    lr_zero          lr = 0 leaves every parameter exactly as it was, decay on or off
    gradient_scale   gradients times c = 4 (a power of two, so every product scales
                     exactly): Adam and AdamW with eps = 0 and no decay take the very same
                     steps, their moments scaled by c and c^2; SGD with lr / c takes the
                     same steps, its momentum buffer scaled by c
    determinism      two fresh runs on the same gradients agree bit for bit
    save_restore     saved halfway (Stepper.save) and restored into a fresh stepper
                     (Stepper.restore), the run ends where the uninterrupted one ends, state
                     and all
    param_groups     two param groups with different hyperparameters in one optimizer
                     (grouped_stepper) step exactly as each group alone

Each run starts from the torch family's tensors and steps on the gradient of its
objective at the run's own current parameters, rounded to the dtype, so a difference feeds
back and grows. Settings make bugs show (betas away from their defaults, decay on, odd
lr); where the adapter cannot run them, the first simpler setting it can run is used
(ggml's SGD has no momentum), and where it runs none, or lacks the optional part a check
needs, the row is `unsupported` with the reason. Our engine's own invariants (training
loop, checkpoint files, schedules) are optcheck.invariants'.
"""

from __future__ import annotations

import numpy as np

from optcheck.adapter_rows import Outcome, cast, first_supported, needs, row
from optcheck.adapters.base import Group
from optcheck.torch_trajectories import initial_params, objective_grad

FAMILY = "invariant"
STEPS = 30              # steps per run: enough for a difference to feed back and show
SCALE = 4.0             # the gradient scale: a power of two, exact in every float dtype
# per rule, the settings to try, richest first: (hp, flags)
SETTINGS = {
    "sgd": [({"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.02},
             {"nesterov": False, "maximize": False}),
            ({"lr": 0.05, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.02},
             {"nesterov": False, "maximize": False})],
    "adam": [({"lr": 0.03, "beta1": 0.8, "beta2": 0.95, "eps": 1e-3, "weight_decay": 0.02},
              {"amsgrad": False, "maximize": False}),
             ({"lr": 0.03, "beta1": 0.8, "beta2": 0.95, "eps": 1e-3, "weight_decay": 0.0},
              {"amsgrad": False, "maximize": False})],
    "adamw": [({"lr": 0.03, "beta1": 0.8, "beta2": 0.95, "eps": 1e-3, "weight_decay": 0.1},
               {"amsgrad": False, "maximize": False})],
}


def _run(stepper, init: dict, offsets: dict, dtype: str, steps: int, scale: float = 1.0,
         start: int = 0) -> dict:
    """`steps` steps on the objective's gradient at the stepper's own parameters (times
    `scale`), from step `start` on; the last snapshot."""
    snap = stepper.snapshot() if start else None
    for _ in range(steps):
        params = {k: snap[k] for k in init} if snap is not None else init
        grads = objective_grad(params, offsets, 1.0)
        stepper.step(cast({k: scale * g for k, g in grads.items()}, dtype))
        snap = stepper.snapshot()
    return snap


def _differences(got: dict, want: dict, names) -> list[str]:
    """The names whose arrays differ in a single bit (NaN equals NaN)."""
    return [n for n in names
            if not np.array_equal(np.asarray(got[n]), np.asarray(want[n]), equal_nan=True)]


def _verdict(diffs: list[str], what: str, names) -> Outcome:
    if diffs:
        return Outcome(False, f"{what}: {', '.join(diffs[:4])}"
                              f"{' ...' if len(diffs) > 4 else ''} differ",
                       {"compared": len(names), "differing": len(diffs)})
    return Outcome(True, "", {"compared": len(names), "differing": 0})


def check_lr_zero(adapter, optimizer, dtype, seed):
    hp, flags = first_supported(adapter, optimizer, dtype,
                                [({**hp, "lr": 0.0}, f) for hp, f in SETTINGS[optimizer]])
    init, offsets = initial_params(seed, dtype)
    init = cast(init, dtype)
    snap = _run(adapter.stepper(optimizer, init, hp, flags, dtype), init, offsets, dtype, STEPS)
    want = {k: np.asarray(v, np.float64) for k, v in init.items()}
    return _verdict(_differences(snap, want, list(init)), "with lr = 0 the parameters moved",
                    list(init))


def check_gradient_scale(adapter, optimizer, dtype, seed):
    candidates = [({**hp, "weight_decay": 0.0, **({"eps": 0.0} if "eps" in hp else {})}, f)
                  for hp, f in SETTINGS[optimizer]]
    hp, flags = first_supported(adapter, optimizer, dtype, candidates)
    scaled_hp = {**hp, "lr": hp["lr"] / SCALE} if optimizer == "sgd" else hp
    init, offsets = initial_params(seed, dtype)
    init = cast(init, dtype)
    base = _run(adapter.stepper(optimizer, init, hp, flags, dtype), init, offsets, dtype, STEPS)
    scaled = _run(adapter.stepper(optimizer, init, scaled_hp, flags, dtype), init, offsets,
                  dtype, STEPS, scale=SCALE)
    power = {"exp_avg": 1, "momentum_buffer": 1, "exp_avg_sq": 2, "max_exp_avg_sq": 2}
    want = {}
    for name, value in base.items():
        kind = name.partition(".")[2]
        want[name] = value * SCALE ** power.get(kind, 0)
    names = [n for n in want if n in scaled]
    return _verdict(_differences(scaled, want, names),
                    f"gradients times {SCALE:g} changed the steps", names)


def check_determinism(adapter, optimizer, dtype, seed):
    hp, flags = first_supported(adapter, optimizer, dtype, SETTINGS[optimizer])
    init, offsets = initial_params(seed, dtype)
    init = cast(init, dtype)
    runs = [_run(adapter.stepper(optimizer, init, hp, flags, dtype), init, offsets, dtype,
                 STEPS) for _ in range(2)]
    return _verdict(_differences(runs[1], runs[0], list(runs[0])),
                    "two runs on the same gradients differ", list(runs[0]))


def check_save_restore(adapter, optimizer, dtype, seed):
    hp, flags = first_supported(adapter, optimizer, dtype, SETTINGS[optimizer])
    init, offsets = initial_params(seed, dtype)
    init = cast(init, dtype)
    straight = _run(adapter.stepper(optimizer, init, hp, flags, dtype), init, offsets, dtype,
                    STEPS)
    first = adapter.stepper(optimizer, init, hp, flags, dtype)
    needs(first, "save", "restore", what="state save and restore")
    half = STEPS // 2
    _run(first, init, offsets, dtype, half)
    saved = first.save()
    fresh = adapter.stepper(optimizer, init, hp, flags, dtype)
    fresh.restore(saved)
    resumed = _run(fresh, init, offsets, dtype, STEPS - half, start=half)
    return _verdict(_differences(resumed, straight, list(straight)),
                    f"restored at step {half}, the run ends elsewhere", list(straight))


def check_param_groups(adapter, optimizer, dtype, seed):
    needs(adapter, "grouped_stepper", what="param groups")
    hp, flags = first_supported(adapter, optimizer, dtype, SETTINGS[optimizer])
    other = {**hp, "lr": hp["lr"] * 0.5,
             **({"weight_decay": hp["weight_decay"] * 3} if hp["weight_decay"] else {})}
    if "beta1" in hp:
        other.update(beta1=0.6, beta2=0.9)
    if adapter.unsupported(optimizer, dtype, other, flags):
        other = {**hp, "lr": hp["lr"] * 0.5}
    init, offsets = initial_params(seed, dtype)
    init = cast(init, dtype)
    names = list(init)
    split = [dict((k, init[k]) for k in names[:2]), dict((k, init[k]) for k in names[2:])]
    groups = [Group(split[0], hp, flags, dtype), Group(split[1], other, flags, dtype)]
    together = _run(adapter.grouped_stepper(optimizer, groups), init, offsets, dtype, STEPS)
    alone = {}
    for group in groups:
        sub_offsets = {k: offsets[k] for k in group.init}
        alone.update(_run(adapter.stepper(optimizer, group.init, group.hp, group.flags, dtype),
                          group.init, sub_offsets, dtype, STEPS))
    names = [n for n in alone if n in together]
    return _verdict(_differences(together, alone, names),
                    "in one optimizer, the groups step unlike each alone", names)


CHECKS = {"lr_zero": check_lr_zero, "gradient_scale": check_gradient_scale,
          "determinism": check_determinism, "save_restore": check_save_restore,
          "param_groups": check_param_groups}


def run(optimizer: str, dtype: str, adapter, backend: str = "cpu", seed: int = 0,
        checks=None) -> list:
    """One row per check of CHECKS (or those named in `checks`), of `adapter`."""
    return [row(adapter, optimizer, FAMILY, check, f"{check}(steps={STEPS})", dtype, backend,
                lambda fn=fn: fn(adapter, optimizer, dtype, seed))
            for check, fn in CHECKS.items() if checks is None or check in checks]

