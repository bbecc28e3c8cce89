"""CPU kernels of 2-D pooling over NCHW tensors and of its backward.

Every kernel runs a `prange` over the N*C planes: a thread owns whole planes of its output,
so no two threads ever write the same element and no atomics are needed.

The general forward kernel (max and avg alike, `_pool`) and the avg backward work a row at a
time: for output row oy, each image row y of its window (`_window_span`) and each window
column kx, the output columns ox whose image column ox*sw - pw + kx lies inside the image
form a range [lo, hi) (`_columns`), found once before the inner loop; the inner loop over
ox then has no bounds checks and no branches. Padded cells are never visited (for max they
never win; for avg they count in the divisor kh*kw as zeros).

Max: among equal maxima the first in row-major window order wins; a NaN in a window makes the
output NaN (as in torch). The max backward is given the forward output y, so it never
recomputes a maximum: window (oy, ox) sends g[oy, ox] to its first cell v (row-major) with
v == y[oy, ox], or v NaN (that test only matches a NaN when y is NaN, since a NaN in the
window makes y NaN): the first maximum, or the first NaN.

The max backward works a window at a time and finds that cell without a branch on the data:
with `free` = "no earlier cell of the window matched" (`_unmatched`, the same step in the
tiled and the general kernel), k = the sum of `free` over the cells is the number of cells
before the first match. (Writing `dx = g if match else 0` per cell instead makes LLVM emit a
branch per cell, mispredicted on random data: 2.5x slower.) When the windows tile the image
(stride = kernel, no padding: the common 2x2 pooling), the window size is given as the
lengths of two tuples, part of numba's type: each window size compiles its own kernels, in
which the loops over the window are unrolled and k // kw is cheap; this is 3-4x faster than
loops over a window whose size is only known at run time. The tiled forward takes each
window whole, its first cell and then the others in row-major order (the same maximum, and
the same first NaN, as the row-at-a-time kernel): on 2x2 windows 4-7x faster than the
row-at-a-time kernel, whose inner loops are 1-2 cells long there. The tiled backward writes
every dx cell once: a window's cells are zeroed just before its winner is stored (in cache),
and the rows and columns past the last window (H > OH*kh or W > OW*kw) are zeroed. Any other
geometry takes the general kernels; the general backward zeroes a plane and then adds each
window's g at its first match. (Working a row at a time as the forward does, with per-column
state in scratch rows, measured slower still: the window and stride sizes are run-time
values there too, so the loops neither unroll nor vectorise.)
"""

from __future__ import annotations

import numpy as np

from engine.backends.calls import sequence
from engine.backends.cpu import paths, threads
from engine.backends.cpu.jit import bindable, call, kernel, parallel_kernel, prange, scalar_math
from engine.backends.cpu.layout import dense

# the largest window (per axis) given its own compiled kernel when the windows tile the image;
# each size compiles once (about 2 s) and is cached on disk
MAX_TILE = 4


