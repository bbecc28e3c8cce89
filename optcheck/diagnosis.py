"""What bug a diverging optimizer trajectory has: the library of known variants of SGD, Adam
and AdamW, each the correct chain of optcheck.update_pieces with a slot refilled, and
`diagnose`, which replays a row's gradients through every variant that applies and names the
one the trajectory matches.

    name                                       rules            applies when
    eps inside sqrt                            adam, adamw      eps != 0
    no bias correction                         adam, adamw      b1 or b2 != 0
    bias correction on m only                  adam, adamw      b2 != 0
    bias correction on v only                  adam, adamw      b1 != 0
    bias correction applied to eps             adam, adamw      eps, b2 != 0
    duplicated bias correction                 adam, adamw      b1 or b2 != 0
    betas swapped                              adam, adamw      b1 != b2
    betas rounded to float32                   adam, adamw      b1 or b2 not a float32
      (1 - b2 from a float32 b2: ggml's opt step)
    step counter starting at 0                 adam, adamw      always (NaN at step 1)
    step counter advancing per parameter       adam, adamw;     two tensors or more; b1 or
                                               sgd              b2 != 0 (sgd: mu, tau != 0)
    AMSGrad keeping the maximum of m           adam, adamw      amsgrad
    AMSGrad keeping the maximum of the         adam, adamw      amsgrad, b2 != 0
      corrected v (optax's behaviour)
    AMSGrad maximum not kept                   adam, adamw      amsgrad
    coupled (L2) decay instead of decoupled    adamw            lambda != 0
    decoupled decay instead of L2              adam, sgd        lambda != 0 (sgd: mu != 0)
    decay not multiplied by lr                 adamw            lambda != 0, gamma != 1
    decay applied to already-updated params    adamw            lambda, gamma != 0
    decay applied twice                        all              lambda != 0
    both coupled and decoupled decay           all              lambda != 0
    maximize ignored                           all              maximize
    Nesterov missing                           sgd              nesterov
    dampening ignored                          sgd              mu, tau != 0
    dampening applied on the first step        sgd              mu, tau != 0
    momentum buffer started at zero            sgd              mu, tau != 0
    state kept in bf16, state kept in f16      all              some state (sgd: mu != 0)
    f32 state for f64 parameters               all              f64 parameters, some state

"applies" means: not a no-op at these settings (SGD without momentum, for one, makes
decoupled decay and L2 decay the same update). `momentum buffer started at zero` and
`dampening applied on the first step` give identical updates at every setting (both make
b_1 = (1 - tau) g_1, the first from b_0 = 0 by the general formula, the second by a wrong
first-step case): a trajectory that matches one matches the other, and the diagnosis names
both. Other variants can coincide at some settings (`no bias correction` and `bias
correction on v only` when b2 = 0); the diagnosis reports whichever predict the same
trajectory within the threshold as indistinguishable there.

The match error of a variant is the largest scaled error over every step, parameter and
exposed float state tensor (exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer; the step
counter, whose storage conventions differ, is not compared):
|observed - replayed| / max(1, max |replayed| of that tensor at that step), the
reference family's own scale; a non-finite value matches a non-finite one (a variant that
makes NaN or inf matches a trajectory that has them) and nothing else. The match threshold
is atol + rtol of the dtype's trajectory tolerance (optcheck.harness.tolerance: 1e-10 for
float64 and 2.2e-5 for float32 over 100 steps): the largest scaled error an element within
that tolerance can have. The replay is float64 from the same gradients, so the right
variant differs from the observed trajectory only by the implementation's own rounding,
exactly what that tolerance allows the correct rule in the reference family. A variant is
named only when it matches and is clearly better (each other error above the threshold and
SEPARATION times its own) than the correct rule and than the next best variant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from optcheck import harness
from optcheck.numpy_optimizers import FLAG_NAMES, HPARAM_NAMES
from optcheck.update_pieces import (
    FLOAT_STATE,
    Chain,
    Layout,
    Piece,
    amsgrad_max,
    bias_corrections,
    count_shared,
    count_steps,
    decoupled_decay,
    denominator,
    l2_decay,
    momentum,
    nesterov,
    round_betas,
    store_state_in,
    swap_betas,
)

SEPARATION = 10.0       # how much better than any other the named variant must be
CORRECT = "the correct rule"
ADAM_RULES = ("adam", "adamw")
ALL_RULES = ("sgd", "adam", "adamw")

# self-test settings (flat, as the families take them): decay, momentum and dampening on,
# eps large enough that where it sits matters
SGD_DEMO = {"lr": 0.05, "momentum": 0.9, "dampening": 0.5, "weight_decay": 0.1,
            "nesterov": False, "maximize": False}
ADAM_DEMO = {"lr": 0.05, "beta1": 0.9, "beta2": 0.999, "eps": 1e-3, "weight_decay": 0.1,
             "amsgrad": False, "maximize": False}
AMSGRAD_DEMO = {**ADAM_DEMO, "beta1": 0.8, "beta2": 0.5, "amsgrad": True}   # v forgets


@dataclasses.dataclass(frozen=True)
class Setting:
    """What decides whether a variant applies: flat hp, flags, dtype, number of tensors."""

    hp: Mapping[str, float]
    flags: Mapping[str, bool]
    dtype: str = "f64"
    tensors: int = 4

    def __getattr__(self, name):            # s.lr, s.beta1, s.amsgrad, ... (0 if absent)
        if name.startswith("_") or name in ("hp", "flags"):
            raise AttributeError(name)
        return self.hp.get(name, self.flags.get(name, 0))


@dataclasses.dataclass(frozen=True)
class Variant:
    """A known wrong version of some rules: per rule, the slots of the correct chain it
    refills; `applies(setting)`: not a no-op there; `demo`: the rule and flat settings the
    self-test runs it at; `same_as`: a variant with identical updates at every setting."""

    name: str
    swaps: Mapping[str, Mapping[str, tuple[Piece, ...]]]
    applies: Callable[[Setting], bool]
    demo: tuple[str, Mapping]
    same_as: str | None = None

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(self.swaps)

    def chain(self, rule: str) -> Chain:
        return Chain.of(rule, **self.swaps[rule])

    def __str__(self) -> str:
        return self.name


def _variant(name, rules, swaps, applies=lambda s: True, demo=None, same_as=None):
    """A Variant whose `swaps` are the same slots for each of `rules` (or a function of the
    rule); `demo`: (rule, settings), default the first rule at its demo settings."""
    per_rule = {r: swaps(r) if callable(swaps) else swaps for r in rules}
    if demo is None:
        demo = (rules[0], SGD_DEMO if rules[0] == "sgd" else ADAM_DEMO)
    return Variant(name, per_rule, applies, demo, same_as)


def _decay(rule):
    """The correct rule's decay piece."""
    return decoupled_decay() if rule == "adamw" else l2_decay()


