"""The table of elementwise ops: one row per op, from which everything else is made.

A row says what the op computes on one element and how it is checked:

- its scalar math, plain Python on floats: `forward(v, *params)` (unary) or
  `forward(a, b)` (binary); for an activation also `gradient(g, v, *params)`, which is
  g f'(v), the gradient of one element for the output gradient g;
- or, for the plain ops, `backward`: the gradient written with engine ops (built by name
  through engine.registry.registered, so this module imports no op module);
- its parameters (floats, in the order the scalar math takes them), their defaults, and
  any rule they must keep (clamp's min <= max);
- its torch reference, its sample ranges and kinks (the inputs keep off the kinks, which
  `Unary` checks when the row is made), and its doc line;
- the ranges its strategy draws from (engine.strategies.draw_range): its `domain`, its
  `wide` range and its `special` ranges, around the points where the op is worth a look
  (saturation of tanh, sigmoid, softplus, gelu, elu; hardswish's +-3; tiny and large
  positive inputs of log and sqrt), all inside its domain and off its kinks (checked
  too); or, where the range depends on the parameters, `draw_domain(draw, params)`
  (clamp: inputs just inside or just outside a bound, a margin away from it).

engine.backends.cpu.elementwise compiles the scalar math with numba.njit into CPU kernels,
engine.backends.cuda.elementwise with numba.cuda into CUDA kernels (the same functions
compiled for each target: engine.backends.compile_scalar), and engine.ops.unary /
engine.ops.binary make the op definitions; all of them keyed by the row's name. Adding an
activation is one row:

    def softsign(v):
        return v / (1.0 + abs(v))

    def softsign_gradient(g, v):
        return g / ((1.0 + abs(v)) * (1.0 + abs(v)))

    Unary("softsign", softsign, softsign_gradient, lambda x: x / (1 + x.abs()))

in the list of rows at the end of this module, or from any other module with
engine.ops.unary.define_unary(row), through which the table's own rows go too: it adds the
row to the table and registers its ops, here `softsign` and `softsign_back`
(tests/engine/test_elementwise.py does so with a toy activation).

The scalar math must stay inside what numba compiles on both targets: numbers, `math`,
if/else, and calls of other plain functions (compiled along with it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from engine.reference_math import torch_gelu, torch_gelu_erf
from engine.registry import registered as op

Domain = tuple    # (kind, low, high): an engine.samples.InputSpec generator and its range


@dataclasses.dataclass(frozen=True)
class Unary:
    """A unary op or activation: y = forward(x, *params) elementwise.

    `gradient` given: an activation, whose gradient is its one-pass op `<name>_back(g, x)`
    computing g f'(x), in float64. Otherwise `backward(g, y, x, **params)` composes the
    gradient from engine ops. `in_float64`: the kernels compute in float64 whatever the
    dtype and round once when storing (activations); False: in the input's dtype."""

    name: str
    forward: Callable
    gradient: Callable | None = None
    torch: Callable | None = None
    backward: Callable | None = None
    params: tuple[str, ...] = ()
    defaults: tuple[tuple[str, float], ...] = ()   # (param, value): torch's defaults
    check: Callable | None = None        # check(op, params): the message if broken
    in_float64: bool = True
    domain: Domain = ("uniform", -2.0, 2.0)      # sample and strategy inputs
    wide: Domain | None = None           # extra samples over a wide range
    kinks: tuple = ()                    # points where f' jumps: numbers or param names
    sample_params: tuple[dict, ...] = ({},)      # one set of sample cases per dict
    draw_params: Callable | None = None  # draw -> params dict, for the strategy
    special: tuple[Domain, ...] = ()     # the strategy's ranges beside domain and wide
    draw_domain: Callable | None = None  # (draw, params) -> Domain: the strategy's range
    doc: str = ""
    zero_gradient: str = ""              # why f' is 0 wherever defined (OpDef.zero_gradient)

    def __post_init__(self):
        if (self.gradient is None) == (self.backward is None):
            raise ValueError(f"elementwise op {self.name}: give its scalar gradient or its "
                             "backward composed of engine ops, one of the two")
        if self.torch is None:
            raise ValueError(f"elementwise op {self.name}: give its torch reference")
        for params in self.sample_params:
            if set(params) != set(self.params):
                raise ValueError(f"elementwise op {self.name}: sample parameters "
                                 f"{sorted(params)}, the op takes {list(self.params)}")
        ranges = [(self.domain, p) for p in self.sample_params]
        ranges += [(self.wide, self.sample_params[0])] if self.wide else []
        ranges += [(r, self.sample_params[0]) for r in self.special]
        for (kind, low, high), params in ranges:
            for k in (params.get(k, k) for k in self.kinks):
                inside = low <= (abs(k) if kind == "away_from_zero" else k) <= high
                if inside:
                    raise ValueError(f"elementwise op {self.name}: the kink at {k} lies in "
                                     f"the sample range {kind} [{low}, {high}]")

    @property
    def family(self) -> tuple[Domain, ...]:
        """The ranges the strategy draws from: domain, wide, special."""
        return (self.domain,) + ((self.wide,) if self.wide else ()) + self.special

    @property
    def back_name(self) -> str | None:
        """The name of the op computing the gradient in one pass, if it has one."""
        return f"{self.name}_back" if self.gradient else None

    def kernel_args(self, op_name: str, params: dict, cast=float) -> tuple:
        """The op's parameters in the order the scalar math takes them, each `cast`."""
        missing = [k for k in self.params if k not in params]
        if missing:
            raise TypeError(f"kernel of {op_name}: missing parameters {missing}, got "
                            f"{sorted(params)}")
        return tuple(cast(params[k]) for k in self.params)


