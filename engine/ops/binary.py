"""Binary elementwise ops with numpy broadcasting: add, sub, mul, div.

Both inputs must have the same dtype (no silent promotion). A python number as either input
becomes a 0-d constant of the other input's dtype (and `x * c` becomes `scale(x, c)`).
"""

from __future__ import annotations

import dataclasses
import numbers

from engine.backends.cpu import elementwise as cpu
from engine.errors import DTypeError
from engine.ops.broadcast import broadcast_shapes, sum_to
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.strategies import broadcast_pair, permutations, sample_strategy
from engine.tensor import Tensor, constant


def _infer(name):
    def infer(a, b):
        if a.dtype != b.dtype:
            raise DTypeError(f"{name}: dtypes differ ({a.dtype} and {b.dtype}) for shapes "
                             f"{list(a.shape)} and {list(b.shape)}; convert one explicitly")
        if a.dtype.kind != "f":
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


def _add_backward(g, out, a, b):
    return sum_to(g, a.shape), sum_to(g, b.shape)


def _sub_backward(g, out, a, b):
    from engine.ops import neg
    return sum_to(g, a.shape), sum_to(neg(g), b.shape)


def _mul_backward(g, out, a, b):
    return sum_to(mul(g, b), a.shape), sum_to(mul(g, a), b.shape)


def _div_backward(g, out, a, b):
    # d(a/b)/da = 1/b;  d(a/b)/db = -a/b^2 = -out/b
    from engine.ops import neg
    return sum_to(div(g, b), a.shape), sum_to(neg(div(mul(g, out), b)), b.shape)


_TORCH = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
          "mul": lambda a, b: a * b, "div": lambda a, b: a / b}

BROADCAST_SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)),
                    ((1,), (2, 3)), ((2, 3, 1, 5), (3, 4, 1)), ((), (3, 2)), ((4, 1), (1, 5))]


def _samples(name):
    @both_dtypes
    def samples(dtype):
        out = []
        for sa, sb in BROADCAST_SHAPES:
            b_spec = (InputSpec("b", sb, "away_from_zero", 0.5, 2.0) if name == "div"
                      else InputSpec("b", sb))
            out.append(Sample.make(name, [InputSpec("a", sa), b_spec], dtype))
        # a non-contiguous (permuted) operand, broadcast against a contiguous one
        b_spec = dataclasses.replace(b_spec, shape=(4, 1), permute=(1, 0))
        out.append(Sample.make(name, [InputSpec("a", (3, 4, 5), permute=(2, 0, 1)), b_spec],
                               dtype))
        return out
    return samples


def _strategy(name):
    """Random broadcast-compatible shape pairs (0-d included), either operand possibly a
    permuted view; div's denominator |b| in [0.5, 2]."""
    @sample_strategy
    def strategy(draw, dtype):
        sa, sb = draw(broadcast_pair())
        b_range = (dict(kind="away_from_zero", low=0.5, high=2.0) if name == "div"
                   else {})
        return Sample.make(name, [InputSpec("a", sa, permute=draw(permutations(len(sa)))),
                                  InputSpec("b", sb, permute=draw(permutations(len(sb))),
                                            **b_range)], dtype)
    return strategy


_BACKWARD = {"add": _add_backward, "sub": _sub_backward, "mul": _mul_backward,
             "div": _div_backward}

for _name in ("add", "sub", "mul", "div"):
    register(OpDef(_name, infer=_infer(_name), backward=_BACKWARD[_name],
                   kernels={"cpu": cpu.binary(_name),
                            "cuda": f"engine.backends.cuda.elementwise:cuda_{_name}"},
                   build=_builder(_name),
                   torch=_TORCH[_name], samples=_samples(_name), strategy=_strategy(_name),
                   doc=f"elementwise {_name} with numpy broadcasting"))

add = _builder("add")
sub = _builder("sub")
div = _builder("div")
_mul = _builder("mul")


def mul(a, b):
    from engine.ops.unary import scale
    if isinstance(b, numbers.Number) and isinstance(a, Tensor):
        return scale(a, b)
    if isinstance(a, numbers.Number) and isinstance(b, Tensor):
        return scale(b, a)
    return _mul(a, b)
