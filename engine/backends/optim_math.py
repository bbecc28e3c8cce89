"""The scalar math of the optimizer steps, written once for the CPU and the CUDA kernels
(engine.backends.cpu.optim and engine.backends.cuda.optim), which inline it (scalar_math).

Per step, `sgd_scalars` and `adam_scalars` derive from the hyperparameters (read by the
kernels from the tensor `hp`, in the layout of engine.hyperparams) the scalars of the
update, in float64: bias corrections, step size, decay factor, the branches taken. Per
element, `sgd_element` and `adam_element` round those scalars to the parameter's dtype,
which the element itself carries (`type(x)`), and run the update in that dtype, in the
order torch.optim's single-tensor implementations use, so that float32 trajectories follow
torch's to a few ulps per step. In a compiled kernel the rounding does not depend on the
element and is hoisted out of the loop: it runs once per step.

The kernels hand these functions scalars, never arrays: under the CUDA simulator a kernel
runs as Python and calls them as compiled CPU functions, which cannot take the simulator's
device arrays; and the scalars come back from such a call as Python floats, which the
per-element rounding takes back to the parameter's dtype. The one reader of an array,
`sgd_hp_scalars` / `adam_hp_scalars` (the scalars of the hyperparameter tensor `hp`, read by
position), is a numba register_jitable function instead: compiled into the CPU and GPU
kernels, called as plain Python by the simulator's.
"""

from __future__ import annotations

import collections
import math

from numba.extending import register_jitable

from engine.backends.cpu.jit import scalar_math
from engine.hyperparams import (
    ADAM_BETA1,
    ADAM_BETA2,
    ADAM_EPS,
    ADAM_LR,
    ADAM_WEIGHT_DECAY,
    SGD_DAMPENING,
    SGD_LR,
    SGD_MOMENTUM,
    SGD_WEIGHT_DECAY,
)

SgdScalars = collections.namedtuple(
    "SgdScalars", ["neg_lr", "momentum", "keep", "weight_decay", "use_wd", "use_momentum"])
AdamScalars = collections.namedtuple(
    "AdamScalars", ["neg_step_size", "bc2_sqrt", "neg_decay", "use_l2", "l2", "w1", "lerp_low",
                    "beta2", "w2", "eps"])


@scalar_math
def sgd_scalars(lr, momentum, dampening, weight_decay):
    """SGD's scalars (float64): -lr, mu, keep = 1 - dampening, wd, whether wd != 0 and
    whether mu != 0."""
    return SgdScalars(-lr, momentum, 1.0 - dampening, weight_decay, weight_decay != 0.0,
                      momentum != 0.0)


@scalar_math
def adam_scalars(lr, beta1, beta2, eps, weight_decay, n, decoupled):
    """Adam's (decoupled False) or AdamW's (True) scalars of step n (float64):

        neg_step_size = -lr / (1 - b1^n),   bc2_sqrt = sqrt(1 - b2^n)
        neg_decay = -lr wd for AdamW, 0 for Adam (an unconditional multiply-add: a branch
            on it kept LLVM from vectorising the CPU loop, 4-5x slower)
        use_l2 = Adam with wd != 0, l2 = wd
        w1 = 1 - b1, lerp_low = w1 < 0.5 (which of its two forms torch's lerp takes)
        beta2 = b2, w2 = 1 - b2, eps
    """
    return AdamScalars(-lr / (1.0 - beta1 ** n), math.sqrt(1.0 - beta2 ** n),
                       -lr * weight_decay if decoupled else 0.0,
                       (not decoupled) and weight_decay != 0.0, weight_decay, 1.0 - beta1,
                       (1.0 - beta1) < 0.5, beta2, 1.0 - beta2, eps)


@register_jitable
def sgd_hp_scalars(hp):
    """sgd_scalars of the hyperparameter tensor hp (engine.hyperparams' layout)."""
    return sgd_scalars(hp[SGD_LR], hp[SGD_MOMENTUM], hp[SGD_DAMPENING], hp[SGD_WEIGHT_DECAY])


@register_jitable
def adam_hp_scalars(hp, n, decoupled):
    """adam_scalars of step n from the hyperparameter tensor hp (engine.hyperparams'
    layout)."""
    return adam_scalars(hp[ADAM_LR], hp[ADAM_BETA1], hp[ADAM_BETA2], hp[ADAM_EPS],
                        hp[ADAM_WEIGHT_DECAY], n, decoupled)


@scalar_math
def sgd_element(x, g, b, first, s, nesterov, maximize):
    """One SGD element, `s` = sgd_scalars(...): (new param, new momentum buffer), in torch's
    operation order, in x's dtype."""
    t = type(x)
    d = -g if maximize else g
    if s.use_wd:
        d = d + t(s.weight_decay) * x
    if s.use_momentum:
        mu = t(s.momentum)
        b = d if first else b * mu + t(s.keep) * d
        d = d + mu * b if nesterov else b
    return x + t(s.neg_lr) * d, b


@scalar_math
def adam_element(x, g, m, v, vmax, s, amsgrad, maximize):
    """One Adam/AdamW element, `s` = adam_scalars(...): (new param, m, v, max v), in torch's
    operation order (lerp form, addcdiv order), in x's dtype, but for AdamW's decoupled
    decay: torch multiplies the parameter by 1 - lr wd first, which in float32 rounds to 1
    when lr wd < 2^-25 (lr 1e-4, wd 1e-5) and so decays nothing (pytorch/pytorch#64475);
    here the decay -lr wd x joins the step before the one rounding of the new parameter, so
    it acts however small it is (optcheck's known-bugs family, decay_rounding)."""
    t = type(x)
    d = -g if maximize else g
    decay = t(s.neg_decay) * x
    if s.use_l2:
        d = d + t(s.l2) * x
    # m.lerp_(d, 1 - b1), in the two forms torch's lerp uses
    w1 = t(s.w1)
    m = m + w1 * (d - m) if s.lerp_low else d - (d - m) * (t(1.0) - w1)
    v = v * t(s.beta2) + t(s.w2) * d * d
    if amsgrad and v > vmax:
        vmax = v
    denom_v = vmax if amsgrad else v
    # torch's addcdiv order: (value * m) / denom
    step = (t(s.neg_step_size) * m) / (math.sqrt(denom_v) / t(s.bc2_sqrt) + t(s.eps))
    return x + (step + decay), m, v, vmax