@dataclasses.dataclass(frozen=True)
class Binary:
    """A binary op: out = forward(a, b) elementwise, computed in the inputs' dtype.

    `backward(g, out, a, b)` gives both gradients before the broadcast reduction (the op
    module sums them to each input's shape). Without one (`no_grad` says why) the op is a
    dedicated backward op of (g, x) of one shape, such as relu_back."""

    name: str
    forward: Callable
    torch: Callable
    backward: Callable | None = None
    no_grad: str | None = None
    b_domain: Domain | None = None        # the second input's range (None: the default)
    b_special: tuple[Domain, ...] = ()    # the strategy's other ranges of it, with b_domain
    doc: str = ""

    def __post_init__(self):
        if (self.backward is None) == (self.no_grad is None):
            raise ValueError(f"binary op {self.name}: give its backward or say why it has "
                             "none (no_grad), one of the two")

    @property
    def broadcasts(self) -> bool:
        return self.backward is not None


UNARY: dict[str, Unary] = {}
BINARY: dict[str, Binary] = {}


def _names_taken() -> set[str]:
    return {*UNARY, *BINARY, *(u.back_name for u in UNARY.values() if u.back_name)}


def add_unary(row: Unary) -> Unary:
    """Add a row to the table (its op names must be new)."""
    if {row.name, row.back_name} & _names_taken():
        raise ValueError(f"elementwise op {row.name} is in the table already")
    UNARY[row.name] = row
    return row


def add_binary(row: Binary) -> Binary:
    if row.name in _names_taken():
        raise ValueError(f"elementwise op {row.name} is in the table already")
    BINARY[row.name] = row
    return row


def remove(name: str):
    """Take row `name` out of the table (a toy row of a test) and return it."""
    return UNARY.pop(name, None) or BINARY.pop(name)


def identity(v):
    """v itself: the scalar of a copy (cont, broadcast_to)."""
    return v


# --- scalar math of more than one line (the one-liners sit in their rows) --------------------
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
SOFTPLUS_THRESHOLD = 20.0       # torch's default: softplus(x) = x for x > 20


# In the saturated tails, 1 - tanh^2 v, s (1 - s) and 1 + tanh u cancel: written so, in
# float64, tanh's gradient was off by 2e-4 at |v| = 15 and 0 from 19.1, sigmoid's by 1e-3
# at 30 and 0 from 37, gelu by 0.7% at -7 and 0 below -7.3, where float32 still holds
# their values (1.7e-17 at 20, 4e-18 at 40, 5.6e-17 at -7.3; against mpmath). So they are
# written with e^-|v|, whose small values float64 keeps, as torch's are not.
def sigmoid(v):
    """1 / (1 + e^-v), without overflow for either sign."""
    if v >= 0.0:
        return 1.0 / (1.0 + math.exp(-v))
    e = math.exp(v)
    return e / (1.0 + e)


