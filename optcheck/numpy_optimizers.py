"""The float64 numpy optimizers: SGD, Adam and AdamW in plain numpy, with exactly the
semantics of torch.optim, as a third opinion beside the engine and torch (the torch family
asks them which side of a diverging row is right; the invariant family follows them under a
schedule).

Each optimizer is a pair of pure functions, in the style of optax, acting on one parameter
tensor at a time:

    init(param, hp, flags) -> state
    update(param, grad, state, hp, flags) -> (new_param, new_state)

``hp`` maps hyperparameter names to numbers, ``flags`` maps flag names to bools (see
``HPARAM_NAMES`` and ``FLAG_NAMES``). ``state`` maps the names torch uses in its state dict
to float64 arrays; ``step`` has shape (1,) and counts the updates made so far. ``update``
never mutates its arguments. Everything is computed in float64, in the order of operations
of torch's single-tensor (``foreach=False``) CPU path, so the two agree to rounding.

Example::

    >>> import numpy as np
    >>> hp = {"lr": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    >>> flags = {"amsgrad": False, "maximize": False}
    >>> param = np.array([1.0, -2.0])
    >>> state = adam_init(param, hp, flags)
    >>> param, state = adam_update(param, np.array([0.5, 0.5]), state, hp, flags)
    >>> param  # the first Adam step moves every element by lr against the gradient's sign
    array([ 0.9, -2.1])

References:
    Sutskever, Martens, Dahl, Hinton (2013). On the importance of initialization and momentum
    in deep learning. ICML.
    Kingma, Ba (2015). Adam: A Method for Stochastic Optimization. ICLR.
    Reddi, Kale, Kumar (2018). On the Convergence of Adam and Beyond. ICLR.
    Loshchilov, Hutter (2019). Decoupled Weight Decay Regularization. ICLR.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Real

import numpy as np

State = dict[str, np.ndarray]
InitFn = Callable[[np.ndarray, Mapping[str, float], Mapping[str, bool]], State]
UpdateFn = Callable[..., tuple[np.ndarray, State]]

HPARAM_NAMES: dict[str, tuple[str, ...]] = {
    "sgd": ("lr", "momentum", "dampening", "weight_decay"),
    "adam": ("lr", "beta1", "beta2", "eps", "weight_decay"),
    "adamw": ("lr", "beta1", "beta2", "eps", "weight_decay"),
}
FLAG_NAMES: dict[str, tuple[str, ...]] = {
    "sgd": ("nesterov", "maximize"),
    "adam": ("amsgrad", "maximize"),
    "adamw": ("amsgrad", "maximize"),
}


def _as_float64(array) -> np.ndarray:
    """A float64 array (0-d stays 0-d: numpy arithmetic on 0-d arrays returns scalars)."""
    return np.asarray(array, dtype=np.float64)


def _checked_pair(param, grad) -> tuple[np.ndarray, np.ndarray]:
    param, grad = _as_float64(param), _as_float64(grad)
    if param.shape != grad.shape:
        raise ValueError(f"gradient shape {grad.shape} does not match parameter shape "
                         f"{param.shape}")
    return param, grad


def _lerp(start: np.ndarray, end: np.ndarray, weight: float) -> np.ndarray:
    """start + weight (end - start), rounded as torch's scalar ``lerp`` kernel rounds it."""
    if abs(weight) < 0.5:
        return start + weight * (end - start)
    return end - (end - start) * (1.0 - weight)


# ----------------------------------------------------------------------------- SGD

def sgd_init(param: np.ndarray, hp: Mapping[str, float], flags: Mapping[str, bool]) -> State:
    """State of SGD for one parameter: ``step`` = [0] and ``momentum_buffer`` = 0.

    The momentum buffer is always present (a fixed layout), but only read or written when
    momentum != 0; torch then creates it on the first step, which ``sgd_update`` mirrors.
    """
    param = _as_float64(param)
    return {"step": np.zeros(1), "momentum_buffer": np.zeros_like(param)}


def sgd_update(param: np.ndarray, grad: np.ndarray, state: State, hp: Mapping[str, float],
               flags: Mapping[str, bool]) -> tuple[np.ndarray, State]:
    """One step of SGD with momentum, dampening, Nesterov momentum and L2 weight decay.

    With learning rate gamma, momentum mu, dampening tau, weight decay lambda, and step
    t = 1, 2, ... (torch.optim.SGD):

        g_t   = -grad if maximize else grad
        g_t   = g_t + lambda theta_{t-1}                  (only if lambda != 0)
        if mu != 0:
            b_t = g_t                                     (t = 1: no dampening)
            b_t = mu b_{t-1} + (1 - tau) g_t              (t > 1)
            g_t = g_t + mu b_t   if nesterov   else   b_t
        theta_t = theta_{t-1} - gamma g_t

    Nesterov momentum is Sutskever et al. (2013), eq. 3-4, rewritten as torch writes it: in
    terms of the look-ahead point, with gamma outside the buffer (so b accumulates gradients,
    not steps); torch requires mu > 0 and tau = 0 for it.
    """
    param, grad = _checked_pair(param, grad)
    lr, momentum = float(hp["lr"]), float(hp["momentum"])
    dampening, weight_decay = float(hp["dampening"]), float(hp["weight_decay"])
    step = state["step"]
    buffer = state["momentum_buffer"]

    if flags["maximize"]:
        grad = -grad
    if weight_decay != 0:
        grad = grad + weight_decay * param
    if momentum != 0:
        if step[0] == 0:
            buffer = grad.copy()
        else:
            buffer = buffer * momentum + (1.0 - dampening) * grad
        grad = grad + momentum * buffer if flags["nesterov"] else buffer
    new_param = _as_float64(param - lr * grad)
    # np.array copies, so the new state never aliases the old one (momentum == 0 keeps it)
    return new_param, {"step": step + 1.0, "momentum_buffer": np.array(buffer, np.float64)}


