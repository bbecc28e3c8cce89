"""CPU kernels of cross_entropy_loss and its dedicated backward.

Forward: loss = (1/N) sum_r sum_c labels[r, c] (lse_r - logits[r, c]), with
lse_r = m_r + log(sum_c exp(logits[r, c] - m_r)) and m_r the row max (stable).

The N rows are split into a number of chunks that depends on N only (never on the thread
count), one `prange` iteration each. A chunk accumulates its rows in a private float64 and
writes it once, into its own cache line of `partials` (no false sharing); the partials are
then added serially in chunk order; a row's terms are summed in vector lanes (any_order),
so the result is the same bits on every run and thread count of one machine. Exponentials
and row maxima are softmax's (row_logsumexp: patterns.exp_into, row_extreme), which took
the forward + backward from 2.9x torch's to 0.6x over (256, 32000) (python
bench/bench_ops.py --op cross_entropy_loss --repeat 7, 2 threads, a loaded machine): a libm
exp per element in float64 and strict-order sums had been the cost.

Both run on the engine's threads from threads.MIN_ELEMENTS logits (the fast paths
split:cpu_cross_entropy_loss and split:cpu_cross_entropy_loss_back; the plain twin is one
range): the forward as ranges of its chunks (each chunk's partial as on one thread, added
in chunk order after), the backward as ranges of rows. The backward takes one exponential
per logit, kept in a float64 scratch row and scaled by t_r / sum_c exp(logits[r, c] - m_r),
and sums the labels in vector lanes: it had recomputed the row's exponentials after its
log-sum-exp and summed the labels in a strict order (a float64 addition's latency per
label), which with the forward on one thread took forward + backward over (256, 32000) to
2.8 times torch's two threads' (python bench/bench_ops.py on a quiet machine).
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu import threads
from engine.backends.cpu.jit import (
    any_order_contracting,
    bindable,
    call,
    contracting,
    kernel,
    prange,
)
from engine.backends.cpu.patterns import (
    F16,
    exp_into,
    row_extreme,
    sum_any_order,
    value_sum_any_order,
)
from engine.backends.cpu.softmax import as_rows, row_logsumexp, scratch_rows

MAX_CHUNKS = 32
LINE = 8   # float64 slots per partial: one 64-byte cache line each


def num_chunks(rows: int) -> int:
    """How many chunks the forward splits `rows` rows into (a function of rows only)."""
    return max(1, min(MAX_CHUNKS, rows))


@any_order_contracting
def _row_loss(labels_r, logits_r, lse, n):
    """sum_j labels_r[j] (lse - logits_r[j]) in float64, in vector lanes (sum_any_order's
    order: the same bits on every run of one machine, at any thread count)."""
    acc = 0.0
    for j in range(n):
        acc += np.float64(labels_r[j]) * (lse - np.float64(logits_r[j]))
    return acc


@contracting
def _cross_entropy_chunks(logits, labels, partials, first, last, dst):
    """partials[c, 0] = sum over the rows r of chunk c of sum_j labels[r, j] (lse_r -
    logits[r, j]), for first <= c < last: the rows cut into partials.shape[0] chunks (their
    length set by the number of rows alone), each accumulated privately in float64 and
    written once, into its own cache line. `dst` (an array of the loss's dtype) sets the
    exponentials' precision (patterns.exp_into)."""
    rows, n = logits.shape
    nchunks = partials.shape[0]
    chunk = (rows + nchunks - 1) // nchunks
    for c in prange(first, last):
        acc = 0.0
        for r in range(c * chunk, min(rows, (c + 1) * chunk)):
            lse = row_logsumexp(logits[r], n, F16, dst)
            acc += _row_loss(labels[r], logits[r], lse, n)
        partials[c, 0] = acc


@kernel
def _mean_of_partials(partials, rows, out):
    """out[0] = (partials[0, 0] + partials[1, 0] + ...) / rows, added in chunk order."""
    loss = 0.0
    for c in range(partials.shape[0]):
        loss += partials[c, 0]
    out[0] = loss / rows


@contracting
def _cross_entropy_back_rows(g, logits, labels, out, e, nrows):
    """out[r, c] = gscale (softmax(logits[r])[c] t_r - labels[r, c]), t_r = sum_c
    labels[r, c], gscale = g[0] / nrows, in float64 (g read when the kernel runs). The rows
    are cut into e.shape[0] parts (the prange); part p keeps a row's exponentials
    exp(logits[r, c] - m_r) in its float64 scratch row e[p], and softmax's is that times
    1 / sum_c exp(logits[r, c] - m_r)."""
    rows, n = logits.shape
    gscale = np.float64(g[0]) / nrows if nrows else 0.0
    per = (rows + e.shape[0] - 1) // e.shape[0]
    for p in prange(e.shape[0]):
        er = e[p]
        for r in range(p * per, min(rows, (p + 1) * per)):
            if n == 0:
                continue
            xr = logits[r]
            lr = labels[r]
            orow = out[r]
            m = row_extreme(xr, n, F16, False)
            for j in range(n):
                er[j] = exp_into(np.float64(xr[j]) - m, orow)
            scale = value_sum_any_order(lr, n, F16) / sum_any_order(er, n)
            for j in range(n):
                orow[j] = gscale * (er[j] * scale - np.float64(lr[j]))


@bindable
def cpu_cross_entropy_loss(out, ins):
    logits, labels = (as_rows(a, "cross_entropy_loss") for a in ins)
    # a few cache lines of partials (at most MAX_CHUNKS * 64 bytes), made once per binding
    partials = np.zeros((num_chunks(logits.shape[0]), LINE))
    dst = out.reshape(1)
    ranges = threads.row_ranges("cpu_cross_entropy_loss", partials.shape[0], 2 * logits.size)
    chunks = threads.side_by_side([call(_cross_entropy_chunks, logits, labels, partials, lo,
                                        hi, dst) for lo, hi in ranges])
    mean = call(_mean_of_partials, partials, logits.shape[0], dst)

    def run():
        chunks()
        mean()
    return run


@bindable
def cpu_cross_entropy_loss_back(out, ins):
    g, logits, labels = ins
    logits, labels = (as_rows(a, "cross_entropy_loss_back") for a in (logits, labels))
    rows_out = as_rows(out, "cross_entropy_loss_back")
    nrows, n = logits.shape
    return threads.side_by_side([
        call(_cross_entropy_back_rows, g.reshape(-1), logits[lo:hi], labels[lo:hi],
             rows_out[lo:hi], scratch_rows(hi - lo, n, np.float64), nrows)
        for lo, hi in threads.row_ranges("cpu_cross_entropy_loss_back", nrows, 3 * logits.size)])
