"""CPU kernels of get_rows (a gather of table rows) and get_rows_back (its scatter-add).

Indices are checked by the dispatchers before any kernel runs: one out of [0, R) raises
engine.errors.RowIndexError, never an out-of-bounds read or write.

get_rows runs a `prange` over the output rows. get_rows_back must add several gradient
rows into one table row when an index repeats, so it splits the table's COLUMNS among
the threads instead: the table is zeroed, then each task owns a band of columns of every
table row and adds into it the gradient rows in index order. No two tasks write one
element (no races, no atomics), and each element's sum runs in the same order whatever
the bands are, so the result never depends on the thread count. There is one band per
thread (each band walks every gradient row, so more bands would only repeat the random
accesses to the table), at least MIN_BAND columns wide.
"""

from __future__ import annotations

import numba

from engine.backends.cpu import paths
from engine.backends.cpu.block import fill_zero
from engine.backends.cpu.jit import parallel_kernel, prange
from engine.backends.cpu.layout import contiguous
from engine.errors import RowIndexError

MIN_BAND = 16   # columns (64 bytes of float32: bands of two threads share few cache lines)


@parallel_kernel
def _get_rows(table, idx, out):
    """out[b, k, :] = table[idx[b, k], :]."""
    nb, nk = idx.shape
    nc = table.shape[1]
    for p in prange(nb * nk):
        b = p // nk
        k = p % nk
        trow = table[idx[b, k]]
        orow = out[b, k]
        for c in range(nc):
            orow[c] = trow[c]


@parallel_kernel
def _get_rows_back(g, idx, out, band):
    """out[idx[b, k], :] += g[b, k, :] for every (b, k) in order, out zeroed before."""
    nb, nk = idx.shape
    nc = out.shape[1]
    for q in prange((nc + band - 1) // band):
        c0 = q * band
        c1 = min(nc, c0 + band)
        for b in range(nb):
            for k in range(nk):
                orow = out[idx[b, k]]
                grow = g[b, k]
                for c in range(c0, c1):
                    orow[c] += grow[c]


def _checked(op, idx, nrows):
    """idx as a 2-D (batch, index) array, once every index is known to lie in [0, nrows)."""
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= nrows):
        bad = idx[(idx < 0) | (idx >= nrows)]
        raise RowIndexError(f"{op}: index {int(bad.reshape(-1)[0])} out of range for a table "
                            f"of {nrows} rows ({bad.size} of the {idx.size} indices of shape "
                            f"{list(idx.shape)} are outside [0, {nrows}))")
    return idx if idx.ndim == 2 else idx.reshape(1, -1)


def cpu_get_rows(out, ins):
    """Dispatcher of get_rows: kernel(out, [table, idx])."""
    table, idx = (contiguous(a) for a in ins)      # one compiled layout (layout.dense)
    idx2 = _checked("get_rows", idx, table.shape[0])
    _get_rows(table, idx2, out.reshape(idx2.shape + table.shape[1:]))


def cpu_get_rows_back(out, ins, nrows):
    """Dispatcher of get_rows_back: kernel(out, [g, idx], nrows)."""
    g, idx = (contiguous(a) for a in ins)          # one compiled layout (layout.dense)
    idx2 = _checked("get_rows_back", idx, nrows)
    g3 = g if g.ndim == 3 else g.reshape((1,) + g.shape)
    nc = out.shape[1]
    band = -(-nc // numba.get_num_threads())
    band = max(MIN_BAND, -(-band // MIN_BAND) * MIN_BAND)
    if paths.PLAIN:
        band = max(nc, 1)                  # one band: every row added whole, in order
    elif band < nc:
        paths.taken("get_rows_back:bands")
    fill_zero(out)
    _get_rows_back(g3, idx2, out, band)
