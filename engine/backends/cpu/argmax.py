"""CPU kernel of argmax along the last axis.

A row's maximum is found first, as the maximum of integer keys whose order is the values'
(patterns.order_key; a NaN of either sign given the key of a positive NaN, beyond +inf),
which vectorises where a loop of float comparisons does not; then the first index holding
it (the first NaN, where the maximum is one; the first of +0 and -0, which compare equal,
as numpy and torch pick). The former single loop of comparisons took 1.7 times torch's
time over (256, 32000) (python bench/bench_ops.py on a quiet machine, 2 threads each).
"""

from __future__ import annotations

from engine.backends.cpu.jit import bindable, call, kernel, parallel_kernel, prange
from engine.backends.cpu.patterns import F16, key_value, order_key
from engine.backends.cpu.softmax import as_rows


@kernel
def _row_argmax(xr):
    """The first j with xr[j] maximal (xr.size >= 1); a NaN counts as maximal."""
    n = xr.size
    v = xr[0]
    top = order_key(abs(v) if v != v else v)
    for j in range(1, n):
        v = xr[j]
        top = max(top, order_key(abs(v) if v != v else v))
    best = key_value(top, xr, F16)
    if best != best:
        for j in range(n):
            if xr[j] != xr[j]:
                return j
    for j in range(n):
        if xr[j] == best:
            return j
    return 0


@parallel_kernel
def _argmax_rows(x, out):
    """out[r] = the first j with x[r, j] maximal; a NaN counts as maximal (as numpy, torch)."""
    for r in prange(x.shape[0]):
        out[r] = _row_argmax(x[r])


@bindable
def cpu_argmax(out, ins):
    (x,) = ins
    return call(_argmax_rows, as_rows(x, "argmax"), out.reshape(-1))
