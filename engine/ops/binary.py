"""Binary elementwise ops: the op definitions of engine.elementwise's binary rows.

add, sub, mul, div broadcast as numpy does. Both inputs must have the same dtype (no silent
promotion). A python number as either input becomes a 0-d constant of the other input's
dtype (and `x * c` becomes `scale(x, c)`). Their gradients are the row's, summed over the
broadcast axes to each input's shape.

relu_back(g, x) = g where x > 0, else 0, relu's gradient in one pass (composed, it costs two
passes and a temporary), is a dedicated backward op of two inputs of one shape. Such a row
`<f>_back` is the VJP of the unary op `<f>` at x (its `vjp_of`, which gradcheck checks).

`define_binary(row)` registers the op of one row; every binary row of the table goes
through it when this module is imported.
"""

from __future__ import annotations

import dataclasses
import numbers

from engine import elementwise
from engine.backends.cpu import elementwise as cpu
from engine.elementwise import Binary
from engine.errors import DTypeError
from engine.ops.broadcast import broadcast_shapes, sum_to
from engine.ops.unary import scale
from engine.registry import OpDef, VJPOf, at_x, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import BENCH_ELEMENTS, SIDE, SQUARE, TRANSPOSED, bench_case, scale_case
from engine.strategies import SIGNED, broadcast_pair, draw_input, sample_strategy
from engine.tensor import Tensor, constant, is_float

__all__ = ["mul"]    # mul by a python number is scale; the other builders are the ops'


def _infer(name):
    def infer(a, b):
        if a.dtype != b.dtype:
            raise DTypeError(f"{name}: dtypes differ ({a.dtype} and {b.dtype}) for shapes "
                             f"{list(a.shape)} and {list(b.shape)}; convert one explicitly")
        if not is_float(a.dtype):
            raise DTypeError(f"{name}: needs float inputs, got {a.dtype}")
        return broadcast_shapes(name, a.shape, b.shape), a.dtype
    return infer


def _lift(a, b):
    """Turn a python number on either side into a constant of the other side's dtype."""
    if isinstance(a, numbers.Number) and isinstance(b, Tensor):
        a = constant(a, b.dtype)
    if isinstance(b, numbers.Number) and isinstance(a, Tensor):
        b = constant(b, a.dtype)
    return a, b


def _builder(name):
    def build(a, b):
        a, b = _lift(a, b)
        return make_node(name, (a, b))
    build.__name__ = name
    return build


def _backward(row: Binary):
    """The row's gradients, each summed to its input's shape."""
    def backward(g, out, a, b):
        ga, gb = row.backward(g, out, a, b)
        return sum_to(ga, a.shape), sum_to(gb, b.shape)
    return backward


BROADCAST_SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)),
                    ((1,), (2, 4)), ((2, 3, 1, 5), (3, 4, 1)), ((), (3, 2)), ((4, 1), (1, 5))]


VIEW_PAIRS = [(((3, 4), {"slice": ((1, 4, 1), (0, 8, 2))}), ((3, 4), {"expand": (1,)})),
              (((2, 3, 4), {"expand": (0, 2)}), ((3, 4), {"slice": ((0, 3, 1), (1, 5, 1))})),
              (((2, 1, 4), {"slice": ((1, 3, 1), (1, 2, 1), (0, 8, 2))}),
               ((3, 1), {"expand": (0,)})),
              (((2, 3, 4), {"slice": ((1, 3, 1), (0, 6, 2), (1, 5, 1))}),
               ((3, 4), {"slice": ((1, 4, 1), (2, 6, 1))}))]


def _b_spec(row: Binary, shape, **kw) -> InputSpec:
    if row.b_domain is None:
        return InputSpec("b", shape, **kw)
    kind, low, high = row.b_domain
    return InputSpec("b", shape, kind, low, high, **kw)


