"""CPU kernels of im2col (NCHW image -> (N, OH, OW, C*KH*KW) columns) and its backward.

Column index k = (c*KH + ky)*KW + kx, as in ggml. Image cell of output (oy, ox) and window
cell (ky, kx): y = oy*sh - ph + ky*dh, x = ox*sw - pw + kx*dw; cells outside the image read 0.

Both kernels gather: every output element is computed whole and written once, by the one
thread that owns it, so nothing is zeroed first and no two threads write the same element.

The window size is given as the lengths of two tuples, `rows` (KH) and `cols` (KW), part of
numba's type: each window size up to STATIC_WINDOW per axis compiles its own kernel, in which
the loops over the window are unrolled. Short loops over a window whose size is known only at
run time cost 2-3x the time per element. A larger window passes arrays instead of tuples, and
the same code runs with run-time loop bounds.

The forward runs a `prange` over the N*OH output rows and writes each column vector
out[n, oy, ox, :] in order. A window whose columns all lie inside the image (x0 >= 0 and
x0 + (KW-1)*dw < W, for all but the border windows) copies each of its image rows without a
bounds test; a window row in the padding is written 0.

The backward (col2im) runs a `prange` over the N*H image rows (n, y) and, for each channel c
and column x, sums in float64, in the order (ky, kx),

    dx[n, c, y, x] = sum of g[n, oy, ox, (c*KH + ky)*KW + kx]
                     over oy = row_of[y, ky] >= 0 and ox = col_of[x, kx] >= 0,

where row_of[y, ky] = (y + ph - ky*dh) / sh when that is a whole number in [0, OH) and -1
otherwise (col_of likewise). The tables are made once per geometry by the dispatcher, so the
loop has no division and no stride test. Image row (n, y) reads only the KH rows of g's block
that reach it, in cache for all C channels, so g is read from memory about once.

Images of SCATTER_MIN_CHANNELS channels or more take the fast path im2col_back:scatter
instead (its plain twin: the gather): per image, g's column vectors in memory order, each
added into a float64 copy of the image in an order that gives every cell its terms in the
gather's (ky, kx) order, so both produce the same bits.

Columns in the layout NKHW, (N, C*KH*KW, OH, OW) (engine.ops.im2col's `layout`, as
conv_2d multiplies them: kernel rows @ each image's (K, P) columns), are one image plane
per row k = (c, ky, kx), shifted by (ky, kx): the fast paths im2col:rows and
im2col_back:rows copy and add whole rows of a plane, each (n, c) on its own, with the
bounds worked out once per row instead of per element. col2im adds the KH*KW rows of a
channel into one float64 plane (H*W doubles, in L1) with ky, then kx, ascending: each cell
receives its terms in the gather's order, so both give the same bits. Their plain twins
are the kernels above on the (N, OH, OW, K) view of the same memory.
"""

from __future__ import annotations

import functools

import numpy as np

from engine.backends.cpu import paths, threads
from engine.backends.cpu.jit import parallel_kernel, prange
from engine.backends.cpu.layout import contiguous

# the largest window side (per axis) given its own compiled kernels; each size compiles once
# per dtype and layout (about 1-2 s) and is cached on disk
STATIC_WINDOW = 5

# images of at least this many channels take the scatter (im2col_back:scatter): a gather
# per image cell reads KH*KW scattered terms, a scatter reads each column vector whole and
# spends its per-window bookkeeping on C channels at once. One thread, CPU time (median
# of 7), gather -> scatter, float32: (500, 8, 14, 14) 3 x 3 padding 1 (the MNIST CNN's
# second layer) 10.0 -> 7.6 ms, (64, 32, 33, 33) 3 x 3 stride 2 (conv_transpose_2d's bench
# case) 10.7 -> 6.4 ms; but (2, 4, 182, 182) 1.6 -> 1.9 ms and (500, 1, 28, 28) 3.1 ->
# 4.8 ms, where the gather's few terms per cell are cheap (a one-off script against the
# previous kernel on the loaded 2-core machine; the same bits, compared in it)
SCATTER_MIN_CHANNELS = 8


