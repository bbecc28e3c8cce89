"""Unary elementwise ops and activations: the op definitions of engine.elementwise's rows.

`define_unary(row)` registers, for one row of the table, the op `row.name` (shape rule,
parameter checks, backward, kernels, torch reference, samples, strategy) and, for an
activation, its one-pass gradient op `<name>_back(g, x) = g f'(x)`. Every row of the table
goes through it when this module is imported; a row added later (engine.elementwise's
`add_unary`, a test's toy activation) is defined the same way, and `undefine_unary` takes
it out again.

Plain ops (neg, scale, sqr, sqrt, log, exp, abs, sgn, step, relu) have their gradient
composed of engine ops, written in their row. `sgn` and `step` have zero derivative away
from 0; their backward is an explicit zero, so gradcheck checks it. relu's gradient is
`relu_back` (engine.ops.binary). Activations, f(x) and f'(x) (s = sigmoid(x), Phi/phi the
standard normal cdf/density):

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
memory, where composing f' from engine ops would take several; gradcheck checks it against
the VJP of the activation at x (its `vjp_of`). Kinks (abs, sgn, step, relu,
elu, leaky_relu at 0; hardswish at -3 and 3; clamp at min and max) are kept off by the input
domains of the samples and strategies, fixed per row (the row checks its samples).

Builders take the row's parameters positionally or by name, with the row's defaults:
`ops.clamp(x, -1.0, 1.0)`, `ops.elu(x)`, `ops.scale(x, 2.0)`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers

import ml_dtypes

from engine import elementwise
from engine.backends.cpu import elementwise as cpu
from engine.elementwise import Unary
from engine.errors import DTypeError, ParamError, ShapeError
from engine.ops.shape import cont_if_strided
from engine.params import Params, Rule, factor_param, float_param, is_real, number
from engine.registry import (
    OPS,
    OpDef,
    VJPOf,
    at_x,
    make_node,
    register,
    shapes_str,
    unregister,
)
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import (
    BENCH_DTYPE,
    BENCH_ELEMENTS,
    BENCH_HALF_DTYPES,
    HALF_SCALE_DTYPES,
    SCALE_DTYPE,
    SQUARE,
    TRANSPOSED,
    bench_cases,
    scale_case,
)
from engine.strategies import draw_input, sample_strategy, shapes
from engine.tensor import dtype_name, is_float

__all__ = ["activation_back"]     # the ops themselves: engine.ops exports their builders


def _number(op, name, value) -> float:
    """A float parameter: a real number, not NaN (+-inf allowed, e.g. a one-sided clamp)."""
    if is_real(value) and not isinstance(value, numbers.Integral) and math.isnan(value):
        raise ParamError(f"{op}: parameter {name} is NaN")
    return number(op, f"parameter {name}", value, finite=False)


# The ranges of the table's parameters, (row, parameter) -> Param; a parameter of a row
# added later (a toy activation) is a factor. Each is required on a node (the builders give
# the row's defaults) and named "parameter <name>" in messages.
RANGES = {
    ("scale", "scale"): factor_param(),                      # scale x
    ("elu", "alpha"): factor_param(),                        # alpha (e^x - 1)
    ("leaky_relu", "negative_slope"): factor_param(),        # negative_slope x
    ("clamp", "min"): float_param(-math.inf, why="clamp's lower bound, -inf for none; "
                                                 "+inf would clamp everything to inf"),
    ("clamp", "max"): float_param(None, math.inf, why="clamp's upper bound, inf for none; "
                                                     "-inf would clamp everything to -inf"),
}
RULES = {"clamp": "min must not exceed max"}     # what a row's own check requires
# parameters that become outputs: a finite clamp bound beyond the dtype's range would be
# stored as an infinity (min 1e300 in float32); +1 for a lower bound, -1 for an upper one
OUTPUT_BOUNDS = {"clamp": (("min", 1), ("max", -1))}


def declared(row: Unary) -> Params:
    """The parameters of row's op and of its _back op: RANGES (a factor for a parameter it
    does not name) and the row's own check as a rule (clamp's min <= max)."""
    params = {k: dataclasses.replace(RANGES.get((row.name, k), factor_param()),
                                     label=f"parameter {k}") for k in row.params}
    if row.check is None:
        return Params(params)
    rule = Rule(row.params, lambda **values: not row.check(row.name, values),
                RULES.get(row.name, f"{row.name}'s rule ({row.check.__name__})"),
                explain=row.check)
    return Params(params, rules=(rule,))


def _infer(row: Unary):
    def infer(x, **params):
        if not is_float(x.dtype):
            raise DTypeError(f"{row.name}: needs a float input, got {x.dtype} of shape "
                             f"{list(x.shape)}")
        top = float(ml_dtypes.finfo(x.dtype).max)
        for name, side in OUTPUT_BOUNDS.get(row.name, ()):
            if math.isfinite(params[name]) and side * params[name] > top:
                raise ParamError(f"{row.name}: {name} {params[name]!r} lies beyond "
                                 f"{dtype_name(x.dtype)}'s range (+-{top:g}): every output "
                                 "would be an infinity")
        return x.shape, x.dtype
    return infer


def _builder(row: Unary):
    """build(x, *params, **params): the row's parameters by position or name, each a
    number, the row's defaults for those not given."""
    defaults = dict(row.defaults)

    def build(x, *args, **params):
        if len(args) > len(row.params):
            raise TypeError(f"{row.name}() takes {len(row.params)} parameters after x "
                            f"({', '.join(row.params) or 'none'}), got {len(args)}")
        for k, v in zip(row.params, args, strict=False):   # the first len(args)
            if k in params:
                raise TypeError(f"{row.name}() got parameter {k!r} twice")
            params[k] = v
        missing = [k for k in row.params if k not in params and k not in defaults]
        if missing:
            raise TypeError(f"{row.name}() missing parameters {missing}")
        params = {**{k: v for k, v in defaults.items() if k not in params}, **params}
        return make_node(row.name, (x,), **{k: _number(row.name, k, v)
                                             for k, v in params.items()})
    build.__name__ = build.__qualname__ = row.name
    build.__doc__ = row.doc
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    build.__signature__ = inspect.Signature(
        [inspect.Parameter("x", kind)] +
        [inspect.Parameter(k, kind, default=defaults.get(k, inspect.Parameter.empty))
         for k in row.params])
    return build


