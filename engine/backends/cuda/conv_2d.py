"""CUDA kernels of conv_2d and of its backward ops conv_2d_back_x and conv_2d_back_w.

Output (oy, ox) with window cell (ky, kx) reads image cell

    y = oy*sh - ph + ky*dh,    x = ox*sw - pw + kx*dw        (0 outside the image).

Direct kernels, one thread per output element in a grid-stride loop (launched by
engine.backends.cuda.launch), each summing its terms in float64 and writing once: no
atomics, so the result does not depend on thread timing.

    conv_2d:         out[n, o, oy, ox] = sum over c, ky, kx of w[o, c, ky, kx] x[n, c, y, x]
    conv_2d_back_x:  dx[n, c, y, x] = sum over o, ky, kx of g[n, o, oy, ox] w[o, c, ky, kx]
                     where y + ph - ky*dh = oy*sh and x + pw - kx*dw = ox*sw, 0 <= oy < OH,
                     0 <= ox < OW (im2col_back's gather, through the kernel)
    conv_2d_back_w:  dw[o, c, ky, kx] = sum over n, oy, ox of g[n, o, oy, ox] x[n, c, y, x]

They make no columns: simple rather than fast, as the rest of this backend (its GPU check
runs gradcheck's cases, not a benchmark).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from engine.backends.cuda.launch import grid_stride, unravel4


@cuda.jit
def _conv(x, w, out, sh, sw, ph, pw, dh, dw):
    """out[n, o, oy, ox] = sum of w[o, c, ky, kx] x[n, c, y, x] over the window's cells
    inside the image."""
    n, o, oh, ow = out.shape
    c, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    h, wd = x.shape[2], x.shape[3]
    for idx in range(cuda.grid(1), n * o * oh * ow, cuda.gridsize(1)):
        i, oc, oy, ox = unravel4(idx, o, oh, ow)
        acc = np.float64(0)        # not 0.0: the simulator would sum float32 terms in float32
        for ch in range(c):
            for ky in range(kh):
                y = oy * sh - ph + ky * dh
                if y < 0 or y >= h:
                    continue
                for kx in range(kw):
                    xx = ox * sw - pw + kx * dw
                    if 0 <= xx < wd:
                        acc += np.float64(w[oc, ch, ky, kx]) * np.float64(x[i, ch, y, xx])
        out[i, oc, oy, ox] = acc


@cuda.jit
def _conv_back_x(g, w, dx, sh, sw, ph, pw, dh, dw):
    """dx[n, c, y, x] = sum of g[n, o, oy, ox] w[o, c, ky, kx] over the (o, ky, kx) whose
    window (oy, ox) reads (y, x)."""
    n, c, h, wd = dx.shape
    o, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    oh, ow = g.shape[2], g.shape[3]
    for idx in range(cuda.grid(1), n * c * h * wd, cuda.gridsize(1)):
        i, ch, y, xx = unravel4(idx, c, h, wd)
        acc = np.float64(0)
        for oc in range(o):
            for ky in range(kh):
                ty = y + ph - ky * dh
                if ty < 0 or ty % sh != 0 or ty // sh >= oh:
                    continue
                oy = ty // sh
                for kx in range(kw):
                    tx = xx + pw - kx * dw
                    if tx < 0 or tx % sw != 0 or tx // sw >= ow:
                        continue
                    acc += np.float64(g[i, oc, oy, tx // sw]) * np.float64(w[oc, ch, ky, kx])
        dx[i, ch, y, xx] = acc


@cuda.jit
def _conv_back_w(g, x, dw_out, sh, sw, ph, pw, dh, dw):
    """dw[o, c, ky, kx] = sum of g[n, o, oy, ox] x[n, c, y, x] over n, oy, ox whose window
    cell (ky, kx) lies inside the image."""
    o, c, kh, kw = dw_out.shape
    n, oh, ow = g.shape[0], g.shape[2], g.shape[3]
    h, wd = x.shape[2], x.shape[3]
    for idx in range(cuda.grid(1), o * c * kh * kw, cuda.gridsize(1)):
        oc, ch, ky, kx = unravel4(idx, c, kh, kw)
        acc = np.float64(0)
        for i in range(n):
            for oy in range(oh):
                y = oy * sh - ph + ky * dh
                if y < 0 or y >= h:
                    continue
                for ox in range(ow):
                    xx = ox * sw - pw + kx * dw
                    if 0 <= xx < wd:
                        acc += np.float64(g[i, oc, oy, ox]) * np.float64(x[i, ch, y, xx])
        dw_out[oc, ch, ky, kx] = acc


def _geometry(stride, padding, dilation) -> tuple:
    return (stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1])


def cuda_conv_2d(out, ins, stride, padding, dilation):
    """Dispatcher of conv_2d: kernel(out, [x, w], **params); out in w's dtype."""
    x, w = ins
    grid_stride(_conv, out.size, x, w, out, *_geometry(stride, padding, dilation))


def cuda_conv_2d_back_x(out, ins, x_shape, dtype, stride, padding, dilation):
    """Dispatcher of conv_2d_back_x: kernel(dx, [g, w], **params); dx in the image's
    dtype."""
    g, w = ins
    grid_stride(_conv_back_x, out.size, g, w, out, *_geometry(stride, padding, dilation))


def cuda_conv_2d_back_w(out, ins, w_shape, stride, padding, dilation):
    """Dispatcher of conv_2d_back_w: kernel(dw, [g, x], **params); dw in g's dtype."""
    g, x = ins
    grid_stride(_conv_back_w, out.size, g, x, out, *_geometry(stride, padding, dilation))


def _signatures():
    """(kernel, signature) for every dtype pair (image, kernel): inputs strided, outputs
    C-contiguous."""
    ints = ", ".join(["int64"] * 6)
    sigs = []
    for xt in ("float32", "float64"):
        for wt in ("float32", "float64"):
            x, w = f"{xt}[:, :, :, :]", f"{wt}[:, :, :, :]"
            sigs += [(_conv, f"void({x}, {w}, {wt}[:, :, :, ::1], {ints})"),
                     (_conv_back_x, f"void({w}, {w}, {xt}[:, :, :, ::1], {ints})"),
                     (_conv_back_w, f"void({w}, {x}, {wt}[:, :, :, ::1], {ints})")]
    return sigs


PTX_SIGNATURES = _signatures()
