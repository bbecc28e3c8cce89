"""Optimizers: a graph of in-place step ops over persistent parameters and state.

    x = engine.param((3, 4), name="x")
    loss = ops.sum(ops.sqr(x)).set_loss()
    train = engine.Graph([loss]); train.build_backward(loss, accumulate=True)
    opt = AdamW(train, lr=1e-3)            # steps every param with a gradient in `train`
    train.compute(); opt.step(); train.reset()

An optimizer builds its own graph (`opt.graph`), one step node per parameter, whose every
source is persistent: the parameter, its gradient (read through a leaf that shares the
training graph's gradient buffer, see `engine.tensor.shared_leaf`), the step counter and
moments (flag STATE) and the hyperparameter tensor. Stepping computes that graph with its
own plan; the training graph's plan is untouched.

State has the parameter's dtype, but float32 for a float16 or bfloat16 parameter
(engine.ops.optimizer_steps.state_dtype): the parameter is rounded once per step, on store,
and the moments keep float32's precision (as mixed-precision training keeps them; unlike
torch.optim, whose state takes the parameter's dtype).

Numeric hyperparameters live in `opt.hp`, a float64 tensor, so `opt.set(lr=...)` and
schedules change them between steps without rebuilding anything. Structural options
(nesterov, amsgrad, maximize) are fixed at construction. Every value is validated when the
optimizer is built and whenever it is set: bad values raise HyperparameterError.
"""

from __future__ import annotations

import math

import numpy as np

from engine.errors import EngineError, HyperparameterError
from engine.graph import Graph
from engine.hyperparams import ADAM_HPARAMS, SGD_HPARAMS
from engine.ops.optimizer_steps import state_dtype
from engine.registry import OPS
from engine.tensor import Flag, Tensor, is_float, shared_leaf