def _samples(row: Binary):
    @both_dtypes
    def samples(dtype):
        out = [Sample.make(row.name, [InputSpec("a", sa), _b_spec(row, sb)], dtype)
               for sa, sb in BROADCAST_SHAPES]
        # a non-contiguous (permuted) operand, broadcast against a contiguous one
        b_spec = dataclasses.replace(_b_spec(row, (4, 1)), permute=(1, 0))
        out.append(Sample.make(row.name, [InputSpec("a", (3, 4, 5), permute=(2, 0, 1)),
                                          b_spec], dtype))
        # sliced (an offset and steps) and expanded (stride 0) operands, broadcasting too
        out += [Sample.make(row.name, [InputSpec("a", sa, **va), _b_spec(row, sb, **vb)],
                            dtype) for (sa, va), (sb, vb) in VIEW_PAIRS]
        # NaNs and infinities in a: a propagation case (gradcheck.special_values)
        out.append(Sample.make(row.name, [InputSpec("a", (4, 6), "special", -2.0, 2.0,
                                                    show_range=True),
                                          _b_spec(row, (4, 6))], dtype))
        if dtype != "f64" and row.name != "div":
            # subnormal outputs and gradients (a tiny; b too for a sum), held to correct
            # rounding (gradcheck.precision.ONE_ROUNDING; a quotient rounds inexactly)
            tiny = dict(kind="away_from_zero", low=TINY[dtype][0], high=TINY[dtype][1],
                        show_range=True)
            b = InputSpec("b", (4, 8), **tiny) if row.name in ("add", "sub") else \
                _b_spec(row, (4, 8))
            out.append(Sample.make(row.name, [InputSpec("a", (4, 8), **tiny), b], dtype))
        return out
    return samples


# magnitudes below the dtype's smallest normal (float16: 2^-14; bfloat16 and float32:
# 2^-126), some products and gradients of which fall further, where a kernel that flushes
# subnormals to zero errs by 100% (precision.correctly_rounded sees it)
TINY = {"f16": (2.0 ** -20, 2.0 ** -15), "bf16": (2.0 ** -132, 2.0 ** -127),
        "f32": (2.0 ** -140, 2.0 ** -127)}


def _scale(row: Binary):
    """The op's scale cases (engine.scale_cases): two SQUARE operands split over the
    engine's threads in ragged chunks; b broadcast along the rows (1, SIDE), which a thread
    split along axis 0 must not slice (each chunk reads all of it), and along the columns
    (SIDE, 1), which it must slice with the output; a transposed operand."""
    def scale():
        return [scale_case(row.name, [InputSpec("a", SQUARE), _b_spec(row, sb, permute=p)])
                for sb, p in ((SQUARE, None), ((1, SIDE), None), ((SIDE, 1), None),
                              (SQUARE, TRANSPOSED))]
    return scale


def _bench(row: Binary):
    """The op's bench cases: two BENCH_ELEMENTS operands; for add, a bias too (b one row
    broadcast along the rows: its gradient a sum over them)."""
    def bench():
        shapes = [BENCH_ELEMENTS] + ([BENCH_ELEMENTS[-1:]] if row.name == "add" else [])
        return [bench_case(row.name, [InputSpec("a", BENCH_ELEMENTS), _b_spec(row, sb)])
                for sb in shapes]
    return bench


def _strategy(row: Binary):
    """Random broadcast-compatible shape pairs (0-d included), either operand possibly a
    view (permuted, sliced, expanded); a in a range of SIGNED, b too or in the row's
    ranges (div's denominator: |b| in [0.5, 2], or small or large)."""
    b_family = (row.b_domain,) + row.b_special if row.b_domain else SIGNED

    @sample_strategy
    def strategy(draw, dtype):
        sa, sb = draw(broadcast_pair())
        return Sample.make(row.name, [draw_input(draw, "a", sa),
                                      draw_input(draw, "b", sb, b_family)], dtype)
    return strategy


# --- dedicated backward ops of (g, x) of one shape: relu_back ---------------------------------
def _back_infer(name):
    def infer(g, x):
        if g.shape != x.shape or g.dtype != x.dtype or not is_float(x.dtype):
            raise DTypeError(f"{name}: needs a gradient and an input of one float dtype and "
                             f"shape, got {g.dtype} {list(g.shape)} and {x.dtype} "
                             f"{list(x.shape)}")
        return x.shape, x.dtype
    return infer


def _back_samples(row: Binary):
    kind, low, high = row.b_domain

    @both_dtypes
    def samples(dtype):
        g = lambda s, **view: InputSpec("g", s, grad=False, **view)  # noqa: E731
        return [Sample.make(row.name, [g_spec, InputSpec("x", g_spec.shape, kind, low, high,
                                                         grad=False, permute=px)], dtype)
                for g_spec, px in [(g((10,)), None), (g((2, 3, 4, 5)), None),
                                   (g((4, 5), permute=(1, 0)), None),
                                   (g((3, 4, 5), permute=(2, 0, 1)), (1, 2, 0)),
                                   (g((3, 4, 5), expand=(1,)), None),
                                   (g((3, 4), slice=((1, 4, 1), (0, 8, 2))), (1, 0))]]
    return samples


