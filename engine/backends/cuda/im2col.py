"""CUDA kernels of im2col and im2col_back (2-D), and of im2col_1d and im2col_1d_back.

Column index k = (c*KH + ky)*KW + kx, as in ggml. Output (oy, ox) with window cell (ky, kx)
reads image cell

    y = oy*sh - ph + ky*dh,    x = ox*sw - pw + kx*dw        (0 outside the image).

im2col runs one thread per column entry (a grid-stride loop over N*OH*OW*C*KH*KW, launched
by engine.backends.cuda.launch, as every kernel here) and copies
one value, converting to the columns' dtype. im2col_back is the gather form of col2im: one
thread per image cell (n, c, y, x) sums, in float64 as the CPU kernel does,

    dx[n, c, y, x] = sum over ky, kx (in that order) of g[n, oy, ox, (c*KH + ky)*KW + kx]
                     where y + ph - ky*dh = oy*sh and x + pw - kx*dw = ox*sw,
                     0 <= oy < OH, 0 <= ox < OW,

and writes once: no atomics, so the result does not depend on thread timing.

Columns in the layout NKHW, (N, C*KH*KW, OH, OW), run the same kernels on their (N, OH,
OW, C*KH*KW) view (a permutation of the axes: the columns written or read strided).

The 1-D ops run the same kernels on 4-axis views, (N, C, L) as (N, C, 1, L) and (N, OL, C*K)
as (N, 1, OL, C*K), with a 1 x K window.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from engine.backends.cuda.arrays import strided
from engine.backends.cuda.launch import grid_stride, unravel3, unravel4


@cuda.jit
def _im2col(x, out, kh, kw, sh, sw, ph, pw, dh, dw):
    """out[n, oy, ox, (c*kh + ky)*kw + kx] = x[n, c, y, x] (0 outside the image)."""
    n, oh, ow, ck = out.shape
    h, w = x.shape[2], x.shape[3]
    for idx in range(cuda.grid(1), n * oh * ow * ck, cuda.gridsize(1)):
        i, oy, ox, k = unravel4(idx, oh, ow, ck)
        ch, ky, kx = unravel3(k, kh, kw)
        y = oy * sh - ph + ky * dh
        xx = ox * sw - pw + kx * dw
        if 0 <= y < h and 0 <= xx < w:
            out[i, oy, ox, k] = x[i, ch, y, xx]
        else:
            out[i, oy, ox, k] = 0


@cuda.jit
def _im2col_back(g, dx, kh, kw, sh, sw, ph, pw, dh, dw):
    """dx[n, c, y, x] = sum of g[n, oy, ox, (c*kh + ky)*kw + kx] over the (ky, kx) whose
    window cell of some (oy, ox) is (y, x); accumulated in float64."""
    n, c, h, w = dx.shape
    oh, ow = g.shape[1], g.shape[2]
    for idx in range(cuda.grid(1), n * c * h * w, cuda.gridsize(1)):
        i, ch, y, xx = unravel4(idx, c, h, w)
        acc = np.float64(0)        # not 0.0: the simulator would sum float32 g in float32
        for ky in range(kh):
            ty = y + ph - ky * dh
            if ty < 0 or ty % sh != 0 or ty // sh >= oh:
                continue
            oy = ty // sh
            k0 = (ch * kh + ky) * kw
            for kx in range(kw):
                tx = xx + pw - kx * dw
                if tx < 0 or tx % sw != 0 or tx // sw >= ow:
                    continue
                acc += g[i, oy, tx // sw, k0 + kx]
        dx[i, ch, y, xx] = acc


def _launch(kernel, out, src, kh, kw, stride, padding, dilation):
    """`kernel` (_im2col or _im2col_back) from `src` into `out`, one thread per element of
    out."""
    grid_stride(kernel, out.size, src, out, kh, kw, stride[0], stride[1], padding[0],
                padding[1], dilation[0], dilation[1])


def _nhwk(cols, layout: str):
    """Columns in `layout` as their (N, OH, OW, K) view."""
    if layout == "NHWK":
        return cols
    return strided(cols, [cols.shape[a] for a in (0, 2, 3, 1)],
                   [cols.strides[a] for a in (0, 2, 3, 1)])


def cuda_im2col(out, ins, kh, kw, stride, padding, dilation, dtype, layout="NHWK"):
    """Dispatcher of im2col: kernel(cols, [x], **params); cols has the columns' dtype and
    the shape of `layout`."""
    (x,) = ins
    _launch(_im2col, _nhwk(out, layout), x, kh, kw, stride, padding, dilation)


def cuda_im2col_back(out, ins, x_shape, kh, kw, stride, padding, dilation, dtype,
                     layout="NHWK"):
    """Dispatcher of im2col_back: kernel(dx, [g], **params); dx has the image's dtype, g
    the shape of `layout`."""
    (g,) = ins
    _launch(_im2col_back, out, _nhwk(g, layout), kh, kw, stride, padding, dilation)


def _unit_axis(arr, axis: int):
    """A view of `arr` with a unit axis inserted before `axis` (stride 0)."""
    shape, strides = list(arr.shape), list(arr.strides)
    shape.insert(axis, 1)
    strides.insert(axis, 0)
    return strided(arr, shape, strides)


def cuda_im2col_1d(out, ins, k, stride, padding, dilation, dtype):
    """Dispatcher of im2col_1d: the 2-D kernel on (N, C, 1, L) -> (N, 1, OL, C*K) views."""
    (x,) = ins
    _launch(_im2col, _unit_axis(out, 1), _unit_axis(x, 2), 1, k, (1, stride), (0, padding),
            (1, dilation))


def cuda_im2col_1d_back(out, ins, x_shape, k, stride, padding, dilation, dtype):
    """Dispatcher of im2col_1d_back: the 2-D kernel on (N, 1, OL, C*K) -> (N, C, 1, L)
    views."""
    (g,) = ins
    _launch(_im2col_back, _unit_axis(out, 2), _unit_axis(g, 1), 1, k, (1, stride),
            (0, padding), (1, dilation))


def _signatures():
    """(kernel, signature) for every dtype pair: inputs strided, outputs C-contiguous, and
    im2col's output strided (NKHW columns, written through their NHWK view)."""
    ints = ", ".join(["int64"] * 8)
    sigs = []
    for src in ("float32", "float64"):
        for dst in ("float32", "float64"):
            for out in ("[:, :, :, ::1]", "[:, :, :, :]"):
                sigs.append((_im2col, f"void({src}[:, :, :, :], {dst}{out}, {ints})"))
            sigs.append((_im2col_back, f"void({src}[:, :, :, :], {dst}[:, :, :, ::1], {ints})"))
    return sigs


PTX_SIGNATURES = _signatures()
