"""CPU kernel of the causal masks diag_mask_inf and diag_mask_zero (ggml's DIAG_MASK_INF and
DIAG_MASK_ZERO).

For x seen as 4-D (unit axes in front), rows i on axis -2 and columns j on axis -1:

    out[a, b, i, j] = fill            where j > n_past + i
                      x[a, b, i, j]   elsewhere

fill is -inf (diag_mask_inf) or 0 (diag_mask_zero). x is read C-contiguous: a permuted,
sliced or stride-0 view is copied first (layout.dense, when the call runs), so that numba
compiles the kernel once per dtype, not again per layout (such views made 4 of its 6
compilations in a cold `gradcheck --all`: `python bench/bench_first_run.py --breakdown
--records F`); out is C-contiguous. The work is a range of
flattened rows (a, b, i): inputs of at least threads.MIN_ELEMENTS elements (x and out
together) run as near-equal row ranges on the engine's threads (the fast path
split:cpu_diag_mask; its plain twin is one range). A row's elements depend on its own
index i only, so any split gives the same bits.
"""

from __future__ import annotations

import numpy as np

from engine.backends.calls import sequence
from engine.backends.cpu import layout, paths, threads
from engine.backends.cpu.jit import bindable, kernel

PATH = "split:cpu_diag_mask"


@kernel
def _diag_mask_rows(x, out, n_past, fill, lo, hi):
    """Rows lo <= p < hi of the flattened (a, b, i) rows: out[.., i, j] = x[.., i, j] for
    j <= n_past + i, fill after."""
    nb, nr, nc = x.shape[1], x.shape[2], x.shape[3]
    for p in range(lo, hi):
        i = p % nr
        ab = p // nr
        a = ab // nb
        b = ab % nb
        keep = min(nc, n_past + i + 1)       # columns 0 .. keep-1 are kept (n_past >= 0)
        xr = x[a, b, i]
        orow = out[a, b, i]
        for j in range(keep):
            orow[j] = xr[j]
        for j in range(keep, nc):
            orow[j] = fill


def as_4d(arr: np.ndarray) -> np.ndarray:
    """`arr` (2 to 4 axes) with unit axes in front up to 4 axes: a view, never a copy."""
    return arr[(None,) * (4 - arr.ndim)]


def _prepare(out, ins, n_past, fill):
    (x,) = ins
    copies: list = []
    x4, out4 = layout.dense(as_4d(x), copies), as_4d(out)
    rows = out4.shape[0] * out4.shape[1] * out4.shape[2]
    big = out.size + x.size >= threads.MIN_ELEMENTS
    spans = threads.bounds(rows, threads.parts() if big else 1)
    if len(spans) > 1:
        paths.taken(PATH)
    value = float(fill)
    calls = [lambda lo=lo, hi=hi: _diag_mask_rows(x4, out4, n_past, value, lo, hi)
             for lo, hi in spans]
    return sequence(*copies, threads.side_by_side(calls))


_kernel = bindable(_prepare)


def cpu_diag_mask_inf(out, ins, n_past):
    """Kernel of diag_mask_inf: kernel(out, [x], n_past); -inf above the diagonal
    n_past."""
    _kernel(out, ins, n_past=n_past, fill=-np.inf)


def cpu_diag_mask_zero(out, ins, n_past):
    """Kernel of diag_mask_zero: kernel(out, [x], n_past); 0 above the diagonal n_past."""
    _kernel(out, ins, n_past=n_past, fill=0.0)


cpu_diag_mask_inf.bind = lambda out, ins, n_past: _prepare(out, ins, n_past, -np.inf)
cpu_diag_mask_zero.bind = lambda out, ins, n_past: _prepare(out, ins, n_past, 0.0)