# sample shapes (with the axis order of a permuted input); WIDE_SHAPES differ from SHAPES,
# so a wide-range case never prints like a base case
SHAPES = [((10,), None), ((3, 4), None), ((2, 3, 4, 5), None), ((3, 4, 5), (2, 0, 1))]
WIDE_SHAPES = [((5, 7), None), ((2, 3, 4), (1, 2, 0))]
# sliced (an offset, steps and a border around the view; one with unit steps along its
# rows, as ggml's views have) and expanded (stride 0) inputs
VIEW_SHAPES = [((4, 4), {"slice": ((1, 5, 1), (0, 8, 2))}),
               ((3, 4), {"slice": ((1, 4, 1), (2, 6, 1))}), ((3, 5), {"expand": (0,)}),
               ((2, 3, 4), {"slice": ((1, 3, 1), (2, 3, 1), (0, 4, 1)), "expand": (1,)})]
BACK_SHAPES = [((10,), None, None), ((2, 3, 4, 5), None, None), ((4, 5), None, (1, 0)),
               ((3, 4, 5), (2, 0, 1), (2, 0, 1))]          # (shape, g's axes, x's axes)
BACK_EXPANDED = ((3, 4, 5), (0, 2))     # the backward ops' g broadcast (stride 0) on axes


def _samples(row: Unary):
    cases = [(row.domain, p, SHAPES) for p in row.sample_params]
    if row.wide:
        cases.append((row.wide, row.sample_params[0], WIDE_SHAPES))

    @both_dtypes
    def samples(dtype):
        return [Sample.make(row.name, [InputSpec("x", s, kind, low, high, permute=p)], dtype,
                            **params)
                for (kind, low, high), params, shape_list in cases for s, p in shape_list] + [
            Sample.make(row.name, [InputSpec("x", s, *row.domain, **view)], dtype,
                        **row.sample_params[0]) for s, view in VIEW_SHAPES]
    return samples


