"""CPU kernels of sum over axes.

Accumulation is in float64 for every input dtype. Every result is the same bits on every
machine and for every thread count: the order of the additions depends on the shapes and
strides only. A single chain of float64 additions runs at the latency of one addition per
element; instead, a long contiguous run is added in LANES float64 lanes (add_run): lane j
takes elements j, j + LANES, j + 2 LANES, ..., eight at a time added pairwise before they
reach its accumulator, and the lanes are added by a fixed tree at the end (lanes_total).
Every addition there is vertical, lane by lane, which LLVM turns into vector instructions
without being allowed to reorder anything (no fastmath), and short runs go in eight
interleaved partial sums (run_sum). So a sum can differ from a strictly sequential float64
sum in its last bits: only the order of the float64 additions differs, and it is fixed by
the shapes.

Why float64 lanes for float32 data, where torch sums float32 in float32 lanes: at a
realistic size they cost little, and they keep the error at the float32 rounding of the
result. Measured by `python bench/bench_sum.py --threads 1 --cpu` (2-core machine, both on
one thread, CPU time, medians of 15 alternating rounds), forward: the sum over the last axis
of (4096, 4096) float32 1.12x torch's time, over all axes 1.05x (float64: 0.84x, 0.81x);
of (2048, 1024) float32 1.1-1.8x over runs (L3-resident, noisy); in L2-resident data,
(64, 4096), 2.2x, where the conversions bound it (numba's LLVM targets 256-bit vectors
here: four float32 widened per instruction, against torch's sixteen float32 per AVX-512
addition). Forward and backward together (the backward a broadcast, 2.5x faster than
torch's) stay at 0.5-1.35x over these runs. The bench's error, |sum - exact| / sum |x|
over the rows of (64, 16384): 1e-9 (normal data) and 4e-8 (positive: the result's own
rounding), torch's 4e-9 and 1.6e-7. float32 lanes (a numpy model of these 64 lanes and
steps in float32) err as torch does on rows of 4096 and 16384, and 2-5x more on rows of a
million, where each lane adds 2048 float32s in a chain; on cancelling rows of 65536 they
err up to 62x the result's half ulp (the bound of tests/engine/backends/cpu/test_reduce.py),
where gradcheck's precision verdict allows 8x torch's error.

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
  size alone); each chunk is summed privately into its own lanes and writes its partial
  once (no false sharing), and the partials are added in chunk order. From
  threads.MIN_ELEMENTS the chunks run as ranges on the engine's threads (sum:chunks_split);
- the kept axis innermost and contiguous (a bias gradient: the sum over the rows of a
  matrix): rows are added into float64 accumulator rows, one per chunk of rows, then the
  chunks in order; every addition is a contiguous, vectorised row operation;
- a reduced axis innermost and contiguous (the sum over the rows, a channel bias gradient:
  the sum over images and pixels for each channel): each kept element adds its contiguous
  runs into its own lanes, one thread per kept element (a big one: ranges of kept elements
  on the engine's threads, engine.backends.cpu.threads); eight runs at a time where there
  are eight or more, each shorter than add_run's step (add_runs_grouped, the path
  sum:runs_grouped): run by run, the CNN's bias gradients of (500, 16, 7, 7) and (500, 8,
  14, 14) took 3.5-4.0 and 1.8-2.0 times torch's float32 sum, now 0.87-0.99 and 1.13
  (one thread, CPU time, medians of 7 alternating rounds, two runs, the old and new
  kernels in turn: a scratch script);
- anything else: a strided loop over at most two kept and two reduced axes, else numpy.
"""

from __future__ import annotations

import functools

import numpy as np
from numba.core import types
from numba.extending import overload

from engine.backends.cpu import layout, paths, threads
from engine.backends.cpu.jit import (
    any_order,
    bindable,
    call,
    kernel,
    parallel_kernel,
    prange,
    scalar_math,
)
from engine.backends.cpu.patterns import (
    as_patterns,
    fmt_of,
    native_half,
    rounded,
    value,
    value_number,
)
from engine.tensor import is_half

