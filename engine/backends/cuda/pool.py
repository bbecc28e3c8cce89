"""CUDA kernels of 2-D pooling over NCHW tensors (pool_2d) and of its backward (pool_2d_back).

Window (oy, ox) covers image rows oy*sh - ph ... oy*sh - ph + kh - 1 and columns likewise;
only its cells inside the image are visited (padding is at most half the kernel, so every
window holds one). Each kernel runs one thread per output element in a grid-stride loop, and
each thread writes its element once, so no atomics are needed and results are deterministic.
They compute exactly what the CPU kernels (engine/backends/cpu/pool_2d.py) compute, in the
same order of additions:

    max:      out[oy, ox] = max over the window's image cells, row-major (a NaN wins);
    avg:      out[oy, ox] = (sum over the window's image cells, row-major) * (1 / (kh kw)),
              summed in the tensor's dtype;
    avg back: dx[y, x] = sum over the windows (oy, ox) holding (y, x), oy then kx ascending,
              of g[oy, ox] * (1 / (kh kw));
    max back: dx[y, x] = sum over the windows holding (y, x), oy then ox ascending, of
              g[oy, ox] where (y, x) is the window's first image cell (row-major) equal to
              y[oy, ox] or NaN, or its last cell if none is.

The backward kernels are gathers: each image cell finds the windows that cover it,

    oy from ceil((y + ph - kh + 1) / sh) to (y + ph) // sh, within [0, OH)   (ox likewise),

and sums their contributions itself. (That range is written out in each kernel rather than
in a device function: numba-cuda compiles device functions for the current device, so a
kernel calling one cannot be compiled to PTX on a machine without a GPU.)
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from engine.backends.cuda.im2col import THREADS, blocks


@cuda.jit
def _max_pool(x, out, kh, kw, sh, sw, ph, pw):
    """out[n, c, oy, ox] = max of x[n, c, y, x] over the window's cells inside the image."""
    n, c, oh, ow = out.shape
    h, w = x.shape[2], x.shape[3]
    for idx in range(cuda.grid(1), n * c * oh * ow, cuda.gridsize(1)):
        ox = idx % ow
        r = idx // ow
        oy = r % oh
        r //= oh
        ch = r % c
        i = r // c
        m = out.dtype.type(-math.inf)
        for y in range(max(oy * sh - ph, 0), min(oy * sh - ph + kh, h)):
            for xx in range(max(ox * sw - pw, 0), min(ox * sw - pw + kw, w)):
                v = x[i, ch, y, xx]
                if v > m or v != v:
                    m = v
        out[i, ch, oy, ox] = m


@cuda.jit
def _avg_pool(x, out, kh, kw, sh, sw, ph, pw, inv):
    """out[n, c, oy, ox] = (sum of x over the window's cells inside the image) * inv, with
    inv = 1 / (kh*kw) in the tensor's dtype."""
    n, c, oh, ow = out.shape
    h, w = x.shape[2], x.shape[3]
    for idx in range(cuda.grid(1), n * c * oh * ow, cuda.gridsize(1)):
        ox = idx % ow
        r = idx // ow
        oy = r % oh
        r //= oh
        ch = r % c
        i = r // c
        acc = out.dtype.type(0)
        for y in range(max(oy * sh - ph, 0), min(oy * sh - ph + kh, h)):
            for xx in range(max(ox * sw - pw, 0), min(ox * sw - pw + kw, w)):
                acc += x[i, ch, y, xx]
        out[i, ch, oy, ox] = acc * inv


