"""CPU kernels of the optimizer steps: one fused pass over each parameter tensor.

Each kernel updates the parameter and its state in place, reading the hyperparameters from
the small float64 tensor `hp` (so a schedule changes them without recompiling or
replanning) and counting the step in the float64 tensor `step` (shape (1,)). Scalars derived
from the hyperparameters (bias corrections, step size, decay factor) are computed once in
float64 and rounded to the parameter's dtype, and the per-element arithmetic runs in that
dtype in the order torch.optim's single-tensor implementations use, so that float32
trajectories follow torch's to a few ulps per step.
"""

from __future__ import annotations

import math

from engine.backends.cpu.jit import bindable, call, parallel_kernel, prange, scalar_math

SGD_HP = ("lr", "momentum", "dampening", "weight_decay")
ADAM_HP = ("lr", "beta1", "beta2", "eps", "weight_decay")


@scalar_math
def sgd_element(x, g, b, first, neg_lr, mu, keep, wd, use_wd, use_mu, nesterov, maximize):
    """One SGD element: (new param, new momentum buffer), in torch's operation order.
    Shared by the CPU and CUDA kernels."""
    d = -g if maximize else g
    if use_wd:
        d = d + wd * x
    if use_mu:
        b = d if first else b * mu + keep * d
        d = d + mu * b if nesterov else b
    return x + neg_lr * d, b


@scalar_math
def adam_element(x, g, m, v, vmax, decay, use_l2, l2, w1, lerp_low, w1c, beta2, w2, e,
                 neg_step_size, bc2_sqrt, amsgrad, maximize):
    """One Adam/AdamW element: (new param, m, v, max v), in torch's operation order (lerp
    form, addcdiv order). Shared by the CPU and CUDA kernels."""
    d = -g if maximize else g
    x = x * decay
    if use_l2:
        d = d + l2 * x
    # m.lerp_(d, 1 - b1), in the two forms torch's lerp uses
    m = m + w1 * (d - m) if lerp_low else d - (d - m) * w1c
    v = v * beta2 + w2 * d * d
    if amsgrad and v > vmax:
        vmax = v
    denom_v = vmax if amsgrad else v
    # torch's addcdiv order: (value * m) / denom
    return x + (neg_step_size * m) / (math.sqrt(denom_v) / bc2_sqrt + e), m, v, vmax


@parallel_kernel
def _sgd(p, g, buf, step, hp, nesterov, maximize):
    """SGD with momentum, dampening, Nesterov and L2 weight decay (torch.optim.SGD):

        d = -g if maximize else g;   d += wd p
        b = d on the first step, else b = mu b + (1 - dampening) d     (when mu != 0)
        d = d + mu b if nesterov else b;   p = p - lr d
    """
    step[0] += 1.0
    first = step[0] == 1.0
    t = p.dtype.type
    neg_lr = t(-hp[0])
    mu = t(hp[1])
    keep = t(1.0 - hp[2])
    wd = t(hp[3])
    use_wd = hp[3] != 0.0
    use_mu = hp[1] != 0.0
    for i in prange(p.size):
        p[i], b = sgd_element(p[i], g[i], buf[i], first, neg_lr, mu, keep, wd, use_wd,
                              use_mu, nesterov, maximize)
        if use_mu:
            buf[i] = b


@parallel_kernel
def _adam(p, g, m, v, vmax, step, hp, decoupled, amsgrad, maximize):
    """Adam (L2 weight decay) or AdamW (decoupled weight decay), with AMSGrad and maximize
    (torch.optim.Adam / AdamW):

        d = -g if maximize else g
        AdamW: p = (1 - lr wd) p          Adam: d += wd p
        m = m + (1 - b1)(d - m);   v = b2 v + (1 - b2) d^2;   vmax = max(vmax, v)
        p = p - lr / (1 - b1^t) * m / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps)
    """
    step[0] += 1.0
    n = step[0]
    lr, b1, b2, eps, wd = hp[0], hp[1], hp[2], hp[3], hp[4]
    t = p.dtype.type
    neg_step_size = t(-lr / (1.0 - b1 ** n))
    bc2_sqrt = t(math.sqrt(1.0 - b2 ** n))
    # decoupled decay as an unconditional multiply (by 1 without it): a branch here kept
    # LLVM from vectorising the loop (4-5x slower)
    decay = t(1.0 - lr * wd) if decoupled else t(1.0)
    use_l2 = (not decoupled) and wd != 0.0
    l2 = t(wd)
    w1 = t(1.0 - b1)
    lerp_low = (1.0 - b1) < 0.5
    w1c = t(1.0) - w1
    beta2 = t(b2)
    w2 = t(1.0 - b2)
    e = t(eps)
    for i in prange(p.size):
        p[i], m[i], v[i], vm = adam_element(p[i], g[i], m[i], v[i], vmax[i], decay, use_l2, l2,
                                            w1, lerp_low, w1c, beta2, w2, e, neg_step_size,
                                            bc2_sqrt, amsgrad, maximize)
        if amsgrad:
            vmax[i] = vm


def _flat(a):
    return a.reshape(-1)


@bindable
def sgd_step(out, ins, nesterov=False, maximize=False):
    """ins: param, grad, step, hp, momentum_buffer; `out` is the param's own buffer."""
    _, g, step, hp, buf = ins
    return call(_sgd, _flat(out), _flat(g), _flat(buf), step, hp, nesterov, maximize)


@bindable
def adam_step(out, ins, amsgrad=False, maximize=False, decoupled=False):
    """ins: param, grad, step, hp, exp_avg, exp_avg_sq[, max_exp_avg_sq]."""
    g, step, hp, m, v = ins[1], ins[2], ins[3], ins[4], ins[5]
    vmax = ins[6] if amsgrad else v
    return call(_adam, _flat(out), _flat(g), _flat(m), _flat(v), _flat(vmax), step, hp,
                decoupled, amsgrad, maximize)


def adam_kernel(decoupled: bool):
    """The kernel of adam_step (decoupled=False) or adamw_step (True): adam_step with the
    weight decay's kind fixed, bindable by a plan."""
    @bindable
    def prepare(out, ins, amsgrad=False, maximize=False):
        return adam_step.bind(out, ins, amsgrad=amsgrad, maximize=maximize,
                              decoupled=decoupled)
    return prepare
