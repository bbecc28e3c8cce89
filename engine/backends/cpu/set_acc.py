"""CPU kernels of set and acc: out = a, then b written into (set) or added onto (acc) the
block of out at `offset`."""

from __future__ import annotations

from engine.backends.cpu.block import copy_block


def _block(out, offset, shape):
    return out[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]


def cpu_set(out, ins, offset):
    """Dispatcher of set: kernel(out, [a, b], offset)."""
    a, b = ins
    copy_block(out, a)
    copy_block(_block(out, offset, b.shape), b)


def cpu_acc(out, ins, offset):
    """Dispatcher of acc: kernel(out, [a, b], offset)."""
    a, b = ins
    copy_block(out, a)
    copy_block(_block(out, offset, b.shape), b, add=True)