def _has_state(s: Setting) -> bool:
    return "momentum" not in s.hp or s.momentum != 0


def _any_beta(s: Setting) -> bool:
    return s.beta1 != 0 or s.beta2 != 0


def _damped(s: Setting) -> bool:
    return s.momentum != 0 and s.dampening != 0


VARIANTS: dict[str, Variant] = {v.name: v for v in [
    _variant("eps inside sqrt", ADAM_RULES, {"denominator": (denominator("inside"),)},
             lambda s: s.eps != 0),
    _variant("no bias correction", ADAM_RULES,
             {"corrections": (bias_corrections(m=False, v=False),)}, _any_beta),
    _variant("bias correction on m only", ADAM_RULES,
             {"corrections": (bias_corrections(v=False),)}, lambda s: s.beta2 != 0,
             ("adamw", ADAM_DEMO)),
    _variant("bias correction on v only", ADAM_RULES,
             {"corrections": (bias_corrections(m=False),)}, lambda s: s.beta1 != 0),
    _variant("bias correction applied to eps", ADAM_RULES,
             {"denominator": (denominator("corrected"),)},
             lambda s: s.eps != 0 and s.beta2 != 0, ("adamw", ADAM_DEMO)),
    _variant("duplicated bias correction", ADAM_RULES,
             {"corrections": (bias_corrections(times=2),)}, _any_beta),
    _variant("betas swapped", ADAM_RULES, {"betas": (swap_betas(),)},
             lambda s: s.beta1 != s.beta2, ("adamw", ADAM_DEMO)),
    _variant("betas rounded to float32", ADAM_RULES, {"betas": (round_betas(),)},
             lambda s: any(float(np.float32(b)) != b for b in (s.beta1, s.beta2))),
    _variant("step counter starting at 0", ADAM_RULES, {"count": (count_steps(start=0),)}),
    _variant("step counter advancing per parameter", ALL_RULES, {"count": (count_shared(),)},
             lambda s: s.tensors > 1 and (_damped(s) if "momentum" in s.hp else _any_beta(s)),
             ("adam", ADAM_DEMO)),
    _variant("AMSGrad keeping the maximum of m", ADAM_RULES,
             {"amsgrad": (amsgrad_max("m"),)}, lambda s: s.amsgrad,
             ("adam", AMSGRAD_DEMO)),
    _variant("AMSGrad keeping the maximum of the corrected v", ADAM_RULES,
             {"amsgrad": (amsgrad_max("corrected v"),)}, lambda s: s.amsgrad and s.beta2 != 0,
             ("adamw", AMSGRAD_DEMO)),
    _variant("AMSGrad maximum not kept", ADAM_RULES, {"amsgrad": (amsgrad_max("current v"),)},
             lambda s: s.amsgrad, ("adam", AMSGRAD_DEMO)),
    _variant("coupled (L2) decay instead of decoupled", ("adamw",), {"decay": (l2_decay(),)},
             lambda s: s.weight_decay != 0),
    _variant("decoupled decay instead of L2", ("adam", "sgd"),
             {"decay": (decoupled_decay(),)},
             lambda s: s.weight_decay != 0 and ("momentum" not in s.hp or s.momentum != 0)),
    _variant("decay not multiplied by lr", ("adamw",),
             {"decay": (decoupled_decay(lr_scaled=False),)},
             lambda s: s.weight_decay != 0 and s.lr != 1),
    _variant("decay applied to already-updated parameters", ("adamw",),
             {"decay": (), "after": (decoupled_decay(),)},
             lambda s: s.weight_decay != 0 and s.lr != 0),
    _variant("decay applied twice", ALL_RULES,
             lambda rule: {"decay": (_decay(rule), _decay(rule))},
             lambda s: s.weight_decay != 0, ("adamw", ADAM_DEMO)),
    _variant("both coupled and decoupled decay", ALL_RULES,
             {"decay": (l2_decay(), decoupled_decay())}, lambda s: s.weight_decay != 0),
    _variant("maximize ignored", ALL_RULES, {"sign": ()}, lambda s: s.maximize,
             ("adamw", {**ADAM_DEMO, "maximize": True})),
    _variant("Nesterov missing", ("sgd",), {"nesterov": (nesterov(look_ahead=False),)},
             lambda s: s.nesterov and s.momentum != 0,
             ("sgd", {**SGD_DEMO, "dampening": 0.0, "nesterov": True})),
    _variant("dampening ignored", ("sgd",), {"momentum": (momentum(dampening=False),)},
             _damped),
    _variant("dampening applied on the first step", ("sgd",),
             {"momentum": (momentum(first="dampened"),)}, _damped,
             same_as="momentum buffer started at zero"),
    _variant("momentum buffer started at zero", ("sgd",),
             {"momentum": (momentum(first="zero buffer"),)}, _damped,
             same_as="dampening applied on the first step"),
    _variant("state kept in bf16", ALL_RULES, {"store": (store_state_in("bf16"),)},
             _has_state),
    _variant("state kept in f16", ALL_RULES, {"store": (store_state_in("f16"),)}, _has_state,
             ("sgd", SGD_DEMO)),
    _variant("f32 state for f64 parameters", ALL_RULES, {"store": (store_state_in("f32"),)},
             lambda s: s.dtype == "f64" and _has_state(s), ("adamw", ADAM_DEMO)),
]}


