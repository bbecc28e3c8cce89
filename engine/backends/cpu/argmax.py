"""CPU kernel of argmax along the last axis."""

from __future__ import annotations

from engine.backends.cpu.jit import bindable, call, parallel_kernel, prange
from engine.backends.cpu.softmax import as_rows


@parallel_kernel
def _argmax_rows(x, out):
    """out[r] = the first j with x[r, j] maximal; a NaN counts as maximal (as numpy, torch)."""
    rows, n = x.shape
    for r in prange(rows):
        best = x[r, 0]
        idx = 0
        for j in range(1, n):
            v = x[r, j]
            if v > best or (v != v and best == best):
                best = v
                idx = j
        out[r] = idx


@bindable
def cpu_argmax(out, ins):
    (x,) = ins
    return call(_argmax_rows, as_rows(x, "argmax"), out.reshape(-1))
