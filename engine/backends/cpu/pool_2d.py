"""CPU kernels of 2-D pooling over NCHW tensors and of its backward.

Every kernel runs a `prange` over the N*C planes: a thread owns whole planes of its output,
so no two threads ever write the same element and no atomics are needed.

Forward kernels and the avg backward work a row at a time: for output row oy, each image row
y of its window and each window column kx, the output columns ox whose image column
ox*sw - pw + kx lies inside the image form a range [lo, hi), found once before the inner
loop; the inner loop over ox then has no bounds checks and no branches. Padded cells are
never visited (for max they never win; for avg they count in the divisor kh*kw as zeros).

Max: among equal maxima the first in row-major window order wins; a NaN in a window makes the
output NaN (as in torch), and the backward routes that window's gradient to its first NaN.
The max backward recomputes each window's maximum from x (first pass) and then finds the
first cell equal to it (second pass, scanning backwards and keeping the last hit, so the
loop has no early exit); two passes keep both loops free of a serial argmax dependency.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.jit import kernel, parallel_kernel, prange


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


@parallel_kernel
def _max_pool(x, out, kh, kw, sh, sw, ph, pw):
    """out[n, c, oy, ox] = max of x[n, c, y, x] over the window's cells inside the image."""
    n, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    for p in prange(n * c):
        xp = x[p // c, p % c]
        op = out[p // c, p % c]
        for oy in range(oh):
            orow = op[oy]
            for ox in range(ow):
                orow[ox] = -np.inf
            for y in range(max(oy * sh - ph, 0), min(oy * sh - ph + kh, h)):
                xrow = xp[y]
                for kx in range(kw):
                    off, lo, hi = _columns(kx, pw, sw, w, ow)
                    for ox in range(lo, hi):
                        v = xrow[ox * sw + off]
                        m = orow[ox]
                        orow[ox] = v if (v > m) | (v != v) else m


@parallel_kernel
def _avg_pool(x, out, kh, kw, sh, sw, ph, pw):
    """out[n, c, oy, ox] = (sum of x over the window's cells inside the image) / (kh*kw)."""
    n, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    inv = out.dtype.type(1.0 / (kh * kw))
    for p in prange(n * c):
        xp = x[p // c, p % c]
        op = out[p // c, p % c]
        for oy in range(oh):
            orow = op[oy]
            for ox in range(ow):
                orow[ox] = 0
            for y in range(max(oy * sh - ph, 0), min(oy * sh - ph + kh, h)):
                xrow = xp[y]
                for kx in range(kw):
                    off, lo, hi = _columns(kx, pw, sw, w, ow)
                    for ox in range(lo, hi):
                        orow[ox] += xrow[ox * sw + off]
            for ox in range(ow):
                orow[ox] *= inv


@parallel_kernel
def _max_pool_back(g, x, dx, h, w, kh, kw, sh, sw, ph, pw):
    """dx = 0, then g[n, c, oy, ox] is added at the first maximum of its window.

    x and dx are given as contiguous planes (N*C, H*W), g as (N, C, OH, OW).
    """
    c = g.shape[1]
    oh, ow = g.shape[2], g.shape[3]
    for p in prange(x.shape[0]):
        xp = x[p]
        dp = dx[p]
        gp = g[p // c, p % c]
        for i in range(h * w):
            dp[i] = 0
        for oy in range(oh):
            y0 = max(oy * sh - ph, 0)
            y1 = min(oy * sh - ph + kh, h)
            for ox in range(ow):
                x0 = max(ox * sw - pw, 0)
                x1 = min(ox * sw - pw + kw, w)
                width = x1 - x0
                cells = (y1 - y0) * width
                skip = w - width             # from the end of one window row to the next
                first = y0 * w + x0
                m = xp[first]                # pass 1: the maximum (NaN if any)
                q = first
                col = 0
                for _ in range(cells):
                    v = xp[q]
                    m = v if (v > m) | (v != v) else m
                    q += 1
                    col += 1
                    if col == width:
                        col = 0
                        q += skip
                pos = first                  # pass 2: its first cell, scanning backwards
                q = (y1 - 1) * w + x1 - 1
                col = 0
                for _ in range(cells):
                    v = xp[q]
                    pos = q if (v == m) | (v != v) else pos
                    q -= 1
                    col += 1
                    if col == width:
                        col = 0
                        q -= skip
                dp[pos] += gp[oy, ox]


@parallel_kernel
def _avg_pool_back(g, dx, kh, kw, sh, sw, ph, pw):
    """dx = 0, then g[n, c, oy, ox] / (kh*kw) is added to every image cell of its window."""
    n, c, h, w = dx.shape
    oh, ow = g.shape[2], g.shape[3]
    inv = dx.dtype.type(1.0 / (kh * kw))
    for p in prange(n * c):
        gp = g[p // c, p % c]
        dp = dx[p // c, p % c]
        for y in range(h):
            for xx in range(w):
                dp[y, xx] = 0
        for oy in range(oh):
            grow = gp[oy]
            for y in range(max(oy * sh - ph, 0), min(oy * sh - ph + kh, h)):
                drow = dp[y]
                for kx in range(kw):
                    off, lo, hi = _columns(kx, pw, sw, w, ow)
                    for ox in range(lo, hi):
                        drow[ox * sw + off] += grow[ox] * inv


def cpu_pool_2d(out, ins, mode, kernel, stride, padding):
    """Dispatcher of pool_2d: kernel(out, [x], **params)."""
    (x,) = ins
    fn = _max_pool if mode == "max" else _avg_pool
    fn(x, out, kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1])


def cpu_pool_2d_back(out, ins, mode, kernel, stride, padding):
    """Dispatcher of pool_2d_back: kernel(dx, [g, x], **params)."""
    g, x = ins
    geometry = (kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1])
    if mode == "avg":
        _avg_pool_back(g, out, *geometry)
        return
    n, c, h, w = x.shape
    # the max backward walks each plane by flat index; a strided x (a permuted view) is
    # copied to contiguous planes here, outside the kernel
    planes = np.ascontiguousarray(x).reshape(n * c, h * w)
    _max_pool_back(g, planes, out.reshape(n * c, h * w), h, w, *geometry)