def applicable(rule: str, setting: Setting) -> list[Variant]:
    """The variants of `rule` that are no no-op at `setting`, in library order."""
    return [v for v in VARIANTS.values() if rule in v.swaps and v.applies(setting)]


# --------------------------------------------------------------------------- matching

class _Trajectory:
    """Per quantity ("param" and each float state entry): a (steps, elements) matrix in the
    layout, and the elements it holds (a tensor exposed at every step in its shape)."""

    def __init__(self, values: dict[str, np.ndarray], held: dict[str, np.ndarray]):
        self.values, self.held = values, held

    @classmethod
    def observed(cls, layout: Layout, snapshots: list[Mapping]) -> _Trajectory:
        values, held = {}, {}
        steps = len(snapshots)
        for q in ("param", *FLOAT_STATE):
            matrix, mask = np.zeros((steps, layout.size)), np.zeros(layout.size, bool)
            for k, a, b in zip(layout.names, layout.offsets[:-1], layout.offsets[1:],
                               strict=True):
                key = k if q == "param" else f"{k}.{q}"
                arrays = [np.asarray(s[key], np.float64) if key in s else None
                          for s in snapshots]
                if any(x is None or x.size != b - a for x in arrays):
                    continue
                matrix[:, a:b] = np.reshape(arrays, (steps, b - a))
                mask[a:b] = True
            if mask.any():
                values[q], held[q] = matrix, mask
        return cls(values, held)

    def error(self, other: _Trajectory, layout: Layout) -> float:
        """The largest scaled error of `other` (the replay) against this (module doc), over
        the quantities and elements both hold."""
        worst = 0.0
        for q, mask in self.held.items():
            if q not in other.values:
                continue
            mask = mask & other.held[q]
            if not mask.any():
                continue
            got, want = self.values[q][:, mask], other.values[q]
            size = np.where(np.isfinite(want), np.abs(want), 0.0)
            top = np.maximum.reduceat(size, list(layout.offsets[:-1]), axis=1)
            scale = np.maximum(top, 1.0)[:, layout.segment][:, mask]
            want = want[:, mask]
            finite_got, finite_want = np.isfinite(got), np.isfinite(want)
            diff = np.where(finite_got & finite_want, np.abs(got - want),
                            np.where(finite_got | finite_want, np.inf, 0.0))
            worst = max(worst, float(np.max(diff / scale)))
        return worst


