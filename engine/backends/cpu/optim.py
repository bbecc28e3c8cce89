"""CPU kernels of the optimizer steps: one fused pass over each parameter tensor.

Each kernel updates the parameter and its state in place, reading the hyperparameters from
the small float64 tensor `hp` (layout: engine.hyperparams; a schedule changes them without
recompiling or replanning) and counting the step in the float64 tensor `step` (shape (1,)).
The scalars derived from the hyperparameters and the per-element update are the CUDA
kernels' too (engine.backends.optim_math): the scalars are computed once per step in float64
and rounded to the parameter's dtype, and the per-element arithmetic runs in that dtype in
torch.optim's operation order.

A float16 or bfloat16 parameter (with its gradient in its dtype and its state in float32,
engine.ops.optimizer_steps.state_dtype) runs these same float32 kernels through the
backend's widening (engine.backends.cpu.half.widened, update=True): parameter and gradient
widened exactly into float32 temporaries, the float32 state updated in place as it is, and
the new parameter rounded to nearest even once, when stored back. Nothing of the state is
rounded to 16 bits.
"""

from __future__ import annotations

from engine.backends.cpu.jit import bindable, call, parallel_kernel, prange
from engine.backends.optim_math import (
    adam_element,
    adam_hp_scalars,
    sgd_element,
    sgd_hp_scalars,
)


@parallel_kernel
def _sgd(p, g, buf, step, hp, nesterov, maximize):
    """SGD with momentum, dampening, Nesterov and L2 weight decay (torch.optim.SGD):

        d = -g if maximize else g;   d += wd p
        b = d on the first step, else b = mu b + (1 - dampening) d     (when mu != 0)
        d = d + mu b if nesterov else b;   p = p - lr d
    """
    step[0] += 1.0
    first = step[0] == 1.0
    s = sgd_hp_scalars(hp)
    for i in prange(p.size):
        p[i], b = sgd_element(p[i], g[i], buf[i], first, s, nesterov, maximize)
        if s.use_momentum:
            buf[i] = b


@parallel_kernel
def _adam(p, g, m, v, vmax, step, hp, decoupled, amsgrad, maximize):
    """Adam (L2 weight decay) or AdamW (decoupled weight decay), with AMSGrad and maximize
    (torch.optim.Adam / AdamW):

        d = -g if maximize else g
        AdamW: p = p - lr wd p (in the one rounding of the update)   Adam: d += wd p
        m = m + (1 - b1)(d - m);   v = b2 v + (1 - b2) d^2;   vmax = max(vmax, v)
        p = p - lr / (1 - b1^t) * m / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps)
    """
    step[0] += 1.0
    s = adam_hp_scalars(hp, step[0], decoupled)
    for i in prange(p.size):
        p[i], m[i], v[i], vm = adam_element(p[i], g[i], m[i], v[i], vmax[i], s, amsgrad,
                                            maximize)
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
