"""CUDA kernel of the causal masks diag_mask_inf and diag_mask_zero: one thread per output
element, in a grid-stride loop (engine.backends.cuda.launch).

For x seen as 4-D (unit axes in front), rows i on axis -2 and columns j on axis -1:

    out[a, b, i, j] = fill if j > n_past + i else x[a, b, i, j]

fill is -inf (diag_mask_inf) or 0 (diag_mask_zero). x is read through its strides (views
reach the kernel as they are); out is C-contiguous. A masked element never reads x. The
CPU kernel (engine.backends.cpu.diag_mask) copies the same values, so both backends give
the same bits.
"""

from __future__ import annotations

import math

from numba import cuda

from engine.backends.cuda.arrays import with_rank
from engine.backends.cuda.launch import grid_stride, unravel4


@cuda.jit
def _diag_mask(x, out, n_past, fill):
    """out[a, b, i, j] = fill where j > n_past + i, x[a, b, i, j] elsewhere."""
    _, nb, nr, nc = out.shape
    value = out.dtype.type(fill)
    for flat in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        a, b, i, j = unravel4(flat, nb, nr, nc)
        if j > n_past + i:
            out[a, b, i, j] = value
        else:
            out[a, b, i, j] = x[a, b, i, j]


def _launch(out, ins, n_past, fill):
    (x,) = ins
    if out.size:
        grid_stride(_diag_mask, out.size, with_rank(x, 4), with_rank(out, 4), n_past, fill)


def cuda_diag_mask_inf(out, ins, n_past):
    """Dispatcher of diag_mask_inf: kernel(out, [x], n_past)."""
    _launch(out, ins, n_past, -math.inf)


def cuda_diag_mask_zero(out, ins, n_past):
    """Dispatcher of diag_mask_zero: kernel(out, [x], n_past)."""
    _launch(out, ins, n_past, 0.0)


PTX_SIGNATURES = [(_diag_mask, f"void({dt}{lay}, {dt}[:, :, :, ::1], int64, float64)")
                  for dt in ("float32", "float64")
                  for lay in ("[:, :, :, ::1]", "[:, :, :, :]")]