def _replay(chain: Chain, layout: Layout, init, grads, hp, flags,
            seen: _Trajectory) -> _Trajectory:
    """`chain`'s float64 trajectory from `init` on `grads`, of what `seen` holds."""
    steps = len(grads)
    theta, state = layout.flat(init), chain.init(layout, hp, flags)
    quantities = [q for q in seen.values if q == "param" or q in state]
    values = {q: np.empty((steps, layout.size)) for q in quantities}
    with np.errstate(all="ignore"):
        for s, grad in enumerate(grads):
            theta, state = chain.step(theta, layout.flat(grad), state, hp, flags, layout)
            for q in quantities:
                values[q][s] = theta if q == "param" else state[q]
    return _Trajectory(values, {q: seen.held[q] for q in quantities})


# --------------------------------------------------------------------------- diagnosis

def _e(x: float) -> str:
    """An error in one significant digit: 3e-9, 4e-1, 5, 0, inf."""
    if x == 0 or not np.isfinite(x):
        return "0" if x == 0 else "inf"
    mantissa, exponent = f"{x:.0e}".split("e")
    return mantissa if int(exponent) == 0 else f"{mantissa}e{int(exponent)}"


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """Which known variant a trajectory matches. `best`: the closest variant (None: none
    applies), `ties`: those predicting the same trajectory as it within the threshold
    here; `next_best`: the closest variant that does not; `match`: `best` matches within
    `threshold` and is clearly better than the correct rule and `next_best` (module doc)."""

    best: str | None
    best_err: float
    next_best: str | None
    next_err: float
    correct_err: float
    threshold: float
    steps: int
    match: bool
    ties: tuple[str, ...] = ()
    candidates: int = 0

    @property
    def named(self) -> tuple[str, ...]:
        """The variants named (the best and its ties) when it is a match, else ()."""
        return (self.best, *self.ties) if self.match else ()

    @property
    def message(self) -> str:
        if self.best is None:
            return "matches no known variant (none applies at these settings)"
        nxt = f"next best: `{self.next_best}`, {_e(self.next_err)}" if self.next_best else \
            f"no other variant applies; {CORRECT}: {_e(self.correct_err)}"
        if self.match:
            same = "".join(f", as does `{t}` (the same updates here)" for t in self.ties)
            return (f"matches `{self.best}` to {_e(self.best_err)} over {self.steps} steps"
                    f"{same} ({nxt})")
        if not np.isfinite(self.best_err) and not np.isfinite(self.correct_err):
            return ("matches no known variant: the trajectory holds NaN or inf where every "
                    "variant's and the correct rule's are finite")
        closest = f"closest: `{self.best}`, {_e(self.best_err)}"
        if self.correct_err <= self.threshold:
            if self.best_err * SEPARATION <= self.correct_err:
                return (f"most like `{self.best}` ({_e(self.best_err)}, against "
                        f"{CORRECT}'s {_e(self.correct_err)}; both within the dtype's "
                        f"rounding here, so not named)")
            return (f"matches no known variant: {CORRECT} replays the parameters and float "
                    f"state to {_e(self.correct_err)}, within the dtype's rounding "
                    f"({closest}); what diverged is small, or not compared here (the step "
                    f"counter)")
        if self.best_err <= self.threshold:
            rival = (CORRECT, self.correct_err)
            if self.next_best and self.next_err < self.correct_err:
                rival = (f"`{self.next_best}`", self.next_err)
            closest += f", not clearly better than {rival[0]}, {_e(rival[1])}"
        return f"matches no known variant ({closest}; {CORRECT}: {_e(self.correct_err)})"