def _strategy(row: Unary):
    @sample_strategy
    def strategy(draw, dtype):
        """Any shape of up to 4 axes (0-d too), often a view (permuted, sliced, expanded);
        the parameters drawn, and the input range: from the row's domain, wide and special
        ranges (engine.elementwise), or by its draw_domain (clamp: near its bounds)."""
        shape = draw(shapes(min_dims=0, max_dims=4, max_side=6))
        params = row.draw_params(draw) if row.draw_params else {}
        family = (row.draw_domain(draw, params),) if row.draw_domain else row.family
        return Sample.make(row.name, [draw_input(draw, "x", shape, family)], dtype, **params)
    return strategy


def _backward(row: Unary):
    if row.gradient is not None:
        def backward(g, y, x, **params):
            return (activation_back(row.name, g, x, **params),)
    else:
        def backward(g, y, x, **params):
            return (row.backward(g, y, x, **params),)
    return backward


# --- <name>_back: g * f'(x) in one pass, one op per activation ---------------------------------
def _back_infer(row: Unary):
    name = row.back_name

    def infer(g, x, **params):
        if g.shape != x.shape or g.dtype != x.dtype or not is_float(x.dtype):
            raise DTypeError(f"{name}: needs a gradient and an input of one float dtype and "
                             f"shape, got {g.dtype} and {x.dtype} of shapes {shapes_str(g, x)}")
        if not g.contiguous:
            raise ShapeError(f"{name}: gradient of shape {list(g.shape)} is a non-contiguous "
                             f"view; use engine.ops.unary.activation_back, which inserts cont()")
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


def _back_samples(row: Unary):
    """g and x contiguous or permuted views (BACK_SHAPES) with the row's first parameters;
    one case with each of its other parameters (clamp's first bounds, [-0.5, 0.5], hold
    none of its inputs, where the gradient is 0: the others do); g a stride-0 broadcast
    (BACK_EXPANDED)."""
    kind, low, high = row.domain

    @both_dtypes
    def samples(dtype):
        cases = [(shape, row.sample_params[0]) for shape in BACK_SHAPES]
        cases += [(BACK_SHAPES[-1], params) for params in row.sample_params[1:]]
        out = [Sample.make(row.back_name,
                           [InputSpec("g", s, grad=False, permute=pg),
                            InputSpec("x", s, kind, low, high, grad=False, permute=px)],
                           dtype, **params)
               for (s, pg, px), params in cases]
        s, axes = BACK_EXPANDED
        out.append(Sample.make(row.back_name,
                               [InputSpec("g", s, grad=False, expand=axes),
                                InputSpec("x", s, kind, low, high, grad=False)],
                               dtype, **row.sample_params[0]))
        return out
    return samples


# ops whose scale cases also take a transposed view (the tiled copy into a contiguous
# buffer before the kernel; the same code for every unary op, so a few ops suffice)
PERMUTED_AT_SCALE = ("relu", "exp", "tanh")
# ops whose scale cases are also float16 and bfloat16: the activations' vector kernels read
# 16-bit patterns themselves (engine.backends.cpu.elementwise), split over the threads; one
# template with a reach (sin) and one without (gelu) take every such kernel's code; relu's
# and relu_back's 16-bit kernels too (elementwise.HALF_NATIVE, the path half:<op>); and
# every activation whose 16-bit kernels compute in float32 math of their own
# (vector_unary's forward16 and gradient16), so that each is compared with its plain twin
HALF_AT_SCALE = ("gelu", "sin", "relu", "sigmoid", "silu", "gelu_erf", "softplus", "tanh",
                 "elu", "gelu_quick")


# ops whose scale cases also take a float32 input of STREAMED_SHAPE, 16.1 MiB, the size from
# which the threads' writes stream (engine.backends.cpu.block.STREAM_MIN_BYTES): the plain
# rows' streaming map (the path stream:<op>; sgn's gradient, scale(g, 0), takes it too)
STREAMED_AT_SCALE = ("sgn",)
STREAMED_SHAPE = (2048, 2063)


