"""Known bugs of optimizer kernels and learning-rate schedules, put in place one at a time to
prove optcheck's power.

Each mutant replaces the CPU kernel of some step ops by a numpy implementation of the same
update with exactly one mistake (the correct rule is in engine/backends/cpu/optim.py); the
kernel layout is the engine's: `kernel(out, ins, **flags)`, `out` the parameter's buffer,
`ins` = param, grad, step, hp, *state. `optcheck --self-test` runs every family against each
mutant and reports which caught it. A mutant for 16-bit parameters names its dtype: the
backend runs its numpy kernel on float32 copies and rounds the parameter to nearest even on
store, so the kernel's bug is what it does to those float32 values (rounding the state to
16 bits; rounding the parameter toward zero first, which the store then keeps).

A schedule mutant replaces instead the factor of a learning-rate schedule of
engine.optim.schedules (`schedules`: its name -> the mutated `__call__(self, t)`): a warmup
whose second phase is evaluated at t instead of t - warmup_steps, a bug that comparing the
engine with itself cannot see and the torch family's SequentialLR rows do.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from engine.optim import schedules
from engine.registry import get_op
from engine.tensor import DTYPES


def _to_half(x, half):
    """float32 array `x` rounded to 16-bit dtype `half` ('f16', 'bf16'), to nearest even,
    kept in float32 (what storing it in 16 bits keeps)."""
    return x.astype(DTYPES[half]).astype(x.dtype)


def _truncated(x, half):
    """float32 array `x` rounded toward zero to 16-bit dtype `half`, kept in float32: where
    rounding to nearest went away from zero, one ulp less in magnitude (the 16-bit pattern
    minus 1: sign and magnitude, so this holds across binades and subnormals)."""
    near = x.astype(DTYPES[half])
    away = np.abs(near.astype(x.dtype)) > np.abs(x)
    bits = near.view(np.uint16)
    bits[away] -= np.uint16(1)
    return bits.view(DTYPES[half]).astype(x.dtype)


def _stored(bug, half):
    """What the kernel does to a new parameter `p` (in place) before the backend stores it:
    nothing, or, for "param_truncated", rounding toward zero in 16 bits (the backend's
    rounding to nearest of a value already in 16 bits changes nothing)."""
    def store(p):
        if bug == "param_truncated":
            p[...] = _truncated(p, half)
    return store


def _sgd(bug, half=None):
    store, rounded = _stored(bug, half), bug == "state_rounded"

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
            if rounded:
                buf[...] = _to_half(buf, half)
            d = d + mu * buf if nesterov and bug != "nesterov_term_missing" else buf
        p -= lr * d
        store(p)
    return kernel


def _adam(bug, decoupled, half=None):
    store, rounded = _stored(bug, half), bug == "state_rounded"

    def kernel(out, ins, amsgrad=False, maximize=False):
        p, g, step, hp, m, v = out, ins[1], ins[2], ins[3], ins[4], ins[5]
        step[0] += 1
        t = float(step[0])
        lr, b1, b2, eps, wd = (float(x) for x in hp)
        d = -g if maximize else g.copy()
        if decoupled and bug != "decay_coupled":
            p *= 1 - lr * wd
            if bug == "decay_rounded_apart":     # decay and update rounded one by one
                p[...] = _to_half(p, half)
        elif wd:
            d = d + wd * p
        m[...] = b1 * m + (1 - b1) * d
        v[...] = b2 * v + (1 - b2) * d * d
        if rounded:
            m[...], v[...] = _to_half(m, half), _to_half(v, half)
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
        store(p)
    return kernel


def _unshifted(schedule_class):
    """`schedule_class`'s factor (a warmup, then a second phase at t - warmup_steps) with the
    second phase at t: the correct factor n steps later, from the milestone n on."""
    correct = schedule_class.__call__

    def factor(self, t):
        n = self.warmup_steps
        return correct(self, t if t < n else t + n)
    return factor


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    kernels: dict            # op name -> mutated kernel
    optimizers: tuple[str, ...]
    dtype: str | None = None     # the parameter dtype it is run in (None: the self-test's)
    # engine schedule name (engine.optim.schedules) -> mutated __call__(self, t)
    schedules: dict = dataclasses.field(default_factory=dict)


def _adam_pair(bug, half=None):
    return {"adam_step": _adam(bug, False, half), "adamw_step": _adam(bug, True, half)}


def _all_three(bug, half=None):
    return {"sgd_step": _sgd(bug, half), **_adam_pair(bug, half)}


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
    # 16-bit parameters (their kernels run widened to float32 by the backend, which rounds
    # the new parameter to nearest even on store): what the precision family is for
    Mutant("state_in_bf16", "moments and momentum buffer rounded to bfloat16 every step "
           "(torch.optim's state for a bfloat16 parameter) instead of kept in float32",
           _all_three("state_rounded", "bf16"), ("sgd", "adam", "adamw"), "bf16"),
    Mutant("param_truncated_f16", "the new float16 parameter rounded toward zero "
           "(truncated) on store instead of to nearest even",
           _all_three("param_truncated", "f16"), ("sgd", "adam", "adamw"), "f16"),
    # learning-rate schedules: a bug of the factor, not of a kernel
    Mutant("warmup_cosine_unshifted", "warmup_cosine's cosine phase evaluated at t instead "
           "of t - warmup_steps", {}, ("sgd",),
           schedules={"warmup_cosine": _unshifted(schedules.WarmupCosine)}),
    Mutant("warmup_step_unshifted", "warmup_step's step decay evaluated at t instead of "
           "t - warmup_steps", {}, ("sgd",),
           schedules={"warmup_step": _unshifted(schedules.WarmupStep)}),
]}


# The same numpy kernels without a bug: the self-test's control, which every family must
# pass, so that a caught mutant is caught for its bug and not for the numpy rewrite.
CONTROL = Mutant("control", "the mutants' numpy kernels without any bug",
                 _all_three(None), ("sgd", "adam", "adamw"))


def control(dtype: str) -> Mutant:
    """The control in parameter dtype `dtype` (the self-test runs one per dtype that its
    mutants run in): CONTROL itself, run in that dtype."""
    return dataclasses.replace(CONTROL, name=f"control_{dtype}", dtype=dtype)


@contextlib.contextmanager
def mutated(mutant: Mutant, backend: str = "cpu"):
    """Put `mutant`'s kernels and schedule factors in place for the duration of the block,
    then restore."""
    saved, saved_calls = {}, {}
    try:
        for op_name, kernel in mutant.kernels.items():
            op = get_op(op_name)
            saved[op_name] = dict(op.kernels)
            op.kernels[backend] = kernel
        for name, factor in mutant.schedules.items():
            schedule_class = getattr(schedules, name)
            saved_calls[schedule_class] = schedule_class.__call__
            schedule_class.__call__ = factor
        yield mutant
    finally:
        for op_name, kernels in saved.items():
            op = get_op(op_name)
            op.kernels.clear()
            op.kernels.update(kernels)
        for schedule_class, call in saved_calls.items():
            schedule_class.__call__ = call
