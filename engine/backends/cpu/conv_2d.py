"""CPU kernels of conv_2d and of its two backward ops, conv_2d_back_x (the image's
gradient) and conv_2d_back_w (the kernel's).

Index k = (c*KH + ky)*KW + kx of a kernel row (w as (O, K), K = C*KH*KW) and p = oy*OW + ox
of an output cell (P = OH*OW); image cell y = oy*sh - ph + ky*dh, x = ox*sw - pw + kx*dw,
read as 0 outside the image. Each image's columns, cols_i[k, p] = x[i, c, y, x], are
shifted rows of its planes (im2col's NKHW layout), built in a scratch of K*P elements
that stays in L2 (288 x 1024 float32, 1.2 MB, for bench_ops' case), and used at once:

    forward   cols_i;  out[i] = w_rows @ cols_i                      (BLAS, beta 0)
    weight    cols_i;  dw^T_j += cols_i @ g[i]^T  for the images i of range j, in order
              (BLAS's beta 1), then dw^T = sum of the partials dw^T_j in float64, in order
    image     s = w_rows^T @ g[i];  dx[i] = col2im(s): each channel's KH*KW rows added
              into a float64 plane, ky then kx ascending (im2col_back's order and bits)

(the fast path conv_2d:columns). No (N, K, P) buffer of columns is written or read back
from memory, and the weight's gradient needs no (N, O, K) batch of per-image products and
no sum over it. `OPENBLAS_NUM_THREADS=1 python bench/probe_conv_fused.py` measured the
design on one thread's CPU time (bench case (64, 32, 32, 32) by (64, 32, 3, 3), padding
1): forward+backward 109 -> 80-82 ms against the composed nodes.

Threads: the forward and the image's gradient split the images into ranges (each image
on its own: the same bits at every thread count). The weight's gradient sums over the
images in WEIGHT_PARTIALS fixed ranges (fewer for a small batch, at least two images
each), one partial (K, O) sum each, the threads taking whole partials, and adds the
partials in float64 in order: its bits depend on N alone. (Splitting the input channels
instead, as probe_conv_fused.py did, changed the bits with the thread count: OpenBLAS
takes other kernels for products of fewer rows; `gradcheck --op conv_2d --tier scale`
found 810 of 1152 elements differing between 7 threads and 1.) BLAS is held to one
thread while the calls run (SciPy's OpenBLAS, engine.backends.cpu.blas).

The window's sides kh and kw are run-time values: the loops over the window are outer loops
around a row of OW cells, so compiling the window into the kernel (im2col's tuples,
im2col.window_size, as these kernels did first) only unrolled them, and made a compilation
per window shape: 40 compilations, 35 s of CPU of a cold `gradcheck --op conv_2d --op
conv_2d_back_x --op conv_2d_back_w`, against 20 and 14 s now (`python
bench/bench_first_run.py --breakdown --op ...`, quiet AVX2 machine), and no slower: bench_ops'
conv_2d case forward 32.2 and 36.6 ms before, 32.5 and 36.9 after, forward and backward
92.6 and 80.4 before, 99.9 and 80.0 after (alternating runs).

The plain twin (paths.plain()) is the composition conv_2d was before it had kernels of
its own: im2col's gather into (N, K, OH, OW) columns, numpy's batched products, the
per-image weight products summed over the batch in float64, col2im's gather.
"""

from __future__ import annotations

import functools

import numpy as np

from engine.backends.calls import sequence
from engine.backends.cpu import paths, threads
from engine.backends.cpu.blas import gemm
from engine.backends.cpu.im2col import _im2col, _im2col_back, window_size, window_table
from engine.backends.cpu.jit import bindable, njit
from engine.backends.cpu.layout import dense

# partial sums of the weight's gradient, each over a fixed range of images, whatever the
# number of threads (module doc)
WEIGHT_PARTIALS = 4


@njit
def _columns(x, i, s, c0, c1, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw):
    """s[((c - c0)*kh + ky)*kw + kx, oy*ow + ox] = x[i, c, y, x] for c in [c0, c1) (0
    outside the image; x converted to s's dtype). Rows of unit stride and dilation take
    a loop of their own, whose index LLVM knows steps by one."""
    h, w = x.shape[2], x.shape[3]
    zero = s.dtype.type(0)
    unit = sw == 1
    for ch in range(c0, c1):
        for ky in range(kh):
            for kx in range(kw):
                dst = s[((ch - c0) * kh + ky) * kw + kx]
                x0 = kx * dw - pw
                for oy in range(oh):
                    y = oy * sh - ph + ky * dh
                    base = oy * ow
                    if y < 0 or y >= h:
                        for ox in range(ow):
                            dst[base + ox] = zero
                        continue
                    src = x[i, ch, y]
                    if unit:
                        for ox in range(ow):
                            xx = ox + x0
                            dst[base + ox] = src[xx] if 0 <= xx < w else zero
                    else:
                        for ox in range(ow):
                            xx = ox * sw + x0
                            dst[base + ox] = src[xx] if 0 <= xx < w else zero