@parallel_kernel
def _im2col(x, out, rows, cols, sh, sw, ph, pw, dh, dw):
    """out[n, oy, ox, (c*kh + ky)*kw + kx] = x[n, c, y, x] (0 outside the image), with
    kh = len(rows) and kw = len(cols) (their contents are unused)."""
    kh, kw = len(rows), len(cols)
    n, c, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    zero = out.dtype.type(0)
    for r in prange(n * oh):
        i = r // oh
        oy = r - i * oh
        y0 = oy * sh - ph
        for ox in range(ow):
            x0 = ox * sw - pw
            inside = x0 >= 0 and x0 + (kw - 1) * dw < w     # every window column
            col = out[i, oy, ox]
            for ch in range(c):
                for ky in range(kh):
                    y = y0 + ky * dh
                    k0 = (ch * kh + ky) * kw
                    if y < 0 or y >= h:
                        for kx in range(kw):
                            col[k0 + kx] = zero
                    elif inside:
                        image_row = x[i, ch, y]
                        for kx in range(kw):
                            col[k0 + kx] = image_row[x0 + kx * dw]
                    else:
                        image_row = x[i, ch, y]
                        for kx in range(kw):
                            xx = x0 + kx * dw
                            col[k0 + kx] = image_row[xx] if 0 <= xx < w else zero


@parallel_kernel
def _im2col_back(g, dx, row_of, col_of, rows, cols):
    """dx[n, c, y, x] = sum of g[n, row_of[y, ky], col_of[x, kx], (c*kh + ky)*kw + kx] over
    the (ky, kx) whose table entries are both >= 0 (float64 sum, in (ky, kx) order), with
    kh = len(rows) and kw = len(cols)."""
    kh, kw = len(rows), len(cols)
    n, c, h, w = dx.shape
    for r in prange(n * h):
        i = r // h
        y = r - i * h
        for ch in range(c):
            for xx in range(w):
                acc = 0.0
                for ky in range(kh):
                    oy = row_of[y, ky]
                    if oy >= 0:
                        k0 = (ch * kh + ky) * kw
                        for kx in range(kw):
                            ox = col_of[xx, kx]
                            if ox >= 0:
                                acc += g[i, oy, ox, k0 + kx]
                dx[i, ch, y, xx] = acc


@parallel_kernel
def _im2col_back_scatter(g, dx, rows, cols, sh, sw, ph, pw, dh, dw):
    """_im2col_back's result, scattered (the fast path im2col_back:scatter): one image at
    a time, its column vectors read in memory order and added into a float64 image (C*H*W
    doubles, in cache), output rows and columns from the last to the first, so that each
    cell receives its terms with ky, then kx, ascending (a larger ky reaches a cell from
    an earlier output row, a larger kx from an earlier column): the gather's order, and so
    its bits."""
    kh, kw = len(rows), len(cols)
    n, c, h, w = dx.shape
    oh, ow = g.shape[1], g.shape[2]
    for i in prange(n):
        acc = np.zeros((c, h, w), np.float64)
        for oy in range(oh - 1, -1, -1):
            y0 = oy * sh - ph
            for ox in range(ow - 1, -1, -1):
                x0 = ox * sw - pw
                inside = x0 >= 0 and x0 + (kw - 1) * dw < w     # every window column
                col = g[i, oy, ox]
                for ky in range(kh):
                    y = y0 + ky * dh
                    if y < 0 or y >= h:
                        continue
                    for ch in range(c):
                        k0 = (ch * kh + ky) * kw
                        image_row = acc[ch, y]
                        if inside:
                            for kx in range(kw):
                                image_row[x0 + kx * dw] += col[k0 + kx]
                        else:
                            for kx in range(kw):
                                xx = x0 + kx * dw
                                if 0 <= xx < w:
                                    image_row[xx] += col[k0 + kx]
        for ch in range(c):
            for y in range(h):
                for xx in range(w):
                    dx[i, ch, y, xx] = acc[ch, y, xx]