def sigmoid_pair(u):
    """(sigmoid(u), 1 - sigmoid(u)), both to float64's precision: with e = e^-|u|,
    1 / (1 + e) and e / (1 + e), the larger and the smaller."""
    e = math.exp(-abs(u))
    r = 1.0 / (1.0 + e)
    if u >= 0.0:
        return r, e * r
    return e * r, r


def tanh_gradient(g, v):
    """g (1 - tanh^2 v) = g 4 e / (1 + e)^2, e = e^-2|v|."""
    e = math.exp(-2.0 * abs(v))
    return g * (4.0 * e / ((1.0 + e) * (1.0 + e)))


def sigmoid_gradient(g, v):
    """g s (1 - s) = g e / (1 + e)^2, s = sigmoid(v), e = e^-|v|."""
    e = math.exp(-abs(v))
    return g * (e / ((1.0 + e) * (1.0 + e)))


def gelu_u(v):
    """2 sqrt(2/pi) (v + 0.044715 v^3): gelu's 0.5 (1 + tanh(u / 2)) is sigmoid(u)."""
    return 2.0 * SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v)


def gelu(v):
    """0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))) = v sigmoid(u), u = gelu_u(v)."""
    return v * sigmoid(gelu_u(v))


def gelu_gradient(g, v):
    """g (0.5 (1 + t) + 0.5 v (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 v^2)), t the tanh above:
    g (S + v S (1 - S) 2 sqrt(2/pi) (1 + 3 0.044715 v^2)), S = sigmoid(u)."""
    s, c = sigmoid_pair(gelu_u(v))
    return g * (s + v * (s * c) * (2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * v * v)))


def gelu_erf(v):
    """v Phi(v) = 0.5 v erfc(-v / sqrt 2) (erfc keeps the tail accurate for v << 0)."""
    return 0.5 * v * math.erfc(-v * INV_SQRT_2)


def gelu_erf_gradient(g, v):
    """g (Phi(v) + v phi(v)), phi the standard normal density."""
    return g * (0.5 * math.erfc(-v * INV_SQRT_2) + v * math.exp(-0.5 * v * v) * INV_SQRT_2PI)


def silu_gradient(g, v):
    """g d/dv v s(v) = g s (1 + v (1 - s)), s = sigmoid(v)."""
    s = sigmoid(v)
    return g * (s * (1.0 + v * (1.0 - s)))


GELU_QUICK_COEF = 1.702         # ggml's GELU_QUICK: x sigmoid(1.702 x)


def gelu_quick(v):
    """v sigmoid(1.702 v), ggml's GELU_QUICK."""
    return v * sigmoid(GELU_QUICK_COEF * v)


def gelu_quick_gradient(g, v):
    """g (s + 1.702 v s (1 - s)), s = sigmoid(1.702 v)."""
    s = sigmoid(GELU_QUICK_COEF * v)
    return g * (s + GELU_QUICK_COEF * v * (s * (1.0 - s)))


def softplus(v):
    """log(1 + e^v), or v above the threshold."""
    return v if v > SOFTPLUS_THRESHOLD else math.log1p(math.exp(v))


def hardswish(v):
    """v relu6(v + 3) / 6."""
    if v <= -3.0:
        return 0.0
    return v if v >= 3.0 else v * (v + 3.0) / 6.0


def clamp(v, low, high):
    """v limited to [low, high]; NaN stays NaN. (Written with ifs, LLVM vectorises it with
    a min instruction; written as one nested conditional expression, with compares and
    blends, a few percent slower.)"""
    if v < low:
        return low
    if v > high:
        return high
    return v


def hardswish_gradient(g, v):
    """g times the slope: 0 below -3, 1 above 3, (2 v + 3) / 6 between."""
    return g * (0.0 if v < -3.0 else (1.0 if v > 3.0 else v / 3.0 + 0.5))


# --- torch references and parameter draws (torch and hypothesis imported only when used) ------
def _functional(fn, **fixed):
    """The torch reference torch.nn.functional.<fn>(x, **fixed, **params)."""
    def ref(x, **params):
        import torch.nn.functional as F
        return getattr(F, fn)(x, **fixed, **params)
    return ref


def _draw_float(draw, low, high) -> float:
    from hypothesis import strategies as st
    return round(draw(st.floats(low, high)), 3)


CLAMP_MARGIN = 0.06     # a drawn clamp input's least distance from a bound


