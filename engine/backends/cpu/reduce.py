"""CPU kernels of sum over axes.

Accumulation is in float64 for every input dtype. Every result is the same bits on every
machine and for every thread count: the order of the additions depends on the shapes and
strides only. A single chain of float64 additions runs at the latency of one addition per
element; instead, long contiguous runs are added element by element into BLOCK float64
accumulators (vertical additions, which vectorise; add_run) that are summed at the end,
and short runs in eight interleaved partial sums (run_sum). So a sum can differ from a
strictly sequential float64 sum in its last bits: only the order of the float64 additions
differs, and it is fixed by the shapes.

Layouts (axes coalesced first, see engine.backends.cpu.layout):
- everything reduced, x contiguous: the data is split into chunks (their number set by the
  size alone); each thread sums a chunk privately into its own accumulators and writes its
  partial once (no false sharing), and the partials are added in chunk order;
- the kept axis innermost and contiguous (a bias gradient: the sum over the rows of a
  matrix): rows are added into float64 accumulator rows, one per chunk of rows, then the
  chunks in order; every addition is a contiguous, vectorised row operation;
- a reduced axis innermost and contiguous (a channel bias gradient: the sum over images
  and pixels for each channel): each kept element adds its contiguous runs into its own
  accumulators, one thread per kept element (a big one: ranges of kept elements on the
  engine's threads, engine.backends.cpu.threads);
- anything else: a strided loop over at most two kept and two reduced axes, else numpy.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu import layout, paths, threads
from engine.backends.cpu.jit import bindable, call, parallel_kernel, prange, scalar_math

MAX_CHUNKS = 64
ROW_CHUNK_ELEMENTS = 1 << 16   # rows per accumulator row: at least this many elements
BLOCK = 256                    # float64 accumulators of a vertical sum (see add_run)
LINE = 8                       # float64s per cache line
MAX_SCRATCH = 1 << 21          # float64 accumulators at most, else sums of scalar chains


@scalar_math
def run_sum(x, start, n):
    """x[start] + ... + x[start + n - 1] in float64, in eight interleaved partial sums
    (lanes j mod 8) added pairwise at the end."""
    xs = x[start:start + n]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    n8 = n // 8 * 8
    for i in range(0, n8, 8):
        s0 += xs[i]
        s1 += xs[i + 1]
        s2 += xs[i + 2]
        s3 += xs[i + 3]
        s4 += xs[i + 4]
        s5 += xs[i + 5]
        s6 += xs[i + 6]
        s7 += xs[i + 7]
    for i in range(n8, n):
        s0 += xs[i]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@scalar_math
def add_run(x, start, n, acc):
    """acc[j mod acc.size] += x[start + j] for j < n, block after block of acc.size
    elements: vertical additions, which vectorise (a sum is then run_sum of acc)."""
    width = acc.size
    for lo in range(0, n, width):
        m = min(width, n - lo)
        src = x[start + lo:start + lo + m]
        for j in range(m):
            acc[j] += src[j]


@parallel_kernel
def _sum_all(x, acc, out):
    """out[0] = the sum of contiguous x, cut into acc.shape[0] chunks: chunk c added into
    the accumulators acc[c, LINE:], its sum written once into acc[c, 0] (rows of whole
    cache lines: no false sharing), then the chunks' sums added in order."""
    n = x.size
    nchunks = acc.shape[0]
    chunk = (n + nchunks - 1) // nchunks
    for c in prange(nchunks):
        a = acc[c, LINE:]
        for j in range(a.size):
            a[j] = 0.0
        lo = min(n, c * chunk)
        add_run(x, lo, min(n, lo + chunk) - lo, a)
        acc[c, 0] = run_sum(a, 0, a.size)
    total = 0.0
    for c in range(nchunks):
        total += acc[c, 0]
    out[0] = total


@parallel_kernel
def _sum_rows(x, rows, run, acc, out):
    """out[j] = sum over r of x[rows[r] + j], j < run: the rows split into acc.shape[0]
    chunks, chunk c added row by row into acc[c], then acc[0] + acc[1] + ... in order."""
    nchunks = acc.shape[0]
    nrows = rows.size
    chunk = (nrows + nchunks - 1) // nchunks
    for c in prange(nchunks):
        a = acc[c]
        for j in range(run):
            a[j] = 0.0
        for r in range(c * chunk, min(nrows, (c + 1) * chunk)):
            src = x[rows[r]:rows[r] + run]
            for j in range(run):
                a[j] += src[j]
    for j in range(run):
        total = 0.0
        for c in range(nchunks):
            total += acc[c, j]
        out[j] = total