@kernel
def _plane(a, p, c):
    """Plane p of the N*C planes of the NCHW array a (C = c): a[p // c, p % c], a view."""
    return a[p // c, p % c]


@kernel
def _window_span(o, k, s, p, size):
    """(first, stop): the image indices first <= i < stop, along one axis, of the cells of
    window o (kernel k, stride s, padding p) that lie inside the image [0, size)."""
    return max(o * s - p, 0), min(o * s - p + k, size)


@kernel
def _columns(kx, pw, sw, w, ow):
    """(off, lo, hi): output columns lo <= ox < hi read image column ox*sw + off in [0, w)."""
    off = kx - pw
    lo = 0
    while lo < ow and lo * sw + off < 0:
        lo += 1
    hi = ow
    while hi > lo and (hi - 1) * sw + off >= w:
        hi -= 1
    return off, lo, hi


@scalar_math
def _max_or_nan(v, m):
    """The running maximum m after cell value v: v if it is larger or NaN, else m (so the
    first NaN of a window stays). Inlined at IR level, as `_unmatched`."""
    return v if (v > m) | (v != v) else m


@scalar_math
def _unmatched(free, v, m):
    """Whether no cell of a window matched yet, after cell value v: `free` and v is neither
    m nor NaN (the first-match search of the max backward, module doc). Inlined at IR level
    (scalar_math): as a call that LLVM inlines, the tiled backward ran 20% slower."""
    return free & (not ((v == m) | (v != v)))


@parallel_kernel
def _pool(x, out, is_max, kh, kw, sh, sw, ph, pw):
    """Max (is_max) or avg pooling for any geometry, a row at a time (module doc):

        max: out[n, c, oy, ox] = max of x[n, c, y, x] over the window's cells inside the image
        avg: out[n, c, oy, ox] = (sum of x over the window's cells inside the image) / (kh*kw)
    """
    n, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    start = -np.inf if is_max else 0.0
    inv = out.dtype.type(1.0 / (kh * kw))
    for p in prange(n * c):
        xp, op = _plane(x, p, c), _plane(out, p, c)
        for oy in range(oh):
            orow = op[oy]
            for ox in range(ow):
                orow[ox] = start
            y0, y1 = _window_span(oy, kh, sh, ph, h)
            for y in range(y0, y1):
                xrow = xp[y]
                for kx in range(kw):
                    off, lo, hi = _columns(kx, pw, sw, w, ow)
                    # the branch is taken once per window column, outside the inner loop
                    if is_max:
                        for ox in range(lo, hi):
                            orow[ox] = _max_or_nan(xrow[ox * sw + off], orow[ox])
                    else:
                        for ox in range(lo, hi):
                            orow[ox] += xrow[ox * sw + off]
            if not is_max:
                for ox in range(ow):
                    orow[ox] *= inv


@parallel_kernel
def _max_pool_tiled(x, out, rows, cols):
    """Max pooling when the windows tile the image: stride = kernel = (kh, kw), no padding,
    kh = len(rows) and kw = len(cols) compile-time constants (the tuples' contents are
    unused). out[n, c, oy, ox] = max of x[n, c, oy*kh + ky, ox*kw + kx] over the window, its
    first NaN if it holds one."""
    n, c = x.shape[0], x.shape[1]
    oh, ow = out.shape[2], out.shape[3]
    kh, kw = len(rows), len(cols)
    for p in prange(n * c):
        xp, op = _plane(x, p, c), _plane(out, p, c)
        for oy in range(oh):
            for ox in range(ow):
                m = xp[oy * kh, ox * kw]
                for j in range(1, kh * kw):
                    m = _max_or_nan(xp[oy * kh + j // kw, ox * kw + j % kw], m)
                op[oy, ox] = m


@parallel_kernel
def _max_pool_back_tiled(g, x, y, dx, rows, cols):
    """Max backward when the windows tile the image: stride = kernel = (kh, kw), no padding.

    kh = len(rows) and kw = len(cols) are compile-time constants (the tuples' contents are
    unused). Window (oy, ox) has cells j = ky*kw + kx, image cell (oy*kh + ky, ox*kw + kx);
    with k = the number of cells before its first cell equal to y[oy, ox] (or NaN), or its
    last cell if none is,

        dx[cell k] = g[oy, ox],   dx[every other cell of the window] = 0.

    and dx = 0 on the rows y >= OH*kh and the columns x >= OW*kw that no window covers.
    Every dx cell is written in this one pass, no zeroing pass before it (a window's cells
    are zeroed just before its winner is stored, in cache).
    """
    n, c, h, w = x.shape
    oh, ow = g.shape[2], g.shape[3]
    kh, kw = len(rows), len(cols)
    for p in prange(n * c):
        xp, yp, gp, dp = _plane(x, p, c), _plane(y, p, c), _plane(g, p, c), _plane(dx, p, c)
        for oy in range(oh):
            for ox in range(ow):
                m = yp[oy, ox]
                free = True              # no cell so far matched
                k = 0                    # cells before the first match
                for j in range(kh * kw - 1):      # the last cell wins if no other does
                    free = _unmatched(free, xp[oy * kh + j // kw, ox * kw + j % kw], m)
                    k += free
                for j in range(kh * kw):
                    dp[oy * kh + j // kw, ox * kw + j % kw] = 0
                dp[oy * kh + k // kw, ox * kw + k % kw] = gp[oy, ox]
        if h > oh * kh or w > ow * kw:       # cells no window covers
            for yy in range(h):
                for xx in range(ow * kw if yy < oh * kh else 0, w):
                    dp[yy, xx] = 0


@parallel_kernel
def _max_pool_back(g, x, y, dx, kh, kw, sh, sw, ph, pw):
    """Max backward for any geometry: dx = 0, then g[oy, ox] is added at the first cell of
    window (oy, ox), in row-major order over its cells inside the image, equal to y[oy, ox]
    (or NaN); at its last cell if none is. Overlapping windows add up.

    Over the window's image rows y0 <= yy < y1 and columns x0 <= xx < x1 (width x1 - x0),
    k = the number of cells before the first match and r = the number of whole rows before
    it, so the match is cell (y0 + r, x0 + k - r*width).
    """
    n, c, h, w = x.shape
    oh, ow = g.shape[2], g.shape[3]
    for p in prange(n * c):
        xp, yp, gp, dp = _plane(x, p, c), _plane(y, p, c), _plane(g, p, c), _plane(dx, p, c)
        for yy in range(h):
            for xx in range(w):
                dp[yy, xx] = 0
        for oy in range(oh):
            y0, y1 = _window_span(oy, kh, sh, ph, h)
            for ox in range(ow):
                x0, x1 = _window_span(ox, kw, sw, pw, w)
                width = x1 - x0
                m = yp[oy, ox]
                free = True              # no cell so far matched
                k = 0                    # cells before the first match
                r = 0                    # whole rows before the first match
                for yy in range(y0, y1):
                    for xx in range(x0, x1):
                        free = _unmatched(free, xp[yy, xx], m)
                        k += free
                    r += free
                r = min(r, y1 - y0 - 1)                  # no match: the last cell
                k = min(k, (y1 - y0) * width - 1)
                dp[y0 + r, x0 + k - r * width] += gp[oy, ox]


@parallel_kernel
def _avg_pool_back(g, dx, kh, kw, sh, sw, ph, pw):
    """dx = 0, then g[n, c, oy, ox] / (kh*kw) is added to every image cell of its window,
    a row at a time as the forward (module doc)."""
    n, c, h, w = dx.shape
    oh, ow = g.shape[2], g.shape[3]
    inv = dx.dtype.type(1.0 / (kh * kw))
    for p in prange(n * c):
        gp, dp = _plane(g, p, c), _plane(dx, p, c)
        for y in range(h):
            for xx in range(w):
                dp[y, xx] = 0
        for oy in range(oh):
            grow = gp[oy]
            y0, y1 = _window_span(oy, kh, sh, ph, h)
            for y in range(y0, y1):
                drow = dp[y]
                for kx in range(kw):
                    off, lo, hi = _columns(kx, pw, sw, w, ow)
                    for ox in range(lo, hi):
                        drow[ox * sw + off] += grow[ox] * inv


def _tiles(kernel, stride, padding) -> bool:
    """Whether the windows tile the image (stride = kernel, no padding) with a kernel small
    enough for the tiled max kernels (never in plain mode: engine.backends.cpu.paths)."""
    return (tuple(stride) == tuple(kernel) and tuple(padding) == (0, 0)
            and max(kernel) <= MAX_TILE and not paths.PLAIN)



# Each dispatcher hands its kernels C-contiguous inputs (layout.dense: strided ones, the
# permuted and sliced views of gradcheck's cases, copied when the call runs), so that numba
# compiles each kernel once per dtype, not again for every layout: a strided x of _pool and
# g of _avg_pool_back made 6 of their 10 compilations in a cold `gradcheck --all` (`python
# bench/bench_first_run.py --breakdown --records F`). Contiguous inputs, as the benches
# time, are passed as they are. The dispatchers are bindable (jit.bindable): a plan lays
# each node out once, and its runs only call the kernel (gradcheck's numerical differences
# run a case's plan four times per input element).
@threads.split
@bindable
def cpu_pool_2d(out, ins, mode, kernel, stride, padding):
    """Dispatcher of pool_2d: kernel(out, [x], **params)."""
    copies: list = []
    x = dense(ins[0], copies)
    if mode == "max" and _tiles(kernel, stride, padding):
        paths.taken("pool_2d:tiled")
        return sequence(*copies, call(_max_pool_tiled, x, out, (0,) * kernel[0],
                                      (0,) * kernel[1]))
    return sequence(*copies, call(_pool, x, out, mode == "max", kernel[0], kernel[1],
                                  stride[0], stride[1], padding[0], padding[1]))


@threads.split
@bindable
def cpu_pool_2d_back(out, ins, mode, kernel, stride, padding):
    """Dispatcher of pool_2d_back: kernel(dx, [g, x, y], **params), y = pool_2d's output."""
    copies: list = []
    geometry = (kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1])
    if mode == "avg":
        g = dense(ins[0], copies)         # before `copies` is read below
        return sequence(*copies, call(_avg_pool_back, g, out, *geometry))
    g, x, y = (dense(a, copies) for a in ins)
    if _tiles(kernel, stride, padding):
        paths.taken("pool_2d_back:tiled")
        return sequence(*copies, call(_max_pool_back_tiled, g, x, y, out, (0,) * kernel[0],
                                      (0,) * kernel[1]))
    return sequence(*copies, call(_max_pool_back, g, x, y, out, *geometry))