@njit
def _add_columns(s, dx, i, acc, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw):
    """dx[i, c] = col2im of s's rows of channel c, for every c: the rows added into the
    float64 plane acc at their shift, ky then kx ascending, the plane written once."""
    c, h, w = dx.shape[1], dx.shape[2], dx.shape[3]
    for ch in range(c):
        acc[:, :] = 0.0
        for ky in range(kh):
            for kx in range(kw):
                src = s[(ch * kh + ky) * kw + kx]
                x0 = kx * dw - pw
                for oy in range(oh):
                    y = oy * sh - ph + ky * dh
                    if y < 0 or y >= h:
                        continue
                    plane_row = acc[y]
                    base = oy * ow
                    for ox in range(ow):
                        xx = ox * sw + x0
                        if 0 <= xx < w:
                            plane_row[xx] += src[base + ox]
        out = dx[i, ch]
        for y in range(h):
            for xx in range(w):
                out[y, xx] = acc[y, xx]


@njit
def _forward(x, w_rows, out, i0, i1, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw):
    """out[i] = w_rows @ cols_i for the images i in [i0, i1); out is (N, O, P)."""
    s = np.empty((w_rows.shape[1], oh * ow), out.dtype)
    for i in range(i0, i1):
        _columns(x, i, s, 0, x.shape[1], kh, kw, oh, ow, sh, sw, ph, pw, dh, dw)
        gemm(False, False, w_rows, s, out[i], 0.0)


@njit
def weight_t(x, g, dw_t, i0, i1, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw):
    """dw_t = sum over the images i in [i0, i1), in order, of cols_i @ g[i]^T, (K, O); g
    is (N, O, P). (A replaceable helper: engine.mutation.patches.REPLACEABLE.)"""
    s = np.empty((dw_t.shape[0], oh * ow), dw_t.dtype)
    for i in range(i0, i1):
        _columns(x, i, s, 0, x.shape[1], kh, kw, oh, ow, sh, sw, ph, pw, dh, dw)
        gemm(False, True, s, g[i], dw_t, 0.0 if i == i0 else 1.0)


@njit
def _image(w_rows, g, dx, i0, i1, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw):
    """dx[i] = col2im(w_rows^T @ g[i]) for the images i in [i0, i1); g is (N, O, P)."""
    s = np.empty((w_rows.shape[1], oh * ow), g.dtype)
    acc = np.empty((dx.shape[2], dx.shape[3]), np.float64)
    for i in range(i0, i1):
        gemm(True, False, w_rows, g[i], s, 0.0)
        _add_columns(s, dx, i, acc, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw)


# --- dispatchers ---------------------------------------------------------------------------
def _geometry(stride, padding, dilation) -> tuple:
    return (stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1])


def _parts(macs: int, n: int) -> int:
    """Ranges of n items for the engine's threads: one below threads.MIN_MACS multiply-adds,
    recorded as split:cpu_conv_2d when cut."""
    parts = min(threads.parts() if macs >= threads.MIN_MACS else 1, max(n, 1))
    if parts > 1:
        paths.taken("split:cpu_conv_2d")
    return parts


def _held(calls):
    """One call running `calls` side by side, BLAS on one thread while they run (module
    doc; a plan with a convolution holds it already: engine.backends.cpu.BLAS_OPS)."""
    together = threads.side_by_side(calls)

    def run():
        with threads.one_blas_thread():
            together()
    return run


# The dispatchers are bindable (jit.bindable): a plan binds each node once, and its runs
# only call. Laid out at every call, conv_2d_back_w's small gradcheck cases spent about 100
# of their 110 microseconds a run in this Python (cProfile of a warm `gradcheck --op
# conv_2d_back_w`), and gradcheck's numerical differences run a case's plan four times
# per input element. Strided inputs are copied when the call runs (layout.dense).
@bindable
def cpu_conv_2d(out, ins, stride, padding, dilation):
    """Dispatcher of conv_2d: kernel(out, [x, w], **params); out (N, O, OH, OW) in w's
    dtype."""
    copies: list = []
    x, w = dense(ins[0], copies), dense(ins[1], copies)
    n, o, oh, ow = out.shape
    _, c, kh, kw = w.shape
    w_rows = w.reshape(o, c * kh * kw)
    if paths.PLAIN:
        def plain():
            cols = _plain_columns(x, w.dtype, kh, kw, oh, ow, stride, padding, dilation)
            np.matmul(w_rows, cols.reshape(n, c * kh * kw, oh * ow),
                      out=out.reshape(n, o, -1))
        return sequence(*copies, plain)
    paths.taken("conv_2d:columns")
    flat = out.reshape(n, o, oh * ow)
    geo = (kh, kw, oh, ow, *_geometry(stride, padding, dilation))
    parts = _parts(out.size * c * kh * kw, n)
    return sequence(*copies, _held([
        functools.partial(_forward, x, w_rows, flat, lo, hi, *geo)
        for lo, hi in threads.bounds(n, parts)]))


