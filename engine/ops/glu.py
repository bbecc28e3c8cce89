"""The GLU family (ggml's GLU ops: ggml_glu, ggml_swiglu, ... and their *_split forms):
a gated linear unit, one op per activation act:

    swiglu       act = silu            x sigmoid(x)
    geglu        act = gelu            tanh approximation (torch's approximate="tanh")
    geglu_erf    act = gelu_erf        x Phi(x) (torch's exact gelu)
    geglu_quick  act = gelu_quick      x sigmoid(1.702 x)
    reglu        act = relu            max(x, 0), kink at 0

in ggml's two forms:

    fused   op(x):      x of shape (..., 2n), out of shape (..., n)
                        out = act(x[..., :n]) * x[..., n:]
                        swapped=True: out = act(x[..., n:]) * x[..., :n]
    split   op(a, b):   a and b of one shape, out = act(a) * b   (swapped must be False)

Backward, for out = act(a) * b and upstream gradient g:

    grad_a = g b act'(a) = <act>_back(g b, a)       (relu_back for reglu)
    grad_b = g act(a)

composed of registered ops; the fused input's gradient is the two halves joined along the
last axis (concat, in x's order: exchanged when swapped). The kernels (one source for
every activation: engine.backends.cpu.glu, engine.backends.cuda.glu) read strided inputs
through their strides and compute in float64, rounding once. At most 4 axes, as in ggml.
"""

from __future__ import annotations

from engine import elementwise
from engine.backends.cpu.glu import ACTIVATIONS, MAX_DIMS, glu
from engine.errors import DTypeError, ParamError, ShapeError
from engine.params import Params, bool_param, boolean
from engine.registry import OpDef, make_node, register, registered, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import BENCH_ELEMENTS, SIDE, bench_case, scale_case
from engine.strategies import MAX_ELEMENTS, draw_input, sample_strategy, shapes
from engine.tensor import is_float

# the activated input's ranges: reglu's keep off relu's kink at 0
ACT_RANGES = {"reglu": (("away_from_zero", 0.1, 2.0), ("away_from_zero", 1.0, 50.0))}
DEFAULT_RANGES = (("uniform", -4.0, 4.0), ("uniform", -30.0, 30.0))
GATE_RANGES = (("uniform", -2.0, 2.0), ("uniform", -100.0, 100.0))