@parallel_kernel
def _im2col_rows(x, out, kh, kw, sh, sw, ph, pw, dh, dw):
    """out[n, (c*kh + ky)*kw + kx, oy, ox] = x[n, c, y, x] (0 outside the image): for each
    (n, c) and window cell (ky, kx), the plane of x shifted by it, row by row. (A row
    split into its padding and its inside, each a loop of its own, took 2.5x as long: LLVM
    makes such loops memset and memmove calls, one per piece of 32 elements or so.)"""
    n, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    zero = out.dtype.type(0)
    for r in prange(n * c):
        i = r // c
        ch = r - i * c
        for ky in range(kh):
            for kx in range(kw):
                dst = out[i, (ch * kh + ky) * kw + kx]
                x0 = kx * dw - pw
                for oy in range(oh):
                    y = oy * sh - ph + ky * dh
                    row = dst[oy]
                    if y < 0 or y >= h:
                        for ox in range(ow):
                            row[ox] = zero
                        continue
                    src = x[i, ch, y]
                    for ox in range(ow):
                        xx = ox * sw + x0
                        row[ox] = src[xx] if 0 <= xx < w else zero


@parallel_kernel
def _im2col_back_rows(g, dx, kh, kw, sh, sw, ph, pw, dh, dw):
    """_im2col_back's result from NKHW columns g (the fast path im2col_back:rows): for each
    (n, c), the rows of g[n, (c*kh + ky)*kw + kx] added into a float64 plane at their
    shift, ky and then kx ascending (each cell's terms in the gather's order), the plane
    written once."""
    n, c, h, w = dx.shape
    oh, ow = g.shape[2], g.shape[3]
    for r in prange(n * c):
        i = r // c
        ch = r - i * c
        acc = np.zeros((h, w), np.float64)
        for ky in range(kh):
            for kx in range(kw):
                src = g[i, (ch * kh + ky) * kw + kx]
                x0 = kx * dw - pw
                for oy in range(oh):
                    y = oy * sh - ph + ky * dh
                    if y < 0 or y >= h:
                        continue
                    row = src[oy]
                    plane_row = acc[y]
                    for ox in range(ow):
                        xx = ox * sw + x0
                        if 0 <= xx < w:
                            plane_row[xx] += row[ox]
        out = dx[i, ch]
        for y in range(h):
            for xx in range(w):
                out[y, xx] = acc[y, xx]


# The dispatchers copy an image or column gradient that is not C-contiguous first
# (layout.contiguous): numba compiles a kernel once per layout of its arrays, and these
# once per window size too, so transposed and sliced images and gradients (gradcheck's
# cases) made 25 of the 73 compilations of _im2col and _im2col_back in a cold `gradcheck
# --all`, about 8 s of CPU (`python bench/bench_first_run.py --breakdown`, load 5-6). The
# plain twin's transposed views of NKHW columns are made after, from the copy: that twin
# keeps its own layout.
#
# Likewise one dtype per call: where the columns' dtype is not the image's (im2col's
# `dtype`), the dispatchers convert the input first and run the kernels of one dtype,
# which a run compiles anyway (its float32 and float64 cases). The bits are the kernels'
# own: float32 to float64 is exact; the forward's float64 to float32 cast is the one its
# store made (both round to nearest even); the backward sums in float64 whatever its
# arrays, so a float32 image is taken from a float64 result (rounded once, as the store
# rounded it). The mixed pairs made 8 of the 48 compilations of _im2col and _im2col_back
# in a cold `gradcheck --all` (`python bench/bench_first_run.py --breakdown --records F`);
# a conversion pass costs the input's size, and only calls whose two dtypes differ take it.