@bindable
def cpu_conv_2d_back_x(out, ins, x_shape, dtype, stride, padding, dilation):
    """Dispatcher of conv_2d_back_x: kernel(dx, [g, w], **params); dx in the image's dtype,
    g (N, O, OH, OW) and w in one dtype."""
    copies: list = []
    g, w = dense(ins[0], copies), dense(ins[1], copies)
    n, o, oh, ow = g.shape
    _, c, kh, kw = w.shape
    w_rows = w.reshape(o, c * kh * kw)
    flat = g.reshape(n, o, oh * ow)
    if paths.PLAIN:
        def plain():
            cols = np.matmul(w_rows.T, flat).reshape(n, c * kh * kw, oh, ow)
            _im2col_back(cols.transpose(0, 2, 3, 1), out,
                         window_table(x_shape[2], oh, kh, stride[0], padding[0], dilation[0]),
                         window_table(x_shape[3], ow, kw, stride[1], padding[1], dilation[1]),
                         window_size(kh), window_size(kw))
        return sequence(*copies, plain)
    paths.taken("conv_2d:columns")
    geo = (kh, kw, oh, ow, *_geometry(stride, padding, dilation))
    parts = _parts(g.size * c * kh * kw, n)
    return sequence(*copies, _held([
        functools.partial(_image, w_rows, flat, out, lo, hi, *geo)
        for lo, hi in threads.bounds(n, parts)]))


@bindable
def cpu_conv_2d_back_w(out, ins, w_shape, stride, padding, dilation):
    """Dispatcher of conv_2d_back_w: kernel(dw, [g, x], **params); dw (O, C, KH, KW) in
    g's dtype (the kernel's)."""
    copies: list = []
    g, x = dense(ins[0], copies), dense(ins[1], copies)
    n, o, oh, ow = g.shape
    _, c, kh, kw = w_shape
    k = c * kh * kw
    flat = g.reshape(n, o, oh * ow)
    if paths.PLAIN:
        def plain():
            cols = _plain_columns(x, g.dtype, kh, kw, oh, ow, stride, padding, dilation)
            per_image = np.matmul(flat, cols.reshape(n, k, oh * ow).transpose(0, 2, 1))
            out.reshape(o, k)[...] = per_image.sum(axis=0, dtype=np.float64)
        return sequence(*copies, plain)
    paths.taken("conv_2d:columns")
    ranges = weight_ranges(n)
    partials = np.empty((len(ranges), k, o), out.dtype)   # each written whole by weight_t
    geo = (kh, kw, oh, ow, *_geometry(stride, padding, dilation))

    def group(lo, hi):
        for j in range(lo, hi):        # weight_t looked up when run: a replaceable helper
            weight_t(x, flat, partials[j], *ranges[j], *geo)
    parts = _parts(g.size * k, len(ranges))
    products = _held([functools.partial(group, lo, hi)
                      for lo, hi in threads.bounds(len(ranges), parts)])

    def run():
        products()
        total = partials[0].astype(np.float64)
        for j in range(1, len(ranges)):                    # in order: the same bits always
            total += partials[j]
        out.reshape(o, k)[...] = total.T
    return sequence(*copies, run)


def weight_ranges(n: int) -> list[tuple[int, int]]:
    """The image ranges of the weight gradient's partial sums: WEIGHT_PARTIALS of them, or
    fewer so that each holds at least two images; fixed by n alone (module doc)."""
    return threads.bounds(n, max(1, min(WEIGHT_PARTIALS, n // 2)))


def _plain_columns(x, dtype, kh, kw, oh, ow, stride, padding, dilation):
    """The plain twin's columns: im2col's gather into the NHWK view of (N, K, OH, OW)."""
    n, c = x.shape[0], x.shape[1]
    cols = np.empty((n, c * kh * kw, oh, ow), dtype)
    _im2col(x, cols.transpose(0, 2, 3, 1), window_size(kh), window_size(kw),
            *_geometry(stride, padding, dilation))
    return cols
