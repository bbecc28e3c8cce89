"""CUDA kernels of cross_entropy_loss and its dedicated backward, over N rows of n classes:

    loss = (1/N) sum_r sum_c labels[r, c] (lse_r - logits[r, c])
    out[r, c] = (g / N) (exp(logits[r, c] - lse_r) t_r - labels[r, c])    (backward)
                t_r = sum_c labels[r, c]   (1 for probabilities; module doc of the op)

with lse_r = log(sum_c exp(logits[r, c])), taken stably in float64 (launch's
segment_logsumexp). The loss is one block: a segment of threads per row (several rows at
once when rows are short), the block's segments stepping through the rows together; each
thread adds its terms privately in float64 and one shared-memory tree sums the threads, so
the order of additions depends on the shape only. The backward is one segment per row, as softmax.
"""

from __future__ import annotations

import math

from numba import cuda, float64

from engine.backends.cuda.arrays import rows_view, strided
from engine.backends.cuda.launch import (
    SCRATCH,
    row_launch,
    row_sum,
    segment_logsumexp,
    segment_passes,
    segment_row,
    segment_scratch,
    segment_sum,
)


@cuda.jit
def _cross_entropy_kernel(logits, labels, out, rows, n, width):
    """out[0] = (1/rows) sum_r sum_j labels[r n + j] (lse_r - logits[r n + j]); one block."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)    # one block: start 0, step `groups`
    acc = 0.0
    for first in range(start, rows, step):
        _, count, base = segment_row(first, tid, width, rows, n)
        lse = segment_logsumexp(shared, logits, base, count, tid, width)
        for j in range(lane, count, width):
            acc += float64(labels[base + j]) * (lse - float64(logits[base + j]))
    total = segment_sum(shared, acc, tid, cuda.blockDim.x)
    if tid == 0:
        out[0] = total / rows


@cuda.jit
def _cross_entropy_back_kernel(g, logits, labels, out, rows, n, width):
    """out[r n + j] = (g[0] / rows) (exp(logits[r n + j] - lse_r) t_r - labels[r n + j]),
    t_r the row's sum of labels."""
    shared = segment_scratch()
    tid, lane, start, step = segment_passes(width)
    gscale = float64(g[0]) / rows
    for first in range(start, rows, step):
        _, count, base = segment_row(first, tid, width, rows, n)
        lse = segment_logsumexp(shared, logits, base, count, tid, width)
        total = row_sum(shared, labels, base, count, tid, width)
        for j in range(lane, count, width):
            p = math.exp(float64(logits[base + j]) - lse)
            out[base + j] = gscale * (p * total - float64(labels[base + j]))


def cuda_cross_entropy_loss(out, ins):
    """The dispatcher of cross_entropy_loss: ins = [logits, labels], out 0-d."""
    logits, rows, n = rows_view(ins[0], "cross_entropy_loss")
    labels, _, _ = rows_view(ins[1], "cross_entropy_loss")
    _, threads, width = row_launch(rows, n, SCRATCH)    # one block of SCRATCH threads at most
    oflat = strided(out, (1,), (out.dtype.itemsize,))
    _cross_entropy_kernel[1, threads](logits, labels, oflat, rows, n, width)


def cuda_cross_entropy_loss_back(out, ins):
    """The dispatcher of cross_entropy_loss_back: ins = [g (0-d), logits, labels]."""
    if out.size == 0:
        return
    g, logits, labels = ins
    gflat = strided(g, (1,), (g.dtype.itemsize,))
    lf, rows, n = rows_view(logits, "cross_entropy_loss_back")
    bf, _, _ = rows_view(labels, "cross_entropy_loss_back")
    of, _, _ = rows_view(out, "cross_entropy_loss_back")
    blocks, threads, width = row_launch(rows, n)
    _cross_entropy_back_kernel[blocks, threads](gflat, lf, bf, of, rows, n, width)


PTX_SIGNATURES = [sig for t in ("float32", "float64") for sig in [
    (_cross_entropy_kernel, f"void({t}[::1], {t}[::1], {t}[::1], int64, int64, int64)"),
    (_cross_entropy_back_kernel,
     f"void({t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64)"),
]]
