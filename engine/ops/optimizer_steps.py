"""Optimizer steps as engine ops: `sgd_step`, `adam_step`, `adamw_step` (kind "update").

Each updates its parameter in place together with its persistent state, reading the
hyperparameters from a small float64 tensor (see `engine.optim`, which builds these nodes;
their layout is engine.hyperparams'):

    sgd_step(param, grad, step, hp, momentum_buffer, nesterov=, maximize=)
        hp = [lr, momentum, dampening, weight_decay]
    adam_step(param, grad, step, hp, exp_avg, exp_avg_sq[, max_exp_avg_sq], amsgrad=, maximize=)
    adamw_step(...)   the same, with decoupled weight decay
        hp = [lr, beta1, beta2, eps, weight_decay]

`step` is a float64 tensor of shape (1,) counting the steps taken (bias corrections read
it). The update rules are those of torch.optim.SGD, Adam and AdamW; the kernels' docstrings
(engine/backends/cpu/optim.py) state them. Steps have no gradient.
"""

from __future__ import annotations

from engine.backends.cpu import optim as cpu
from engine.errors import DTypeError, ShapeError
from engine.hyperparams import ADAM_HPARAMS, SGD_HPARAMS
from engine.params import boolean
from engine.registry import OpDef, register
from engine.tensor import DTYPES, is_float

NO_GRAD = "an optimizer step updates its parameter in place; it is not differentiated"


def _check_common(op, param, grad, step, hp, n_hp, states):
    if not is_float(param.dtype):
        raise DTypeError(f"{op}: the parameter {param.name!r} must be float, not {param.dtype}")
    for t in (grad, *states):
        if t.shape != param.shape or t.dtype != param.dtype:
            raise ShapeError(f"{op}: {t.name!r} ({list(t.shape)}, {t.dtype}) must match the "
                             f"parameter {param.name!r} ({list(param.shape)}, {param.dtype})")
    if step.shape != (1,) or step.dtype != DTYPES["f64"]:
        raise ShapeError(f"{op}: the step counter {step.name!r} must be float64 of shape [1], "
                         f"got {list(step.shape)} {step.dtype}")
    if hp.shape != (n_hp,) or hp.dtype != DTYPES["f64"]:
        raise ShapeError(f"{op}: the hyperparameters {hp.name!r} must be float64 of shape "
                         f"[{n_hp}], got {list(hp.shape)} {hp.dtype}")
    return param.shape, param.dtype


def _infer_sgd(param, grad, step, hp, momentum_buffer, nesterov=False, maximize=False):
    return _check_common("sgd_step", param, grad, step, hp, len(SGD_HPARAMS),
                         (momentum_buffer,))


def _adam_infer(op):
    def infer(param, grad, step, hp, *states, amsgrad=False, maximize=False):
        want = 3 if amsgrad else 2
        if len(states) != want:
            raise ShapeError(f"{op}: takes {want} state tensors with amsgrad={amsgrad} "
                             f"(exp_avg, exp_avg_sq{', max_exp_avg_sq' if amsgrad else ''}), "
                             f"got {len(states)}")
        return _check_common(op, param, grad, step, hp, len(ADAM_HPARAMS), states)
    return infer


sgd_step = register(OpDef(
    "sgd_step", kind="update", infer=_infer_sgd, no_grad=NO_GRAD,
    params=dict(nesterov=boolean, maximize=boolean),
    kernels={"cpu": cpu.sgd_step, "cuda": "engine.backends.cuda.optim:cuda_sgd_step"},
    doc="SGD step in place: momentum, dampening, Nesterov, L2 weight decay, maximize "
        "(torch.optim.SGD)")).build
adam_step = register(OpDef(
    "adam_step", kind="update", infer=_adam_infer("adam_step"), no_grad=NO_GRAD,
    params=dict(amsgrad=boolean, maximize=boolean),
    kernels={"cpu": cpu.adam_kernel(decoupled=False),
             "cuda": "engine.backends.cuda.optim:cuda_adam_step"},
    doc="Adam step in place: bias correction, L2 weight decay, AMSGrad, maximize "
        "(torch.optim.Adam)")).build
adamw_step = register(OpDef(
    "adamw_step", kind="update", infer=_adam_infer("adamw_step"), no_grad=NO_GRAD,
    params=dict(amsgrad=boolean, maximize=boolean),
    kernels={"cpu": cpu.adam_kernel(decoupled=True),
             "cuda": "engine.backends.cuda.optim:cuda_adamw_step"},
    doc="AdamW step in place: Adam with decoupled weight decay (torch.optim.AdamW, ggml's "
        "OPT_STEP_ADAMW)")).build