MAX_CHUNKS = 64
ROW_CHUNK_ELEMENTS = 1 << 16   # rows per accumulator row: at least this many elements
LANES = 64                     # float64 lanes of a vertical sum (add_run): 16 AVX2 vectors
LINE = 8                       # float64s per cache line


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
    sums in float64 in order (see the module doc). The values widened without float16's
    signalling-NaN fix-up (value_number: the same value, and a NaN sums to a NaN either
    way; which NaN's payload a row of several keeps is the compiler's order's, as it was):
    the rows of (4096, 4096) float16 summed in 4.4 ms of one thread's CPU with the fix-up,
    2.7-3.2 without (the same bits for finite data; the loop alone, compiled in one
    process, alternating)."""
    xs = x[start:start + n]
    total = 0.0
    for lo in range(0, n, LANE_BLOCK):
        block = xs[lo:lo + LANE_BLOCK]
        part = np.float32(0.0)
        for j in range(block.size):
            part += value_number(block[j], fmt)
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
    """acc[j] += the float64 values of x[start + j], x[start + j + w], ... (w = acc.size
    lanes) for the n elements of the run, in a fixed order: steps of 8 w elements, in
    which lane j adds its eight elements pairwise, (((v0 + v1) + (v2 + v3)) + ((v4 + v5) +
    (v6 + v7))), before adding them to acc[j]; then the blocks left one by one (the last
    one partial, lane j taking its element j). The additions are vertical, lane by lane:
    LLVM vectorises them as written (w is a run-time size, so the lane loop is never
    unrolled into scalars), and the eight-element steps load and store the accumulators
    once per eight elements."""
    w = acc.size
    step = 8 * w
    full = n // step * step
    xs = x[start:start + n]
    for lo in range(0, full, step):
        # eight slices of w, indexed by j: indices known non-negative, so numba emits no
        # wrap-around select (which LLVM turned into a gather for xs[lo + w + j])
        b0, b1 = xs[lo:lo + w], xs[lo + w:lo + 2 * w]
        b2, b3 = xs[lo + 2 * w:lo + 3 * w], xs[lo + 3 * w:lo + 4 * w]
        b4, b5 = xs[lo + 4 * w:lo + 5 * w], xs[lo + 5 * w:lo + 6 * w]
        b6, b7 = xs[lo + 6 * w:lo + 7 * w], xs[lo + 7 * w:lo + step]
        for j in range(w):
            acc[j] += (((np.float64(value(b0[j], fmt)) + np.float64(value(b1[j], fmt)))
                        + (np.float64(value(b2[j], fmt)) + np.float64(value(b3[j], fmt))))
                       + ((np.float64(value(b4[j], fmt)) + np.float64(value(b5[j], fmt)))
                          + (np.float64(value(b6[j], fmt)) + np.float64(value(b7[j], fmt)))))
    for lo in range(full, n, w):
        b = xs[lo:min(n, lo + w)]
        for j in range(b.size):
            acc[j] += np.float64(value(b[j], fmt))


@scalar_math
def add_runs_grouped(x, start, reduced, run, acc, fmt):
    """acc[j] += the float64 values of x[s + j], x[s + j + w], ... (w = acc.size lanes) of
    every run s = start + reduced[m], n elements long, m in order, in a fixed order: eight
    runs at a time, each block of w lanes added pairwise across the eight, (((r0 + r1) +
    (r2 + r3)) + ((r4 + r5) + (r6 + r7))), before reaching acc[j]; the runs left (fewer than
    eight) one by one, block by block. For many runs shorter than add_run's eight-block
    step (a channel's bias gradient: the sum of (N, C, H, W) over N, H and W, runs of H W):
    add_run, run by run, loaded and stored the accumulators once per element there."""
    w = acc.size
    nm = reduced.size
    full = nm // 8 * 8
    for m in range(0, full, 8):
        s0, s1 = start + reduced[m], start + reduced[m + 1]
        s2, s3 = start + reduced[m + 2], start + reduced[m + 3]
        s4, s5 = start + reduced[m + 4], start + reduced[m + 5]
        s6, s7 = start + reduced[m + 6], start + reduced[m + 7]
        for lo in range(0, run, w):
            n = min(w, run - lo)
            b0, b1 = x[s0 + lo:s0 + lo + n], x[s1 + lo:s1 + lo + n]
            b2, b3 = x[s2 + lo:s2 + lo + n], x[s3 + lo:s3 + lo + n]
            b4, b5 = x[s4 + lo:s4 + lo + n], x[s5 + lo:s5 + lo + n]
            b6, b7 = x[s6 + lo:s6 + lo + n], x[s7 + lo:s7 + lo + n]
            for j in range(n):
                acc[j] += (((np.float64(value(b0[j], fmt)) + np.float64(value(b1[j], fmt)))
                            + (np.float64(value(b2[j], fmt)) + np.float64(value(b3[j], fmt))))
                           + ((np.float64(value(b4[j], fmt)) + np.float64(value(b5[j], fmt)))
                              + (np.float64(value(b6[j], fmt))
                                 + np.float64(value(b7[j], fmt)))))
    for m in range(full, nm):
        s = start + reduced[m]
        for lo in range(0, run, w):
            b = x[s + lo:s + min(run, lo + w)]
            for j in range(b.size):
                acc[j] += np.float64(value(b[j], fmt))


@scalar_math
def lanes_total(acc):
    """acc[0] + ... + acc[w - 1] (w = acc.size) by a fixed tree, lane by lane: the upper
    half added onto the lower (acc[j] += acc[j + h], h = ceil(w / 2); an odd lane carried),
    again on what is left, down to one. Overwrites acc."""
    w = acc.size
    while w > 1:
        h = (w + 1) // 2
        for j in range(w - h):
            acc[j] += acc[j + h]
        w = h
    return acc[0] if acc.size else 0.0


@parallel_kernel
def _sum_chunks(x, acc, first, last, fmt):
    """acc[c, 0] = the sum of chunk c of contiguous x for first <= c < last, x cut into
    acc.shape[0] chunks (their length set by x.size alone): chunk c added into its lanes
    acc[c, LINE:] (add_run, lanes_total), its sum written once into acc[c, 0] (rows of
    whole cache lines: no false sharing)."""
    n = x.size
    nchunks = acc.shape[0]
    chunk = (n + nchunks - 1) // nchunks
    for c in prange(first, last):
        a = acc[c, LINE:]
        for j in range(a.size):
            a[j] = 0.0
        lo = min(n, c * chunk)
        add_run(x, lo, min(n, lo + chunk) - lo, a, fmt)
        acc[c, 0] = lanes_total(a)


@kernel
def add_partials(acc, out, fmt):
    """out[0] = acc[0, 0] + acc[1, 0] + ..., in chunk order, rounded once into out."""
    total = 0.0
    for c in range(acc.shape[0]):
        total += acc[c, 0]
    out[0] = rounded(total, out, fmt)


class SumInChunks:
    """out[0] = the sum of contiguous x, a zero-argument call: `chunks` (a compilation of
    _sum_chunks, chosen when bound) on `parts` ranges of the chunks side by side on the
    engine's threads (one range: on this thread), then add_partials. The chunks, so the
    order of the additions, depend on x.size only. The ranges and their calls are made
    once, when bound: gradcheck's numerical differences run a case's loss, a sum, four
    times per input element, and making them at each call took 9 of the 37 microseconds
    of a small case's run (cProfile of a warm `gradcheck --op add --op mean ... --random
    30`). `args`: (x, acc, out, fmt, parts, chunks), for the self-test's mutants."""

    def __init__(self, x, acc, out, fmt, parts, chunks):
        self.args = (x, acc, out, fmt, parts, chunks)
        self._chunks = threads.side_by_side([
            functools.partial(chunks, x, acc, lo, hi, fmt)
            for lo, hi in threads.bounds(acc.shape[0], parts)])

    def __call__(self):
        _, acc, out, fmt, _, _ = self.args
        self._chunks()
        add_partials(acc, out, fmt)


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
def _sum_runs(x, kept, reduced, run, grouped, acc, out, fmt):
    """out[k] = sum over m of the sum of x[kept[k] + reduced[m] : ... + run]. With lanes
    (acc of g > 0 rows): the kept elements in g groups of consecutive ones, a group's one
    after the other in the lanes of one row acc[i], zeroed for each (add_run, then
    lanes_total; `grouped`: add_runs_grouped, eight runs at a time); a row per kept element
    instead, 2 MB of them for 4096 rows, made the sum over the rows of (4096, 4096) float32
    take 1.5x the time of a shared row. Without (acc of zero rows), each run is a run_sum
    (16-bit patterns: run_sum_any_order). Either way each sum is its own, whatever the
    groups."""
    groups = acc.shape[0]
    if groups > 0:
        per = (kept.size + groups - 1) // groups
        for i in prange(groups):
            a = acc[i]
            for k in range(i * per, min(kept.size, (i + 1) * per)):
                for j in range(a.size):
                    a[j] = 0.0
                if grouped:
                    add_runs_grouped(x, kept[k], reduced, run, a, fmt)
                else:
                    for m in range(reduced.size):
                        add_run(x, kept[k] + reduced[m], run, a, fmt)
                out[k] = rounded(lanes_total(a), out, fmt)
    else:
        for k in prange(kept.size):
            total = 0.0
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
        acc = np.empty((min(MAX_CHUNKS, max(1, x.size // 4096)), LINE + LANES))
        parts = threads.parts() if x.size >= threads.MIN_ELEMENTS else 1
        if acc.shape[0] > 1:
            paths.taken("sum:chunks")
            if parts > 1:
                paths.taken("sum:chunks_split")
        return SumInChunks(x.reshape(-1), acc, flat_out, fmt, parts,
                           _sum_chunks.for_size(x.size))
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
        width = _whole_lines(min(run, LANES))
        vertical = run >= 16 and not half16
        # many runs shorter than add_run's step of eight blocks: eight runs at a time
        grouped = vertical and reduced_offsets.size >= 8 and run < 8 * width

        def lanes(n):               # n kept elements: MAX_CHUNKS groups at most
            return np.empty((min(MAX_CHUNKS, n), width) if vertical else (0, 1))
        if vertical:
            paths.taken("sum:runs")
            if grouped:
                paths.taken("sum:runs_grouped")
        elif half16 and run >= 16:
            paths.taken("sum:lanes")
        least = LANES_MIN_ELEMENTS if half16 and not vertical else threads.MIN_ELEMENTS
        if threads.parts() > 1 and kept_offsets.size > 1 and x.size >= least:
            # kept elements in ranges on the engine's threads: each element's sum as whole
            paths.taken("sum:runs_split")
            return threads.side_by_side([
                call(_sum_runs, base, kept_offsets[lo:hi], reduced_offsets, run, grouped,
                     lanes(hi - lo), flat_out[lo:hi], fmt)
                for lo, hi in threads.bounds(kept_offsets.size, threads.parts())])
        return call(_sum_runs, base, kept_offsets, reduced_offsets, run, grouped,
                    lanes(kept_offsets.size), flat_out, fmt)
    if len(kdims) > 2 or len(rdims) > 2:      # more than two irreducible axes on a side
        return by_numpy
    ks, kst = _padded(kdims, 2)
    rs, rst = _padded(rdims, 2)
    xv = layout.as_strided(x, ks + rs, kst + rst)
    # out is contiguous, kept axes in order
    return call(_sum_4d, xv, as_patterns(out).reshape(ks), fmt)
