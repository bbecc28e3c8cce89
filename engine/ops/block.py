"""block: a rectangular block of a tensor, as a view (no copy).

    block(x, offset, shape)[k] = x[offset + k],   0 <= k < shape   (per axis)

i.e. x[o0:o0+s0, o1:o1+s1, ...] in numpy terms. One offset and one size per axis. The
result aliases x; it is a contiguous tensor only when the block is one contiguous range of a
contiguous x (whole trailing axes after its first axis of size > 1).

block is linear; its gradient puts g back at the block's place in zeros of x's shape:
pad(g, ((o0, n0 - o0 - s0), ...)). It is the backward of pad and concat and gives set and
acc their block gradients.
"""

from __future__ import annotations

from engine.errors import DTypeError, ShapeError
from engine.params import Params, int_tuple, ints_param
from engine.registry import OpDef, make_node, register, registered
from engine.samples import InputSpec, Sample, both_dtypes
from engine.strategies import draw_input, sample_strategy, shapes
from engine.tensor import is_float


def check_block(op: str, outer, offset, shape) -> None:
    """A block of `shape` at `offset` (one int >= 0 each per axis) must lie inside `outer`
    on every axis."""
    if not len(offset) == len(shape) == len(outer):
        raise ShapeError(f"{op}: offset {list(offset)} and shape {list(shape)} need one int "
                         f"per axis of {list(outer)}")
    for axis, (n, o, s) in enumerate(zip(outer, offset, shape, strict=True)):
        if o + s > n:
            raise ShapeError(f"{op}: a block of shape {list(shape)} at offset {list(offset)} "
                             f"does not fit in shape {list(outer)} (axis {axis}: "
                             f"{o} + {s} > {n})")


def block_slices(offset, shape) -> tuple[slice, ...]:
    """The numpy index of the block: (slice(o0, o0 + s0), ...)."""
    return tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))


def _block_infer(x, offset, shape):
    if not is_float(x.dtype):
        raise DTypeError(f"block: needs a float input, got {x.dtype} of shape "
                         f"{list(x.shape)}")
    check_block("block", x.shape, offset, shape)
    sized = [i for i, d in enumerate(shape) if d != 1]
    # one element (no axis of size > 1) is contiguous wherever it lies
    contiguous = x.contiguous and all(shape[i] == x.shape[i]
                                      for i in range(sized[0] + 1 if sized else x.ndim, x.ndim))
    return tuple(shape), x.dtype, contiguous


def block(x, offset, shape):
    """The block of x of `shape` starting at `offset` (one int per axis each): a view."""
    return make_node("block", (x,), offset=int_tuple("block", "offset", offset, x.ndim),
                     shape=int_tuple("block", "shape", shape, x.ndim))


def _block_backward(g, out, x, offset, shape):
    # pad (engine/ops/pad.py) imports this module for its own gradient: build it by name
    return (registered.pad(g, pads=tuple((o, n - o - s) for n, o, s in zip(x.shape, offset,
                                                                           shape, strict=True))),)


def _torch_block(x, offset, shape):
    return x[block_slices(offset, shape)]


# --- samples and registration ---------------------------------------------------------------
CASES = [((10,), (3,), (5,)), ((4, 6), (1, 2), (2, 3)), ((4, 6), (1, 0), (2, 6)),
         ((4, 6), (0, 0), (4, 6)), ((3, 4, 5), (1, 1, 2), (2, 2, 3)),
         ((3, 4, 5), (2, 0, 0), (1, 4, 5)), ((2, 3, 4, 5), (1, 0, 1, 2), (1, 3, 2, 3)),
         ((2, 3, 4, 5), (0, 1, 0, 0), (2, 1, 4, 5))]


@both_dtypes
def _block_samples(dtype):
    out = [Sample.make("block", [InputSpec("x", s)], dtype, offset=o, shape=b)
           for s, o, b in CASES]
    out += [Sample.make("block", [InputSpec("x", (4, 5, 3), permute=(1, 2, 0))], dtype,
                        offset=o, shape=b) for o, b in [((1, 2, 0), (2, 3, 3)),
                                                        ((0, 1, 1), (4, 1, 2))]]
    return out


@sample_strategy
def _block_strategy(draw, dtype):
    from hypothesis import strategies as st
    shape = draw(shapes(1, 4, 1, 6))
    size = tuple(draw(st.integers(1, n)) for n in shape)
    offset = tuple(draw(st.integers(0, n - s)) for n, s in zip(shape, size, strict=True))
    return Sample.make("block", [draw_input(draw, "x", shape)], dtype, offset=offset,
                       shape=size)


register(OpDef("block", params=Params(dict(
                   offset=ints_param(0, why="a view never starts before its base"),
                   shape=ints_param(0))),
               kind="view", infer=_block_infer, backward=_block_backward,
               view=lambda ins, offset, shape: ins[0][block_slices(offset, shape)],
               build=block, torch=_torch_block, samples=_block_samples,
               strategy=_block_strategy,
               doc="a block of x (x[o0:o0+s0, ...]) as a view; gradient: pad with zeros"))


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("block", "no mutant yet: its gradient is pad of g (pad's kernel has the mutant "
                         "pad_border_unwritten, run on pad's cases only); covered only by "
                         "--inject scale")
