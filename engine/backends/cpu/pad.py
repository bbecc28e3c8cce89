"""CPU kernel of pad: zero the output, then copy x into its interior block."""

from __future__ import annotations

from engine.backends.cpu.block import copy_block, fill_zero


def cpu_pad(out, ins, pads):
    """Dispatcher of pad: kernel(out, [x], pads), pads = ((before, after), ...) per axis."""
    (x,) = ins
    fill_zero(out)
    copy_block(out[tuple(slice(b, b + n) for (b, _), n in zip(pads, x.shape, strict=True))], x)
