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
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.jit import any_order, bindable, call, contracting, prange
from engine.backends.cpu.patterns import F16, exp_into
from engine.backends.cpu.softmax import as_rows, row_logsumexp

MAX_CHUNKS = 32
LINE = 8   # float64 slots per partial: one 64-byte cache line each


def num_chunks(rows: int) -> int:
    """How many chunks the forward splits `rows` rows into (a function of rows only)."""
    return max(1, min(MAX_CHUNKS, rows))


@any_order
def _row_loss(labels_r, logits_r, lse, n):
    """sum_j labels_r[j] (lse - logits_r[j]) in float64, in vector lanes (sum_any_order's
    order: the same bits on every run of one machine, at any thread count)."""
    acc = 0.0
    for j in range(n):
        acc += np.float64(labels_r[j]) * (lse - np.float64(logits_r[j]))
    return acc


@contracting
def _cross_entropy_rows(logits, labels, partials, out):
    rows, n = logits.shape
    nchunks = partials.shape[0]
    chunk = (rows + nchunks - 1) // nchunks
    for c in prange(nchunks):
        acc = 0.0
        for r in range(c * chunk, min(rows, (c + 1) * chunk)):
            lse = row_logsumexp(logits[r], n, F16, out)
            acc += _row_loss(labels[r], logits[r], lse, n)
        partials[c, 0] = acc
    loss = 0.0
    for c in range(nchunks):
        loss += partials[c, 0]
    out[0] = loss / rows


@contracting
def _cross_entropy_back_rows(g, logits, labels, out):
    """out[r, c] = gscale (softmax(logits[r])[c] t_r - labels[r, c]), t_r = sum_c
    labels[r, c], gscale = g[0] / N, in float64 (g read when the kernel runs)."""
    rows, n = logits.shape
    gscale = np.float64(g[0]) / rows if rows else 0.0
    for r in prange(rows):
        xr = logits[r]
        lr = labels[r]
        orow = out[r]
        lse = row_logsumexp(xr, n, F16, orow)
        total = 0.0
        for j in range(n):
            total += np.float64(lr[j])
        for j in range(n):
            orow[j] = gscale * (exp_into(np.float64(xr[j]) - lse, orow) * total
                                - np.float64(lr[j]))


@bindable
def cpu_cross_entropy_loss(out, ins):
    logits, labels = (as_rows(a, "cross_entropy_loss") for a in ins)
    # a few cache lines of partials (at most MAX_CHUNKS * 64 bytes), made once per binding
    partials = np.zeros((num_chunks(logits.shape[0]), LINE))
    return call(_cross_entropy_rows, logits, labels, partials, out.reshape(1))


@bindable
def cpu_cross_entropy_loss_back(out, ins):
    g, logits, labels = ins
    logits, labels = (as_rows(a, "cross_entropy_loss_back") for a in (logits, labels))
    return call(_cross_entropy_back_rows, g.reshape(-1), logits, labels,
                as_rows(out, "cross_entropy_loss_back"))
