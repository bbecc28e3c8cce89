"""A hand-written numpy AdamW, as a user of optcheck.api writes one, and the same with a
known bug (eps inside the square root), for the optimizer-adapter tests. Also an adapter
class for `optcheck --engine tests.optcheck.numpy_adamw:AdamWAdapter`."""

from __future__ import annotations

import numpy as np

from optcheck.adapters.numpy_adapter import NumpyUpdate


def init(params):
    return {k: {"exp_avg": np.zeros_like(p), "exp_avg_sq": np.zeros_like(p)}
            for k, p in params.items()}


def _update(params, grads, state, step, hparams, eps_inside=False):
    lr, (b1, b2), eps, wd = (hparams["lr"], hparams["betas"], hparams["eps"],
                             hparams["weight_decay"])
    sign = -1.0 if hparams.get("maximize") else 1.0
    new_params, new_state = {}, {}
    for k, p in params.items():
        g = sign * grads[k]
        m = b1 * state[k]["exp_avg"] + (1 - b1) * g
        v = b2 * state[k]["exp_avg_sq"] + (1 - b2) * g * g
        if hparams.get("amsgrad"):
            v_max = np.maximum(state[k].get("max_exp_avg_sq", v), v)
        m_hat = m / (1 - b1 ** step)
        v_hat = (v_max if hparams.get("amsgrad") else v) / (1 - b2 ** step)
        denom = np.sqrt(v_hat + eps) if eps_inside else np.sqrt(v_hat) + eps
        # the decay joins the step before p is rounded: p * (1 - lr*wd) on its own rounds
        # to p in float32 when lr*wd < 2^-25 (pytorch/pytorch#64475)
        new_params[k] = (p - (lr * m_hat / denom + lr * wd * p)).astype(p.dtype)
        new_state[k] = {"exp_avg": m, "exp_avg_sq": v}
        if hparams.get("amsgrad"):
            new_state[k]["max_exp_avg_sq"] = v_max
    return new_params, new_state


def update(params, grads, state, step, hparams):
    return _update(params, grads, state, step, hparams)


def update_eps_inside_sqrt(params, grads, state, step, hparams):
    return _update(params, grads, state, step, hparams, eps_inside=True)


def update_decay_multiplied_first(params, grads, state, step, hparams):
    """The decay as its own multiply, p * (1 - lr*wd), before the step (torch's order)."""
    lr, wd = hparams["lr"], hparams["weight_decay"]
    decayed = {k: (p * (1 - lr * wd)).astype(p.dtype) for k, p in params.items()}
    return _update(decayed, grads, state, step, {**hparams, "weight_decay": 0.0})


def update_wrong_shape(params, grads, state, step, hparams):
    new, state = _update(params, grads, state, step, hparams)
    return {k: v.reshape(-1)[:1] for k, v in new.items()}, state


class AdamWAdapter(NumpyUpdate):
    """The correct numpy AdamW as a `module:attribute` adapter."""

    def __init__(self):
        super().__init__(init, update, "adamw", "numpy-adamw")
