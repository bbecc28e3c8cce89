"""optcheck family "known-bugs": cases made from optimizer bugs that shipped, each at the
settings where that bug shows, for any optimizer adapter. Every case compares the adapter
with the float64 numpy optimizers (optcheck.numpy_optimizers) on the same gradients.

    decay_rounding       lr 1e-4, weight decay 1e-5 (lr * wd = 1e-9, below float32's
                         resolution: `1 - lr*wd` rounds to 1 and a decay applied as its own
                         multiply does nothing; pytorch/pytorch#64475, OneTrainer#996).
                         500 steps of fixed gradients run twice, with the decay and
                         without; the decay's effect on the parameters, d = p(wd) - p(0),
                         is projected on the float64 one, D: the ratio <d, D> / <D, D> must
                         lie within DECAY_BAND of 1 (its noise, from float32 rounding over
                         8,192 elements, is about 0.02; a lost decay reads 0, a doubled one
                         2). float32 and float64.
    eps_underflow        eps = 1e-8, below float16's smallest subnormal: kept in the
                         parameter's dtype it rounds to 0, and an element whose gradient is
                         0 divides 0 by 0 (optax#1755). Half the elements get zero
                         gradients: they must stay exactly where they are (no decay), and
                         no parameter or state may be NaN. Every dtype.
    mixed_dtype_groups   six param groups, float32 and float64 in turn, each with its own
                         lr, betas and decay and two tensors: a bug per group, per dtype or
                         per (device, dtype) bucket (huggingface/pytorch-image-models#2750)
                         shows only there. Every tensor against its float64 reference
                         within its dtype's tolerance. Run under float32.
    first_step_vs_100    betas (0.5, 0.9): a wrong coefficient can leave the first step
                         unchanged (m_hat = g at step 1 whatever beta1 is; optax#1715), so
                         the row says both: the parameters after step 1 alone (what a
                         one-step test checks), and every tensor over 100 steps.
    step_counter         1,000 steps at betas (0.9, 0.999): bias corrections far from 1 at
                         step 1 and near it at step 1000 (a counter starting at 0 gives a
                         NaN at once, tracel-ai/burn#630; one advancing per parameter or a
                         duplicated correction drifts); compared at steps 1, 2, 3, every
                         tenth and 1000. Run under float32 (every adapter has it; a
                         counter's bugs do not depend on the parameters' dtype).
    tiny_gradients       random gradients of order 1e-30 (their squares underflow in
                         float32), 50 steps, eps 1e-32 so that sqrt(v), not eps, sets the
                         step: v kept in float32 for a float64 parameter, or eps inside
                         the square root, and the step is off by orders of magnitude.
    huge_gradients       random gradients of order 1e30 (their squares overflow in
                         float32), 50 steps. A parameter whose float64 reference (itself
                         and its state) stays in the dtype's range is compared within
                         tolerance; one whose reference leaves it (v of a 1e30 gradient in
                         float32, or of a 1e-30 one: no float32 implementation can hold it)
                         must stay free of NaN, with finite values. float32 and float64.

A case the adapter cannot run at its settings (a flag, a dtype, param groups) is an
`unsupported` row with the reason. 16-bit parameters run eps_underflow only: their other
trajectories are the precision family's to judge.
"""

from __future__ import annotations

import numpy as np

from engine.tensor import DTYPES as NP_DTYPES
from optcheck import harness
from optcheck.adapter_rows import (
    Outcome,
    Reference,
    cast,
    compared_names,
    first_supported,
    needs,
    row,
)
from optcheck.adapters.base import Group
from optcheck.torch_trajectories import initial_params, objective_grad

FAMILY = "known-bugs"
DTYPES = ("f16", "bf16", "f32", "f64")
DECAY_BAND = 0.2        # |ratio - 1| allowed of the decay's measured effect
DECAY_ELEMENTS, DECAY_STEPS = 8192, 500
EXTREME_STEPS = 50
# the steps step_counter compares at (a divergence feeds back, so it still shows later)
COUNTER_STEPS = frozenset({1, 2, 3, 1000} | set(range(10, 1000, 10)))
ADAM = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
ADAM_FLAGS = {"amsgrad": False, "maximize": False}
SGD = {"lr": 1e-2, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0}
SGD_FLAGS = {"nesterov": False, "maximize": False}