def diagnose(optimizer: str, hp: Mapping[str, float], flags: Mapping[str, bool], dtype: str,
             init: Mapping[str, np.ndarray], grads: list[Mapping[str, np.ndarray]],
             observed: list[Mapping[str, np.ndarray]],
             tolerance: tuple[float, float] | None = None) -> Diagnosis:
    """Which variant of `optimizer` ("sgd", "adam", "adamw") at flat `hp` and `flags` the
    trajectory `observed` (per step: name -> float64 array, the adapter's snapshots:
    parameters and the state it exposes) is, given the gradients it was handed (`grads`,
    per step name -> array) from `init` (name -> array). `tolerance`: (atol, rtol), default
    the dtype's for this many steps (optcheck.harness.tolerance). Module doc."""
    if len(grads) != len(observed):
        raise ValueError(f"{len(grads)} steps of gradients but {len(observed)} snapshots")
    steps = len(observed)
    if not steps:
        raise ValueError("no step to diagnose")
    if tolerance is None and dtype not in harness.TOLERANCES:
        raise ValueError(f"no trajectory tolerance for {dtype} parameters; give one")
    atol, rtol = tolerance or harness.tolerance(dtype, steps)
    threshold = atol + rtol
    init = {k: np.asarray(v, np.float64) for k, v in init.items() if np.size(v)}
    layout = Layout.of(init)
    seen = _Trajectory.observed(layout, observed)
    setting = Setting(hp, flags, dtype, len(layout.names))
    chains = {CORRECT: Chain.of(optimizer)}
    chains.update({v.name: v.chain(optimizer) for v in applicable(optimizer, setting)})
    replays = {name: _replay(chain, layout, init, grads, hp, flags, seen)
               for name, chain in chains.items()}
    errors = {name: seen.error(replay, layout) for name, replay in replays.items()}
    correct_err = errors.pop(CORRECT)
    if not errors:
        return Diagnosis(None, np.inf, None, np.inf, correct_err, threshold, steps, False)
    ranked = sorted(errors, key=errors.__getitem__)
    best = ranked[0]
    ties = tuple(n for n in ranked[1:]
                 if replays[best].error(replays[n], layout) <= threshold)
    others = [n for n in ranked[1:] if n not in ties]
    next_best = others[0] if others else None
    next_err = errors[next_best] if next_best else np.inf
    best_err = errors[best]

    def clearly_worse(err):
        return err > threshold and err > SEPARATION * best_err
    match = best_err <= threshold and clearly_worse(correct_err) and clearly_worse(next_err)
    return Diagnosis(best, best_err, next_best, next_err, correct_err, threshold, steps, match,
                     ties, len(errors))


# --------------------------------------------------------------------------- as an update

def _flat_settings(rule: str, hparams: Mapping) -> tuple[dict, dict]:
    """Flat hp and flags from torch-named `hparams` (betas as a pair) of `rule`."""
    named = dict(hparams)
    if "betas" in named:
        named["beta1"], named["beta2"] = named.pop("betas")
    hp = {k: float(named[k]) for k in HPARAM_NAMES[rule]}
    return hp, {k: bool(named.get(k, False)) for k in FLAG_NAMES[rule]}


def numpy_update(chain: Chain, rule: str):
    """(init, update) of optcheck.adapters.numpy_adapter that step with `chain` (the correct
    rule's, or a variant's: a buggy optimizer for the self-test), computed in float64 with
    the parameters and state rounded to the parameters' dtype after each step (as an
    implementation in that dtype keeps them). The state exposes exp_avg, exp_avg_sq,
    max_exp_avg_sq and momentum_buffer per parameter."""
    def init(params):
        return {"_chain": None}

    def update(params, grads, state, step, hparams):
        hp, flags = _flat_settings(rule, hparams)
        layout = Layout.of(params)
        dtype = next(iter(params.values())).dtype
        flat = state["_chain"]
        if flat is None:
            flat = chain.init(layout, hp, flags)
        with np.errstate(all="ignore"):
            theta, flat = chain.step(layout.flat(params), layout.flat(grads), flat, hp, flags,
                                     layout)
            flat = {n: v.astype(dtype).astype(np.float64) for n, v in flat.items()}
        out = {"_chain": flat}
        tensors = {n: layout.split(v) for n, v in flat.items() if n in FLOAT_STATE}
        for k in layout.names:
            out[k] = {n: by_name[k] for n, by_name in tensors.items()}
        with np.errstate(all="ignore"):
            new = {k: v.astype(dtype) for k, v in layout.split(theta).items()}
        return new, out

    return init, update
