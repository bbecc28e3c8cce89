"""CUDA kernels of win_part and win_unpart (SAM's windowing, ggml's WIN_PART/WIN_UNPART).

For an image of shape (H, W, C), window w, npx = ceil(W / w) windows across, window
p = py * npx + px:

    win_part:    out[p, i, j, c] = x[py*w + i, px*w + j, c]   inside x, 0 in the padding
    win_unpart:  out[h, v, c]    = y[(h // w) * npx + v // w, h % w, v % w, c]

Gathers, as the CPU kernels: one thread per output element (a grid-stride loop over the
C-contiguous output, engine.backends.cuda.launch), each element written once, the padding
included; inputs may be strided views. No arithmetic, so both backends give the same bits.
"""

from __future__ import annotations

from numba import cuda

from engine.backends.cuda.launch import grid_stride, input_layouts, unravel3, unravel4


@cuda.jit
def _win_part(x, out, w):
    """out[py*npx + px, i, j, c] = x[py*w + i, px*w + j, c], 0 outside x."""
    nh, nw = x.shape[0], x.shape[1]
    nc = out.shape[3]
    npx = (nw + w - 1) // w
    zero = out.dtype.type(0)
    for flat in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        p, i, j, c = unravel4(flat, w, w, nc)
        h = (p // npx) * w + i
        v = (p % npx) * w + j
        if h < nh and v < nw:
            out[p, i, j, c] = x[h, v, c]
        else:
            out[p, i, j, c] = zero


@cuda.jit
def _win_unpart(y, out, w):
    """out[h, v, c] = y[(h // w) * npx + v // w, h % w, v % w, c]."""
    nw, nc = out.shape[1], out.shape[2]
    npx = (nw + w - 1) // w
    for flat in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        h, v, c = unravel3(flat, nw, nc)
        out[h, v, c] = y[(h // w) * npx + v // w, h % w, v % w, c]


def cuda_win_part(out, ins, window):
    """Dispatcher of win_part: kernel(out, [x], window); out is (npy*npx, w, w, C)."""
    (x,) = ins
    grid_stride(_win_part, out.size, x, out, window)


def cuda_win_unpart(out, ins, height, width, window):
    """Dispatcher of win_unpart: kernel(out, [y], height, width, window); out is
    (height, width, C)."""
    (y,) = ins
    grid_stride(_win_unpart, out.size, y, out, window)


PTX_SIGNATURES = [sig for dt, lay3, lay4 in input_layouts(3, 4) for sig in [
    (_win_part, f"void({dt}{lay3}, {dt}[:, :, :, ::1], int64)"),
    (_win_unpart, f"void({dt}{lay4}, {dt}[:, :, ::1], int64)")]]
