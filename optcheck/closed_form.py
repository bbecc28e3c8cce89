"""optcheck family "closed-form": scenarios whose exact trajectory is known in closed form.

Every expected value is computed in float64 from an explicit formula (never by running
another optimizer) and compared with the engine after every step, within the dtype's float
error (`harness.TOLERANCES`, grown in proportion to the steps beyond 100), or exactly where
the exact result is representable: lr = 0, zero gradient without decay, maximize against
minimize, ggml's test-opt toy model. Initial parameters and gradients are drawn with the
seed and rounded to the dtype, so the formulas see the very values the engine sees.

    constant_gradient     SGD: p_t = p0 - t lr g.   Adam, AdamW (wd = 0): m_t = (1 - b1^t) g,
                          v_t = (1 - b2^t) g^2, so m_hat = g, sqrt(v_hat) = |g| and every step
                          is -u, u = lr g / (|g| + eps): p_t = p0 - t u. One case has eps
                          comparable to |g|, where the place of eps (outside the square root,
                          after bias correction) changes u.
    constant_gradient_decay   p <- c p - u with c = 1 - lr wd (SGD's L2 term: u = lr g; AdamW's
                          decoupled decay: u as above): p_t = c^t p0 - u (1 - c^t) / (1 - c).
    momentum              SGD, b_1 = g, b_t = mu b_{t-1} + (1 - tau) g:
                          b_t = g (mu^{t-1} + (1 - tau)(1 - mu^{t-1}) / (1 - mu)),
                          p_t = p0 - lr g (S_t + (1 - tau)(t - S_t) / (1 - mu)),
                          S_t = (1 - mu^t) / (1 - mu).  Nesterov (tau = 0): b_t = g S_t and
                          p_t = p0 - lr g (t + mu (t - mu S_t) / (1 - mu)).
    gradient_then_zero    Adam, AdamW (wd = 0): gradient g for k = steps // 2 steps, then 0.
                          For t > k: m_t = b1^(t-k) (1 - b1^k) g, v_t = b2^(t-k) (1 - b2^k) g^2,
                          v decreases, so AMSGrad's max stays v_k; the step is
                          lr / (1 - b1^t) m_t / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps).
    quadratic             SGD on f = a/2 p^2 (gradient a p at the current p): p_t = (1 - lr a)^t p0.
    zero_gradient         Without decay nothing moves and the state stays zero, bit for bit.
                          SGD (L2) and AdamW (decoupled): p_t = (1 - lr wd)^t p0. Adam with L2
                          decay is checked with betas = (0, 0) and eps = 0, where its step is
                          lr d / sqrt(d^2) with d = wd p: a sign step, p_t = p0 - t lr sign(p0)
                          while |p0| > t lr (m_t = wd p_{t-1}, v_t = (wd p_{t-1})^2).
    lr_zero               lr = 0: the parameters never change, bit for bit, whatever the rest.
    maximize              maximize with gradient g equals minimizing with -g: every parameter
                          and state tensor, bit for bit.
    toy_*                 ggml's tests/test-opt.cpp model trained by the engine's Trainer
                          (optcheck.closed_form_toy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from optcheck.closed_form_toy import toy_cases
from optcheck.harness import EXACT, Comparison, result, status_of, tolerance
from optcheck.numpy_optimizers import FLAG_NAMES
from reports.record import Result

FAMILY = "closed-form"
SHAPE = (3, 4)
_FLOAT = {"f32": np.float32, "f64": np.float64}


def skip_reason(dtype: str) -> str | None:
    """Why this family does not run in `dtype` (None: it does)."""
    if dtype in _FLOAT:
        return None
    return (f"closed forms are float64 formulas held to float32's and float64's tolerances; a "
            f"{dtype} parameter is rounded by up to half its ulp at every step, so its "
            f"trajectory is judged by the precision family (against the float64 trajectory, "
            f"bounded by torch at the same precision)")


class Unsupported(Exception):
    """A scenario the optimizer under test cannot run; the message says why."""


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One row: its `check` (snake_case), its one-line `case`, the function that runs it."""

    check: str
    case: str
    compare: Callable[[], Comparison]