def _scale(row: Unary):
    """The op's scale cases: one contiguous float32 input of SQUARE in its domain, split
    over the engine's threads in ragged chunks (engine.scale_cases), for the ops of
    PERMUTED_AT_SCALE a transposed view of it too, for those of HALF_AT_SCALE the
    contiguous one in float16 and bfloat16, and for those of STREAMED_AT_SCALE one of
    STREAMED_SHAPE."""
    kind, low, high = row.domain

    def scale():
        layouts = [None] + ([TRANSPOSED] if row.name in PERMUTED_AT_SCALE else [])
        dtypes = (SCALE_DTYPE,) + (HALF_SCALE_DTYPES if row.name in HALF_AT_SCALE else ())
        cases = [scale_case(row.name, [InputSpec("x", SQUARE, kind, low, high, permute=p)],
                            dtype, **row.sample_params[0])
                 for dtype in dtypes for p in (layouts if dtype == SCALE_DTYPE else [None])]
        if row.name in STREAMED_AT_SCALE:
            cases.append(scale_case(row.name, [InputSpec("x", STREAMED_SHAPE, kind, low, high)],
                                    SCALE_DTYPE, **row.sample_params[0]))
        return cases
    return scale


# activations a 16-bit model runs (bench cases in float16 and bfloat16 too)
HALF_AT_BENCH = ("relu", "tanh", "sigmoid", "gelu", "gelu_erf", "gelu_quick", "silu", "elu",
                 "softplus")


def _bench(row: Unary):
    """The op's bench case: an activation of a large model, BENCH_ELEMENTS in its domain
    (and in 16 bits for HALF_AT_BENCH)."""
    kind, low, high = row.domain

    def bench():
        dtypes = (BENCH_DTYPE, *(BENCH_HALF_DTYPES if row.name in HALF_AT_BENCH else ()))
        return bench_cases(row.name, [InputSpec("x", BENCH_ELEMENTS, kind, low, high)], dtypes,
                           **row.sample_params[0])
    return bench


def activation_back(name: str, g, x, **params):
    """The gradient of activation `name` at x given the output gradient g: g * f'(x), one
    pass (op `<name>_back`). A strided g is made contiguous first."""
    for k, v in params.items():
        params[k] = _number(f"{name}_back", k, v)
    return make_node(f"{name}_back", (cont_if_strided(g), x), **params)


def define_unary(row: Unary) -> None:
    """Register the ops of table row `row` (adding the row to the table if it is new): the
    op itself and, for an activation, `<name>_back`."""
    if elementwise.UNARY.get(row.name) is not row:
        elementwise.add_unary(row)
    params = declared(row)
    register(OpDef(row.name, params=params, infer=_infer(row), backward=_backward(row),
                   kernels={"cpu": cpu.unary(row.name),
                            "cuda": f"engine.backends.cuda.elementwise:cuda_{row.name}"},
                   build=_builder(row), torch=row.torch, samples=_samples(row),
                   scale=_scale(row), bench=_bench(row), strategy=_strategy(row), doc=row.doc,
                   zero_gradient=row.zero_gradient))
    if row.gradient is None:
        return
    back = row.back_name
    register(OpDef(back, params=params, kind="backward", infer=_back_infer(row),
                   no_grad="dedicated backward op",
                   kernels={"cpu": cpu.unary_back(row.name),
                            "cuda": f"engine.backends.cuda.elementwise:cuda_{back}"},
                   build=lambda g, x, **p: activation_back(row.name, g, x, **p),
                   torch=_torch_back(row.torch), samples=_back_samples(row),
                   vjp_of=VJPOf(row.name, at_x),
                   doc=f"g * d/dx {row.name}(x): the gradient of {row.name}, one pass"))


def undefine_unary(name: str) -> Unary:
    """Unregister the ops of row `name` and take the row out of the table (a test's toy)."""
    row = elementwise.UNARY[name]
    for op in (name, row.back_name):
        if op in OPS:
            unregister(op)
    return elementwise.remove(name)


for _row in list(elementwise.UNARY.values()):
    define_unary(_row)