def _draw_clamp_domain(draw, params) -> Domain:
    """clamp's inputs near its bounds: a range just inside [min, max] against one bound,
    or just outside one, at least CLAMP_MARGIN from both bounds (so that finite
    differences stay on one side), at most 0.5 wide."""
    from hypothesis import strategies as st
    lo, hi, m = params["min"], params["max"], CLAMP_MARGIN
    width = _draw_float(draw, 0.01, 0.5)
    choices = ("below", "above") + (("inside_low", "inside_high") if hi - lo > 2 * m + 0.01
                                    else ())
    ends = {"below": (lo - m - width, lo - m), "above": (hi + m, hi + m + width),
            "inside_low": (lo + m, min(lo + m + width, hi - m)),
            "inside_high": (max(hi - m - width, lo + m), hi - m)}[draw(st.sampled_from(choices))]
    return ("uniform", round(ends[0], 3), round(ends[1], 3))


def _draw_clamp_bounds_anywhere(draw) -> dict:
    """min and max in [-3, 3], at least 0.2 apart (room inside for _draw_clamp_domain)."""
    a = _draw_float(draw, -3.0, 2.8)
    return {"min": a, "max": round(a + _draw_float(draw, 0.2, 3.0), 3)}


def _ordered_bounds(op_name, params) -> str | None:
    """clamp's rule: min <= max (the message if broken)."""
    if params["min"] > params["max"]:
        return f"{op_name}: min {params['min']} exceeds max {params['max']}"
    return None


# --- the table --------------------------------------------------------------------------------
WIDE = ("uniform", -150.0, 150.0)    # as ggml's test-backend-ops: no NaN/overflow in tails
OFF_ZERO = ("away_from_zero", 0.1, 3.0)
POSITIVE = ("uniform", 0.1, 2.0)
OFF_KINK = ("away_from_zero", 0.1, 2.0)
# the strategies' special ranges (see the module doc)
LARGE = (("uniform", -1e3, 1e3), ("uniform", -1e-3, 1e-3))
LARGE_OFF_KINK = (("away_from_zero", 1.0, 1e3), ("away_from_zero", 0.1, 0.2))
POSITIVE_ENDS = (("uniform", 0.01, 0.1), ("uniform", 2.0, 1e3))


def _saturated(low, high):
    """Both tails: |x| in [low, high]."""
    return (("away_from_zero", low, high),)


def _zero(g, y, x):
    return op.scale(g, 0.0)


