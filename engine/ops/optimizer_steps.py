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

The gradient has the parameter's dtype; the state (moments, momentum buffer) has
`state_dtype(param.dtype)`: the parameter's own for float32 and float64, float32 for the
16-bit floats. A 16-bit parameter's step then runs in float32 on the CPU (its kernel widened,
engine.backends.cpu.half.widened with update=True): the parameter and gradient widened
exactly, the state read and written in float32 as it is, and the new parameter rounded to
nearest even once, on store. The moments are never rounded to 16 bits: an exp_avg_sq kept in
bfloat16 loses all but 8 bits of every update (torch.optim's default for a bfloat16
parameter, which keeps its state in the parameter's dtype).
"""

from __future__ import annotations

from engine.backends.cpu import optim as cpu
from engine.errors import DTypeError, ShapeError
from engine.hyperparams import ADAM_HPARAMS, SGD_HPARAMS
from engine.params import Params, bool_param
from engine.registry import OpDef, register
from engine.tensor import DTYPES, is_float, is_half

NO_GRAD = "an optimizer step updates its parameter in place; it is not differentiated"


def state_dtype(param_dtype):
    """The dtype of an optimizer's state for a parameter of `param_dtype`: float32 for the
    16-bit floats (their moments would lose most of each update in 16 bits), else the
    parameter's own."""
    return DTYPES["f32"] if is_half(param_dtype) else param_dtype


def _check_common(op, param, grad, step, hp, n_hp, states):
    if not is_float(param.dtype):
        raise DTypeError(f"{op}: the parameter {param.name!r} must be float, not {param.dtype}")
    want_state = state_dtype(param.dtype)
    for t, dtype in ((grad, param.dtype), *((s, want_state) for s in states)):
        if t.shape != param.shape or t.dtype != dtype:
            raise ShapeError(f"{op}: {t.name!r} ({list(t.shape)}, {t.dtype}) must match the "
                             f"shape of the parameter {param.name!r} ({list(param.shape)}) "
                             f"and have dtype {dtype}")
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


ADAM_PARAMS = Params(dict(amsgrad=bool_param(default=False), maximize=bool_param(default=False)))
sgd_step = register(OpDef(
    "sgd_step", kind="update", infer=_infer_sgd, no_grad=NO_GRAD,
    params=Params(dict(nesterov=bool_param(default=False), maximize=bool_param(default=False))),
    kernels={"cpu": cpu.sgd_step, "cuda": "engine.backends.cuda.optim:cuda_sgd_step"},
    doc="SGD step in place: momentum, dampening, Nesterov, L2 weight decay, maximize "
        "(torch.optim.SGD)")).build


def _register_adam(op: str, decoupled: bool, doc: str):
    """Register Adam's step as `op`, with decoupled weight decay (AdamW) or L2 (Adam); its
    builder."""
    return register(OpDef(op, kind="update", infer=_adam_infer(op), no_grad=NO_GRAD,
                          params=ADAM_PARAMS,
                          kernels={"cpu": cpu.adam_kernel(decoupled=decoupled),
                                   "cuda": f"engine.backends.cuda.optim:cuda_{op}"},
                          doc=doc)).build


adam_step = _register_adam("adam_step", False,
                           "Adam step in place: bias correction, L2 weight decay, AMSGrad, "
                           "maximize (torch.optim.Adam)")
adamw_step = _register_adam("adamw_step", True,
                            "AdamW step in place: Adam with decoupled weight decay "
                            "(torch.optim.AdamW, ggml's OPT_STEP_ADAMW)")
