"""CUDA kernels of the optimizer steps: sgd_step, adam_step and adamw_step.

The update rules, the float64 scalars derived from the hyperparameters (read from `hp` in
the layout of engine.hyperparams) and the per-element math are the CPU kernels' (whose
docstrings state the rules): the same `sgd_scalars`, `adam_scalars`, `sgd_element` and
`adam_element` of engine.backends.optim_math, inlined into both. On a GPU the compiler fuses
a * b + c into one rounding (numba-cuda has no switch for that short of fastmath), so the
two backends agree to about an ulp per operation, not bit for bit.

The step counter `step` (float64, shape (1,)) is read by every thread and must be written
once per step. There is no grid-wide barrier, so the update kernel never writes it: every
thread computes the new count n = step[0] + 1 from the value before the step, and a second
launch of one thread (`_count_step`, ordered after the update on the stream) stores it.

Parameter and state buffers are persistent tensors, C-contiguous, updated in place through
1-D views; the gradient may be any strided view, read as a 4-axis view
(dropout.c_order_rank4) at the flat C-order position of the parameter element
(launch.unravel4); one thread per parameter element, in a grid-stride loop (launch).
"""

from __future__ import annotations

from numba import cuda

from engine.backends.cuda.arrays import flat
from engine.backends.cuda.dropout import c_order_rank4
from engine.backends.cuda.launch import grid_stride, unravel4
from engine.backends.optim_math import (
    adam_element,
    adam_hp_scalars,
    sgd_element,
    sgd_hp_scalars,
)


@cuda.jit
def _count_step(step):
    """step[0] += 1 (launched with one thread, after the update kernel)."""
    if cuda.grid(1) == 0:
        step[0] += 1.0


@cuda.jit(device=True)
def _grad_at(g, i):
    """The element of the 4-axis gradient view g at flat C-order position i."""
    i0, i1, i2, i3 = unravel4(i, g.shape[1], g.shape[2], g.shape[3])
    return g[i0, i1, i2, i3]


@cuda.jit
def _sgd(p, g, buf, step, hp, nesterov, maximize):
    """SGD with momentum, dampening, Nesterov and L2 weight decay (torch.optim.SGD):

        d = -g if maximize else g;   d += wd p
        b = d on the first step, else b = mu b + (1 - dampening) d     (when mu != 0)
        d = d + mu b if nesterov else b;   p = p - lr d
    """
    first = step[0] + 1.0 == 1.0
    s = sgd_hp_scalars(hp)
    for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
        p[i], b = sgd_element(p[i], _grad_at(g, i), buf[i], first, s, nesterov, maximize)
        if s.use_momentum:
            buf[i] = b


@cuda.jit
def _adam(p, g, m, v, vmax, step, hp, decoupled, amsgrad, maximize):
    """Adam (L2 weight decay) or AdamW (decoupled weight decay), with AMSGrad and maximize
    (torch.optim.Adam / AdamW), n = step[0] + 1:

        d = -g if maximize else g
        AdamW: p = p - lr wd p (in the one rounding of the update)   Adam: d += wd p
        m = m + (1 - b1)(d - m);   v = b2 v + (1 - b2) d^2;   vmax = max(vmax, v)
        p = p - lr / (1 - b1^n) * m / (sqrt(v or vmax) / sqrt(1 - b2^n) + eps)
    """
    s = adam_hp_scalars(hp, step[0] + 1.0, decoupled)
    for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
        p[i], m[i], v[i], vm = adam_element(p[i], _grad_at(g, i), m[i], v[i], vmax[i], s,
                                            amsgrad, maximize)
        if amsgrad:
            vmax[i] = vm


def _flat(arr, what: str, op: str):
    """The 1-D view of a C-contiguous device array (persistent buffers always are); any
    other layout raises, naming the op and the array (arrays.flat)."""
    return flat(arr, f"{op}: {what}, updated in place,")


def _grad(g, op: str):
    return c_order_rank4(g, f"{op}'s gradient")


def cuda_sgd_step(out, ins, nesterov=False, maximize=False):
    """Dispatcher of sgd_step: ins = param, grad, step, hp, momentum_buffer; `out` is the
    param's own buffer."""
    _, g, step, hp, buf = ins
    if out.size:
        grid_stride(_sgd, out.size, _flat(out, "the parameter", "sgd_step"),
                    _grad(g, "sgd_step"), _flat(buf, "the momentum buffer", "sgd_step"), step,
                    hp, nesterov, maximize)
    _count_step[1, 1](step)


def _adam_step(op, out, ins, amsgrad, maximize, decoupled):
    """ins = param, grad, step, hp, exp_avg, exp_avg_sq[, max_exp_avg_sq]."""
    g, step, hp = ins[1], ins[2], ins[3]
    m = _flat(ins[4], "exp_avg", op)
    v = _flat(ins[5], "exp_avg_sq", op)
    vmax = _flat(ins[6], "max_exp_avg_sq", op) if amsgrad else v
    if out.size:
        grid_stride(_adam, out.size, _flat(out, "the parameter", op), _grad(g, op), m, v,
                    vmax, step, hp, decoupled, amsgrad, maximize)
    _count_step[1, 1](step)


def cuda_adam_step(out, ins, amsgrad=False, maximize=False):
    """Dispatcher of adam_step (L2 weight decay)."""
    _adam_step("adam_step", out, ins, amsgrad, maximize, decoupled=False)


def cuda_adamw_step(out, ins, amsgrad=False, maximize=False):
    """Dispatcher of adamw_step (decoupled weight decay)."""
    _adam_step("adamw_step", out, ins, amsgrad, maximize, decoupled=True)


def _signatures():
    """Both kernels for float32 and float64, the gradient contiguous or strided."""
    sigs = [(_count_step, "void(float64[::1])")]
    for dt in ("float32", "float64"):
        flat = f"{dt}[::1]"
        for grad in (f"{dt}[:, :, :, ::1]", f"{dt}[:, :, :, :]"):
            sigs.append((_sgd, f"void({flat}, {grad}, {flat}, float64[::1], float64[::1], "
                               "boolean, boolean)"))
            sigs.append((_adam, f"void({flat}, {grad}, {flat}, {flat}, {flat}, float64[::1], "
                                "float64[::1], boolean, boolean, boolean)"))
    return sigs


PTX_SIGNATURES = _signatures()