@cuda.jit
def _avg_pool_back(g, dx, kh, kw, sh, sw, ph, pw, inv):
    """dx[n, c, y, x] = sum of g[n, c, oy, ox] * inv over the windows holding (y, x)."""
    n, c, h, w = dx.shape
    oh, ow = g.shape[2], g.shape[3]
    for idx in range(cuda.grid(1), n * c * h * w, cuda.gridsize(1)):
        xx = idx % w
        r = idx // w
        y = r % h
        r //= h
        ch = r % c
        i = r // c
        acc = dx.dtype.type(0)
        t = y + ph - kh + 1              # windows oy0 <= oy < oy1 hold row y
        oy0 = 0 if t <= 0 else (t + sh - 1) // sh
        oy1 = min((y + ph) // sh + 1, oh)
        for oy in range(oy0, oy1):
            for kx in range(kw):         # the CPU kernel's order: kx ascending, ox descending
                tx = xx + pw - kx
                if tx >= 0 and tx % sw == 0 and tx // sw < ow:
                    acc += g[i, ch, oy, tx // sw] * inv
        dx[i, ch, y, xx] = acc


@cuda.jit
def _max_pool_back(g, x, yv, dx, kh, kw, sh, sw, ph, pw):
    """dx[n, c, y, x] = sum of g[n, c, oy, ox] over the windows whose winning cell is (y, x):
    the first cell (row-major, image cells only) equal to yv[oy, ox] or NaN, else the last.

    (y, x) wins window (oy, ox) iff no earlier cell of it matches and (y, x) either matches
    or is the window's last cell; most cells fail the first test without a scan.
    """
    n, c, h, w = dx.shape
    oh, ow = g.shape[2], g.shape[3]
    for idx in range(cuda.grid(1), n * c * h * w, cuda.gridsize(1)):
        xx = idx % w
        r = idx // w
        y = r % h
        r //= h
        ch = r % c
        i = r // c
        v = x[i, ch, y, xx]
        acc = dx.dtype.type(0)
        t = y + ph - kh + 1              # windows oy0 <= oy < oy1 hold row y
        oy0 = 0 if t <= 0 else (t + sh - 1) // sh
        oy1 = min((y + ph) // sh + 1, oh)
        t = xx + pw - kw + 1             # windows ox0 <= ox < ox1 hold column xx
        ox0 = 0 if t <= 0 else (t + sw - 1) // sw
        ox1 = min((xx + pw) // sw + 1, ow)
        for oy in range(oy0, oy1):
            y0 = max(oy * sh - ph, 0)
            y1 = min(oy * sh - ph + kh, h)
            for ox in range(ox0, ox1):
                x0 = max(ox * sw - pw, 0)
                x1 = min(ox * sw - pw + kw, w)
                m = yv[i, ch, oy, ox]
                if not (v == m or v != v or (y == y1 - 1 and xx == x1 - 1)):
                    continue
                wins = True
                for yy in range(y0, y + 1):
                    for cx in range(x0, x1 if yy < y else xx):
                        u = x[i, ch, yy, cx]
                        if u == m or u != u:
                            wins = False
                            break
                    if not wins:
                        break
                if wins:
                    acc += g[i, ch, oy, ox]
        dx[i, ch, y, xx] = acc


def cuda_pool_2d(out, ins, mode, kernel, stride, padding):
    """Dispatcher of pool_2d: kernel(out, [x], **params)."""
    (x,) = ins
    total = out.size
    if not total:
        return
    geometry = (kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1])
    if mode == "max":
        _max_pool[blocks(total), THREADS](x, out, *geometry)
    else:
        inv = np.dtype(out.dtype).type(1.0 / (kernel[0] * kernel[1]))
        _avg_pool[blocks(total), THREADS](x, out, *geometry, inv)


def cuda_pool_2d_back(out, ins, mode, kernel, stride, padding):
    """Dispatcher of pool_2d_back: kernel(dx, [g, x, y], **params), y = pool_2d's output."""
    g, x, y = ins
    total = out.size
    if not total:
        return
    geometry = (kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1])
    if mode == "max":
        _max_pool_back[blocks(total), THREADS](g, x, y, out, *geometry)
    else:
        inv = np.dtype(out.dtype).type(1.0 / (kernel[0] * kernel[1]))
        _avg_pool_back[blocks(total), THREADS](g, out, *geometry, inv)


def _signatures():
    """(kernel, signature) per dtype: inputs strided, outputs C-contiguous."""
    sigs = []
    for t in ("float32", "float64"):
        src, dst, ints = f"{t}[:, :, :, :]", f"{t}[:, :, :, ::1]", ", ".join(["int64"] * 6)
        sigs += [(_max_pool, f"void({src}, {dst}, {ints})"),
                 (_avg_pool, f"void({src}, {dst}, {ints}, {t})"),
                 (_avg_pool_back, f"void({src}, {dst}, {ints}, {t})"),
                 (_max_pool_back, f"void({src}, {src}, {src}, {dst}, {ints})")]
    return sigs


PTX_SIGNATURES = _signatures()
