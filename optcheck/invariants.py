"""optcheck family "invariant": properties every correct optimizer and training loop has,
checked by running the engine twice and comparing the runs (no expected values needed).

    run("adam", dtype="f32") -> list[Result]          one row per invariant

grad_accumulation   A logical batch of B = 8 as k = 2, 4 physical batches of B/k: after every
                    logical batch of an epoch the accumulator holds the logical gradient,
                    sum_j grad L_j = grad L (sum loss), sum_j grad (L_j / k) = grad L (mean,
                    cross-entropy), and weights and state agree (to float error: the summation
                    order differs). The sum loss trains with lr / (3 B), its mean's step size.
checkpoint_resume   n steps, save_checkpoint, m steps (A) == load into a fresh optimizer (other
                    lr, zero params), m steps (B), every tensor bit for bit. A file loads only
                    into the same optimizer with the same flags: a flipped flag or another
                    optimizer raises GGUFFormatError and changes nothing.
checkpoint_resume_schedule   The same under a cosine schedule: the resumed lr must be
                    base * factor(t), so the base lr must survive the file.
determinism         Two complete runs (fit: shuffle, accumulation, validation, 2 epochs) with
                    one seed give the same bits; another shuffle seed gives other weights.
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
epoch_vs_fit        Trainer.epoch after dataset.shuffle(trainer.rng) == fit(copy, epochs=1,
                    val_split=0) of a trainer with the same seed, bit for bit (ggml's
                    test_epoch_vs_fit): weights, state and every batch loss.
schedule_no_replan  With warmup_cosine and opt.set(lr, weight_decay) halfway, the step graph
                    keeps one Plan object, the hyperparameter tensor holds lr = base *
                    factor(t), and the trajectory matches the float64 reference optimizer
                    stepped with that lr (so the kernel reads the lr it is given).

Tolerances: the dtype's (`harness.TOLERANCES`) where the two runs round differently, zero
where they must not. Values are drawn from `seed`; the settings make eps matter (1e-3 against
gradients down to ~0.05), dampening nonzero, and gradients shrink so AMSGrad's max is not v.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np

import engine
from engine import ops
from engine.gguf_io import GGUFFormatError
from engine.optim.checkpoint import load_checkpoint, save_checkpoint
from engine.optim.schedules import cosine, warmup_cosine
from engine.train import Dataset, Trainer
from optcheck.harness import (
    DTYPES,
    OPTIMIZER_NAMES,
    Comparison,
    EngineStepper,
    result,
    to_engine_kwargs,
)
from optcheck.reference import REFERENCES
from reports.record import Result

FAMILY = "invariant"
EXACT = (0.0, 0.0)
SCALES = (1e-3, 7.0, 1e3)
WEIGHT_DECAY = 0.1
_ADAM = {"lr": 0.02, "beta1": 0.9, "beta2": 0.99, "eps": 1e-3}
SETTINGS = {   # optimizer -> (hp, flags) of every invariant unless it says otherwise
    "sgd": ({"lr": 0.05, "momentum": 0.9, "dampening": 0.25, "weight_decay": 0.0},
            {"nesterov": False, "maximize": False}),
    "adam": ({**_ADAM, "weight_decay": 0.0}, {"amsgrad": True, "maximize": False}),
    "adamw": ({**_ADAM, "weight_decay": 0.05}, {"amsgrad": True, "maximize": False}),
}
NESTEROV = ({"lr": 0.05, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.0},
            {"nesterov": True, "maximize": False})


@dataclasses.dataclass(frozen=True)
class _Config:
    optimizer: str
    dtype: str
    backend: str
    steps: int
    seed: int

    hp = property(lambda self: dict(SETTINGS[self.optimizer][0]))
    flags = property(lambda self: dict(SETTINGS[self.optimizer][1]))
    ftype = property(lambda self: np.float32 if self.dtype == "f32" else np.float64)
    batches = property(lambda self: max(2, min(12, self.steps // 8)), doc="logical batches "
                       "per epoch in the training-loop invariants")

    def init(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        return {"w0": rng.uniform(-1, 1, (3, 4)).astype(self.ftype),
                "w1": rng.uniform(-1, 1, (5,)).astype(self.ftype)}

    def gradient_sequence(self) -> list[dict[str, np.ndarray]]:
        """Fixed gradients g_t = a_t z_t + 0.1, z_t standard normal, a_t = 0.05 + 2 (0.9)^t
        shrinking (so v decreases and AMSGrad's max matters), rounded to the dtype."""
        rng = np.random.default_rng(self.seed + 7)
        shapes = {k: v.shape for k, v in self.init().items()}
        return [{k: ((0.05 + 2 * 0.9**t) * rng.standard_normal(s) + 0.1).astype(self.ftype)
                 for k, s in shapes.items()} for t in range(self.steps)]

    def stepper(self, name=None, hp=None, flags=None, init=None, schedule=None):
        name = name or self.optimizer
        return EngineStepper(name, self.init() if init is None else init,
                             SETTINGS[name][0] if hp is None else hp,
                             SETTINGS[name][1] if flags is None else flags,
                             self.dtype, self.backend, schedule)


@dataclasses.dataclass
class _Outcome:
    comparison: Comparison
    problems: list[str] = dataclasses.field(default_factory=list)   # beyond the comparison
    metrics: dict = dataclasses.field(default_factory=dict)


def run(optimizer: str, dtype: str = "f64", backend: str = "cpu", steps: int = 100,
        seed: int = 0, checks=None) -> list[Result]:
    """Every invariant of `optimizer` ('sgd', 'adam', 'adamw'), or those named in `checks`,
    one Result each; an invariant that raises becomes an "error" row carrying the exception."""
    if optimizer not in OPTIMIZER_NAMES:
        raise ValueError(f"invariant: unknown optimizer {optimizer!r}; known: "
                         f"{', '.join(OPTIMIZER_NAMES)}")
    if dtype not in DTYPES:
        raise ValueError(f"invariant: dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if steps < 2:
        raise ValueError(f"invariant: steps must be >= 2, got {steps}")
    unknown = sorted(set(checks or ()) - set(INVARIANTS))
    if unknown:
        raise ValueError(f"invariant: unknown check(s) {unknown}; known: {', '.join(INVARIANTS)}")
    cfg = _Config(optimizer, dtype, backend, steps, seed)
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


def _hp_text(hp: dict, flags: dict) -> str:
    return ",".join([f"{k}={v:g}" for k, v in hp.items()] + [k for k, v in flags.items() if v])


def _prefixed(prefix: str, snap: dict) -> dict:
    return {f"{prefix}:{k}": v for k, v in snap.items()}


def _compare_traces(comparison, label, got, want, dtype, tol=None, first_step=1):
    if len(got) != len(want):
        raise RuntimeError(f"{label}: {len(got)} snapshots against {len(want)}")
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=first_step):
        comparison.add(step, _prefixed(label, g), _prefixed(label, w), dtype, tol=tol)


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


# --- training loop --------------------------------------------------------------------------

def _trainer(cfg: _Config, loss_type: str, batch_physical: int, batch_logical: int,
             seed: int | None = None) -> Trainer:
    """x (B, 4) -> tanh(x W1 + b1) W2 (B, 3), parameters drawn from cfg.seed. A sum loss's
    gradient is 3 B times its mean's, so it trains with lr / (3 B): steps of the mean's size
    keep the two runs of an invariant from drifting apart by more than their rounding."""
    rng = np.random.default_rng(cfg.seed)
    x = engine.input_tensor((batch_physical, 4), cfg.dtype, name="x")
    w1 = engine.param((4, 5), cfg.dtype, name="w1").set(rng.uniform(-1, 1, (4, 5)))
    b1 = engine.param((5,), cfg.dtype, name="b1").set(rng.uniform(-0.5, 0.5, (5,)))
    w2 = engine.param((5, 3), cfg.dtype, name="w2").set(rng.uniform(-1, 1, (5, 3)))
    out = ops.matmul(ops.tanh(ops.add(ops.matmul(x, w1), b1)), w2)
    labels = None
    if loss_type == "cross_entropy":
        labels = engine.input_tensor((batch_physical, 3), cfg.dtype, name="y")
    hp = cfg.hp
    if loss_type == "sum":
        hp["lr"] /= 3 * batch_logical
    return Trainer(x, out, loss_type, labels, cfg.optimizer,
                   to_engine_kwargs(cfg.optimizer, hp, cfg.flags), batch_logical,
                   cfg.backend, cfg.seed if seed is None else seed)


def _dataset(cfg: _Config, n: int) -> Dataset:
    rng = np.random.default_rng(cfg.seed + 1)
    return Dataset(rng.standard_normal((n, 4)).astype(cfg.ftype),
                   np.eye(3, dtype=cfg.ftype)[rng.integers(0, 3, n)])


def _trainer_snapshot(trainer: Trainer) -> dict[str, np.ndarray]:
    return {**{p.name: p.numpy() for p in trainer.optimizer.params},
            **trainer.optimizer.state_arrays()}


def _accumulation_trace(cfg, loss_type, batch_logical, k) -> list[dict]:
    """Parameters, state and accumulated gradients after each logical batch of one epoch
    (dataset order, physical batch batch_logical / k)."""
    trainer = _trainer(cfg, loss_type, batch_logical // k, batch_logical)
    trace = []

    def after_batch(i, train, val):
        if (i + 1) % k == 0:
            trace.append({**_trainer_snapshot(trainer),
                          **{f"{p.name}.grad": trainer.training.grad(p).numpy()
                             for p in trainer.optimizer.params}})

    trainer.epoch(_dataset(cfg, batch_logical * cfg.batches), progress=after_batch)
    return trace


def _check_accumulation(cfg) -> _Outcome:
    comparison = Comparison()
    for loss_type in ("mean", "sum", "cross_entropy"):
        want = _accumulation_trace(cfg, loss_type, 8, 1)
        for k in (2, 4):
            _compare_traces(comparison, f"{loss_type},k={k}",
                            _accumulation_trace(cfg, loss_type, 8, k), want, cfg.dtype)
    return _Outcome(comparison)


def _training_run(cfg: _Config, shuffle_seed: int) -> dict[str, np.ndarray]:
    trainer = _trainer(cfg, "cross_entropy", 4, 8, seed=shuffle_seed)
    history = trainer.fit(_dataset(cfg, 8 * cfg.batches + 8), epochs=2, val_split=0.2)
    losses = [x for train, val in history for x in train.losses + val.losses]
    return {**_trainer_snapshot(trainer), "losses": np.array(losses)}


def _check_determinism(cfg) -> _Outcome:
    first, second = _training_run(cfg, cfg.seed), _training_run(cfg, cfg.seed)
    comparison = Comparison()
    comparison.add(0, second, first, cfg.dtype, tol=EXACT)
    other = _training_run(cfg, cfg.seed + 1)
    seed_diff = max(float(np.max(np.abs(other[k] - first[k])))
                    for k in first if "." not in k and k != "losses")
    problems = [] if seed_diff > 0 else [f"shuffle seed {cfg.seed + 1} gave the weights of "
                                         f"seed {cfg.seed}: the seed does not reach the shuffle"]
    return _Outcome(comparison, problems, {"seed_diff": seed_diff})


def _check_epoch_vs_fit(cfg) -> _Outcome:
    dataset = _dataset(cfg, 8 * cfg.batches)
    copy = Dataset(dataset.data.copy(), dataset.labels.copy())
    by_epoch = _trainer(cfg, "cross_entropy", 4, 8)
    dataset.shuffle(by_epoch.rng)
    train, _ = by_epoch.epoch(dataset)
    by_fit = _trainer(cfg, "cross_entropy", 4, 8)
    (fit_train, _), = by_fit.fit(copy, epochs=1, val_split=0.0)
    comparison = Comparison()
    comparison.add(0, {**_trainer_snapshot(by_fit), "losses": np.array(fit_train.losses)},
                   {**_trainer_snapshot(by_epoch), "losses": np.array(train.losses)},
                   cfg.dtype, tol=EXACT)
    return _Outcome(comparison)


# --- checkpoint -----------------------------------------------------------------------------

def _check_checkpoint(cfg, schedule=None) -> _Outcome:
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
        _compare_traces(comparison, "resumed", _trace(b, _field_gradient, n, cfg.steps), trace_a,
                        cfg.dtype, EXACT, first_step=n + 1)
        problems = [] if schedule is not None else _refusals(cfg, path)
    return _Outcome(comparison, problems)


def _refusals(cfg: _Config, path: str) -> list[str]:
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


# --- update rules ---------------------------------------------------------------------------

def _unscaled(snap: dict, c: float) -> dict:
    """State of a run on c g brought back to the run on g: momentum and m over c, v over c^2."""
    power = {"momentum_buffer": 1, "exp_avg": 1, "exp_avg_sq": 2, "max_exp_avg_sq": 2}
    return {k: v / c ** power.get(k.partition(".")[2], 0) for k, v in snap.items()}


def _describe_scale(cfg):
    c = "|".join(f"{x:g}" for x in SCALES)
    if cfg.optimizer == "sgd":
        return f"sgd: c*g with lr == g with c*lr,c={c},{_hp_text(*SETTINGS['sgd'])}; nesterov"
    hp = {**cfg.hp, "weight_decay": 0.0} if cfg.optimizer == "adam" else cfg.hp
    return f"holds up to eps: eps=0 unchanged; eps>0: c*g == eps/c,c={c},{_hp_text(hp, cfg.flags)}"


def _check_scale(cfg) -> _Outcome:
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
            _compare_traces(comparison, label, [_unscaled(s, c) for s in scaled], plain,
                            cfg.dtype)
    return _Outcome(comparison)


def _decay_cases(cfg):
    if cfg.optimizer == "sgd":
        plain = {**cfg.hp, "momentum": 0.0, "dampening": 0.0}
        return [("plain", plain, cfg.flags), ("momentum", cfg.hp, cfg.flags),
                ("nesterov", *NESTEROV)]
    return [("amsgrad", cfg.hp, cfg.flags), ("adam", cfg.hp, {**cfg.flags, "amsgrad": False})]


def _describe_decay(cfg):
    names = "|".join(label for label, _, _ in _decay_cases(cfg))
    rule = "decoupled == (1-lr*wd)*p then undecayed step, != L2 form g+wd*p" \
        if cfg.optimizer == "adamw" else "== g+wd*p"
    hp = {k: v for k, v in cfg.hp.items() if k != "weight_decay"}
    return f"wd={WEIGHT_DECAY:g} {rule},{names},{_hp_text(hp, cfg.flags)}"


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


def _check_decay(cfg) -> _Outcome:
    comparison, l2_form = Comparison(), Comparison()
    for label, hp, flags in _decay_cases(cfg):
        got = _decay_trace(cfg, cfg.optimizer, hp, flags, "optimizer")
        if cfg.optimizer != "adamw":
            want = _decay_trace(cfg, cfg.optimizer, hp, flags, "l2")
            _compare_traces(comparison, label, got, want, cfg.dtype)
            continue
        want = _decay_trace(cfg, "adamw", hp, flags, "shrink")
        _compare_traces(comparison, label, got, want, cfg.dtype)
        _compare_traces(l2_form, label, got, _decay_trace(cfg, "adam", hp, flags, "l2"),
                        cfg.dtype)
    if cfg.optimizer != "adamw":
        return _Outcome(comparison)
    problems = [] if not l2_form.ok else [
        f"adamw's decay agreed with the L2 form g + wd p (max |diff| {l2_form.max_abs_err:.3g}):"
        " it is not decoupled"]
    return _Outcome(comparison, problems, {"l2_form_diff": l2_form.max_abs_err})


# --- schedules --------------------------------------------------------------------------------

def _schedule(cfg):
    return warmup_cosine(max(1, cfg.steps // 10), cfg.steps, start_factor=0.25)


def _describe_schedule(cfg):
    s = _schedule(cfg)
    return (f"warmup_cosine({s.warmup_steps},{s.t_max}),set(lr/2,wd+0.01) at step "
            f"{cfg.steps // 2},{_hp_text(cfg.hp, cfg.flags)}"
            + ("; nesterov" if cfg.optimizer == "sgd" else ""))


def _check_schedule(cfg) -> _Outcome:
    schedule, grads = _schedule(cfg), cfg.gradient_sequence()
    init_fn, update_fn = REFERENCES[cfg.optimizer]
    comparison, replans, lr_mismatches = Comparison(), 0, 0
    configs = [(cfg.hp, cfg.flags)] + ([NESTEROV] if cfg.optimizer == "sgd" else [])
    for i, (hp, flags) in enumerate(configs):
        stepper = cfg.stepper(hp=hp, flags=flags, schedule=schedule)
        ref_hp, plan = dict(hp), None
        ref = {k: (v.astype(np.float64), init_fn(v.astype(np.float64), hp, flags))
               for k, v in cfg.init().items()}
        for t, g in enumerate(grads):
            if t == cfg.steps // 2:
                ref_hp.update(lr=hp["lr"] / 2, weight_decay=hp["weight_decay"] + 0.01)
                stepper.opt.set(lr=ref_hp["lr"], weight_decay=ref_hp["weight_decay"])
            stepper.step(g)
            plan = plan or stepper.opt.graph.plan
            replans += stepper.opt.graph.plan is not plan
            lr = ref_hp["lr"] * float(schedule(t))
            lr_mismatches += stepper.opt.hparams["lr"] != lr
            want = {}
            for k, (p, state) in ref.items():
                ref[k] = update_fn(p, g[k].astype(np.float64), state, {**ref_hp, "lr": lr}, flags)
                want.update({k: ref[k][0], **{f"{k}.{s}": v for s, v in ref[k][1].items()}})
            comparison.add(t + 1, _prefixed(f"config{i}", stepper.snapshot()),
                           _prefixed(f"config{i}", want), cfg.dtype)
    problems = ([f"the step graph was replanned {replans} times"] if replans else []) + (
        [f"{lr_mismatches} steps ran with an lr other than base * factor(t)"]
        if lr_mismatches else [])
    return _Outcome(comparison, problems, {"replans": replans, "lr_mismatches": lr_mismatches})


INVARIANTS = {   # check -> (describe(cfg): the case's parameters, evaluate(cfg) -> _Outcome)
    "grad_accumulation": (lambda cfg: "loss=mean|sum|cross_entropy,B=8,k=2|4,"
                          f"batches={cfg.batches},{_hp_text(cfg.hp, cfg.flags)}",
                          _check_accumulation),
    "checkpoint_resume": (lambda cfg: f"n={cfg.steps // 2},m={cfg.steps - cfg.steps // 2},"
                          f"{_hp_text(cfg.hp, cfg.flags)},refuse=flag|optimizer",
                          _check_checkpoint),
    "checkpoint_resume_schedule": (
        lambda cfg: f"n={cfg.steps // 2},m={cfg.steps - cfg.steps // 2},"
                    f"cosine({cfg.steps}),{_hp_text(cfg.hp, cfg.flags)}",
        lambda cfg: _check_checkpoint(cfg, cosine(cfg.steps))),
    "determinism": (lambda cfg: f"fit,epochs=2,val_split=0.2,B=4,logical=8,seed={cfg.seed},"
                    f"{_hp_text(cfg.hp, cfg.flags)}", _check_determinism),
    "gradient_scale": (_describe_scale, _check_scale),
    "weight_decay_l2": (_describe_decay, _check_decay),
    "epoch_vs_fit": (lambda cfg: f"cross_entropy,B=4,logical=8,batches={cfg.batches},"
                     f"{_hp_text(cfg.hp, cfg.flags)}", _check_epoch_vs_fit),
    "schedule_no_replan": (_describe_schedule, _check_schedule),
}