def _infer(op):
    def infer(*srcs, swapped):
        if len(srcs) not in (1, 2):
            raise ShapeError(f"{op}: takes one fused input (x) or two split inputs (a, b), "
                             f"got {len(srcs)} inputs of shapes {shapes_str(*srcs)}")
        x = srcs[0]
        for s in srcs:
            if not is_float(s.dtype) or s.dtype != x.dtype:
                raise DTypeError(f"{op}: inputs must be float of one dtype, got "
                                 f"{[str(t.dtype) for t in srcs]} (shapes {shapes_str(*srcs)})")
            if not 1 <= s.ndim <= MAX_DIMS:
                raise ShapeError(f"{op}: inputs must have 1 to {MAX_DIMS} axes, got shapes "
                                 f"{shapes_str(*srcs)}")
        if len(srcs) == 2:
            if swapped:
                raise ParamError(f"{op}: swapped applies to the fused form only (one input "
                                 f"x); got two inputs of shapes {shapes_str(*srcs)}")
            if srcs[1].shape != x.shape:
                raise ShapeError(f"{op}: split inputs a and b must have one shape, got "
                                 f"{shapes_str(*srcs)}")
            return x.shape, x.dtype
        if x.shape[-1] % 2 or x.shape[-1] == 0:
            raise ShapeError(f"{op}: the fused input's last axis must have an even, "
                             f"positive length 2n, got shape {list(x.shape)}")
        return x.shape[:-1] + (x.shape[-1] // 2,), x.dtype
    return infer


def _builder(op):
    def build(x, b=None, swapped=False):
        srcs = (x,) if b is None else (x, b)
        return make_node(op, srcs, swapped=boolean(op, "swapped", swapped))
    build.__name__ = op
    build.__doc__ = (f"{op}(x, swapped=False) = act(x[..., :n]) * x[..., n:] (halves "
                     f"exchanged when swapped), or {op}(a, b) = act(a) * b; act = "
                     f"{ACTIVATIONS[op]}.")
    return build


def _last_axis(x, lo, hi):
    return registered.strided_slice(
        x, slices=tuple((0, d, 1) for d in x.shape[:-1]) + ((lo, hi, 1),))


def _backward(op):
    act = ACTIVATIONS[op]

    def backward(g, out, *srcs, swapped):
        if len(srcs) == 2:
            a, b = srcs
        else:
            (x,) = srcs
            n = out.shape[-1]
            first, second = _last_axis(x, 0, n), _last_axis(x, n, 2 * n)
            a, b = (second, first) if swapped else (first, second)
        grad_a = getattr(registered, f"{act}_back")(registered.mul(g, b), a)
        grad_b = registered.mul(g, getattr(registered, act)(a))
        if len(srcs) == 2:
            return grad_a, grad_b
        halves = (grad_b, grad_a) if swapped else (grad_a, grad_b)
        return (registered.concat(*halves, axis=out.ndim - 1),)
    return backward


def glu_halves(tensors, swapped=False):
    """(a, b) of a GLU's inputs, in any array library that slices: the two inputs of the
    split form, or the halves of the one input along its last axis (exchanged when
    swapped)."""
    if len(tensors) == 2:
        return tuple(tensors)
    (x,) = tensors
    n = x.shape[-1] // 2
    return (x[..., n:], x[..., :n]) if swapped else (x[..., :n], x[..., n:])


def _torch(op):
    act = elementwise.UNARY[ACTIVATIONS[op]].torch

    def reference(*tensors, swapped=False):
        a, b = glu_halves(tensors, swapped)
        return act(a) * b
    return reference


# --- samples, strategies, scale cases -------------------------------------------------------
def _x(op, shape, **view):
    kind, low, high = ACT_RANGES.get(op, DEFAULT_RANGES)[0]
    return InputSpec("x", shape, kind, low, high, **view)


def _ab(op, shape, a_view=None, b_view=None):
    kind, low, high = ACT_RANGES.get(op, DEFAULT_RANGES)[0]
    return [InputSpec("a", shape, kind, low, high, **(a_view or {})),
            InputSpec("b", shape, "uniform", -2.0, 2.0, **(b_view or {}))]


def _samples(op):
    @both_dtypes
    def samples(dtype):
        """Both forms, swapped, 1 to 4 axes, and permuted, sliced and expanded views."""
        out = [Sample.make(op, [_x(op, shape)], dtype, swapped=sw)
               for shape in [(8,), (3, 6), (2, 3, 10), (2, 1, 2, 4)] for sw in (False, True)]
        out += [Sample.make(op, [_x(op, (4, 6), permute=(1, 0))], dtype, swapped=True),
                Sample.make(op, [_x(op, (2, 3, 4), permute=(2, 0, 1))], dtype, swapped=False),
                Sample.make(op, [_x(op, (4, 6), slice=((1, 5, 1), (0, 12, 2)))], dtype,
                            swapped=False),
                Sample.make(op, [_x(op, (3, 8), expand=(0,))], dtype, swapped=True)]
        out += [Sample.make(op, _ab(op, shape), dtype, swapped=False)
                for shape in [(5,), (3, 4), (2, 3, 4), (2, 2, 1, 3)]]
        out += [Sample.make(op, _ab(op, (4, 5), a_view={"permute": (1, 0)}), dtype,
                            swapped=False),
                Sample.make(op, _ab(op, (3, 4), b_view={"slice": ((1, 4, 1), (0, 8, 2))}),
                            dtype, swapped=False),
                Sample.make(op, _ab(op, (3, 4), a_view={"expand": (1,)},
                                    b_view={"expand": (0,)}), dtype, swapped=False)]
        return out
    samples.__name__ = f"_{op}_samples"
    return samples


def _strategy(op):
    @sample_strategy
    def strategy(draw, dtype):
        from hypothesis import strategies as st
        n = draw(st.integers(1, 6))
        lead = draw(shapes(0, MAX_DIMS - 1, max_side=4, max_size=MAX_ELEMENTS // (2 * n)))
        ranges = ACT_RANGES.get(op, DEFAULT_RANGES)
        if draw(st.booleans()):
            x = draw_input(draw, "x", lead + (2 * n,), ranges)
            return Sample.make(op, [x], dtype, swapped=draw(st.booleans()))
        a = draw_input(draw, "a", lead + (n,), ranges)
        b = draw_input(draw, "b", lead + (n,), GATE_RANGES)
        return Sample.make(op, [a, b], dtype, swapped=False)
    strategy.__name__ = f"_{op}_strategy"
    return strategy


def _scale(op):
    def scale():
        """A fused (1031, 1040) input (out of 1031 x 520, with x 1.6 million elements:
        split over the threads, ragged chunks), swapped; swiglu also split."""
        out = [scale_case(op, [_x(op, (SIDE, 1040))], swapped=True)]
        if op == "swiglu":
            out.append(scale_case(op, _ab(op, (SIDE, 520), a_view={"permute": (1, 0)}),
                                  swapped=False))
        return out
    scale.__name__ = f"_{op}_scale"
    return scale


def _bench(op):
    def bench():
        """Bench case: a feed-forward layer's fused (2048, 8192) projection gated into
        BENCH_ELEMENTS."""
        rows, cols = BENCH_ELEMENTS
        return [bench_case(op, [_x(op, (rows, 2 * cols))], swapped=False)]
    bench.__name__ = f"_{op}_bench"
    return bench


for _op, _act in ACTIVATIONS.items():
    register(OpDef(_op, params=Params(dict(swapped=bool_param())), infer=_infer(_op),
                   backward=_backward(_op),
                   kernels={"cpu": glu(_op), "cuda": f"engine.backends.cuda.glu:cuda_{_op}"},
                   build=_builder(_op), torch=_torch(_op), samples=_samples(_op),
                   scale=_scale(_op), bench=_bench(_op), strategy=_strategy(_op),
                   doc=f"gated linear unit with {_act}: act(x[..., :n]) * x[..., n:] (fused; "
                       "swapped exchanges the halves) or act(a) * b (split)"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import backwards_replaced  # noqa: E402
from engine.ops.shape import cont_if_strided  # noqa: E402


def _glu_halves_unswapped(real):
    """The real gradient of the fused input with its two halves exchanged when swapped."""
    def backward(g, out, *xs, swapped=False):
        grads = real(g, out, *xs, swapped=swapped)
        if len(xs) != 1 or not swapped:
            return grads
        n = xs[0].shape[-1] // 2
        gx = cont_if_strided(grads[0])
        lead = gx.shape[:-1]
        first = registered.block(gx, (0,) * len(lead) + (0,), lead + (n,))
        second = registered.block(gx, (0,) * len(lead) + (n,), lead + (n,))
        return (registered.concat(second, first, axis=-1),)
    return backward


mutation.register(
    Mutant("glu_grad_halves_unswapped", ("swiglu", "geglu"),
           "the fused GLU's gradient joined as (activated half, gate half) even when "
           "swapped=True put the activated half second",
           backwards_replaced(("swiglu", "geglu"), _glu_halves_unswapped),
           where=lambda case: len(case.inputs) == 1 and case.kwargs.get("swapped"),
           kind="transposed gradient"),
)
for _op in ("reglu", "geglu_erf", "geglu_quick"):
    mutation.exempt(_op, "no mutant of its own: its backward is made by the same function as "
                         "swiglu's and geglu's, which glu_grad_halves_unswapped breaks")