def define_binary(row: Binary) -> None:
    """Register the op of table row `row` (adding the row to the table if it is new)."""
    if elementwise.BINARY.get(row.name) is not row:
        elementwise.add_binary(row)
    kernels = {"cpu": cpu.binary(row.name),
               "cuda": f"engine.backends.cuda.elementwise:cuda_{row.name}"}
    if row.broadcasts:
        register(OpDef(row.name, params={}, infer=_infer(row.name), backward=_backward(row),
                       kernels=kernels, build=_builder(row.name), torch=row.torch,
                       samples=_samples(row), scale=_scale(row), bench=_bench(row),
                       strategy=_strategy(row),
                       doc=row.doc))
    else:
        register(OpDef(row.name, params={}, kind="backward", infer=_back_infer(row.name),
                       no_grad=row.no_grad, kernels=kernels,
                       build=lambda g, x: make_node(row.name, (g, x)), torch=row.torch,
                       samples=_back_samples(row),
                       vjp_of=VJPOf(row.name.removesuffix("_back"), at_x), doc=row.doc))


for _row in list(elementwise.BINARY.values()):
    define_binary(_row)

add = _builder("add")
sub = _builder("sub")
div = _builder("div")
_mul = _builder("mul")


def mul(a, b):
    """a * b with numpy broadcasting; a python number on either side makes it scale."""
    if isinstance(b, numbers.Number) and isinstance(a, Tensor):
        return scale(a, b)
    if isinstance(a, numbers.Number) and isinstance(b, Tensor):
        return scale(b, a)
    return _mul(a, b)


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
import math  # noqa: E402  (imported here, with the declarations that use them)

from engine import mutation  # noqa: E402
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.kernels import slices_broadcast_operands  # noqa: E402
from engine.mutation.patches import backward_replaced, chunks_replaced  # noqa: E402
from engine.registry import registered  # noqa: E402


def _sum_to_wrong_axis(g, shape):
    """sum_to that reduces each broadcast (size-1) axis's left neighbour instead of the axis
    itself, then reshapes: wrong numbers where the two lengths agree, a ShapeError elsewhere."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    right = [lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1]
    axes = sorted(set(range(lead)) | {(a - 1) % g.ndim for a in right})
    return registered.reshape(registered.sum(g, tuple(axes)), shape)


def _add_wrong_axis(real):
    return lambda g, out, a, b: (_sum_to_wrong_axis(g, a.shape), _sum_to_wrong_axis(g, b.shape))


def _add_square_case(dtype):
    return [Sample.make("add", [InputSpec("a", (3, 3)), InputSpec("b", (3, 1))], dtype)]


def _one_element_grad_mean(real):
    """add's backward (as add1 builds on it) with a one-element b's gradient the mean of g."""
    def backward(g, out, a, b):
        ga, gb = real(g, out, a, b)
        n = math.prod(g.shape)
        if math.prod(b.shape) == 1 and n > 1:
            gb = registered.scale(gb, 1.0 / n)
        return ga, gb
    return backward


mutation.register(
    Mutant("div_drops_denominator_grad", ("div",),
           "div's backward returns no gradient for the denominator b (zero)",
           lambda: backward_replaced("div", lambda real: lambda g, out, a, b:
                                     (real(g, out, a, b)[0], None)), kind="dropped term"),
    Mutant("add_broadcast_wrong_axis", ("add",),
           "add's broadcast gradient reduced over the axis left of each broadcast axis, then "
           "reshaped: a shape error on the registry's cases (caught by shape check), wrong "
           "numbers on the extra case a (3,3) + b (3,1), which the registry lacks",
           lambda: backward_replaced("add", _add_wrong_axis), extra=_add_square_case,
           kind="wrong broadcast reduction"),
    Mutant("split_slices_broadcast_operand", ("sub",),
           "sub's thread split slices every operand with the output's number of axes, so a "
           "row b (1, C) broadcast over the rows is sliced too (an empty slice past the "
           "first chunk: the kernel cannot broadcast it and raises)",
           lambda: chunks_replaced("sub", slices_broadcast_operands),
           where=lambda case: case.inputs[1].shape == (1, SIDE), tier="scale",
           max_cases=1, kind="broadcast split"),
    # add's code, which add1 is made of: add1's cases catch it
    Mutant("add1_grad_mean_not_sum", ("add1",),
           "the one-element operand's gradient is the mean of g instead of its sum (ggml "
           "0.20.2's ADD1 backward: 'TODO: should probably be sum instead of mean')",
           lambda: backward_replaced("add", _one_element_grad_mean),
           where=lambda case: math.prod(case.inputs[0].shape) > 1,
           kind="wrong broadcast reduction"),
)
mutation.exempt("relu_back", "no mutant yet: relu's dedicated gradient op, checked against "
                "relu's VJP by gradcheck.backward_ops; relu_grad_scaled breaks the rule that "
                "builds it, not its kernel")