for _row in [
    # plain ops, in the input's dtype; the gradient composed of engine ops
    Unary("neg", lambda v: -v, torch=lambda x: -x, backward=lambda g, y, x: op.neg(g),
          in_float64=False, special=LARGE, doc="-x"),
    Unary("scale", lambda v, scale: scale * v, torch=lambda x, scale: x * scale,
          backward=lambda g, y, x, scale: op.scale(g, scale), params=("scale",),
          in_float64=False, sample_params=({"scale": -1.5},),
          draw_params=lambda draw: {"scale": _draw_float(draw, -3.0, 3.0)}, special=LARGE,
          doc="scale * x, with a python float `scale`"),
    Unary("sqr", lambda v: v * v, torch=lambda x: x * x,
          backward=lambda g, y, x: op.mul(g, op.scale(x, 2.0)), in_float64=False,
          special=LARGE, doc="x^2"),
    Unary("sqrt", lambda v: math.sqrt(v), torch=lambda x: x.sqrt(),
          backward=lambda g, y, x: op.div(g, op.scale(y, 2.0)), in_float64=False,
          domain=POSITIVE, special=POSITIVE_ENDS, doc="sqrt(x); d/dx = 1 / (2 sqrt(x))"),
    Unary("log", lambda v: math.log(v), torch=lambda x: x.log(),
          backward=lambda g, y, x: op.div(g, x), in_float64=False, domain=POSITIVE,
          special=POSITIVE_ENDS, doc="natural log; d/dx = 1/x"),
    Unary("exp", lambda v: math.exp(v), torch=lambda x: x.exp(),
          backward=lambda g, y, x: op.mul(g, y), in_float64=False,
          special=(("uniform", 5.0, 30.0), ("uniform", -30.0, -5.0)), doc="e^x"),
    Unary("abs", lambda v: abs(v), torch=lambda x: x.abs(),
          backward=lambda g, y, x: op.mul(g, op.sgn(x)), in_float64=False, domain=OFF_KINK,
          kinks=(0.0,), special=LARGE_OFF_KINK, doc="|x|; d/dx = sgn(x), kink at 0"),
    Unary("sgn", lambda v: 1.0 if v > 0 else (-1.0 if v < 0 else 0.0),
          torch=lambda x: x.sign(), backward=_zero, in_float64=False, domain=OFF_KINK,
          kinks=(0.0,), special=LARGE_OFF_KINK,
          doc="sign of x (-1, 0, 1); zero derivative away from 0",
          zero_gradient="sgn is piecewise constant: its derivative is 0 away from 0"),
    Unary("step", lambda v: 1.0 if v > 0 else 0.0, torch=lambda x: x.sign().clamp(min=0),
          backward=_zero, in_float64=False, domain=OFF_KINK, kinks=(0.0,),
          special=LARGE_OFF_KINK, doc="1 where x > 0 else 0; zero derivative away from 0",
          zero_gradient="step is piecewise constant: its derivative is 0 away from 0"),
    Unary("relu", lambda v: v if v > 0 else 0.0, torch=lambda x: x.relu(),
          backward=lambda g, y, x: op.relu_back(g, x), in_float64=False, domain=OFF_KINK,
          kinks=(0.0,), special=LARGE_OFF_KINK, doc="max(x, 0); d/dx = step(x), kink at 0"),
    # activations, in float64: f(v), g f'(v) (the one-pass op <name>_back), torch
    Unary("sin", lambda v: math.sin(v), lambda g, v: g * math.cos(v), lambda x: x.sin(),
          domain=("uniform", -4.0, 4.0), wide=WIDE, doc="sin x"),
    Unary("cos", lambda v: math.cos(v), lambda g, v: -g * math.sin(v), lambda x: x.cos(),
          domain=("uniform", -4.0, 4.0), wide=WIDE, doc="cos x"),
    # wide: to 20, where tanh is 1 in every dtype but a few of 35 draws keep a gradient
    # (over WIDE's [-150, 150] every draw may saturate: a zero gradient, checking nothing)
    Unary("tanh", lambda v: math.tanh(v), tanh_gradient, lambda x: x.tanh(),
          domain=("uniform", -3.0, 3.0), wide=("uniform", -20.0, 20.0),
          special=_saturated(4.0, 20.0),
          doc="tanh x"),
    Unary("sigmoid", sigmoid, sigmoid_gradient, lambda x: x.sigmoid(),
          domain=("uniform", -5.0, 5.0), wide=WIDE, special=_saturated(8.0, 40.0),
          doc="1 / (1 + e^-x)"),
    Unary("gelu", gelu, gelu_gradient, lambda x, **params: torch_gelu(x),
          domain=("uniform", -4.0, 4.0), wide=WIDE, special=_saturated(4.0, 30.0),
          doc="0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), torch's approximate='tanh'"),
    Unary("gelu_erf", gelu_erf, gelu_erf_gradient, lambda x, **params: torch_gelu_erf(x),
          domain=("uniform", -4.0, 4.0), wide=WIDE, special=_saturated(4.0, 30.0),
          doc="x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), torch's exact gelu"),
    Unary("silu", lambda v: v * sigmoid(v), silu_gradient, _functional("silu"),
          domain=("uniform", -5.0, 5.0), wide=WIDE, special=_saturated(8.0, 40.0),
          doc="x sigmoid(x)"),
    Unary("gelu_quick", gelu_quick, gelu_quick_gradient,
          lambda x: x * (GELU_QUICK_COEF * x).sigmoid(), domain=("uniform", -4.0, 4.0),
          wide=WIDE, special=_saturated(4.0, 30.0),
          doc="x sigmoid(1.702 x), ggml's GELU_QUICK"),
    Unary("expm1", lambda v: math.expm1(v), lambda g, v: g * math.exp(v),
          lambda x: x.expm1(), special=(("uniform", 5.0, 30.0), ("uniform", -30.0, -5.0),
                                        ("uniform", -1e-3, 1e-3)),
          doc="e^x - 1, accurate near 0 (ggml_expm1); d/dx = e^x"),
    Unary("elu", lambda v, alpha: v if v > 0.0 else alpha * math.expm1(v),
          lambda g, v, alpha: g if v > 0.0 else g * (alpha * math.exp(v)),
          _functional("elu"), params=("alpha",), defaults=(("alpha", 1.0),),
          domain=OFF_ZERO, wide=("away_from_zero", 0.1, 150.0), kinks=(0.0,),
          special=(("uniform", -30.0, -4.0),), sample_params=({"alpha": 1.0}, {"alpha": 0.5}),
          draw_params=lambda draw: {"alpha": _draw_float(draw, 0.1, 3.0)},
          doc="x if x > 0 else alpha (e^x - 1); kink at 0"),
    Unary("leaky_relu", lambda v, slope: v if v > 0.0 else slope * v,
          lambda g, v, slope: g if v > 0.0 else g * slope, _functional("leaky_relu"),
          params=("negative_slope",), defaults=(("negative_slope", 0.01),), domain=OFF_ZERO,
          wide=("away_from_zero", 0.1, 150.0), kinks=(0.0,),
          sample_params=({"negative_slope": 0.01}, {"negative_slope": 0.1}),
          draw_params=lambda draw: {"negative_slope": _draw_float(draw, 0.0, 1.0)},
          doc="x if x > 0 else negative_slope x; kink at 0"),
    Unary("softplus", softplus,
          lambda g, v: g if v > SOFTPLUS_THRESHOLD else g * sigmoid(v),
          _functional("softplus"), domain=("uniform", -5.0, 5.0),
          wide=("away_from_zero", 21.0, 150.0), kinks=(SOFTPLUS_THRESHOLD,),
          special=(("uniform", -40.0, -8.0), ("uniform", 15.0, 19.9), ("uniform", 20.1, 25.0)),
          doc="log(1 + e^x), and x where x > 20 (torch's threshold)"),
    Unary("hardswish", hardswish, hardswish_gradient, _functional("hardswish"),
          domain=("away_from_zero", 0.1, 2.9), wide=("away_from_zero", 3.1, 150.0),
          kinks=(-3.0, 3.0),
          special=(("away_from_zero", 2.0, 2.9), ("away_from_zero", 3.1, 4.0)),
          doc="x relu6(x + 3) / 6; kinks at -3 and 3"),
    # clamp: NaN stays NaN; the gradient is g inside [min, max], else 0 even for an
    # infinite g (as torch's), so it is not a product with f'
    Unary("clamp", clamp, lambda g, v, low, high: g if low <= v <= high else 0.0,
          lambda x, **bounds: x.clamp(**bounds), params=("min", "max"),
          check=_ordered_bounds, domain=("away_from_zero", 0.6, 2.0), kinks=("min", "max"),
          # each set keeps inputs (|x| in [0.6, 2]) both inside the range and outside it
          # (below, above): a set with all of them outside checks only a zero gradient
          sample_params=({"min": -0.5, "max": 2.5}, {"min": -2.5, "max": 0.0},
                         {"min": 0.0, "max": 2.5}),
          draw_params=_draw_clamp_bounds_anywhere, draw_domain=_draw_clamp_domain,
          doc="min(max(x, min), max); kinks at min and max"),
]:
    add_unary(_row)