def skip_reason(dtype: str) -> str | None:
    """Why this family does not run in `dtype` (None: it does)."""
    return None if dtype in DTYPES else f"the known-bug cases run in {', '.join(DTYPES)}"


def _base(optimizer: str, **hp) -> tuple[dict, dict]:
    if optimizer == "sgd":
        return {**SGD, **hp}, dict(SGD_FLAGS)
    return {**ADAM, **hp}, dict(ADAM_FLAGS)


def _candidates(optimizer: str, **hp):
    """The case's settings, then the same without momentum (an adapter without it)."""
    first = _base(optimizer, **hp)
    if optimizer == "sgd" and first[0]["momentum"]:
        return [first, ({**first[0], "momentum": 0.0, "dampening": 0.0}, first[1])]
    return [first]


def _judge(comparison: harness.Comparison, **metrics) -> Outcome:
    return Outcome(comparison.ok, "" if comparison.ok else
                   f"{comparison.describe()} from the float64 reference", metrics, comparison)


def _trajectory(stepper, reference: Reference, grads_at, steps: int, dtypes: dict,
                steps_for_tol: int, every=None, params_only=False) -> harness.Comparison:
    """Step the adapter and the reference on the same gradients (grads_at(t, params) ->
    float64, rounded to each tensor's dtype); compare every step, or the steps in `every`."""
    comparison = harness.Comparison()
    current = {k: np.asarray(v, np.float64) for k, v in reference.params.items()}
    for t in range(1, steps + 1):
        grads = {k: np.asarray(g, np.float64).astype(NP_DTYPES[dtypes[k]])
                 for k, g in grads_at(t, current).items()}
        stepper.step(grads)
        want = reference.step(grads)
        got = stepper.snapshot()
        if every is None or t in every:
            common = compared_names(got, want, reference.params)
            for k in reference.params:
                names = [n for n in common
                         if n == k or (n.startswith(k + ".") and not params_only)]
                comparison.add(t, got, want, dtypes[k], names,
                               tol=harness.tolerance(dtypes[k], steps_for_tol))
        current = {k: got[k] for k in reference.params}
    return comparison


def _feedback(offsets):
    return lambda t, params: objective_grad(params, offsets, 1.0)


def check_decay_rounding(adapter, optimizer, dtype, seed):
    hp, flags = first_supported(adapter, optimizer, dtype,
                                _candidates(optimizer, lr=1e-4, weight_decay=1e-5))
    rng = np.random.default_rng(seed)
    init = {"w0": rng.standard_normal(DECAY_ELEMENTS)}
    grads = [0.1 * rng.standard_normal(DECAY_ELEMENTS) for _ in range(DECAY_STEPS)]
    cast_grads = [cast({"w0": g}, dtype) for g in grads]

    def final(decay: float, exact: bool) -> np.ndarray:
        settings = {**hp, "weight_decay": decay}
        if exact:
            ref = Reference(optimizer, cast(init, dtype), {"w0": (settings, flags)})
            for g in cast_grads:
                ref.step(g)
            return ref.params["w0"]
        stepper = adapter.stepper(optimizer, cast(init, dtype), settings, flags, dtype)
        for g in cast_grads:
            stepper.step(g)
        return np.asarray(stepper.snapshot()["w0"], np.float64)

    want = final(hp["weight_decay"], True) - final(0.0, True)
    got = final(hp["weight_decay"], False) - final(0.0, False)
    ratio = float(np.dot(got, want) / np.dot(want, want))
    ok = bool(np.isfinite(ratio) and abs(ratio - 1.0) <= DECAY_BAND)
    message = "" if ok else (f"the weight decay moved the parameters {ratio:.3g} times as far "
                             f"as in float64 (lr*wd = {hp['lr'] * hp['weight_decay']:.0e}"
                             f"{'; lost: 1 - lr*wd rounds to 1' if abs(ratio) < 0.1 else ''})")
    return Outcome(ok, message, {"decay_ratio": ratio, "steps": DECAY_STEPS})


