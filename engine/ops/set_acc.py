"""set and acc: a copy of a with block b written into it (set) or added onto it (acc).

ggml's SET and ACC, with the block placed by one offset per axis instead of byte strides:
a and b have one float dtype and one number of axes, and b fits in a at `offset`.

    set(a, b, offset)[o + k] = b[k],            (0 <= k < b.shape, per axis)
    acc(a, b, offset)[o + k] = a[o + k] + b[k],
    both equal a everywhere else.

Gradients, with B = block(g, offset, b.shape) (a view of g):
    acc:  a gets g,  b gets B;
    set:  a gets g with the block zeroed (set(g, 0, offset)),  b gets B.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.set_acc import cpu_acc, cpu_set
from engine.errors import DTypeError, ShapeError
from engine.ops.block import block, block_slices, check_block
from engine.params import Params, int_tuple, ints_param
from engine.registry import OpDef, make_node, register, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import BENCH_ELEMENTS, SQUARE, bench_case, scale_case
from engine.strategies import draw_input, sample_strategy, shapes
from engine.tensor import constant, is_float


def _infer(name):
    def infer(a, b, offset):
        if a.dtype != b.dtype or not is_float(a.dtype):
            raise DTypeError(f"{name}: needs float inputs of one dtype, got {a.dtype} and "
                             f"{b.dtype} for shapes {shapes_str(a, b)}")
        if a.ndim != b.ndim:
            raise ShapeError(f"{name}: a and b need the same number of axes, got shapes "
                             f"{shapes_str(a, b)}")
        check_block(name, a.shape, offset, b.shape)
        return a.shape, a.dtype
    return infer


def _builder(name):
    def build(a, b, offset):
        return make_node(name, (a, b), offset=int_tuple(name, "offset", offset, a.ndim))
    build.__name__ = name
    return build


set = _builder("set")  # noqa: A001  (the engine's op, ggml's SET)
acc = _builder("acc")
set.__doc__ = "A copy of a with the block at `offset` (one int per axis) replaced by b."
acc.__doc__ = "A copy of a with b added onto its block at `offset` (one int per axis)."


def _set_backward(g, out, a, b, offset):
    zeros = constant(np.zeros(b.shape, b.dtype), b.dtype, name="set.zero_block")
    return set(g, zeros, offset), block(g, offset, b.shape)


def _acc_backward(g, out, a, b, offset):
    return g, block(g, offset, b.shape)


def _torch(name):
    def ref(a, b, offset):
        out = a.clone()
        index = block_slices(offset, b.shape)
        if name == "set":
            out[index] = b
        else:
            out[index] += b
        return out
    return ref


# --- samples and registration ---------------------------------------------------------------
def _set_cases():
    """ggml's SET cases: b of shape (2, 2, 2, 3) set at the centre of an a twice as large
    on its last `dim` axes, dim = 1, 2, 3."""
    b = (2, 2, 2, 3)
    out = []
    for dim in (1, 2, 3):
        a = tuple(2 * n if i >= 4 - dim else n for i, n in enumerate(b))
        out.append((a, b, tuple((na - nb) // 2 for na, nb in zip(a, b, strict=True))))
    return out


# ggml's ACC cases: b smaller on one or two axes, at offset 0 or inside
ACC_CASES = [((2, 2, 5, 6), (2, 2, 4, 6), (0, 0, 0, 0)), ((2, 2, 5, 6), (2, 2, 4, 3), (0, 0, 1, 2)),
             ((1, 1, 5, 6), (1, 1, 4, 6), (0, 0, 1, 0))]
COMMON_CASES = [((10,), (4,), (6,)), ((4, 5), (2, 3), (1, 2)), ((4, 5), (4, 5), (0, 0)),
                ((3, 4, 5), (1, 4, 2), (2, 0, 3))]


def _samples(name):
    @both_dtypes
    def samples(dtype):
        cases = (_set_cases() if name == "set" else ACC_CASES) + COMMON_CASES
        # where set's b covers all of a, a's gradient is 0 everywhere: not checked there
        # (a check of it could not fail; the other cases check its zeroed block)
        out = [Sample.make(name, [InputSpec("a", a, grad=name != "set" or a != b),
                                  InputSpec("b", b)], dtype, offset=o)
               for a, b, o in cases]
        for pa, pb in [((2, 0, 1), None), (None, (1, 2, 0)), ((1, 0, 2), (2, 1, 0))]:
            out.append(Sample.make(name, [InputSpec("a", (4, 5, 3), permute=pa),
                                          InputSpec("b", (2, 3, 2), permute=pb)],
                                   dtype, offset=(1, 2, 0)))
        return out
    return samples


def _strategy(name):
    @sample_strategy
    def strategy(draw, dtype):
        from hypothesis import strategies as st
        a_shape = draw(shapes(1, 4, 1, 5, max_size=150))    # a and b: <= 300 elements
        b_shape = tuple(draw(st.integers(1, n)) for n in a_shape)
        offset = tuple(draw(st.integers(0, n - m)) for n, m in zip(a_shape, b_shape,
                                                                     strict=True))
        inputs = [draw_input(draw, "a", a_shape), draw_input(draw, "b", b_shape)]
        return Sample.make(name, inputs, dtype, offset=offset)
    strategy.__name__ = f"_{name}_strategy"
    return strategy


def _scale(name):
    """Scale case: a (1000, 1000) block at offset (7, 13) of SQUARE."""
    def scale():
        return [scale_case(name, [InputSpec("a", SQUARE), InputSpec("b", (1000, 1000))],
                           offset=(7, 13))]
    return scale


OFFSET = Params(dict(offset=ints_param(0, why="the block lies inside a")))
def _bench(name):
    """Bench case: a (1024, 2048) block at offset (512, 1024) of BENCH_ELEMENTS."""
    def bench():
        return [bench_case(name, [InputSpec("a", BENCH_ELEMENTS), InputSpec("b", (1024, 2048))],
                           offset=(512, 1024))]
    return bench


register(OpDef("set", params=OFFSET,
               scale=_scale("set"), bench=_bench("set"), infer=_infer("set"),
               backward=_set_backward,
               kernels={"cpu": cpu_set, "cuda": "engine.backends.cuda.indexing:cuda_set"},
               build=set, torch=_torch("set"), samples=_samples("set"),
               strategy=_strategy("set"),
               doc="a with the block at offset replaced by b; gradient: g with the block "
                   "zeroed to a, g's block to b"))
register(OpDef("acc", params=OFFSET,
               scale=_scale("acc"), bench=_bench("acc"), infer=_infer("acc"),
               backward=_acc_backward,
               kernels={"cpu": cpu_acc, "cuda": "engine.backends.cuda.indexing:cuda_acc"},
               build=acc, torch=_torch("acc"), samples=_samples("acc"),
               strategy=_strategy("acc"),
               doc="a with b added onto the block at offset; gradient: g to a, g's block to b"))


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("acc", "no mutant yet: its gradient is g and a block (a view) of g; covered "
                       "only by --inject scale")
mutation.exempt("set", "no mutant yet: its gradient is set(g, 0) and block(g); covered only by "
                       "--inject scale")