for _row in [
    Binary("add", lambda a, b: a + b, lambda a, b: a + b, lambda g, out, a, b: (g, g),
           doc="elementwise add with numpy broadcasting"),
    Binary("sub", lambda a, b: a - b, lambda a, b: a - b, lambda g, out, a, b: (g, op.neg(g)),
           doc="elementwise sub with numpy broadcasting"),
    Binary("mul", lambda a, b: a * b, lambda a, b: a * b,
           lambda g, out, a, b: (op.mul(g, b), op.mul(g, a)),
           doc="elementwise mul with numpy broadcasting"),
    # d(a/b)/da = 1/b;  d(a/b)/db = -a/b^2 = -out/b
    Binary("div", lambda a, b: a / b, lambda a, b: a / b,
           lambda g, out, a, b: (op.div(g, b), op.neg(op.div(op.mul(g, out), b))),
           b_domain=("away_from_zero", 0.5, 2.0),
           b_special=(("away_from_zero", 0.05, 0.5), ("away_from_zero", 2.0, 100.0)),
           doc="elementwise div with numpy broadcasting"),
    Binary("relu_back", lambda g, x: g if x > 0 else 0.0, lambda g, x: g * (x > 0).to(g.dtype),
           no_grad="dedicated backward op", b_domain=OFF_KINK,
           doc="g where x > 0 else 0: the gradient of relu"),
]:
    add_binary(_row)
