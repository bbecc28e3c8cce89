"""CPU kernels of sum over axes.

Accumulation is in float64 for every input dtype. A full reduction splits the data into
chunks (their number set by the size alone, never by the thread count); each thread sums a
chunk privately and writes its partial once (no false sharing), and the partials are added
in a fixed order, so the result is the same bits on every machine.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.elementwise import _coalesce
from engine.backends.cpu.jit import kernel, parallel_kernel, prange

MAX_CHUNKS = 64


@parallel_kernel
def _sum_all(x, partials):
    n = x.size
    nchunks = partials.size
    chunk = (n + nchunks - 1) // nchunks
    for c in prange(nchunks):
        acc = 0.0
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            acc += x[i]
        partials[c] = acc


@parallel_kernel
def _sum_4d(x, out):
    """out[k0, k1] = sum over (r0, r1) of x[k0, k1, r0, r1] (x strided)."""
    d0, d1, d2, d3 = x.shape
    for k in prange(d0 * d1):
        k0 = k // d1
        k1 = k % d1
        acc = 0.0
        for r0 in range(d2):
            for r1 in range(d3):
                acc += x[k0, k1, r0, r1]
        out[k0, k1] = acc


@kernel
def _sum_partials(partials):
    acc = 0.0
    for i in range(partials.size):
        acc += partials[i]
    return acc


def _strided(arr, dims, rank):
    """A view of `arr` over coalesced `dims` [(size, stride)], padded to `rank` axes."""
    pad = rank - len(dims)
    return [1] * pad + [n for n, _ in dims], [0] * pad + [s for _, s in dims]


def cpu_sum(out, ins, axes, keepdims):
    (x,) = ins
    if len(axes) == x.ndim and x.flags.c_contiguous:
        # the chunking depends on the size only, never on the thread count: same bits
        # on every machine
        nchunks = min(MAX_CHUNKS, max(1, x.size // 4096))
        partials = np.empty(nchunks)  # a few doubles, one per chunk
        _sum_all(x.reshape(-1), partials)
        out.reshape(-1)[0] = _sum_partials(partials)
        return
    kept = [i for i in range(x.ndim) if i not in axes]
    kdims = _coalesce([x.shape[i] for i in kept], [x.strides[i] for i in kept])
    rdims = _coalesce([x.shape[i] for i in axes], [x.strides[i] for i in axes])
    kdims = [(n, s[0]) for n, s in kdims]
    rdims = [(n, s[0]) for n, s in rdims]
    if len(kdims) > 2 or len(rdims) > 2:      # more than two irreducible axes on a side
        np.sum(x, axis=tuple(axes), keepdims=keepdims, out=out)
        return
    ks, kst = _strided(x, kdims, 2)
    rs, rst = _strided(x, rdims, 2)
    xv = np.lib.stride_tricks.as_strided(x, ks + rs, kst + rst, writeable=False)
    ov = out.reshape(ks)  # out is contiguous, kept axes in order
    _sum_4d(xv, ov)