# the builders under their names, for modules that import them from here (the engine.ops
# package exports every registered op's builder itself)
globals().update({name: OPS[name].build for name in elementwise.UNARY})


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
import numpy as np  # noqa: E402  (imported here, with the declarations that use them)

from engine import mutation  # noqa: E402
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.kernels import chunk_ends_one_short  # noqa: E402
from engine.mutation.patches import (  # noqa: E402
    chunks_replaced,
    kernel_replaced,
    prepare_replaced,
    scaled,
)


def hardswish_back_middle_slope_beyond_3(prepare):
    """hardswish_back: above 3 the slope of the middle piece, x/3 + 1/2, instead of 1 (the
    branch for x > 3 lost): only inputs beyond 3 show it."""
    def mutated(out, ins, **params):
        run = prepare(out, ins, **params)
        g, x = ins

        def call():
            run()
            beyond = np.asarray(x) > 3.0
            out[beyond] = (g * (x / 3.0 + 0.5))[beyond]
        return call
    return mutated


def _silu_back_negative_branch(real):
    def kernel(out, ins, **params):
        real(out, ins, **params)
        g, x = (np.broadcast_to(a, out.shape) for a in ins)
        below = x < 0
        out[below] = (g / (1.0 + np.exp(-x)))[below]
    return kernel


mutation.register(
    Mutant("relu_grad_scaled", ("relu",),
           "relu's gradient multiplied by 1.01", scaled("relu", 1.01), kind="scaled gradient"),
    Mutant("hardswish_back_middle_slope_beyond_3", ("hardswish",),
           "hardswish_back uses the middle piece's slope x/3 + 1/2 above 3 instead of 1: "
           "only the wide-range cases (|x| in [3.1, 150]) reach it",
           lambda: prepare_replaced("hardswish_back", hardswish_back_middle_slope_beyond_3),
           where=lambda case: case.inputs[0].high > 3.0, max_cases=1, kind="wrong branch"),
    Mutant("split_chunk_ends_one_short", ("tanh",),
           "tanh's thread split (from 2^20 elements) ends every chunk but the last one row "
           "short: the row before each chunk boundary is never computed",
           lambda: chunks_replaced("tanh", chunk_ends_one_short),
           where=mutation.contiguous, tier="scale", max_cases=1, kind="chunk boundary"),
    # silu_back's code, as swiglu's backward takes it: swiglu's cases catch it
    Mutant("swiglu_silu_grad_wrong_below_zero", ("swiglu",),
           "silu's derivative, as swiglu's backward takes it (silu_back), is sigmoid(x) on "
           "the negative branch: the term x sigmoid(x) (1 - sigmoid(x)) dropped where x < 0",
           lambda: kernel_replaced("silu_back", _silu_back_negative_branch),
           kind="wrong branch"),
)

# the ops of this module with no mutant, and why (tests/engine/test_mutation.py)
for _op in ("neg", "scale", "sqr", "sqrt", "log", "sgn", "step"):
    mutation.exempt(_op, "no mutant yet: its gradient is composed of engine ops written in its "
                         "elementwise row; covered only by --inject scale")
for _op in ("sin", "cos", "sigmoid", "gelu", "gelu_erf", "gelu_quick", "elu", "leaky_relu",
            "softplus", "expm1", "clamp"):
    mutation.exempt(_op, f"no mutant yet: its gradient is its dedicated op {_op}_back (a "
                         "kernel with no mutant either); covered only by --inject scale")
for _op in ("sin", "cos", "tanh", "sigmoid", "gelu", "gelu_erf", "gelu_quick", "elu",
            "leaky_relu", "softplus", "expm1", "clamp"):
    mutation.exempt(f"{_op}_back", f"no mutant yet: the dedicated gradient op of {_op}, "
                                   f"checked against {_op}'s VJP by gradcheck.backward_ops; "
                                   "no known bug is injected into its kernel")
mutation.exempt("silu", "its gradient is its dedicated op silu_back, whose kernel the mutant "
                        "swiglu_silu_grad_wrong_below_zero breaks (caught through swiglu)")
