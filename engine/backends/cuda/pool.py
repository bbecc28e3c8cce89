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

(`_windows`) and sums their contributions itself. Max and average pooling are one forward
kernel, `_pool`: the same windows (`_cells`), the mode choosing what the cells are reduced
with. Launches and index arithmetic are engine.backends.cuda.launch's.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from engine.backends.cuda.launch import grid_stride, unravel4


@cuda.jit(device=True)
def _cells(o, s, p, k, n):
    """[lo, hi): the image cells, along one axis of n cells, of window o (stride s, padding
    p, kernel size k) that lie inside the image."""
    return max(o * s - p, 0), min(o * s - p + k, n)


@cuda.jit(device=True)
def _windows(y, s, p, k, n_out):
    """[lo, hi): the windows, along one axis of n_out windows, that hold image cell y."""
    t = y + p - k + 1
    return (0 if t <= 0 else (t + s - 1) // s), min((y + p) // s + 1, n_out)


@cuda.jit
def _pool(x, out, kh, kw, sh, sw, ph, pw, inv, is_max):
    """out[n, c, oy, ox] = the max (is_max) of x[n, c, y, x] over the window's cells inside
    the image, or their sum (row-major) times inv = 1 / (kh*kw) in the tensor's dtype."""
    n, c, oh, ow = out.shape
    h, w = x.shape[2], x.shape[3]
    for idx in range(cuda.grid(1), n * c * oh * ow, cuda.gridsize(1)):
        i, ch, oy, ox = unravel4(idx, c, oh, ow)
        y0, y1 = _cells(oy, sh, ph, kh, h)
        x0, x1 = _cells(ox, sw, pw, kw, w)
        acc = out.dtype.type(-math.inf) if is_max else out.dtype.type(0)
        for y in range(y0, y1):
            for xx in range(x0, x1):
                v = x[i, ch, y, xx]
                if not is_max:
                    acc += v
                elif v > acc or v != v:
                    acc = v
        out[i, ch, oy, ox] = acc if is_max else acc * inv


@cuda.jit
def _avg_pool_back(g, dx, kh, kw, sh, sw, ph, pw, inv):
    """dx[n, c, y, x] = sum of g[n, c, oy, ox] * inv over the windows holding (y, x)."""
    n, c, h, w = dx.shape
    oh, ow = g.shape[2], g.shape[3]
    for idx in range(cuda.grid(1), n * c * h * w, cuda.gridsize(1)):
        i, ch, y, xx = unravel4(idx, c, h, w)
        oy0, oy1 = _windows(y, sh, ph, kh, oh)
        acc = dx.dtype.type(0)
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
        i, ch, y, xx = unravel4(idx, c, h, w)
        v = x[i, ch, y, xx]
        acc = dx.dtype.type(0)
        oy0, oy1 = _windows(y, sh, ph, kh, oh)
        ox0, ox1 = _windows(xx, sw, pw, kw, ow)
        for oy in range(oy0, oy1):
            y0, y1 = _cells(oy, sh, ph, kh, h)
            for ox in range(ox0, ox1):
                x0, x1 = _cells(ox, sw, pw, kw, w)
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


def _geometry(kernel, stride, padding) -> tuple[int, ...]:
    return (kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1])


def _inv(out, kernel):
    """1 / (kh kw) in out's dtype."""
    return np.dtype(out.dtype).type(1.0 / (kernel[0] * kernel[1]))


def cuda_pool_2d(out, ins, mode, kernel, stride, padding):
    """Dispatcher of pool_2d: kernel(out, [x], **params)."""
    (x,) = ins
    grid_stride(_pool, out.size, x, out, *_geometry(kernel, stride, padding),
                _inv(out, kernel), mode == "max")


def cuda_pool_2d_back(out, ins, mode, kernel, stride, padding):
    """Dispatcher of pool_2d_back: kernel(dx, [g, x, y], **params), y = pool_2d's output."""
    g, x, y = ins
    geometry = _geometry(kernel, stride, padding)
    if mode == "max":
        grid_stride(_max_pool_back, out.size, g, x, y, out, *geometry)
    else:
        grid_stride(_avg_pool_back, out.size, g, out, *geometry, _inv(out, kernel))


def _signatures():
    """(kernel, signature) per dtype: inputs strided, outputs C-contiguous."""
    sigs = []
    for t in ("float32", "float64"):
        src, dst, ints = f"{t}[:, :, :, :]", f"{t}[:, :, :, ::1]", ", ".join(["int64"] * 6)
        sigs += [(_pool, f"void({src}, {dst}, {ints}, {t}, boolean)"),
                 (_avg_pool_back, f"void({src}, {dst}, {ints}, {t})"),
                 (_max_pool_back, f"void({src}, {src}, {src}, {dst}, {ints})")]
    return sigs


PTX_SIGNATURES = _signatures()
