"""CPU kernels of im2col (NCHW image -> (N, OH, OW, C*KH*KW) columns) and its backward.

Column index k = (c*KH + ky)*KW + kx, as in ggml. Image cell of output (oy, ox) and window
cell (ky, kx): y = oy*sh - ph + ky*dh, x = ox*sw - pw + kx*dw; cells outside the image read 0.

The forward runs a `prange` over the N*OH output rows. The backward runs a `prange` over
the N*C image planes and gathers: each image cell sums, privately in float64, the columns
that read it and writes once, so no two threads write the same element.
"""

from __future__ import annotations

from engine.backends.cpu.jit import parallel_kernel, prange


@parallel_kernel
def _im2col(x, out, kh, kw, sh, sw, ph, pw, dh, dw):
    """out[n, oy, ox, (c*kh + ky)*kw + kx] = x[n, c, y, x] (0 outside the image)."""
    n, c, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    zero = out.dtype.type(0)
    for r in prange(n * oh):
        i = r // oh
        oy = r % oh
        for ox in range(ow):
            col = out[i, oy, ox]
            for ch in range(c):
                for ky in range(kh):
                    y = oy * sh - ph + ky * dh
                    k0 = (ch * kh + ky) * kw
                    if y < 0 or y >= h:
                        for kx in range(kw):
                            col[k0 + kx] = zero
                        continue
                    for kx in range(kw):
                        xx = ox * sw - pw + kx * dw
                        if 0 <= xx < w:
                            col[k0 + kx] = x[i, ch, y, xx]
                        else:
                            col[k0 + kx] = zero


@parallel_kernel
def _im2col_back(g, dx, kh, kw, sh, sw, ph, pw, dh, dw):
    """dx[n, c, y, x] = sum of g[n, oy, ox, (c*kh + ky)*kw + kx] over the (oy, ox, ky, kx)
    whose window cell is (y, x)."""
    n, c, h, w = dx.shape
    oh, ow = g.shape[1], g.shape[2]
    for p in prange(n * c):
        i = p // c
        ch = p % c
        for y in range(h):
            for xx in range(w):
                acc = 0.0
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


def cpu_im2col(out, ins, kh, kw, stride, padding, dilation, dtype):
    """Dispatcher of im2col: kernel(out, [x], **params); out has the columns' dtype."""
    (x,) = ins
    _im2col(x, out, kh, kw, stride[0], stride[1], padding[0], padding[1],
            dilation[0], dilation[1])


def cpu_im2col_back(out, ins, x_shape, kh, kw, stride, padding, dilation, dtype):
    """Dispatcher of im2col_back: kernel(dx, [g], **params); dx has the image's dtype."""
    (g,) = ins
    _im2col_back(g, out, kh, kw, stride[0], stride[1], padding[0], padding[1],
                 dilation[0], dilation[1])