def check_eps_underflow(adapter, optimizer, dtype, seed):
    hp, flags = first_supported(adapter, optimizer, dtype, _candidates(optimizer, eps=1e-8))
    init, offsets = initial_params(seed, dtype)
    init = cast(init, dtype)
    zero = {k: (np.arange(np.size(v)).reshape(np.shape(v)) % 2 == 0) for k, v in init.items()}
    stepper = adapter.stepper(optimizer, init, hp, flags, dtype)
    for _ in range(10):
        snap = stepper.snapshot()
        grads = objective_grad({k: snap[k] for k in init}, offsets, 1.0)
        stepper.step(cast({k: np.where(zero[k], 0.0, g) for k, g in grads.items()}, dtype))
    snap = stepper.snapshot()
    nan = sorted(n for n, v in snap.items() if np.isnan(np.asarray(v)).any())
    moved = sorted(k for k in init if not np.array_equal(
        np.asarray(snap[k])[zero[k]], np.asarray(init[k], np.float64)[zero[k]]))
    problems = ([f"NaN in {', '.join(nan)}"] if nan else []) + \
        ([f"parameters with zero gradients moved in {', '.join(moved)}"] if moved else [])
    return Outcome(not problems, "; ".join(problems) + (" (eps rounded to 0 gives 0/0?)"
                                                         if nan else ""),
                   {"steps": 10})


def check_mixed_dtype_groups(adapter, optimizer, dtype, seed):
    needs(adapter, "grouped_stepper", what="param groups")
    rng = np.random.default_rng(seed)
    groups, settings, dtypes, offsets = [], {}, {}, {}
    for i in range(6):
        group_dtype = ("f32", "f64")[i % 2]
        extra = dict(lr=0.01 * (i + 1), weight_decay=0.05 * i)
        if optimizer != "sgd":
            extra.update(beta1=0.5 + 0.07 * i, beta2=0.8 + 0.03 * i, eps=1e-3)
        else:
            extra.update(momentum=0.5 + 0.05 * i, dampening=0.1)
        hp, flags = first_supported(adapter, optimizer, group_dtype,
                                    _candidates(optimizer, **extra))
        init = {}
        for j in range(2):
            name = f"w{2 * i + j}"
            init[name] = rng.standard_normal((3, 4)).astype(NP_DTYPES[group_dtype])
            offsets[name] = 0.1 * rng.standard_normal((3, 4))
            settings[name], dtypes[name] = (hp, flags), group_dtype
        groups.append(Group(init, hp, flags, group_dtype))
    stepper = adapter.grouped_stepper(optimizer, groups)
    reference = Reference(optimizer, {k: v for g in groups for k, v in g.init.items()},
                          settings)
    return _judge(_trajectory(stepper, reference, _feedback(offsets), 100, dtypes, 100),
                  groups=len(groups), steps=100)


def _started(adapter, optimizer, dtype, seed, **hp_changes):
    """(offsets, the adapter's stepper, the float64 reference) from the torch family's
    tensors, at the case's settings (the first the adapter runs)."""
    hp, flags = first_supported(adapter, optimizer, dtype,
                                _candidates(optimizer, **hp_changes))
    init, offsets = initial_params(seed, dtype)
    init = cast(init, dtype)
    stepper = adapter.stepper(optimizer, init, hp, flags, dtype)
    return offsets, stepper, Reference(optimizer, init, dict.fromkeys(init, (hp, flags)))


def _single(adapter, optimizer, dtype, seed, steps, every=None, params_only=False,
            **hp_changes):
    offsets, stepper, reference = _started(adapter, optimizer, dtype, seed, **hp_changes)
    return _trajectory(stepper, reference, _feedback(offsets), steps,
                       dict.fromkeys(reference.params, dtype), steps, every, params_only)


def check_first_step_vs_100(adapter, optimizer, dtype, seed):
    changes = dict(beta1=0.5, beta2=0.9, eps=1e-3) if optimizer != "sgd" else \
        dict(momentum=0.5, dampening=0.3, weight_decay=0.01)
    first = _single(adapter, optimizer, dtype, seed, 1, params_only=True, **changes)
    whole = _single(adapter, optimizer, dtype, seed, 100, **changes)
    metrics = {"step1_ok": first.ok, "steps": 100}
    if first.ok and not whole.ok:
        return Outcome(False, f"the parameters after step 1 agree with the float64 "
                              f"reference, but "
                              f"{whole.describe()}: a one-step test would pass this",
                       metrics, whole)
    return _judge(whole, **metrics)


def check_step_counter(adapter, optimizer, dtype, seed):
    comparison = _single(adapter, optimizer, dtype, seed, 1000, COUNTER_STEPS, beta1=0.9,
                         beta2=0.999, eps=1e-6)
    return _judge(comparison, steps=1000)