def run(optimizer: str, dtype: str = "f64", backend: str = "cpu", steps: int = 100,
        seed: int = 0, adapter=None) -> list[Result]:
    """Every closed-form scenario of `optimizer` ('sgd', 'adam', 'adamw'), one Result each,
    stepped by `adapter` (optcheck.adapters; default: our engine on `backend`); a scenario
    that raises becomes an "error" row carrying the exception, one the adapter cannot run
    an "unsupported" row with its reason."""
    for bad, why in ((optimizer not in ("sgd", "adam", "adamw"),
                      f"unknown optimizer {optimizer!r}; known: sgd, adam, adamw"),
                     (dtype not in _FLOAT, f"dtype must be one of {list(_FLOAT)}, got {dtype!r}"),
                     (steps < 2, f"steps must be >= 2, got {steps}")):
        if bad:
            raise ValueError(f"closed-form: {why}")
    rows = []
    for s in scenarios(optimizer, dtype, backend, steps, seed, adapter):
        try:
            rows.append(result(optimizer, FAMILY, s.check, s.case, dtype, backend, s.compare()))
        except Unsupported as exc:
            rows.append(result(optimizer, FAMILY, s.check, s.case, dtype, backend,
                               message=str(exc), status="unsupported"))
        except Exception as exc:    # a scenario that cannot run is a row, never raised
            row = result(optimizer, FAMILY, s.check, s.case, dtype, backend, ok=False,
                         message=f"{type(exc).__name__}: {exc}")
            rows.append(dataclasses.replace(row, status=status_of(exc)))
    return rows


def scenarios(optimizer: str, dtype: str, backend: str, steps: int, seed: int,
              adapter=None) -> list[Scenario]:
    """The scenarios of one optimizer, their random values drawn now from `seed`, stepped by
    `adapter` (default: our engine on `backend`). The toy model's rows train with our
    engine's Trainer: another adapter's are unsupported rows that say so."""
    from optcheck.adapters.engine_adapter import EngineOptimizer
    ours = adapter is None or isinstance(adapter, EngineOptimizer)
    rng = np.random.default_rng(seed)
    ctx = _Context(optimizer, dtype, backend, steps, rng,
                   EngineOptimizer(backend) if adapter is None else adapter)
    own = sgd_scenarios(ctx) if optimizer == "sgd" else adam_scenarios(ctx)
    toy = [Scenario(check, case, compare if ours else _not_ours)
           for check, case, compare in toy_cases(optimizer, dtype, backend)]
    return own + shared_scenarios(ctx) + toy


def _not_ours() -> Comparison:
    raise Unsupported("ggml's test-opt toy model is trained by our engine's Trainer (a "
                      "graph, a dataset, gradient accumulation): it checks our engine only")