# ----------------------------------------------------------------------------- Adam, AdamW

def adam_init(param: np.ndarray, hp: Mapping[str, float], flags: Mapping[str, bool]) -> State:
    """State of Adam (and AdamW) for one parameter.

    ``step`` = [0], moments ``exp_avg`` = ``exp_avg_sq`` = 0, and with amsgrad also the
    running maximum ``max_exp_avg_sq`` = 0.
    """
    param = _as_float64(param)
    state = {"step": np.zeros(1), "exp_avg": np.zeros_like(param),
             "exp_avg_sq": np.zeros_like(param)}
    if flags["amsgrad"]:
        state["max_exp_avg_sq"] = np.zeros_like(param)
    return state


def _adam_step(param: np.ndarray, grad: np.ndarray, state: State, hp: Mapping[str, float],
               flags: Mapping[str, bool], decoupled: bool) -> tuple[np.ndarray, State]:
    param, grad = _checked_pair(param, grad)
    lr, beta1, beta2 = float(hp["lr"]), float(hp["beta1"]), float(hp["beta2"])
    eps, weight_decay = float(hp["eps"]), float(hp["weight_decay"])
    step = state["step"] + 1.0
    t = float(step[0])

    if flags["maximize"]:
        grad = -grad
    if weight_decay != 0:
        if decoupled:
            param = param * (1.0 - lr * weight_decay)
        else:
            grad = grad + weight_decay * param
    exp_avg = _lerp(state["exp_avg"], grad, 1.0 - beta1)
    exp_avg_sq = state["exp_avg_sq"] * beta2 + (1.0 - beta2) * grad * grad

    bias_correction1 = 1.0 - beta1**t
    bias_correction2 = 1.0 - beta2**t
    step_size = lr / bias_correction1
    new_state = {"step": step, "exp_avg": _as_float64(exp_avg),
                 "exp_avg_sq": _as_float64(exp_avg_sq)}
    if flags["amsgrad"]:
        second_moment = _as_float64(np.maximum(state["max_exp_avg_sq"], exp_avg_sq))
        new_state["max_exp_avg_sq"] = second_moment
    else:
        second_moment = exp_avg_sq
    denom = np.sqrt(second_moment) / bias_correction2**0.5 + eps
    new_param = _as_float64(param - step_size * exp_avg / denom)
    return new_param, new_state


def adam_update(param: np.ndarray, grad: np.ndarray, state: State, hp: Mapping[str, float],
                flags: Mapping[str, bool]) -> tuple[np.ndarray, State]:
    """One step of Adam (Kingma & Ba 2015, Algorithm 1), with L2 weight decay and AMSGrad.

    With learning rate gamma, betas beta1 and beta2, eps, weight decay lambda and step
    t = 1, 2, ... (torch.optim.Adam):

        g_t = -grad if maximize else grad
        g_t = g_t + lambda theta_{t-1}                    (only if lambda != 0; L2 decay)
        m_t = beta1 m_{t-1} + (1 - beta1) g_t
        v_t = beta2 v_{t-1} + (1 - beta2) g_t^2
        vmax_t = max(vmax_{t-1}, v_t)                     (amsgrad only)
        theta_t = theta_{t-1} - gamma / (1 - beta1^t) * m_t
                  / (sqrt(v_t) / sqrt(1 - beta2^t) + eps)        (v_t -> vmax_t if amsgrad)

    AMSGrad (Reddi et al. 2018, Algorithm 2) takes the running maximum of v; as torch does,
    the maximum is over the uncorrected v and the current bias correction is applied to it.
    m_t is computed as m_{t-1} + (1 - beta1)(g_t - m_{t-1}), torch's ``lerp``, which equals
    the line above up to rounding.
    """
    return _adam_step(param, grad, state, hp, flags, decoupled=False)


