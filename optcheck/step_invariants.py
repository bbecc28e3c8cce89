"""Step invariants of the invariant family: an engine optimizer stepped on given gradients
(harness.EngineStepper) twice, in two ways that must agree, and the runs compared.

checkpoint_resume   n steps, save_checkpoint, m steps (A) == load into a fresh optimizer (other
                    lr, zero params), m steps (B), every tensor bit for bit. A file loads only
                    into the same optimizer with the same flags: a flipped flag or another
                    optimizer raises GGUFFormatError and changes nothing.
checkpoint_resume_schedule   The same under a cosine schedule: the resumed lr must be
                    base * factor(t), so the base lr must survive the file.
gradient_scale      Adam, AdamW: invariant to g -> c g (c = 1e-3, 7, 1e3) up to eps. With
                    eps = 0 the update is unchanged (m -> c m, v -> c^2 v); with eps > 0,
                    c m / (c sqrt(v) + eps) = m / (sqrt(v) + eps / c): g -> c g is eps -> eps/c.
                    Adam runs without weight decay (L2 breaks the invariance; AdamW's decoupled
                    decay does not). SGD, the analogue: the update is linear in g, so c g with
                    lr equals g with c lr (momentum, dampening, Nesterov; no weight decay).
weight_decay_l2     SGD, Adam: weight decay wd equals no decay on the loss + wd/2 |p|^2, i.e.
                    the gradient g + wd p (SGD plain, with momentum + dampening, Nesterov; Adam
                    with and without AMSGrad). AdamW: decoupled decay equals p <- (1 - lr wd) p
                    before an undecayed step, and it is NOT the L2 form: those runs must differ.
schedule_no_replan  With warmup_cosine and opt.set(lr, weight_decay) halfway, the step graph
                    keeps one Plan object, the hyperparameter tensor holds lr = base *
                    factor(t), and the trajectory matches the float64 numpy optimizer
                    (optcheck.numpy_optimizers) stepped with that lr (so the kernel reads the
                    lr it is given).

Each invariant is a pair describe_*(cfg) (the row's parameters) and check_*(cfg) -> Outcome.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from engine.gguf_io import GGUFFormatError
from engine.optim.checkpoint import load_checkpoint, save_checkpoint
from engine.optim.schedules import cosine, warmup_cosine
from optcheck.harness import EXACT, Comparison, EngineStepper
from optcheck.invariant_setup import (
    NESTEROV,
    SETTINGS,
    InvariantConfig,
    Outcome,
    compare_traces,
    hp_text,
    prefixed,
)
from optcheck.numpy_optimizers import NUMPY_OPTIMIZERS

SCALES = (1e-3, 7.0, 1e3)
WEIGHT_DECAY = 0.1


def _field_gradient(t: int, params: dict) -> dict:
    """The gradient of the non-convex f(p) = sum -cos(2p + t/7)/2 + p^2/8 + p/10 at params."""
    def gradient(p):
        p = p.astype(np.float64)
        return np.sin(2.0 * p + t / 7.0) + 0.25 * p + 0.1
    return {k: gradient(p) for k, p in params.items()}


def _given(grads: list[dict]):
    """The gradient function of a fixed sequence."""
    return lambda t, params: grads[t]


def _trace(stepper: EngineStepper, gradient, t0: int, t1: int) -> list[dict]:
    """Steps t0..t1-1 with gradient(t, current params); the snapshot after each."""
    trace = []
    for t in range(t0, t1):
        stepper.step(gradient(t, {k: p.numpy() for k, p in stepper.params.items()}))
        trace.append(stepper.snapshot())
    return trace


# --- checkpoint_resume, checkpoint_resume_schedule ------------------------------------------

def describe_checkpoint(cfg: InvariantConfig) -> str:
    return (f"n={cfg.steps // 2},m={cfg.steps - cfg.steps // 2},{hp_text(cfg.hp, cfg.flags)},"
            "refuse=flag|optimizer")


def describe_checkpoint_schedule(cfg: InvariantConfig) -> str:
    return (f"n={cfg.steps // 2},m={cfg.steps - cfg.steps // 2},cosine({cfg.steps}),"
            f"{hp_text(cfg.hp, cfg.flags)}")


def check_checkpoint_schedule(cfg: InvariantConfig) -> Outcome:
    return check_checkpoint(cfg, cosine(cfg.steps))


def check_checkpoint(cfg: InvariantConfig, schedule=None) -> Outcome:
    n = cfg.steps // 2
    comparison = Comparison()
    with tempfile.TemporaryDirectory(prefix="optcheck-") as tmp:
        path = os.path.join(tmp, "state.gguf")
        a = cfg.stepper(schedule=schedule)
        _trace(a, _field_gradient, 0, n)
        save_checkpoint(path, list(a.params.values()), a.opt, arch="optcheck")
        trace_a = _trace(a, _field_gradient, n, cfg.steps)
        fresh = {k: np.zeros_like(v) for k, v in cfg.init().items()}
        b = cfg.stepper(hp={**cfg.hp, "lr": 3 * cfg.hp["lr"]}, init=fresh, schedule=schedule)
        load_checkpoint(path, list(b.params.values()), b.opt, arch="optcheck")
        compare_traces(comparison, "resumed", _trace(b, _field_gradient, n, cfg.steps), trace_a,
                       cfg.dtype, EXACT, first_step=n + 1)
        problems = [] if schedule is not None else _refusals(cfg, path)
    return Outcome(comparison, problems)


def _refusals(cfg: InvariantConfig, path: str) -> list[str]:
    """Loading `path` into the optimizer with a flag flipped, or into another optimizer, must
    raise GGUFFormatError and leave every tensor as it was."""
    flag = "maximize" if cfg.optimizer == "sgd" else "amsgrad"
    other = {"sgd": "adam", "adam": "adamw", "adamw": "adam"}[cfg.optimizer]
    targets = [(f"{cfg.optimizer} with {flag}={not cfg.flags[flag]}", cfg.optimizer,
                {**cfg.flags, flag: not cfg.flags[flag]}), (other, other, None)]
    problems = []
    for label, name, flags in targets:
        target = cfg.stepper(name, flags=flags)
        before = target.snapshot()
        try:
            load_checkpoint(path, list(target.params.values()), target.opt, arch="optcheck")
        except GGUFFormatError:
            after = target.snapshot()
            changed = [k for k in before if not np.array_equal(before[k], after[k])]
            if changed:
                problems.append(f"loading into {label} was refused but changed {changed}")
        except Exception as exc:  # noqa: BLE001 - the wrong error is a finding, not a crash
            problems.append(f"loading into {label} raised {type(exc).__name__} ({exc}), "
                            "not GGUFFormatError")
        else:
            problems.append(f"loading into {label} was accepted")
    return problems


# --- gradient_scale -------------------------------------------------------------------------

def _unscaled(snap: dict, c: float) -> dict:
    """State of a run on c g brought back to the run on g: momentum and m over c, v over c^2."""
    power = {"momentum_buffer": 1, "exp_avg": 1, "exp_avg_sq": 2, "max_exp_avg_sq": 2}
    return {k: v / c ** power.get(k.partition(".")[2], 0) for k, v in snap.items()}


def describe_scale(cfg: InvariantConfig) -> str:
    c = "|".join(f"{x:g}" for x in SCALES)
    if cfg.optimizer == "sgd":
        return f"sgd: c*g with lr == g with c*lr,c={c},{hp_text(*SETTINGS['sgd'])}; nesterov"
    hp = {**cfg.hp, "weight_decay": 0.0} if cfg.optimizer == "adam" else cfg.hp
    return f"holds up to eps: eps=0 unchanged; eps>0: c*g == eps/c,c={c},{hp_text(hp, cfg.flags)}"


def check_scale(cfg: InvariantConfig) -> Outcome:
    grads, f, comparison = cfg.gradient_sequence(), cfg.ftype, Comparison()
    for c in SCALES:
        scaled_grads = [{k: v * f(c) for k, v in g.items()} for g in grads]
        if cfg.optimizer == "sgd":   # (label, hp with c g, hp with g, flags)
            pairs = [(f"c={c:g},{kind}", hp, {**hp, "lr": c * hp["lr"]}, flags)
                     for kind, (hp, flags) in (("momentum", SETTINGS["sgd"]),
                                               ("nesterov", NESTEROV))]
        else:
            hp = {**cfg.hp, "weight_decay": 0.0} if cfg.optimizer == "adam" else cfg.hp
            pairs = [(f"c={c:g},eps=0", {**hp, "eps": 0.0}, {**hp, "eps": 0.0}, cfg.flags),
                     (f"c={c:g},eps={hp['eps']:g}", hp, {**hp, "eps": hp["eps"] / c},
                      cfg.flags)]
        for label, scaled_hp, plain_hp, flags in pairs:
            scaled = _trace(cfg.stepper(hp=scaled_hp, flags=flags), _given(scaled_grads), 0,
                            cfg.steps)
            plain = _trace(cfg.stepper(hp=plain_hp, flags=flags), _given(grads), 0, cfg.steps)
            compare_traces(comparison, label, [_unscaled(s, c) for s in scaled], plain,
                           cfg.dtype)
    return Outcome(comparison)


# --- weight_decay_l2 ------------------------------------------------------------------------

def _decay_cases(cfg):
    if cfg.optimizer == "sgd":
        plain = {**cfg.hp, "momentum": 0.0, "dampening": 0.0}
        return [("plain", plain, cfg.flags), ("momentum", cfg.hp, cfg.flags),
                ("nesterov", *NESTEROV)]
    return [("amsgrad", cfg.hp, cfg.flags), ("adam", cfg.hp, {**cfg.flags, "amsgrad": False})]


def describe_decay(cfg: InvariantConfig) -> str:
    names = "|".join(label for label, _, _ in _decay_cases(cfg))
    rule = "decoupled == (1-lr*wd)*p then undecayed step, != L2 form g+wd*p" \
        if cfg.optimizer == "adamw" else "== g+wd*p"
    hp = {k: v for k, v in cfg.hp.items() if k != "weight_decay"}
    return f"wd={WEIGHT_DECAY:g} {rule},{names},{hp_text(hp, cfg.flags)}"


def _decay_trace(cfg, name, hp, flags, form) -> list[dict]:
    """Field-gradient steps with weight decay in one of three forms: "optimizer" (its own
    weight_decay), "l2" (g + wd p given to an undecayed optimizer), "shrink" (p <- (1 - lr wd)
    p, then an undecayed step)."""
    wd, f = WEIGHT_DECAY, cfg.ftype
    stepper = cfg.stepper(name, {**hp, "weight_decay": wd if form == "optimizer" else 0.0},
                          flags)

    def gradient(t, params):
        grads = {k: g.astype(f) for k, g in _field_gradient(t, params).items()}
        if form == "l2":
            grads = {k: g + f(wd) * params[k] for k, g in grads.items()}
        elif form == "shrink":
            for k, p in stepper.params.items():
                p.set(params[k] * f(1.0 - hp["lr"] * wd))
        return grads

    return _trace(stepper, gradient, 0, cfg.steps)


def check_decay(cfg: InvariantConfig) -> Outcome:
    comparison, l2_form = Comparison(), Comparison()
    for label, hp, flags in _decay_cases(cfg):
        got = _decay_trace(cfg, cfg.optimizer, hp, flags, "optimizer")
        if cfg.optimizer != "adamw":
            want = _decay_trace(cfg, cfg.optimizer, hp, flags, "l2")
            compare_traces(comparison, label, got, want, cfg.dtype)
            continue
        want = _decay_trace(cfg, "adamw", hp, flags, "shrink")
        compare_traces(comparison, label, got, want, cfg.dtype)
        compare_traces(l2_form, label, got, _decay_trace(cfg, "adam", hp, flags, "l2"),
                       cfg.dtype)
    if cfg.optimizer != "adamw":
        return Outcome(comparison)
    problems = [] if not l2_form.ok else [
        f"adamw's decay agreed with the L2 form g + wd p (max |diff| {l2_form.max_abs_err:.3g}):"
        " it is not decoupled"]
    return Outcome(comparison, problems, {"l2_form_diff": l2_form.max_abs_err})


# --- schedule_no_replan ---------------------------------------------------------------------

def _schedule(cfg):
    return warmup_cosine(max(1, cfg.steps // 10), cfg.steps, start_factor=0.25)


def describe_schedule(cfg: InvariantConfig) -> str:
    s = _schedule(cfg)
    return (f"warmup_cosine({s.warmup_steps},{s.t_max}),set(lr/2,wd+0.01) at step "
            f"{cfg.steps // 2},{hp_text(cfg.hp, cfg.flags)}"
            + ("; nesterov" if cfg.optimizer == "sgd" else ""))


def check_schedule(cfg: InvariantConfig) -> Outcome:
    schedule, grads = _schedule(cfg), cfg.gradient_sequence()
    init_fn, update_fn = NUMPY_OPTIMIZERS[cfg.optimizer]
    comparison, replans, lr_mismatches = Comparison(), 0, 0
    configs = [(cfg.hp, cfg.flags)] + ([NESTEROV] if cfg.optimizer == "sgd" else [])
    for i, (hp, flags) in enumerate(configs):
        stepper = cfg.stepper(hp=hp, flags=flags, schedule=schedule)
        numpy_hp, plan = dict(hp), None
        numpy_side = {k: (v.astype(np.float64), init_fn(v.astype(np.float64), hp, flags))
                      for k, v in cfg.init().items()}
        for t, g in enumerate(grads):
            if t == cfg.steps // 2:
                numpy_hp.update(lr=hp["lr"] / 2, weight_decay=hp["weight_decay"] + 0.01)
                stepper.opt.set(lr=numpy_hp["lr"], weight_decay=numpy_hp["weight_decay"])
            stepper.step(g)
            plan = plan or stepper.opt.graph.plan
            replans += stepper.opt.graph.plan is not plan
            lr = numpy_hp["lr"] * float(schedule(t))
            lr_mismatches += stepper.opt.hparams["lr"] != lr
            want = {}
            for k, (p, state) in numpy_side.items():
                p, state = update_fn(p, g[k].astype(np.float64), state, {**numpy_hp, "lr": lr},
                                     flags)
                numpy_side[k] = p, state
                want.update({k: p, **{f"{k}.{s}": v for s, v in state.items()}})
            comparison.add(t + 1, prefixed(f"config{i}", stepper.snapshot()),
                           prefixed(f"config{i}", want), cfg.dtype)
    problems = ([f"the step graph was replanned {replans} times"] if replans else []) + (
        [f"{lr_mismatches} steps ran with an lr other than base * factor(t)"]
        if lr_mismatches else [])
    return Outcome(comparison, problems, {"replans": replans, "lr_mismatches": lr_mismatches})
