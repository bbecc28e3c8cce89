"""The registry's dedicated backward ops as tinygrad computes them: each is tinygrad's own
VJP (Tensor.gradient) of the forward op's tinygrad code at the case's inputs, for the
case's upstream gradient g, so that gradcheck checks tinygrad's autodiff of the forward op
against the numerical VJP (gradcheck.backward_ops). softmax_back, given softmax's output y
rather than its input, is written from its formula: a VJP would have to recover the input
as log(y) / scale, rounding it in the case's dtype first.
"""

from __future__ import annotations

from gradcheck.adapters.tinygrad_adapter.nn import NN
from gradcheck.adapters.tinygrad_adapter.ops import ELEMENTWISE, SHAPES

FORWARD = {**ELEMENTWISE, **SHAPES, **NN}

# backward op -> its forward op, for B(g, x, **params) = J_F(x)^T g
AT_X = {f"{name}_back": name for name in (
    "sin", "cos", "tanh", "sigmoid", "gelu", "gelu_erf", "silu", "gelu_quick", "expm1",
    "elu", "leaky_relu", "softplus", "hardswish", "clamp", "relu", "norm", "rms_norm",
    "pool_2d")}


def _at_x(forward):
    def back(g, x, **params):
        (dx,) = FORWARD[forward](x, **params).gradient(x, gradient=g)
        return dx
    return back


def _cross_entropy_loss_back(g, logits, labels):
    (d,) = FORWARD["cross_entropy_loss"](logits, labels).gradient(logits, gradient=g)
    return d


def _softmax_back(g, y, scale=1.0, renormalize=False):
    if renormalize:
        y = y / y.sum(-1, keepdim=True)
    return y * (g - (g * y).sum(-1, keepdim=True)) * scale


def _softmax_sink_back(g, x, mask, sinks, scale=1.0, max_bias=0.0):
    y = FORWARD["softmax"](x, mask, sinks, scale=scale, max_bias=max_bias)
    (ds,) = y.gradient(sinks, gradient=g)
    return ds


def _attention_back(g, q, k, v, mask=None, **params):
    """dq, dk, dv of attention_fwd for g, raveled and concatenated."""
    grads = FORWARD["attention_fwd"](q, k, v, mask, **params).gradient(q, k, v, gradient=g)
    return grads[0].flatten().cat(*(t.flatten() for t in grads[1:]))


BACKWARD = {name: _at_x(forward) for name, forward in AT_X.items()} | {
    "cross_entropy_loss_back": _cross_entropy_loss_back,
    "softmax_back": _softmax_back,
    "softmax_sink_back": _softmax_sink_back,
    "attention_back": _attention_back,
}
