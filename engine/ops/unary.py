"""Unary elementwise ops, one table row each: shape rule, backward, torch reference, domain.

The derivative of each op is written with engine ops beside its name. `sgn` and `step` have
zero derivative away from 0; their backward is an explicit zero, so gradcheck checks it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from engine.backends.cpu import elementwise as cpu
from engine.errors import DTypeError
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes


def _infer(name):
    def infer(x, **params):
        if x.dtype.kind != "f":
            raise DTypeError(f"{name}: needs a float input, got {x.dtype} of shape "
                             f"{list(x.shape)}")
        return x.shape, x.dtype
    return infer


@dataclasses.dataclass(frozen=True)
class Unary:
    name: str
    backward: Callable          # (g, y, x, **params) -> gradient of x
    torch: Callable
    domain: tuple = ("uniform", -2.0, 2.0)
    doc: str = ""


def _zero(g, y, x):
    return scale(g, 0.0)


UNARY = [
    Unary("neg", lambda g, y, x: neg(g), lambda x: -x, doc="-x"),
    Unary("scale", lambda g, y, x, scale: _scale(g, scale), lambda x, scale: x * scale,
          doc="scale * x, with a python float `scale`"),
    Unary("sqr", lambda g, y, x: _mul(g, _scale(x, 2.0)), lambda x: x * x, doc="x^2"),
    Unary("sqrt", lambda g, y, x: _div(g, _scale(y, 2.0)), lambda x: x.sqrt(),
          ("uniform", 0.1, 2.0), doc="sqrt(x); d/dx = 1 / (2 sqrt(x))"),
    Unary("log", lambda g, y, x: _div(g, x), lambda x: x.log(), ("uniform", 0.1, 2.0),
          doc="natural log; d/dx = 1/x"),
    Unary("exp", lambda g, y, x: _mul(g, y), lambda x: x.exp(), doc="e^x"),
    Unary("abs", lambda g, y, x: _mul(g, sgn(x)), lambda x: x.abs(),
          ("away_from_zero", 0.1, 2.0), doc="|x|; d/dx = sgn(x), kink at 0"),
    Unary("sgn", _zero, lambda x: x.sign(), ("away_from_zero", 0.1, 2.0),
          doc="sign of x (-1, 0, 1); zero derivative away from 0"),
    Unary("step", _zero, lambda x: x.sign().clamp(min=0), ("away_from_zero", 0.1, 2.0),
          doc="1 where x > 0 else 0; zero derivative away from 0"),
    Unary("relu", lambda g, y, x: relu_back(g, x), lambda x: x.relu(),
          ("away_from_zero", 0.1, 2.0), doc="max(x, 0); d/dx = step(x), kink at 0"),
]

SHAPES = [(10,), (3, 4), (2, 3, 4, 5)]


def _samples(u: Unary):
    kind, low, high = u.domain

    @both_dtypes
    def samples(dtype):
        params = {"scale": -1.5} if u.name == "scale" else {}
        return [Sample.make(u.name, [InputSpec("x", s, kind, low, high, permute=p)], dtype,
                            **params)
                for s, p in [*((s, None) for s in SHAPES), ((3, 4, 5), (2, 0, 1))]]
    return samples


def _backward(u: Unary):
    def backward(g, y, x, **params):
        return (u.backward(g, y, x, **params),)
    return backward


def _builder(name):
    def build(x, **params):
        return make_node(name, (x,), **params)
    build.__name__ = name
    return build


for _u in UNARY:
    register(OpDef(_u.name, infer=_infer(_u.name), backward=_backward(_u),
                   kernels={"cpu": cpu.unary(_u.name)}, build=_builder(_u.name),
                   torch=_u.torch, samples=_samples(_u), doc=_u.doc))

# --- relu_back: g * step(x) in one pass (composed, it costs two passes and a temporary) ---
def _relu_back_infer(g, x):
    if g.shape != x.shape or g.dtype != x.dtype or x.dtype.kind != "f":
        raise DTypeError(f"relu_back: needs a gradient and an input of one float dtype and "
                         f"shape, got {g.dtype} {list(g.shape)} and {x.dtype} {list(x.shape)}")
    return x.shape, x.dtype


@both_dtypes
def _relu_back_samples(dtype):
    return [Sample.make("relu_back", [InputSpec("g", s, grad=False),
                                      InputSpec("x", s, "away_from_zero", 0.1, 2.0, grad=False)],
                        dtype) for s in ((10,), (2, 3, 4, 5))]


register(OpDef("relu_back", kind="backward", infer=_relu_back_infer,
               no_grad="dedicated backward op", kernels={"cpu": cpu.binary("relu_back")},
               build=lambda g, x: make_node("relu_back", (g, x)),
               torch=lambda g, x: g * (x > 0).to(g.dtype), samples=_relu_back_samples,
               doc="g where x > 0 else 0: the gradient of relu"))


def relu_back(g, x):
    """The gradient of relu(x) given the output gradient g: g * step(x), in one pass."""
    return make_node("relu_back", (g, x))


neg = _builder("neg")
sqr = _builder("sqr")
sqrt = _builder("sqrt")
log = _builder("log")
exp = _builder("exp")
abs = _builder("abs")  # noqa: A001  (the engine's op, like numpy's np.abs)
sgn = _builder("sgn")
step = _builder("step")
relu = _builder("relu")


def scale(x, s: float):
    """s * x for a python number s."""
    return make_node("scale", (x,), scale=float(s))


_scale = scale


def _mul(a, b):
    from engine.ops.binary import mul
    return mul(a, b)


def _div(a, b):
    from engine.ops.binary import div
    return div(a, b)
