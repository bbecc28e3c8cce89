"""Known bugs of optimizer kernels, put in place one at a time to prove optcheck's power.

Each mutant replaces the CPU kernel of some step ops by a numpy implementation of the same
update with exactly one mistake (the correct rule is in engine/backends/cpu/optim.py); the
kernel layout is the engine's: `kernel(out, ins, **flags)`, `out` the parameter's buffer,
`ins` = param, grad, step, hp, *state. `optcheck --self-test` runs every family against each
mutant and reports which caught it.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from engine.registry import get_op


def _sgd(bug):
    def kernel(out, ins, nesterov=False, maximize=False):
        p, g, step, hp, buf = out, ins[1], ins[2], ins[3], ins[4]
        step[0] += 1
        lr, mu, damp, wd = (float(x) for x in hp)
        d = -g if maximize else g.copy()
        if wd:
            d = d + wd * p
        if mu:
            if step[0] == 1:
                buf[...] = d
            elif bug == "dampening_ignored":
                buf[...] = mu * buf + d
            else:
                buf[...] = mu * buf + (1 - damp) * d
            d = d + mu * buf if nesterov and bug != "nesterov_term_missing" else buf
        p -= lr * d
    return kernel


def _adam(bug, decoupled):
    def kernel(out, ins, amsgrad=False, maximize=False):
        p, g, step, hp, m, v = out, ins[1], ins[2], ins[3], ins[4], ins[5]
        step[0] += 1
        t = float(step[0])
        lr, b1, b2, eps, wd = (float(x) for x in hp)
        d = -g if maximize else g.copy()
        if decoupled and bug != "decay_coupled":
            p *= 1 - lr * wd
        elif wd:
            d = d + wd * p
        m[...] = b1 * m + (1 - b1) * d
        v[...] = b2 * v + (1 - b2) * d * d
        vv = v
        if amsgrad:
            vmax = ins[6]
            if bug == "amsgrad_max_not_kept":
                vmax[...] = v
            else:
                np.maximum(vmax, v, out=vmax)
            vv = vmax
        bc1, bc2 = (1.0, 1.0) if bug == "bias_correction_dropped" else (1 - b1**t, 1 - b2**t)
        if bug == "eps_inside_sqrt":
            denom = np.sqrt(vv / bc2 + eps)
        else:
            denom = np.sqrt(vv) / np.sqrt(bc2) + eps
        p -= (lr / bc1) * m / denom
    return kernel


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    kernels: dict            # op name -> mutated kernel
    optimizers: tuple[str, ...]


def _adam_pair(bug):
    return {"adam_step": _adam(bug, False), "adamw_step": _adam(bug, True)}


MUTANTS = {m.name: m for m in [
    Mutant("bias_correction_dropped", "Adam/AdamW without the 1/(1 - beta^t) corrections",
           _adam_pair("bias_correction_dropped"), ("adam", "adamw")),
    Mutant("eps_inside_sqrt", "Adam/AdamW divide by sqrt(v_hat + eps) instead of "
           "sqrt(v_hat) + eps", _adam_pair("eps_inside_sqrt"), ("adam", "adamw")),
    Mutant("decay_coupled", "AdamW adds wd*p to the gradient (L2) instead of decaying p",
           {"adamw_step": _adam("decay_coupled", True)}, ("adamw",)),
    Mutant("nesterov_term_missing", "SGD with nesterov=True steps along the buffer alone",
           {"sgd_step": _sgd("nesterov_term_missing")}, ("sgd",)),
    Mutant("dampening_ignored", "SGD momentum adds the whole gradient, ignoring dampening",
           {"sgd_step": _sgd("dampening_ignored")}, ("sgd",)),
    Mutant("amsgrad_max_not_kept", "AMSGrad overwrites max(v) with the current v",
           _adam_pair("amsgrad_max_not_kept"), ("adam", "adamw")),
]}


# The same numpy kernels without a bug: the self-test's control, which every family must
# pass, so that a caught mutant is caught for its bug and not for the numpy rewrite.
CONTROL = Mutant("control", "the mutants' numpy kernels without any bug",
                 {"sgd_step": _sgd(None), **_adam_pair(None)}, ("sgd", "adam", "adamw"))


@contextlib.contextmanager
def mutated(mutant: Mutant, backend: str = "cpu"):
    """Put `mutant`'s kernels in place for the duration of the block, then restore."""
    saved = {}
    try:
        for op_name, kernel in mutant.kernels.items():
            op = get_op(op_name)
            saved[op_name] = dict(op.kernels)
            op.kernels[backend] = kernel
        yield mutant
    finally:
        for op_name, kernels in saved.items():
            op = get_op(op_name)
            op.kernels.clear()
            op.kernels.update(kernels)
