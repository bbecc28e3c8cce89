"""Row-wise ops along the last axis: softmax (with its dedicated backward) and log_softmax.

    softmax(x, s)[..., j] = exp(s x_j - m) / sum_k exp(s x_k - m),   m = max_k s x_k
    log_softmax(x)[..., j] = x_j - m - log(sum_k exp(x_k - m)),      m = max_k x_k

Subtracting the row max keeps every exponent <= 0, so large inputs stay finite. Backward:

    softmax:      grad_x = s y (g - sum_k g_k y_k)           (the op softmax_back)
    log_softmax:  grad_x = g - exp(out) sum_k g_k             (composed: exp(out) = softmax)

The kernels read rows as contiguous memory, so the builders put `cont` in front of a
strided (permuted) input; the infer rules refuse strided inputs given any other way.
"""

from __future__ import annotations

from engine.backends.cpu.softmax import cpu_log_softmax, cpu_softmax, cpu_softmax_back
from engine.errors import DTypeError, ShapeError
from engine.registry import OpDef, make_node, register, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes


def check_rows(op: str, *tensors) -> None:
    """Shared by the row-wise ops: float, equal dtypes and shapes, >= 1 axis, contiguous."""
    first = tensors[0]
    for t in tensors:
        if t.dtype.kind != "f" or t.dtype != first.dtype:
            raise DTypeError(f"{op}: needs float inputs of one dtype, got "
                             f"{', '.join(str(u.dtype) for u in tensors)} for shapes "
                             f"{shapes_str(*tensors)}")
        if t.shape != first.shape:
            raise ShapeError(f"{op}: inputs must have the same shape, got "
                             f"{shapes_str(*tensors)}")
    if first.ndim < 1:
        raise ShapeError(f"{op}: needs at least one axis (rows are the last axis), got "
                         f"shape {list(first.shape)}")
    for t in tensors:
        if not t.contiguous:
            raise ShapeError(f"{op}: input of shape {list(t.shape)} is a non-contiguous "
                             f"view; use engine.ops.{op}, which inserts cont()")


def contiguous_inputs(*tensors):
    from engine.ops.shape import cont_if_strided
    return tuple(cont_if_strided(t) for t in tensors)


# --- softmax ----------------------------------------------------------------------------------
def _softmax_infer(x, scale):
    check_rows("softmax", x)
    return x.shape, x.dtype


def softmax(x, scale=1.0):
    """softmax(scale * x) along the last axis."""
    (x,) = contiguous_inputs(x)
    return make_node("softmax", (x,), scale=float(scale))


def _softmax_backward(g, y, x, scale):
    return (softmax_back(g, y, scale),)


def _softmax_back_infer(g, y, scale):
    check_rows("softmax_back", g, y)
    return y.shape, y.dtype


def softmax_back(g, y, scale=1.0):
    """Gradient of softmax(x, scale) from its output y and output gradient g:
    scale * y * (g - sum(g * y, last axis))."""
    g, y = contiguous_inputs(g, y)
    return make_node("softmax_back", (g, y), scale=float(scale))


# --- log_softmax --------------------------------------------------------------------------------
def _log_softmax_infer(x):
    check_rows("log_softmax", x)
    return x.shape, x.dtype


def log_softmax(x):
    """log(softmax(x)) along the last axis, via a stable log-sum-exp."""
    (x,) = contiguous_inputs(x)
    return make_node("log_softmax", (x,))


def _log_softmax_backward(g, out, x):
    from engine.ops.binary import mul, sub
    from engine.ops.reduce import sum as reduce_sum
    from engine.ops.unary import exp
    return (sub(g, mul(exp(out), reduce_sum(g, -1, keepdims=True))),)


# --- samples, torch references, registration -----------------------------------------------------
ROW_SHAPES = [(5,), (3, 4), (2, 3, 7)]


@both_dtypes
def _softmax_samples(dtype):
    out = [Sample.make("softmax", [InputSpec("x", s, low=-3.0, high=3.0)], dtype, scale=1.0)
           for s in ROW_SHAPES]
    out += [Sample.make("softmax", [InputSpec("x", (4, 6), low=-3.0, high=3.0)], dtype,
                        scale=s) for s in (2.5, -0.5)]
    return out


@both_dtypes
def _softmax_back_samples(dtype):
    return [Sample.make("softmax_back", [InputSpec("g", s), InputSpec("y", s, "probs")],
                        dtype, scale=sc) for s, sc in [((3, 4), 1.0), ((2, 3, 5), -0.5)]]


@both_dtypes
def _log_softmax_samples(dtype):
    return [Sample.make("log_softmax", [InputSpec("x", s, low=-3.0, high=3.0)], dtype)
            for s in ROW_SHAPES]


def _torch_softmax(x, scale=1.0):
    return (x * scale).softmax(-1)


def _torch_softmax_back(g, y, scale=1.0):
    return scale * y * (g - (g * y).sum(-1, keepdim=True))


register(OpDef("softmax", infer=_softmax_infer, backward=_softmax_backward,
               kernels={"cpu": cpu_softmax}, build=softmax, torch=_torch_softmax,
               samples=_softmax_samples, doc="softmax(scale * x) along the last axis"))
register(OpDef("softmax_back", kind="backward", infer=_softmax_back_infer,
               no_grad="dedicated backward op", kernels={"cpu": cpu_softmax_back},
               build=softmax_back, torch=_torch_softmax_back, samples=_softmax_back_samples,
               doc="scale * y * (g - sum(g * y, last axis)): the gradient of softmax"))
register(OpDef("log_softmax", infer=_log_softmax_infer, backward=_log_softmax_backward,
               kernels={"cpu": cpu_log_softmax}, build=log_softmax,
               torch=lambda x: x.log_softmax(-1), samples=_log_softmax_samples,
               doc="log(softmax(x)) along the last axis (stable log-sum-exp)"))
