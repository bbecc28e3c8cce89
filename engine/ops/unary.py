"""Unary elementwise ops and activations, one table row each: shape rule, backward, torch
reference, sample domain, strategy parameters.

Plain ops, their derivative written with engine ops beside the name: neg, scale, sqr, sqrt,
log, exp, abs, sgn, step, relu. `sgn` and `step` have zero derivative away from 0; their
backward is an explicit zero, so gradcheck checks it. relu's gradient is `relu_back`.

Activations, f(x) and f'(x) (s = sigmoid(x), Phi/phi the standard normal cdf/density):

    sin          sin x                                      cos x
    cos          cos x                                      -sin x
    tanh         tanh x                                     1 - tanh^2 x
    sigmoid      s = 1 / (1 + e^-x)                         s (1 - s)
    gelu         0.5 x (1 + t), t = tanh(u)                 0.5 (1 + t) + 0.5 x (1 - t^2) u'
                 u = sqrt(2/pi) (x + 0.044715 x^3)          (torch's gelu(approximate="tanh"))
    gelu_erf     x Phi(x) (torch's default gelu)            Phi(x) + x phi(x)
    silu         x s                                        s (1 + x (1 - s))
    elu          x if x > 0 else alpha (e^x - 1)            1, or alpha e^x     (alpha = 1)
    leaky_relu   x if x > 0 else negative_slope x           1, or negative_slope  (0.01)
    softplus     log(1 + e^x), x where x > 20 (torch's threshold, beta 1)   s, or 1
    hardswish    x min(max(x + 3, 0), 6) / 6                0 below -3, 1 above 3, x/3 + 1/2
    clamp        min(max(x, min), max), min <= max          1 inside [min, max], else 0

Each activation's gradient is its dedicated op `<name>_back(g, x) = g f'(x)`: one pass over
memory, where composing f' from engine ops would take several. Kinks (abs, sgn, step, relu,
elu, leaky_relu at 0; hardswish at -3 and 3; clamp at min and max) are kept off by the input
domains of the samples and strategies, which are fixed per op.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from engine.backends.cpu import elementwise as cpu
from engine.errors import DTypeError, ShapeError
from engine.registry import OpDef, make_node, register, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.strategies import permutations, sample_strategy, shapes


def _number(op, name, value) -> float:
    """A float parameter: a real number, not NaN (+-inf allowed, e.g. a one-sided clamp)."""
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        v = float(value)
    except (TypeError, ValueError):
        raise ShapeError(f"{op}: parameter {name} must be a number, got {value!r}") from None
    if math.isnan(v):
        raise ShapeError(f"{op}: parameter {name} is NaN")
    return v


def _check_params(op, names, params) -> None:
    if set(params) != set(names):
        raise ShapeError(f"{op}: takes parameters {list(names)}, got {sorted(params)}")
    for k in names:
        _number(op, k, params[k])
    if "min" in params and params["min"] > params["max"]:
        raise ShapeError(f"{op}: min {params['min']} exceeds max {params['max']}")


def _infer(name, names=()):
    def infer(x, **params):
        if x.dtype.kind != "f":
            raise DTypeError(f"{name}: needs a float input, got {x.dtype} of shape "
                             f"{list(x.shape)}")
        _check_params(name, names, params)
        return x.shape, x.dtype
    return infer


# --- builders of the ops with parameters ---------------------------------------------------
def scale(x, s: float):
    """s * x for a python number s."""
    return make_node("scale", (x,), scale=_number("scale", "scale", s))


def elu(x, alpha: float = 1.0):
    """x where x > 0, else alpha (e^x - 1)."""
    return make_node("elu", (x,), alpha=_number("elu", "alpha", alpha))


def leaky_relu(x, negative_slope: float = 0.01):
    """x where x > 0, else negative_slope * x."""
    return make_node("leaky_relu", (x,),
                     negative_slope=_number("leaky_relu", "negative_slope", negative_slope))


def clamp(x, min: float, max: float):  # noqa: A002  (torch's and ggml's names)
    """x limited to [min, max] (min <= max; either may be infinite)."""
    return make_node("clamp", (x,), min=_number("clamp", "min", min),
                     max=_number("clamp", "max", max))


_scale = scale  # the op, where a parameter is called scale


# --- hypothesis draws of the parameters (hypothesis imported only when drawing) ---------------
def _draw_float(draw, low, high) -> float:
    from hypothesis import strategies as st
    return round(draw(st.floats(low, high)), 3)


def _draw_clamp_bounds(draw) -> dict:
    """min and max in the gaps of clamp's inputs, |x| in [0.6, 2]: below -2.05, within
    [-0.55, 0.55] or above 2.05, so every input is >= 0.05 from both bounds."""
    from hypothesis import strategies as st
    gaps = {"low": (-3.0, -2.05), "mid": (-0.55, 0.55), "high": (2.05, 3.0)}
    lo, hi = draw(st.sampled_from([("low", "mid"), ("mid", "high"), ("low", "high"),
                                   ("mid", "mid")]))
    a, b = _draw_float(draw, *gaps[lo]), _draw_float(draw, *gaps[hi])
    return {"min": a if a <= b else b, "max": b if a <= b else a}


# --- the table ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Unary:
    name: str
    backward: Callable | None   # (g, y, x, **params) -> gradient of x; None: <name>_back
    torch: Callable
    domain: tuple = ("uniform", -2.0, 2.0)   # (kind, low, high) of sample/strategy inputs
    doc: str = ""
    params: tuple[str, ...] = ()             # float parameters, in the kernel's order
    sample_params: tuple = ({},)             # one set of sample cases per params dict
    draw_params: Callable | None = None      # draw -> params dict, for the strategy
    wide: tuple | None = None                # (kind, low, high): extra samples, wide range
    build: Callable | None = None            # the user-facing builder, if it takes params


def _zero(g, y, x):
    return scale(g, 0.0)


def _F(fn, **fixed):
    """The torch reference torch.nn.functional.<fn>(x, **fixed, **params)."""
    def ref(x, **params):
        import torch.nn.functional as F
        return getattr(F, fn)(x, **fixed, **params)
    return ref


WIDE = ("uniform", -150.0, 150.0)    # as ggml's test-backend-ops: no NaN/overflow in tails
OFF_ZERO = ("away_from_zero", 0.1, 3.0)

UNARY = [
    Unary("neg", lambda g, y, x: neg(g), lambda x: -x, doc="-x"),
    Unary("scale", lambda g, y, x, scale: _scale(g, scale), lambda x, scale: x * scale,
          doc="scale * x, with a python float `scale`", params=("scale",),
          sample_params=({"scale": -1.5},),
          draw_params=lambda draw: {"scale": _draw_float(draw, -3.0, 3.0)}),
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
    # activations: backward None = the one-pass op <name>_back(g, x) = g f'(x)
    Unary("sin", None, lambda x: x.sin(), ("uniform", -4.0, 4.0), "sin x", wide=WIDE),
    Unary("cos", None, lambda x: x.cos(), ("uniform", -4.0, 4.0), "cos x", wide=WIDE),
    Unary("tanh", None, lambda x: x.tanh(), ("uniform", -3.0, 3.0), "tanh x", wide=WIDE),
    Unary("sigmoid", None, lambda x: x.sigmoid(), ("uniform", -5.0, 5.0),
          "1 / (1 + e^-x)", wide=WIDE),
    Unary("gelu", None, _F("gelu", approximate="tanh"), ("uniform", -4.0, 4.0),
          "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), torch's approximate='tanh'",
          wide=WIDE),
    Unary("gelu_erf", None, _F("gelu"), ("uniform", -4.0, 4.0),
          "x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), torch's exact gelu", wide=WIDE),
    Unary("silu", None, _F("silu"), ("uniform", -5.0, 5.0), "x sigmoid(x)", wide=WIDE),
    Unary("elu", None, _F("elu"), OFF_ZERO, "x if x > 0 else alpha (e^x - 1); kink at 0",
          params=("alpha",), build=elu, sample_params=({"alpha": 1.0}, {"alpha": 0.5}),
          draw_params=lambda draw: {"alpha": _draw_float(draw, 0.1, 3.0)},
          wide=("away_from_zero", 0.1, 150.0)),
    Unary("leaky_relu", None, _F("leaky_relu"), OFF_ZERO,
          "x if x > 0 else negative_slope x; kink at 0", params=("negative_slope",),
          build=leaky_relu,
          sample_params=({"negative_slope": 0.01}, {"negative_slope": 0.1}),
          draw_params=lambda draw: {"negative_slope": _draw_float(draw, 0.0, 1.0)},
          wide=("away_from_zero", 0.1, 150.0)),
    Unary("softplus", None, _F("softplus"), ("uniform", -5.0, 5.0),
          "log(1 + e^x), and x where x > 20 (torch's threshold)",
          wide=("away_from_zero", 21.0, 150.0)),
    Unary("hardswish", None, _F("hardswish"), ("away_from_zero", 0.1, 2.9),
          "x relu6(x + 3) / 6; kinks at -3 and 3", wide=("away_from_zero", 3.1, 150.0)),
    Unary("clamp", None, lambda x, **bounds: x.clamp(**bounds),
          ("away_from_zero", 0.6, 2.0), "min(max(x, min), max); kinks at min and max",
          params=("min", "max"), build=clamp,
          sample_params=({"min": -0.5, "max": 0.5}, {"min": -2.5, "max": 0.0},
                         {"min": 0.0, "max": 2.5}),
          draw_params=_draw_clamp_bounds),
]

# sample shapes (with the axis order of a permuted input); WIDE_SHAPES differ from SHAPES,
# so a wide-range case never prints like a base case
SHAPES = [((10,), None), ((3, 4), None), ((2, 3, 4, 5), None), ((3, 4, 5), (2, 0, 1))]
WIDE_SHAPES = [((5, 7), None), ((2, 3, 4), (1, 2, 0))]
BACK_SHAPES = [((10,), None, None), ((2, 3, 4, 5), None, None), ((4, 5), None, (1, 0)),
               ((3, 4, 5), (2, 0, 1), (2, 0, 1))]          # (shape, g's axes, x's axes)


def _samples(u: Unary):
    cases = [(u.domain, p, SHAPES) for p in u.sample_params]
    if u.wide:
        cases.append((u.wide, u.sample_params[0], WIDE_SHAPES))

    @both_dtypes
    def samples(dtype):
        return [Sample.make(u.name, [InputSpec("x", s, kind, low, high, permute=p)], dtype,
                            **params)
                for (kind, low, high), params, shape_list in cases for s, p in shape_list]
    return samples


def _strategy(u: Unary):
    kind, low, high = u.domain

    @sample_strategy
    def strategy(draw, dtype):
        """Any shape of up to 4 axes (0-d too), often a permuted view; the op's fixed input
        domain; its parameters drawn (clamp's bounds in the gaps of its inputs)."""
        shape = draw(shapes(min_dims=0, max_dims=4, max_side=6))
        params = u.draw_params(draw) if u.draw_params else {}
        return Sample.make(u.name, [InputSpec("x", shape, kind, low, high,
                                              permute=draw(permutations(len(shape))))],
                           dtype, **params)
    return strategy


def _backward(u: Unary):
    if u.backward is None:
        def backward(g, y, x, **params):
            return (activation_back(u.name, g, x, **params),)
    else:
        def backward(g, y, x, **params):
            return (u.backward(g, y, x, **params),)
    return backward


def _builder(name):
    def build(x, **params):
        return make_node(name, (x,), **{k: _number(name, k, v) for k, v in params.items()})
    build.__name__ = name
    return build


for _u in UNARY:
    register(OpDef(_u.name, infer=_infer(_u.name, _u.params), backward=_backward(_u),
                   kernels={"cpu": cpu.unary(_u.name, _u.params),
                            "cuda": f"engine.backends.cuda.elementwise:cuda_{_u.name}"},
                   build=_u.build or _builder(_u.name),
                   torch=_u.torch, samples=_samples(_u), strategy=_strategy(_u), doc=_u.doc))


# --- <name>_back: g * f'(x) in one pass, one op per activation ---------------------------------
def _back_infer(name, names):
    def infer(g, x, **params):
        if g.shape != x.shape or g.dtype != x.dtype or x.dtype.kind != "f":
            raise DTypeError(f"{name}: needs a gradient and an input of one float dtype and "
                             f"shape, got {g.dtype} and {x.dtype} of shapes {shapes_str(g, x)}")
        if not g.contiguous:
            raise ShapeError(f"{name}: gradient of shape {list(g.shape)} is a non-contiguous "
                             f"view; use engine.ops.unary.activation_back, which inserts cont()")
        _check_params(name, names, params)
        return x.shape, x.dtype
    return infer


def _torch_back(forward):
    """torch's own backward of `forward` at x for the output gradient g."""
    def ref(g, x, **params):
        import torch
        with torch.enable_grad():
            xr = x.detach().requires_grad_(True)
            return torch.autograd.grad(forward(xr, **params), xr, g)[0]
    return ref


def _back_samples(u: Unary):
    kind, low, high = u.domain

    @both_dtypes
    def samples(dtype):
        return [Sample.make(f"{u.name}_back",
                            [InputSpec("g", s, grad=False, permute=pg),
                             InputSpec("x", s, kind, low, high, grad=False, permute=px)],
                            dtype, **u.sample_params[0])
                for s, pg, px in BACK_SHAPES]
    return samples


def activation_back(name: str, g, x, **params):
    """The gradient of activation `name` at x given the output gradient g: g * f'(x), one
    pass (op `<name>_back`). A strided g is made contiguous first."""
    from engine.ops.shape import cont_if_strided
    for k, v in params.items():
        params[k] = _number(f"{name}_back", k, v)
    return make_node(f"{name}_back", (cont_if_strided(g), x), **params)


for _u in UNARY:
    if _u.backward is None:
        register(OpDef(f"{_u.name}_back", kind="backward", infer=_back_infer(f"{_u.name}_back",
                                                                               _u.params),
                       no_grad="dedicated backward op",
                       kernels={"cpu": cpu.activation_back(_u.name, _u.params),
                                "cuda": f"engine.backends.cuda.elementwise:cuda_{_u.name}_back"},
                       build=lambda g, x, _name=_u.name, **p: activation_back(_name, g, x, **p),
                       torch=_torch_back(_u.torch), samples=_back_samples(_u),
                       doc=f"g * d/dx {_u.name}(x): the gradient of {_u.name}, one pass"))


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
               no_grad="dedicated backward op",
               kernels={"cpu": cpu.binary("relu_back"),
                        "cuda": "engine.backends.cuda.elementwise:cuda_relu_back"},
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
sin = _builder("sin")
cos = _builder("cos")
tanh = _builder("tanh")
sigmoid = _builder("sigmoid")
gelu = _builder("gelu")
gelu_erf = _builder("gelu_erf")
silu = _builder("silu")
softplus = _builder("softplus")
hardswish = _builder("hardswish")


def _mul(a, b):
    from engine.ops.binary import mul
    return mul(a, b)


def _div(a, b):
    from engine.ops.binary import div
    return div(a, b)
