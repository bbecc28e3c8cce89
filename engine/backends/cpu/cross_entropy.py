"""CPU kernels of cross_entropy_loss and its dedicated backward.

Forward: loss = (1/N) sum_r sum_c labels[r, c] (lse_r - logits[r, c]), with
lse_r = m_r + log(sum_c exp(logits[r, c] - m_r)) and m_r the row max (stable).

The N rows are split into a number of chunks that depends on N only (never on the thread
count), one `prange` iteration each. A chunk accumulates its rows in a private float64 and
writes it once, into its own cache line of `partials` (no false sharing); the partials are
then added serially in chunk order, so the result is the same bits on any machine.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.jit import bindable, call, parallel_kernel, prange
from engine.backends.cpu.softmax import as_rows, row_logsumexp

MAX_CHUNKS = 32
LINE = 8   # float64 slots per partial: one 64-byte cache line each


def num_chunks(rows: int) -> int:
    """How many chunks the forward splits `rows` rows into (a function of rows only)."""
    return max(1, min(MAX_CHUNKS, rows))


@parallel_kernel
def _cross_entropy_rows(logits, labels, partials, out):
    rows, n = logits.shape
    nchunks = partials.shape[0]
    chunk = (rows + nchunks - 1) // nchunks
    for c in prange(nchunks):
        acc = 0.0
        for r in range(c * chunk, min(rows, (c + 1) * chunk)):
            lse = row_logsumexp(logits, r)
            for j in range(n):
                acc += np.float64(labels[r, j]) * (lse - np.float64(logits[r, j]))
        partials[c, 0] = acc
    loss = 0.0
    for c in range(nchunks):
        loss += partials[c, 0]
    out[0] = loss / rows


@parallel_kernel
def _cross_entropy_back_rows(g, logits, labels, out):
    """out[r, c] = gscale (softmax(logits[r])[c] t_r - labels[r, c]), t_r = sum_c
    labels[r, c], gscale = g[0] / N, in float64 (g read when the kernel runs)."""
    rows, n = logits.shape
    gscale = np.float64(g[0]) / rows if rows else 0.0
    for r in prange(rows):
        lse = row_logsumexp(logits, r)
        total = 0.0
        for j in range(n):
            total += np.float64(labels[r, j])
        for j in range(n):
            p = np.exp(np.float64(logits[r, j]) - lse)
            out[r, j] = gscale * (p * total - np.float64(labels[r, j]))


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