def window_size(k: int):
    """What the kernels take for a window side k: a tuple of k zeros (k compiled into the
    kernel) up to STATIC_WINDOW, an array of k zeros (k read at run time) beyond."""
    return (0,) * k if k <= STATIC_WINDOW else np.zeros(k, np.int8)


@functools.lru_cache(maxsize=256)
def window_table(size: int, out_size: int, k: int, stride: int, padding: int,
                 dilation: int) -> np.ndarray:
    """table[v, j] = the output index o with o*stride - padding + j*dilation = v, 0 <= o <
    out_size, or -1 where there is none: which output reads image index v through window
    cell j. (size, k) int64, read-only (it is shared by every call with this geometry)."""
    t = np.arange(size)[:, None] + padding - np.arange(k)[None, :] * dilation
    o = t // stride
    table = np.where((t >= 0) & (t % stride == 0) & (o < out_size), o, -1).astype(np.int64)
    table.flags.writeable = False
    return table


def _window_args(stride, padding, dilation) -> tuple:
    return (stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1])


@threads.split
def cpu_im2col(out, ins, kh, kw, stride, padding, dilation, dtype, layout="NHWK"):
    """Dispatcher of im2col: kernel(out, [x], **params); out has the columns' dtype, and
    the shape of `layout`: (N, OH, OW, K) or, NKHW, (N, K, OH, OW). An image that is not
    C-contiguous is copied first (layout.contiguous), one of another dtype converted."""
    x = contiguous(ins[0])
    if x.dtype != out.dtype:
        x = x.astype(out.dtype)          # one dtype per kernel (see above)
    if layout == "NKHW":
        if not paths.PLAIN:
            paths.taken("im2col:rows")
            _im2col_rows(x, out, kh, kw, *_window_args(stride, padding, dilation))
            return
        out = out.transpose(0, 2, 3, 1)     # the plain twin: the gather into the NHWK view
    _im2col(x, out, window_size(kh), window_size(kw), stride[0], stride[1],
            padding[0], padding[1], dilation[0], dilation[1])


@threads.split
def cpu_im2col_back(out, ins, x_shape, kh, kw, stride, padding, dilation, dtype,
                    layout="NHWK"):
    """Dispatcher of im2col_back: kernel(dx, [g], **params); dx has the image's dtype, g
    the columns' shape in `layout` (see cpu_im2col); g copied first where it is not
    C-contiguous (layout.contiguous), and of another dtype than dx's, summed into a
    float64 image rounded once to dx's dtype."""
    g = contiguous(ins[0])
    if g.dtype != out.dtype:             # one dtype per kernel (see above): in float64
        wide = np.empty(out.shape, np.float64)
        _col2im(g.astype(np.float64, copy=False), wide, x_shape, kh, kw, stride, padding,
                dilation, layout)
        np.copyto(out, wide)
        return
    _col2im(g, out, x_shape, kh, kw, stride, padding, dilation, layout)


def _col2im(g, out, x_shape, kh, kw, stride, padding, dilation, layout):
    """cpu_im2col_back's kernels on C-contiguous columns `g` of out's dtype."""
    if layout == "NKHW":
        if not paths.PLAIN:
            paths.taken("im2col_back:rows")
            _im2col_back_rows(g, out, kh, kw, *_window_args(stride, padding, dilation))
            return
        g = g.transpose(0, 2, 3, 1)         # the plain twin: the gather from the NHWK view
    oh, ow = g.shape[1], g.shape[2]
    if x_shape[1] >= SCATTER_MIN_CHANNELS and not paths.PLAIN:
        paths.taken("im2col_back:scatter")
        _im2col_back_scatter(g, out, window_size(kh), window_size(kw), stride[0], stride[1],
                             padding[0], padding[1], dilation[0], dilation[1])
        return
    row_of = window_table(x_shape[2], oh, kh, stride[0], padding[0], dilation[0])
    col_of = window_table(x_shape[3], ow, kw, stride[1], padding[1], dilation[1])
    _im2col_back(g, out, row_of, col_of, window_size(kh), window_size(kw))
