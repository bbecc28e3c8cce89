"""CPU kernels of set and acc: out = a, then b written into (set) or added onto (acc) the
block of out at `offset`. Both are laid out once, when bound (block.copy_block_call), and
their runs only copy: gradcheck's numerical differences run a case's plan four times per
input element."""

from __future__ import annotations

from engine.backends.calls import sequence
from engine.backends.cpu.block import copy_block_call
from engine.backends.cpu.jit import bindable


def _block(out, offset, shape):
    return out[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]


@bindable
def cpu_set(out, ins, offset):
    """Dispatcher of set: kernel(out, [a, b], offset)."""
    a, b = ins
    return sequence(copy_block_call(out, a), copy_block_call(_block(out, offset, b.shape), b))


@bindable
def cpu_acc(out, ins, offset):
    """Dispatcher of acc: kernel(out, [a, b], offset)."""
    a, b = ins
    return sequence(copy_block_call(out, a),
                    copy_block_call(_block(out, offset, b.shape), b, add=True))