def _finite(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise HyperparameterError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise HyperparameterError(f"{name} must be finite, got {value!r}")
    return float(value)


def _nonnegative(name, value):
    if _finite(name, value) < 0:
        raise HyperparameterError(f"{name} must be >= 0, got {value!r}")


def _beta(name, value):
    if not 0.0 <= _finite(name, value) < 1.0:
        raise HyperparameterError(f"{name} must lie in [0, 1), got {value!r}")


class Optimizer:
    """Base class: subclasses give `name`, `op`, `HPARAMS` (the layout of `hp`), `FLAGS`
    (structural options with defaults), `state_names()` and `validate()`."""

    name: str = ""
    op: str = ""
    HPARAMS: tuple[str, ...] = ()
    FLAGS: dict[str, bool] = {}

    def __init__(self, params, hparams: dict, flags: dict, grads=None, schedule=None):
        for k, v in flags.items():
            if not isinstance(v, (bool, np.bool_)):
                raise HyperparameterError(f"{self.name}: {k} must be True or False, got {v!r}")
        self.flags = {k: bool(v) for k, v in flags.items()}
        self.validate(hparams, self.flags)
        self.params, self.grads = self._params_and_grads(params, grads)
        self.hp = Tensor((len(self.HPARAMS),), "f64", name=f"{self.name}.hparams",
                         flags=Flag.INPUT)
        self.hp.set([hparams[k] for k in self.HPARAMS])
        self.base_lr = float(hparams["lr"])
        self.schedule = schedule
        self.state: dict[Tensor, dict[str, Tensor]] = {}
        steps = []
        for p in self.params:
            state = {"step": Tensor((1,), "f64", name=f"{p.name}.step", flags=Flag.STATE)}
            for s in self.state_names():
                state[s] = Tensor(p.shape, state_dtype(p.dtype), name=f"{p.name}.{s}",
                                  flags=Flag.STATE)
            self.state[p] = state
            g = shared_leaf(self.grads[p], name=f"{self.grads[p].name}@{self.name}")
            moments = [state[s] for s in self.state_names()]
            steps.append(OPS[self.op].build(p, g, state["step"], self.hp, *moments,
                                            **self.flags))
        self.graph = Graph(steps, name=f"{self.name}.step")

    # --- construction ---------------------------------------------------------------------
    def _params_and_grads(self, params, grads):
        if isinstance(params, Graph):
            graph = params
            if graph.loss_grad is None:
                raise EngineError(f"{self.name}: graph {graph.name!r} has no backward pass; "
                                  "call build_backward first")
            ps = [p for p in graph.params() if p in graph.grads]
            grads = {p: graph.grad(p) for p in ps} if grads is None else grads
        else:
            ps = list(params)
        if not ps:
            raise EngineError(f"{self.name}: no parameters to optimize")
        for p in ps:
            if not isinstance(p, Tensor) or not p.is_param or not is_float(p.dtype):
                raise EngineError(f"{self.name}: {p!r} is not a float param tensor")
        if len({p.name for p in ps}) != len(ps):
            raise EngineError(f"{self.name}: parameter names must be unique (state is saved "
                              "by name)")
        if grads is None:   # gradients given by the caller, through inputs of our own
            grads = {p: Tensor(p.shape, p.dtype, name=f"{p.name}.grad", flags=Flag.INPUT)
                     for p in ps}
        missing = [p.name for p in ps if p not in grads]
        if missing:
            raise EngineError(f"{self.name}: no gradient given for {missing}")
        return ps, dict(grads)

    def state_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    @classmethod
    def validate(cls, hp: dict, flags: dict) -> None:
        raise NotImplementedError

    # --- hyperparameters ------------------------------------------------------------------
    @property
    def hparams(self) -> dict[str, float]:
        return dict(zip(self.HPARAMS, self.hp.buffer().tolist(), strict=True))

    def checked_hparams(self, **hp) -> dict[str, float]:
        """The hyperparameters that set(**hp) would give, checked exactly as set() checks them
        (HyperparameterError), with nothing changed: lets a caller validate before it applies."""
        unknown = sorted(set(hp) - set(self.HPARAMS))
        if unknown:
            raise HyperparameterError(f"{self.name}: unknown hyperparameter(s) {unknown}; it "
                                      f"has {list(self.HPARAMS)}")
        new = {**self.hparams, **{k: float(_finite(k, v)) for k, v in hp.items()}}
        self.validate(new, self.flags)
        return new

    def set(self, **hp) -> None:
        """Change numeric hyperparameters between steps (validated; no rebuild). Setting lr
        also sets the base learning rate that a schedule multiplies."""
        new = self.checked_hparams(**hp)
        if "lr" in hp:
            self.base_lr = new["lr"]
        self.hp.set([new[k] for k in self.HPARAMS])

    @property
    def step_count(self) -> int:
        """Steps taken so far (every parameter's counter moves together)."""
        return int(self.state[self.params[0]]["step"].buffer()[0])

    # --- stepping -------------------------------------------------------------------------
    def step(self, backend="cpu") -> None:
        """One update of every parameter from its current gradient."""
        if self.schedule is not None:
            lr = self.base_lr * float(self.schedule(self.step_count))
            _nonnegative("lr (from the schedule)", lr)
            self.hp.buffer()[0] = lr
        self.graph.compute(backend)

    def reset_state(self) -> None:
        """Forget the moments and the step count (as a freshly built optimizer)."""
        for state in self.state.values():
            for t in state.values():
                t.fill(0)

    # --- state ----------------------------------------------------------------------------
    def state_arrays(self) -> dict[str, np.ndarray]:
        """Copies of every state tensor, keyed `<param name>.<state name>`."""
        return {t.name: t.numpy() for state in self.state.values() for t in state.values()}

    def load_state_arrays(self, arrays) -> None:
        """Restore `state_arrays()`: every name must be present, with the same shape."""
        want = {t.name: t for state in self.state.values() for t in state.values()}
        missing = sorted(set(want) - set(arrays))
        if missing:
            raise EngineError(f"{self.name}: optimizer state lacks {missing}")
        for name, t in want.items():
            a = np.asarray(arrays[name])
            if a.shape != t.shape:
                raise EngineError(f"{self.name}: state {name!r} has shape {list(a.shape)}, "
                                  f"expected {list(t.shape)}")
            t.set(a)

    def __repr__(self) -> str:
        hp = ", ".join(f"{k}={v:g}" for k, v in self.hparams.items())
        fl = "".join(f", {k}=True" for k, v in self.flags.items() if v)
        return f"{type(self).__name__}({len(self.params)} params, {hp}{fl})"


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov and L2 weight decay,
    as torch.optim.SGD (Sutskever et al. 2013 for the momentum form):

        d = -g if maximize else g;          d <- d + wd p
        b_1 = d,  b_t = mu b_{t-1} + (1 - dampening) d          (when mu != 0)
        d <- d + mu b_t if nesterov else b_t;                    p <- p - lr d
    """

    name, op, HPARAMS = "sgd", "sgd_step", SGD_HPARAMS

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, maximize=False, grads=None, schedule=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay),
                         dict(nesterov=nesterov, maximize=maximize), grads, schedule)

    def state_names(self):
        return ("momentum_buffer",)

    @classmethod
    def validate(cls, hp, flags):
        for k in ("lr", "momentum", "weight_decay"):
            _nonnegative(f"sgd: {k}", hp[k])
        if not 0.0 <= _finite("sgd: dampening", hp["dampening"]) <= 1.0:
            raise HyperparameterError(f"sgd: dampening must lie in [0, 1], got "
                                      f"{hp['dampening']!r}")
        if flags.get("nesterov") and (hp["momentum"] <= 0 or hp["dampening"] != 0):
            raise HyperparameterError("sgd: nesterov needs momentum > 0 and dampening = 0 "
                                      f"(got momentum={hp['momentum']}, "
                                      f"dampening={hp['dampening']})")


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015) with L2 weight decay, AMSGrad (Reddi et al. 2018) and maximize,
    as torch.optim.Adam:

        d = -g if maximize else g;      d <- d + wd p
        m <- b1 m + (1 - b1) d;         v <- b2 v + (1 - b2) d^2;       vmax <- max(vmax, v)
        p <- p - lr / (1 - b1^t) * m / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps)
    """

    name, op, HPARAMS = "adam", "adam_step", ADAM_HPARAMS
    DEFAULT_WEIGHT_DECAY = 0.0

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=None,
                 amsgrad=False, maximize=False, grads=None, schedule=None):
        try:
            beta1, beta2 = betas
        except (TypeError, ValueError):
            raise HyperparameterError(f"{self.name}: betas must be a pair (beta1, beta2), got "
                                      f"{betas!r}") from None
        wd = self.DEFAULT_WEIGHT_DECAY if weight_decay is None else weight_decay
        super().__init__(params, dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                                      weight_decay=wd),
                         dict(amsgrad=amsgrad, maximize=maximize), grads, schedule)

    def state_names(self):
        return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if self.flags["amsgrad"] else ())

    @classmethod
    def validate(cls, hp, flags):
        for k in ("lr", "eps", "weight_decay"):
            _nonnegative(f"{cls.name}: {k}", hp[k])
        _beta(f"{cls.name}: beta1", hp["beta1"])
        _beta(f"{cls.name}: beta2", hp["beta2"])


class AdamW(Adam):
    """AdamW (Loshchilov & Hutter 2019): Adam with decoupled weight decay, as
    torch.optim.AdamW and ggml's OPT_STEP_ADAMW: p <- p - lr wd p - lr * (Adam's step), and
    no L2 term in the gradient. The decay joins the step before the parameter is rounded
    (torch multiplies by 1 - lr wd first, which float32 rounds to 1 when lr wd is below
    2^-25, so that its decay does nothing; engine.backends.optim_math.adam_element).
    Default weight decay 0.01, as torch's."""

    name, op = "adamw", "adamw_step"
    DEFAULT_WEIGHT_DECAY = 1e-2


OPTIMIZERS: dict[str, type[Optimizer]] = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def make_optimizer(name: str, params, **kwargs) -> Optimizer:
    """An optimizer by name ('sgd', 'adam', 'adamw'), with its constructor's keywords."""
    try:
        cls = OPTIMIZERS[name]
    except KeyError:
        raise HyperparameterError(f"unknown optimizer {name!r}; known: "
                                  f"{', '.join(OPTIMIZERS)}") from None
    try:
        return cls(params, **kwargs)
    except TypeError as exc:
        raise HyperparameterError(f"{name}: {exc}") from None
