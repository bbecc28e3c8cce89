"""CUDA kernels of win_part and win_unpart (SAM's windowing, ggml's WIN_PART/WIN_UNPART).

For an image of shape (H, W, C), window w, npx = ceil(W / w) windows across, window
p = py * npx + px:

    win_part:    out[p, i, j, c] = x[py*w + i, px*w + j, c]   inside x, 0 in the padding
    win_unpart:  out[h, v, c]    = y[(h // w) * npx + v // w, h % w, v % w, c]

Gathers, as the CPU kernels: one thread per output element (a grid-stride loop over the
C-contiguous output), each element written once, the padding included; inputs may be
strided views. No arithmetic, so both backends give the same bits.
"""

from __future__ import annotations

from numba import cuda

from engine.backends.cuda.dropout import THREADS, blocks


@cuda.jit
def _win_part(x, out, w):
    """out[py*npx + px, i, j, c] = x[py*w + i, px*w + j, c], 0 outside x."""
    nh, nw = x.shape[0], x.shape[1]
    nc = out.shape[3]
    npx = (nw + w - 1) // w
    zero = out.dtype.type(0)
    for flat in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        c = flat % nc
        j = (flat // nc) % w
        i = (flat // (nc * w)) % w
        p = flat // (nc * w * w)
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
        c = flat % nc
        v = (flat // nc) % nw
        h = flat // (nc * nw)
        out[h, v, c] = y[(h // w) * npx + v // w, h % w, v % w, c]


def cuda_win_part(out, ins, window):
    """Dispatcher of win_part: kernel(out, [x], window); out is (npy*npx, w, w, C)."""
    (x,) = ins
    if out.size:
        _win_part[blocks(out.size), THREADS](x, out, window)


def cuda_win_unpart(out, ins, height, width, window):
    """Dispatcher of win_unpart: kernel(out, [y], height, width, window); out is
    (height, width, C)."""
    (y,) = ins
    if out.size:
        _win_unpart[blocks(out.size), THREADS](y, out, window)


def _signatures():
    """float32 and float64, inputs contiguous or strided, outputs contiguous."""
    sigs = []
    for dt in ("float32", "float64"):
        for lay3, lay4 in (("[:, :, ::1]", "[:, :, :, ::1]"), ("[:, :, :]", "[:, :, :, :]")):
            sigs.append((_win_part, f"void({dt}{lay3}, {dt}[:, :, :, ::1], int64)"))
            sigs.append((_win_unpart, f"void({dt}{lay4}, {dt}[:, :, ::1], int64)"))
    return sigs


PTX_SIGNATURES = _signatures()