def _extreme(adapter, optimizer, dtype, seed, scale, **hp_changes):
    if optimizer == "sgd":
        hp_changes.pop("eps", None)
    _, stepper, reference = _started(adapter, optimizer, dtype, seed, **hp_changes)
    init = dict(reference.params)       # the names and shapes (the values move)
    rng = np.random.default_rng(seed + 1)
    info = np.finfo(NP_DTYPES[dtype])
    big, small = float(info.max), float(info.smallest_subnormal)
    comparison, problems, out_of_range = harness.Comparison(), [], set()
    for t in range(1, EXTREME_STEPS + 1):
        grads = cast({k: scale * rng.standard_normal(np.shape(v)) for k, v in init.items()},
                     dtype)
        stepper.step(grads)
        want, got = reference.step(grads), stepper.snapshot()
        names = compared_names(got, want, init)
        # a parameter whose reference state leaves the dtype's range: judged by NaN only
        out_of_range |= {n.partition(".")[0] for n in names if _beyond(want[n], big, small)}
        judged = [n for n in names if n.partition(".")[0] not in out_of_range]
        if judged:
            comparison.add(t, got, want, dtype, judged, tol=harness.tolerance(dtype))
        nan = [n for n in got if np.isnan(np.asarray(got[n])).any()]
        infinite = [k for k in init if not np.isfinite(got[k]).all()]
        if (nan or infinite) and not problems:
            problems.append(f"step {t}: " + "; ".join(
                filter(None, [nan and f"NaN in {', '.join(nan[:3])}",
                              infinite and f"infinite {', '.join(infinite[:3])}"])))
    message = "; ".join(problems + ([f"{comparison.describe()} from the float64 reference"]
                                    if not comparison.ok else []))
    return Outcome(comparison.ok and not problems, message,
                   {"steps": EXTREME_STEPS, "beyond_range": ",".join(sorted(out_of_range))},
                   comparison)


def _quietly(fn, *args, **kwargs):
    """fn(...) without numpy's overflow and underflow warnings: these cases overflow and
    underflow on purpose, in the reference and in a numpy update alike."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return fn(*args, **kwargs)


def _beyond(values, big: float, small: float) -> bool:
    """Whether some value is too large for the dtype, or nonzero and below its smallest
    subnormal (so that no implementation in the dtype can hold it)."""
    size = np.abs(np.asarray(values, np.float64))
    return bool((size > big).any() or ((size > 0) & (size < small)).any())


CHECKS = {
    "decay_rounding": check_decay_rounding,
    "eps_underflow": check_eps_underflow,
    "mixed_dtype_groups": check_mixed_dtype_groups,
    "first_step_vs_100": check_first_step_vs_100,
    "step_counter": check_step_counter,
    "tiny_gradients": lambda a, o, d, s: _quietly(_extreme, a, o, d, s, 1e-30, eps=1e-32),
    "huge_gradients": lambda a, o, d, s: _quietly(_extreme, a, o, d, s, 1e30),
}
# the dtypes each case runs in, and the rules it applies to (the others give no row)
CASE_DTYPES = {"eps_underflow": DTYPES, "mixed_dtype_groups": ("f32",),
               "step_counter": ("f32",)}
CASE_RULES = {"eps_underflow": ("adam", "adamw"), "step_counter": ("adam", "adamw")}


def run(optimizer: str, dtype: str = "f32", backend: str = "cpu", steps: int = 100,
        seed: int = 0, adapter=None, checks=None) -> list:
    """One row per case of CHECKS that runs in `dtype` (CASE_DTYPES; the others in float32
    and float64), of `adapter` (default: our engine on `backend`)."""
    if adapter is None:
        from optcheck.adapters.engine_adapter import EngineOptimizer
        adapter = EngineOptimizer(backend)
    rows = [row(adapter, optimizer, FAMILY, check, check, dtype, backend,
                lambda fn=fn: fn(adapter, optimizer, dtype, seed))
            for check, fn in CHECKS.items()
            if (checks is None or check in checks)
            and dtype in CASE_DTYPES.get(check, ("f32", "f64"))
            and optimizer in CASE_RULES.get(check, (optimizer,))]
    if not rows and checks is None:
        return [harness.result(optimizer, FAMILY, "(family)", f"{FAMILY}(type={dtype})", dtype,
                               backend, status="skip",
                               message=f"no known-bug case of {optimizer} runs in {dtype}")]
    return rows