@parallel_kernel
def _sum_runs(x, kept, reduced, run, acc, out):
    """out[k] = sum over m of the sum of x[kept[k] + reduced[m] : ... + run]. With
    accumulators (acc, one row per k) the runs are added into acc[k] (add_run) and acc[k]
    summed at the end; without (acc of zero rows), each run is a run_sum."""
    for k in prange(kept.size):
        total = 0.0
        if acc.shape[0] > 0:
            a = acc[k]
            for j in range(a.size):
                a[j] = 0.0
            for m in range(reduced.size):
                add_run(x, kept[k] + reduced[m], run, a)
            total = run_sum(a, 0, a.size)
        else:
            for m in range(reduced.size):
                total += run_sum(x, kept[k] + reduced[m], run)
        out[k] = total


@parallel_kernel
def _sum_4d(x, out):
    """out[k0, k1] = sum over (r0, r1) of x[k0, k1, r0, r1] (x strided; the fallback)."""
    d0, d1, d2, d3 = x.shape
    for k in prange(d0 * d1):
        k0 = k // d1
        k1 = k % d1
        acc = 0.0
        for r0 in range(d2):
            for r1 in range(d3):
                acc += x[k0, k1, r0, r1]
        out[k0, k1] = acc


def _whole_lines(n: int) -> int:
    """n rounded up to whole cache lines of float64s (so that rows share no line)."""
    return -(-n // LINE) * LINE


def _padded(dims, rank):
    """Sizes and strides of coalesced `dims` [(size, [stride])], left-padded to `rank`."""
    pad = rank - len(dims)
    return [1] * pad + [n for n, _ in dims], [0] * pad + [s[0] for _, s in dims]


@bindable
def cpu_sum(out, ins, axes, keepdims):
    (x,) = ins
    item = x.itemsize
    flat_out = out.reshape(-1)
    if x.size == 0 or out.size == 0:
        return lambda: out.fill(0) if out.size else None
    if paths.PLAIN:            # the plain twin: numpy's sum in float64
        return lambda: np.copyto(out, np.sum(x, axis=tuple(axes), dtype=np.float64,
                                             keepdims=keepdims).reshape(out.shape))
    kept = [i for i in range(x.ndim) if i not in axes]
    kdims = layout.coalesce([x.shape[i] for i in kept], [x.strides[i] for i in kept])
    rdims = layout.coalesce([x.shape[i] for i in axes], [x.strides[i] for i in axes])
    base = layout.flat_base(x)
    if not kdims and x.flags.c_contiguous:
        # the chunking depends on the size only, never on the thread count
        acc = np.empty((min(MAX_CHUNKS, max(1, x.size // 4096)), LINE + BLOCK))
        if acc.shape[0] > 1:
            paths.taken("sum:chunks")
        return call(_sum_all, x.reshape(-1), acc, flat_out)
    if base is not None and len(kdims) == 1 and kdims[0][1][0] == item:
        rows = layout.row_offsets(rdims, 0, item)
        run = kdims[0][0]
        nchunks = max(1, min(MAX_CHUNKS, rows.size * run // ROW_CHUNK_ELEMENTS, rows.size))
        acc = np.empty((nchunks, _whole_lines(run)))   # rows of whole cache lines
        if nchunks > 1:
            paths.taken("sum:rows")
        return call(_sum_rows, base, rows, run, acc, flat_out)
    inner = [i for i, (_, s) in enumerate(rdims) if s[0] == item]
    if base is not None and inner:
        run = rdims[inner[-1]][0]
        others = rdims[:inner[-1]] + rdims[inner[-1] + 1:]
        kept_offsets = layout.row_offsets(kdims, 0, item)
        reduced_offsets = layout.row_offsets(others, 0, item)
        width = _whole_lines(min(run, BLOCK))
        vertical = run >= 16 and kept_offsets.size * width <= MAX_SCRATCH
        acc = np.empty((kept_offsets.size, width) if vertical else (0, 1))
        if vertical:
            paths.taken("sum:runs")
        if threads.parts() > 1 and kept_offsets.size > 1 and x.size >= threads.MIN_ELEMENTS:
            # kept elements in ranges on the engine's threads: each element's sum as whole
            paths.taken("sum:runs_split")
            return threads.side_by_side([
                call(_sum_runs, base, kept_offsets[lo:hi], reduced_offsets, run,
                     acc[lo:hi] if vertical else acc, flat_out[lo:hi])
                for lo, hi in threads.bounds(kept_offsets.size, threads.parts())])
        return call(_sum_runs, base, kept_offsets, reduced_offsets, run, acc, flat_out)
    if len(kdims) > 2 or len(rdims) > 2:      # more than two irreducible axes on a side
        return lambda: np.sum(x, axis=tuple(axes), keepdims=keepdims, out=out)
    ks, kst = _padded(kdims, 2)
    rs, rst = _padded(rdims, 2)
    xv = layout.as_strided(x, ks + rs, kst + rst)
    return call(_sum_4d, xv, out.reshape(ks))  # out is contiguous, kept axes in order