def adamw_update(param: np.ndarray, grad: np.ndarray, state: State, hp: Mapping[str, float],
                 flags: Mapping[str, bool]) -> tuple[np.ndarray, State]:
    """One step of AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019).

    As ``adam_update``, except that weight decay does not enter the gradient; the parameter
    shrinks first and the Adam step is taken from the shrunk parameter (torch.optim.AdamW):

        theta'  = theta_{t-1} (1 - gamma lambda)          (only if lambda != 0)
        theta_t = theta' - gamma / (1 - beta1^t) * m_t / (sqrt(v_t) / sqrt(1 - beta2^t) + eps)

    The decay is scaled by gamma, as in torch (the paper's Algorithm 2 scales it by the
    schedule multiplier eta_t alone).
    """
    return _adam_step(param, grad, state, hp, flags, decoupled=True)


NUMPY_OPTIMIZERS: dict[str, tuple[InitFn, UpdateFn]] = {
    "sgd": (sgd_init, sgd_update),
    "adam": (adam_init, adam_update),
    "adamw": (adam_init, adamw_update),
}


# ----------------------------------------------------------------------------- validation

def _check_keys(name: str, kind: str, given: Mapping, expected: tuple[str, ...]) -> None:
    unknown = sorted(set(given) - set(expected), key=str)
    missing = [key for key in expected if key not in given]
    if unknown:
        raise ValueError(f"{name}: unknown {kind}(s) {', '.join(map(repr, unknown))}; "
                         f"expected {', '.join(expected)}")
    if missing:
        raise ValueError(f"{name}: missing {kind}(s) {', '.join(map(repr, missing))}")


def _check_interval(name: str, key: str, value: float, low: float, high: float,
                    high_open: bool) -> None:
    inside = low <= value < high if high_open else low <= value <= high
    if not inside:
        interval = f"[{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name}: {key} must be in {interval}, got {value!r}")


def validate_hparams(name: str, hp: Mapping[str, float], flags: Mapping[str, bool]) -> None:
    """Raise ``ValueError`` naming the offending optimizer, key or value; return None if valid.

    Checks: the optimizer is known; hp and flags have exactly the expected keys; every hp is
    a finite real number and every flag a bool; lr >= 0, weight_decay >= 0; for SGD
    momentum >= 0, dampening in [0, 1], and Nesterov only with momentum > 0 and dampening = 0
    (as torch.optim.SGD); for Adam/AdamW beta1, beta2 in [0, 1) and eps >= 0.
    """
    if name not in NUMPY_OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; known: "
                         f"{', '.join(sorted(NUMPY_OPTIMIZERS))}")
    _check_keys(name, "hyperparameter", hp, HPARAM_NAMES[name])
    _check_keys(name, "flag", flags, FLAG_NAMES[name])
    for key, value in hp.items():
        if isinstance(value, bool | np.bool_) or not isinstance(value, Real) \
                or not math.isfinite(value):
            raise ValueError(f"{name}: {key} must be a finite real number, got {value!r}")
    for key, value in flags.items():
        if not isinstance(value, bool | np.bool_):
            raise ValueError(f"{name}: flag {key} must be a bool, got {value!r}")

    for key in ("lr", "weight_decay"):
        if hp[key] < 0:
            raise ValueError(f"{name}: {key} must be >= 0, got {hp[key]!r}")
    if name == "sgd":
        if hp["momentum"] < 0:
            raise ValueError(f"{name}: momentum must be >= 0, got {hp['momentum']!r}")
        _check_interval(name, "dampening", hp["dampening"], 0.0, 1.0, high_open=False)
        if flags["nesterov"] and (hp["momentum"] <= 0 or hp["dampening"] != 0):
            raise ValueError(f"{name}: nesterov requires momentum > 0 and dampening == 0, got "
                             f"momentum={hp['momentum']!r}, dampening={hp['dampening']!r}")
    else:
        _check_interval(name, "beta1", hp["beta1"], 0.0, 1.0, high_open=True)
        _check_interval(name, "beta2", hp["beta2"], 0.0, 1.0, high_open=True)
        if hp["eps"] < 0:
            raise ValueError(f"{name}: eps must be >= 0, got {hp['eps']!r}")


def numpy_trajectory(name: str, param0: np.ndarray, grads: Sequence[np.ndarray],
                     hp: Mapping[str, float], flags: Mapping[str, bool],
                     ) -> list[tuple[np.ndarray, State]]:
    """The trajectory of the numpy optimizer ``name`` from ``param0`` under the given gradients.

    Validates ``hp`` and ``flags``, then returns [(theta_t, state_t) for t = 1..len(grads)],
    where step t applies ``grads[t-1]``. The gradients are fixed in advance; to follow a
    gradient that depends on the parameter, call ``init`` and ``update`` from
    ``NUMPY_OPTIMIZERS``.
    """
    validate_hparams(name, hp, flags)
    init, update = NUMPY_OPTIMIZERS[name]
    param = np.array(param0, dtype=np.float64)
    state = init(param, hp, flags)
    trajectory = []
    for grad in grads:
        param, state = update(param, grad, state, hp, flags)
        trajectory.append((param, state))
    return trajectory
