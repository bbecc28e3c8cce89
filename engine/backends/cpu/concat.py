"""CPU kernel of concat: a and b copied into their two blocks of the output."""

from __future__ import annotations

from engine.backends.cpu.block import copy_block


def cpu_concat(out, ins, axis):
    """Dispatcher of concat: kernel(out, [a, b], axis)."""
    a, b = ins
    head = (slice(None),) * axis
    copy_block(out[head + (slice(0, a.shape[axis]),)], a)
    copy_block(out[head + (slice(a.shape[axis], None),)], b)
