"""The widening of 16-bit nodes, written once for the CPU and the CUDA backends
(engine.backends.cpu.half.widened and engine.backends.cuda.half.widened): how a float32
kernel runs on a node of which some arrays are float16 or bfloat16.

Per call, each 16-bit input is widened exactly into a new float32 temporary, the float32
kernel runs on the temporaries, and a 16-bit output is rounded to nearest even on store, so
a plan's 16-bit buffers stay 16-bit between calls. An input that is the output's own buffer
(an update op writing its param in place) gets the output's temporary, which then starts
from the output's values; an update kernel also writes its other inputs in place (optimizer
state), so the 16-bit ones among them are stored back too. The backends differ only in
their arrays, which `HalfArrays` hands in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class HalfArrays(NamedTuple):
    """A backend's operations on its arrays for `run_widened`."""

    is_half: Callable        # (array) -> whether it holds a 16-bit float
    overlap: Callable        # (a, b) -> whether the two arrays may share memory
    widened_copy: Callable   # (array) -> a new float32 array of a 16-bit one's values
    empty32: Callable        # (shape) -> a new float32 array
    store: Callable          # (dst, src) -> dst (16-bit) = src (float32) rounded to nearest even


def run_widened(run, out, ins, update: bool, arrays: HalfArrays) -> None:
    """run(wide_out, wide_ins), the float32 kernel on out and ins with their 16-bit arrays
    widened (module doc); `update`: the kernel writes its inputs in place too."""
    half_out = arrays.is_half(out)
    if not half_out:
        wide_out = out
    elif update:
        wide_out = arrays.widened_copy(out)
    else:
        wide_out = arrays.empty32(out.shape)
    wide_ins = []
    for a in ins:
        if not arrays.is_half(a):
            wide_ins.append(a)
        elif half_out and arrays.overlap(a, out):
            wide_ins.append(wide_out)
        else:
            wide_ins.append(arrays.widened_copy(a))
    run(wide_out, wide_ins)
    if half_out:
        arrays.store(out, wide_out)
    if update:
        for a, w in zip(ins, wide_ins, strict=True):
            if w is not a and w is not wide_out:
                arrays.store(a, w)