@dataclasses.dataclass
class _Context:
    opt: str
    dtype: str
    backend: str
    steps: int
    rng: np.random.Generator
    adapter: object = None      # the optimizer under test (optcheck.adapters)

    def stepper(self, hp, flags, p0):
        """The adapter's optimizer over one parameter w0 = p0; Unsupported when it cannot
        run these settings."""
        flags = {**dict.fromkeys(FLAG_NAMES[self.opt], False), **flags}   # every flag said
        reason = self.adapter.unsupported(self.opt, self.dtype, hp, flags)
        if reason:
            raise Unsupported(reason)
        return self.adapter.stepper(self.opt, {"w0": p0}, hp, flags, self.dtype)

    def draw(self, lo: float, hi: float, shape=SHAPE, log: bool = False) -> np.ndarray:
        """Magnitudes in [lo, hi] (log-uniform when `log`) with random signs, rounded to the
        dtype and returned as float64."""
        r = self.rng
        mag = np.exp(r.uniform(np.log(lo), np.log(hi), shape)) if log else r.uniform(lo, hi, shape)
        return (mag * r.choice([-1.0, 1.0], shape)).astype(_FLOAT[self.dtype]).astype(np.float64)

    @property
    def tolerance(self) -> tuple[float, float]:
        """The dtype's tolerance (sized for 100 steps), grown with the steps, since rounding
        errors add up step after step."""
        return tolerance(self.dtype, self.steps)

    def follow(self, hp, flags, p0, grad, want, tol=None) -> Comparison:
        """Step the engine on grad(t, p) (p the current parameter) and compare its snapshot
        after every step t with want(t) (name -> expected array), within `tol` (default: the
        dtype's float error)."""
        tol = tol or self.tolerance
        stepper = self.stepper(hp, flags, p0)
        comp = Comparison()
        p = np.asarray(p0, np.float64)
        for t in range(1, self.steps + 1):
            stepper.step({"w0": grad(t, p)})
            got, expected = stepper.snapshot(), want(t)
            comp.add(t, got, expected, self.dtype, [n for n in expected if n in got], tol=tol)
            p = np.asarray(got["w0"], np.float64)
        return comp

    def scenario(self, check, hp, flags, p0, grad, want, tol=None, **extra) -> Scenario:
        """A trajectory row; its case names hp, the flags that are set, `extra`, the shape."""
        case = _case(check, **hp, **{k: v for k, v in flags.items() if v}, **extra,
                     shape=np.shape(p0))
        return Scenario(check, case, lambda: self.follow(hp, flags, p0, grad, want, tol))


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{v:g}"
    if isinstance(v, (tuple, list)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return str(v)


def _case(check: str, **kv) -> str:
    return f"{check}({','.join(f'{k}={_fmt(v)}' for k, v in kv.items())})"


def _decayed(p0, u, c: float, t: int):
    """t steps of p <- c p - u: c^t p0 - u (1 - c^t) / (1 - c)  (p0 - t u when c = 1)."""
    if c == 1.0:
        return p0 - t * u
    return c ** t * p0 - u * (1.0 - c ** t) / (1.0 - c)


def _const(g):
    return lambda t, p: g


# --- SGD ------------------------------------------------------------------------------------
def sgd_scenarios(ctx: _Context) -> list[Scenario]:
    p0, g = ctx.draw(0.5, 2.0), ctx.draw(0.5, 2.0)
    lr, wd, mu, tau = 0.01, 0.1, 0.9, 0.5
    plain = dict(lr=lr, momentum=0.0, dampening=0.0, weight_decay=0.0)
    out = [ctx.scenario("constant_gradient", plain, {}, p0, _const(g),
                        lambda t: {"w0": p0 - t * lr * g})]
    c = 1.0 - lr * wd
    out.append(ctx.scenario("constant_gradient_decay", {**plain, "weight_decay": wd}, {}, p0,
                            _const(g), lambda t: {"w0": _decayed(p0, lr * g, c, t)}))

    def damped(t):
        s = (1.0 - mu ** t) / (1.0 - mu)
        buf = g * (mu ** (t - 1) + (1.0 - tau) * (1.0 - mu ** (t - 1)) / (1.0 - mu))
        return {"w0": p0 - lr * g * (s + (1.0 - tau) * (t - s) / (1.0 - mu)),
                "w0.momentum_buffer": buf}

    def nesterov(t):
        s = (1.0 - mu ** t) / (1.0 - mu)
        return {"w0": p0 - lr * g * (t + mu * (t - mu * s) / (1.0 - mu)),
                "w0.momentum_buffer": g * s}

    out.append(ctx.scenario("momentum", {**plain, "momentum": mu, "dampening": tau}, {}, p0,
                            _const(g), damped))
    out.append(ctx.scenario("momentum", {**plain, "momentum": mu}, {"nesterov": True}, p0,
                            _const(g), nesterov))

    a, lr_q = ctx.rng.uniform(0.5, 50.0, SHAPE), 0.03
    out.append(ctx.scenario("quadratic", {**plain, "lr": lr_q}, {}, p0, lambda t, p: a * p,
                            lambda t: {"w0": (1.0 - lr_q * a) ** t * p0}, a="[0.5,50]"))

    zero = np.zeros(SHAPE)
    out.append(ctx.scenario("zero_gradient", {**plain, "momentum": mu}, {"nesterov": True}, p0,
                            _const(zero), lambda t: {"w0": p0, "w0.momentum_buffer": zero},
                            tol=EXACT))
    out.append(ctx.scenario("zero_gradient", {**plain, "weight_decay": wd}, {}, p0,
                            _const(zero), lambda t: {"w0": c ** t * p0}))
    return out


# --- Adam, AdamW ----------------------------------------------------------------------------
def adam_scenarios(ctx: _Context) -> list[Scenario]:
    p0 = ctx.draw(0.5, 2.0)
    out = []
    for eps, g in ((1e-8, ctx.draw(0.5, 2.0)), (1e-3, ctx.draw(1e-4, 1e-2, log=True))):
        hp = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=eps, weight_decay=0.0)
        out.append(ctx.scenario("constant_gradient", hp, {}, p0, _const(g),
                                _adam_constant(p0, g, hp, 1.0),
                                **({"g": "[1e-4,1e-2]"} if eps > 1e-6 else {})))
    if ctx.opt == "adamw":
        g = ctx.draw(0.5, 2.0)
        hp = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)
        out.append(ctx.scenario("constant_gradient_decay", hp, {}, p0, _const(g),
                                _adam_constant(p0, g, hp, 1.0 - hp["lr"] * hp["weight_decay"])))

    g, k = ctx.draw(0.5, 2.0), ctx.steps // 2
    hp = dict(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0)
    zero = np.zeros(SHAPE)
    for amsgrad in (False, True):
        out.append(ctx.scenario("gradient_then_zero", hp, {"amsgrad": amsgrad}, p0,
                                lambda t, p: g if t <= k else zero,
                                _adam_then_zero(p0, g, hp, k, ctx.steps, amsgrad), k=k))

    hp = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    state = {"w0.exp_avg": zero, "w0.exp_avg_sq": zero}
    out.append(ctx.scenario("zero_gradient", hp, {"amsgrad": True}, p0, _const(zero),
                            lambda t: {"w0": p0, **state, "w0.max_exp_avg_sq": zero}, tol=EXACT))
    if ctx.opt == "adamw":
        hp = {**hp, "weight_decay": 0.1}
        c = 1.0 - hp["lr"] * hp["weight_decay"]
        out.append(ctx.scenario("zero_gradient", hp, {}, p0, _const(zero),
                                lambda t: {"w0": c ** t * p0, **state}))
    else:   # L2 decay with betas 0, eps 0: a sign step, while |p0| > steps lr
        wd, lr = 0.1, 0.5 / ctx.steps
        def sign_steps(t):
            before = p0 - (t - 1) * lr * np.sign(p0)
            return {"w0": before - lr * np.sign(p0), "w0.exp_avg": wd * before,
                    "w0.exp_avg_sq": (wd * before) ** 2}

        hp = dict(lr=lr, beta1=0.0, beta2=0.0, eps=0.0, weight_decay=wd)
        out.append(ctx.scenario("zero_gradient", hp, {}, p0, _const(zero), sign_steps))
    return out


