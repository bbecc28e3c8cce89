"""CPU kernels of sum over axes.

Accumulation is in float64 for every input dtype. Every result is the same bits on every
machine and for every thread count: the order of the additions depends on the shapes and
strides only. A single chain of float64 additions runs at the latency of one addition per
element; instead, long contiguous runs are added element by element into BLOCK float64
accumulators (vertical additions, which vectorise; add_run) that are summed at the end,
and short runs in eight interleaved partial sums (run_sum). So a sum can differ from a
strictly sequential float64 sum in its last bits: only the order of the float64 additions
differs, and it is fixed by the shapes.

float16 and bfloat16 inputs are read as their bit patterns and widened in the loads, and
each sum rounded once into the 16-bit output (engine.backends.cpu.patterns). One exception
to the fixed order: a 16-bit contiguous run (the sum over a row) is added in float64
vector lanes in an order the compiler picks for the machine's vector width
run_sum_any_order, the fast path sum:lanes: blocks of 1024 values in float32 lanes, the
blocks in float64), so there a sum's last bits may differ between machines with different
vector widths: invisible after the rounding to 16 bits but for a sum within some 64
float32 ulps of a 16-bit tie.

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
from numba.core import types
from numba.extending import overload

from engine.backends.cpu import layout, paths, threads
from engine.backends.cpu.jit import any_order, bindable, call, parallel_kernel, prange, scalar_math
from engine.backends.cpu.patterns import as_patterns, fmt_of, native_half, rounded, value
from engine.tensor import is_half

MAX_CHUNKS = 64
ROW_CHUNK_ELEMENTS = 1 << 16   # rows per accumulator row: at least this many elements
BLOCK = 256                    # float64 accumulators of a vertical sum (see add_run)
LINE = 8                       # float64s per cache line
MAX_SCRATCH = 1 << 21          # float64 accumulators at most, else sums of scalar chains


@scalar_math
def run_sum(x, start, n):
    """x[start] + ... + x[start + n - 1] (a float array) in float64, in eight interleaved
    partial sums (lanes j mod 8) added pairwise at the end."""
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


LANE_BLOCK = 1024       # 16-bit values summed in float32 lanes per block (run_sum_any_order)
# 16-bit runs in lanes split on the engine's threads from this size: they sum 2 million
# bfloat16 in 0.11 ms on one thread, 0.15 ms on two (the hand-over, about 0.1 ms, costs
# more than the half it saves; measured on the 2-core machine, the rows of (2048, 1024))
LANES_MIN_ELEMENTS = 4 * threads.MIN_ELEMENTS


@any_order
def run_sum_any_order(x, start, n, fmt):
    """The values of x[start], ..., x[start + n - 1] (16-bit patterns of format fmt)
    summed in blocks of LANE_BLOCK: each block in float32 in an order of LLVM's choosing
    (vector lanes, 16 or more: a lane adds at most 64 values, so a block errs at most some
    64 float32 ulps of its sum of magnitudes, a hundredth of a float16 ulp), the blocks'
    sums in float64 in order (see the module doc)."""
    xs = x[start:start + n]
    total = 0.0
    for lo in range(0, n, LANE_BLOCK):
        block = xs[lo:lo + LANE_BLOCK]
        part = np.float32(0.0)
        for j in range(block.size):
            part += value(block[j], fmt)
        total += part
    return total


def run_total(x, start, n, fmt):
    """run_sum of a float array, run_sum_any_order of 16-bit patterns. Compiled code
    only."""
    raise NotImplementedError("reduce.run_total runs inside numba kernels only")


@overload(run_total, inline="always")
def _run_total(x, start, n, fmt):
    if isinstance(x.dtype, types.Integer):
        return lambda x, start, n, fmt: run_sum_any_order(x, start, n, fmt)
    return lambda x, start, n, fmt: run_sum(x, start, n)


@scalar_math
def add_run(x, start, n, acc, fmt):
    """acc[j mod acc.size] += x[start + j]'s value for j < n, block after block of acc.size
    elements: vertical additions, which vectorise (a sum is then run_sum of acc)."""
    width = acc.size
    for lo in range(0, n, width):
        m = min(width, n - lo)
        src = x[start + lo:start + lo + m]
        for j in range(m):
            acc[j] += value(src[j], fmt)


@parallel_kernel
def _sum_all(x, acc, out, fmt):
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
        add_run(x, lo, min(n, lo + chunk) - lo, a, fmt)
        acc[c, 0] = run_sum(a, 0, a.size)
    total = 0.0
    for c in range(nchunks):
        total += acc[c, 0]
    out[0] = rounded(total, out, fmt)


@parallel_kernel
def _sum_rows(x, rows, run, acc, out, fmt):
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
                a[j] += value(src[j], fmt)
    for j in range(run):
        total = 0.0
        for c in range(nchunks):
            total += acc[c, j]
        out[j] = rounded(total, out, fmt)


@parallel_kernel
def _sum_runs(x, kept, reduced, run, acc, out, fmt):
    """out[k] = sum over m of the sum of x[kept[k] + reduced[m] : ... + run]. With
    accumulators (acc, one row per k) the runs are added into acc[k] (add_run) and acc[k]
    summed at the end; without (acc of zero rows), each run is a run_sum (16-bit patterns:
    run_sum_any_order)."""
    for k in prange(kept.size):
        total = 0.0
        if acc.shape[0] > 0:
            a = acc[k]
            for j in range(a.size):
                a[j] = 0.0
            for m in range(reduced.size):
                add_run(x, kept[k] + reduced[m], run, a, fmt)
            total = run_sum(a, 0, a.size)
        else:
            for m in range(reduced.size):
                total += run_total(x, kept[k] + reduced[m], run, fmt)
        out[k] = rounded(total, out, fmt)


@parallel_kernel
def _sum_4d(x, out, fmt):
    """out[k0, k1] = sum over (r0, r1) of x[k0, k1, r0, r1] (x strided; the fallback)."""
    d0, d1, d2, d3 = x.shape
    for k in prange(d0 * d1):
        k0 = k // d1
        k1 = k % d1
        acc = 0.0
        for r0 in range(d2):
            for r1 in range(d3):
                acc += value(x[k0, k1, r0, r1], fmt)
        out[k0, k1] = rounded(acc, out, fmt)


def _whole_lines(n: int) -> int:
    """n rounded up to whole cache lines of float64s (so that rows share no line)."""
    return -(-n // LINE) * LINE


def _padded(dims, rank):
    """Sizes and strides of coalesced `dims` [(size, [stride])], left-padded to `rank`."""
    pad = rank - len(dims)
    return [1] * pad + [n for n, _ in dims], [0] * pad + [s[0] for _, s in dims]


@native_half
@bindable
def cpu_sum(out, ins, axes, keepdims):
    (x,) = ins
    item = x.itemsize
    if x.size == 0 or out.size == 0:
        return lambda: out.fill(0) if out.size else None

    def by_numpy():            # in float64, rounded once into out
        with np.errstate(invalid="ignore", over="ignore"):   # inf - inf is NaN, as in IEEE
            return np.copyto(out, np.sum(ins[0], axis=tuple(axes), dtype=np.float64,
                                         keepdims=keepdims).reshape(out.shape))
    if paths.PLAIN:            # the plain twin
        return by_numpy
    half16 = is_half(x.dtype)  # 16-bit: the kernels read and write patterns
    fmt = fmt_of(x)
    x = as_patterns(ins[0])    # (by_numpy reads ins[0])
    flat_out = as_patterns(out).reshape(-1)
    kept = [i for i in range(x.ndim) if i not in axes]
    kdims = layout.coalesce([x.shape[i] for i in kept], [x.strides[i] for i in kept])
    rdims = layout.coalesce([x.shape[i] for i in axes], [x.strides[i] for i in axes])
    base = layout.flat_base(x)
    if not kdims and x.flags.c_contiguous:
        # the chunking depends on the size only, never on the thread count
        acc = np.empty((min(MAX_CHUNKS, max(1, x.size // 4096)), LINE + BLOCK))
        if acc.shape[0] > 1:
            paths.taken("sum:chunks")
        return call(_sum_all, x.reshape(-1), acc, flat_out, fmt)
    if base is not None and len(kdims) == 1 and kdims[0][1][0] == item:
        rows = layout.row_offsets(rdims, 0, item)
        run = kdims[0][0]
        nchunks = max(1, min(MAX_CHUNKS, rows.size * run // ROW_CHUNK_ELEMENTS, rows.size))
        acc = np.empty((nchunks, _whole_lines(run)))   # rows of whole cache lines
        if nchunks > 1:
            paths.taken("sum:rows")
        return call(_sum_rows, base, rows, run, acc, flat_out, fmt)
    inner = [i for i, (_, s) in enumerate(rdims) if s[0] == item]
    if base is not None and inner:
        run = rdims[inner[-1]][0]
        others = rdims[:inner[-1]] + rdims[inner[-1] + 1:]
        kept_offsets = layout.row_offsets(kdims, 0, item)
        reduced_offsets = layout.row_offsets(others, 0, item)
        width = _whole_lines(min(run, BLOCK))
        vertical = run >= 16 and kept_offsets.size * width <= MAX_SCRATCH and not half16
        acc = np.empty((kept_offsets.size, width) if vertical else (0, 1))
        if vertical:
            paths.taken("sum:runs")
        elif half16 and run >= 16:
            paths.taken("sum:lanes")
        least = LANES_MIN_ELEMENTS if half16 and not vertical else threads.MIN_ELEMENTS
        if threads.parts() > 1 and kept_offsets.size > 1 and x.size >= least:
            # kept elements in ranges on the engine's threads: each element's sum as whole
            paths.taken("sum:runs_split")
            return threads.side_by_side([
                call(_sum_runs, base, kept_offsets[lo:hi], reduced_offsets, run,
                     acc[lo:hi] if vertical else acc, flat_out[lo:hi], fmt)
                for lo, hi in threads.bounds(kept_offsets.size, threads.parts())])
        return call(_sum_runs, base, kept_offsets, reduced_offsets, run, acc, flat_out, fmt)
    if len(kdims) > 2 or len(rdims) > 2:      # more than two irreducible axes on a side
        return by_numpy
    ks, kst = _padded(kdims, 2)
    rs, rst = _padded(rdims, 2)
    xv = layout.as_strided(x, ks + rs, kst + rst)
    # out is contiguous, kept axes in order
    return call(_sum_4d, xv, as_patterns(out).reshape(ks), fmt)
