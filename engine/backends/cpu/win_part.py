"""CPU kernels of win_part (an image cut into zero-padded windows) and win_unpart (the
windows put back together), SAM's windowing as ggml's WIN_PART and WIN_UNPART.

For an image x of shape (H, W, C), window w, npx = ceil(W / w) windows across and
npy = ceil(H / w) down, window p = py * npx + px:

    win_part:    out[p, i, j, c] = x[py*w + i, px*w + j, c]   where both indices are inside x,
                                   0                           in the padding (right, bottom)
    win_unpart:  out[h, v, c]    = y[(h // w) * npx + v // w, h % w, v % w, c]

Both are gathers: each output element is written once, the padding included (the output
buffer may hold garbage). Inputs may be strided views: the dispatchers copy them
C-contiguous first (layout.dense, the copy made when the call runs), so that numba
compiles each kernel once per dtype, not again per layout (the transposed and sliced
inputs of gradcheck's cases made 8 of the 12 compilations of the two in a cold `gradcheck
--all`: `python bench/bench_first_run.py --breakdown --records F`). Split on the engine's threads
(threads.split) along rows of windows: a chunk of window rows py0..py1 is the kernel itself
on out[py0*npx : py1*npx] and x[py0*w : py1*w] (win_part), or on out[py0*w : py1*w] and
y[py0*npx : py1*npx] (win_unpart), so a chunk computes exactly what the whole would.
"""

from __future__ import annotations

import functools

from engine.backends.calls import sequence
from engine.backends.cpu import layout, threads
from engine.backends.cpu.jit import bindable, kernel


@kernel
def _win_part(x, out, w):
    """out[py*npx + px, i, j, c] = x[py*w + i, px*w + j, c], 0 outside x."""
    nh, nw, nc = x.shape
    npx = (nw + w - 1) // w
    zero = out.dtype.type(0)
    for p in range(out.shape[0]):
        y0 = (p // npx) * w
        x0 = (p % npx) * w
        for i in range(w):
            h = y0 + i
            for j in range(w):
                v = x0 + j
                orow = out[p, i, j]
                if h < nh and v < nw:
                    xrow = x[h, v]
                    for c in range(nc):
                        orow[c] = xrow[c]
                else:
                    for c in range(nc):
                        orow[c] = zero


@kernel
def _win_unpart(y, out, w):
    """out[h, v, c] = y[(h // w) * npx + v // w, h % w, v % w, c]."""
    nh, nw, nc = out.shape
    npx = (nw + w - 1) // w
    for h in range(nh):
        for v in range(nw):
            yrow = y[(h // w) * npx + v // w, h % w, v % w]
            orow = out[h, v]
            for c in range(nc):
                orow[c] = yrow[c]


def _chunks(image_of, windows_of, w):
    """The chunking of one of the two kernels: ranges of window rows, when the work is big
    enough for threads.MIN_ELEMENTS; image_of/windows_of pick (out, ins) apart."""
    def chunks(out, ins, parts):
        image, windows = image_of(out, ins), windows_of(out, ins)
        if out.size + ins[0].size < threads.MIN_ELEMENTS:
            return None
        npx = -(-image.shape[1] // w(out, ins))
        win = w(out, ins)
        npy = windows.shape[0] // npx
        pieces = []
        for lo, hi in threads.bounds(npy, parts):
            img, wins = image[lo * win:hi * win], windows[lo * npx:hi * npx]
            pieces.append((wins, [img]) if image is ins[0] else (img, [wins]))
        return pieces
    return chunks


def _part_window(out, ins):
    return out.shape[1]


@bindable
def _win_part_prepare(out, ins, window):
    copies: list = []
    x = layout.dense(ins[0], copies)
    return sequence(*copies, functools.partial(_win_part, x, out, window))


@bindable
def _win_unpart_prepare(out, ins, height, width, window):
    copies: list = []
    y = layout.dense(ins[0], copies)
    return sequence(*copies, functools.partial(_win_unpart, y, out, window))


cpu_win_part = threads.split(
    _win_part_prepare, _chunks(lambda out, ins: ins[0], lambda out, ins: out, _part_window))
cpu_win_part.__doc__ = "Dispatcher of win_part: kernel(out, [x], window)."
cpu_win_unpart = threads.split(
    _win_unpart_prepare, _chunks(lambda out, ins: out, lambda out, ins: ins[0],
                             lambda out, ins: ins[0].shape[1]))
cpu_win_unpart.__doc__ = "Dispatcher of win_unpart: kernel(out, [y], height, width, window)."