def _adam_constant(p0, g, hp, c):
    """Expected snapshot after t steps of a constant gradient g (see the module docstring)."""
    lr, b1, b2, eps = hp["lr"], hp["beta1"], hp["beta2"], hp["eps"]
    u = lr * g / (np.abs(g) + eps)
    return lambda t: {"w0": _decayed(p0, u, c, t), "w0.exp_avg": (1.0 - b1 ** t) * g,
                      "w0.exp_avg_sq": (1.0 - b2 ** t) * g * g}


def _adam_then_zero(p0, g, hp, k, steps, amsgrad):
    """Expected snapshots when the gradient is g for steps 1..k and 0 after."""
    lr, b1, b2, eps = hp["lr"], hp["beta1"], hp["beta2"], hp["eps"]
    ts = np.arange(1, steps + 1, dtype=np.float64).reshape((-1,) + (1,) * g.ndim)
    kept = np.minimum(ts, k)                    # steps that saw the gradient
    m = b1 ** (ts - kept) * (1.0 - b1 ** kept) * g
    v = b2 ** (ts - kept) * (1.0 - b2 ** kept) * g * g
    vmax = (1.0 - b2 ** kept) * g * g           # v rises until step k, then decays
    denom = np.sqrt(vmax if amsgrad else v) / np.sqrt(1.0 - b2 ** ts) + eps
    p = p0 - np.cumsum(lr / (1.0 - b1 ** ts) * m / denom, axis=0)

    def want(t):
        snap = {"w0": p[t - 1], "w0.exp_avg": m[t - 1], "w0.exp_avg_sq": v[t - 1]}
        if amsgrad:
            snap["w0.max_exp_avg_sq"] = vmax[t - 1]
        return snap
    return want


# --- every optimizer: lr = 0, maximize --------------------------------------------------------
def shared_scenarios(ctx: _Context) -> list[Scenario]:
    p0 = ctx.draw(0.5, 2.0)
    grads = [ctx.draw(0.1, 2.0) for _ in range(ctx.steps)]
    if ctx.opt == "sgd":
        settings = [(dict(momentum=0.9, dampening=0.3, weight_decay=0.1), {}),
                    (dict(momentum=0.9, dampening=0.0, weight_decay=0.1), {"nesterov": True})]
    else:
        settings = [(dict(beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1),
                     {"amsgrad": True})]
    out = []
    for hp, flags in settings:
        out.append(ctx.scenario("lr_zero", {"lr": 0.0, **hp}, {**flags, "maximize": True}, p0,
                                lambda t, p: grads[t - 1], lambda t: {"w0": p0}, tol=EXACT))
        hp = {"lr": 0.01, **hp}
        case = _case("maximize", **hp, **flags, shape=SHAPE)
        out.append(Scenario("maximize", case,
                            lambda hp=hp, flags=flags: _maximize(ctx, hp, flags, p0, grads)))
    return out


def _maximize(ctx, hp, flags, p0, grads) -> Comparison:
    """Maximize on g against minimize on -g: every tensor, every step, bit for bit."""
    up, down = (ctx.stepper(hp, {**flags, "maximize": m}, p0) for m in (True, False))
    comp = Comparison()
    for t in range(1, ctx.steps + 1):
        up.step({"w0": grads[t - 1]})
        down.step({"w0": -grads[t - 1]})
        comp.add(t, up.snapshot(), down.snapshot(), ctx.dtype, tol=EXACT)
    return comp
