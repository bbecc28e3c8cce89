"""CUDA kernels of the GLU family (engine.ops.glu): out = act(a) * b, what the CPU kernels
(engine.backends.cpu.glu) compute, from the same scalar math.

    fused:   x of shape (..., 2n)   a = x[..., :n], b = x[..., n:]   (swapped: exchanged)
    split:   a, b of shape (..., n)

One kernel source serves every activation: `_glu` calls the activation by the global name
`forward`, and `kernel(op)` makes a copy of it bound to the activation's row of
engine.elementwise, compiled as a CUDA device function (kept in KERNELS, one per op). A
grid-stride loop over out's elements in C order reads a and b through their strides as 4-D
views (a stride-0 leading unit axis: numba types them with layout "A", one compilation per
dtype for every layout), computes in float64 and rounds once when storing into the
C-contiguous out. 16-bit nodes run the float32 kernel widened (engine.backends.cuda.half).
"""

from __future__ import annotations

import types

from numba import cuda

from engine import elementwise as table
from engine.backends.cpu.glu import ACTIVATIONS, MAX_DIMS
from engine.backends.cuda.arrays import like_numpy, strided
from engine.backends.cuda.elementwise import scalar
from engine.backends.cuda.launch import map_shape, unravel4


def _glu(a, b, out):
    """out[i] = forward(a[j]) * b[j] in float64, j the 4-D index of position i."""
    _, d1, d2, d3 = a.shape
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        out[i] = forward(float(a[i0, i1, i2, i3])) * float(b[i0, i1, i2, i3])  # noqa: F821


KERNELS: dict = {}      # op -> its compiled kernel, made on first use


def kernel(op: str):
    """The CUDA kernel of GLU op `op` (_glu bound to its activation), made once."""
    if op not in KERNELS:
        row = table.UNARY[ACTIVATIONS[op]]
        fn = types.FunctionType(_glu.__code__, {**_glu.__globals__,
                                                "forward": scalar(row.forward)},
                                f"_glu__{op}")
        fn.__doc__ = _glu.__doc__
        KERNELS[op] = cuda.jit(fn)
    return KERNELS[op]


def _view_4d(arr, n: int, offset_items: int = 0):
    """A 4-D view of device array `arr` (unit axes of stride 0 in front), its last axis
    cut to n elements from `offset_items` on (the halves of a fused input)."""
    shape, st = like_numpy(arr)
    pad = MAX_DIMS - len(shape)
    return strided(arr, (1,) * pad + shape[:-1] + (n,), (0,) * pad + st,
                   offset_items * st[len(st) - 1])


def _halves(ins, n: int, swapped: bool):
    """(a, b) as 4-D views: the fused [x] cut at n (exchanged when swapped), or [a, b]."""
    if len(ins) == 2:
        return _view_4d(ins[0], n), _view_4d(ins[1], n)
    (x,) = ins
    first, second = _view_4d(x, n), _view_4d(x, n, n)
    return (second, first) if swapped else (first, second)


def _dispatcher(op: str):
    def run(out, ins, swapped):
        if out.size == 0:
            return
        a, b = _halves(ins, out.shape[out.ndim - 1], swapped)   # (simulator: no shape[-1])
        flat = strided(out, (out.size,), (out.dtype.itemsize,))
        kernel(op)[map_shape(out.size)](a, b, flat)
    run.__name__ = f"cuda_{op}"
    return run


def __getattr__(attr: str):
    """`cuda_<op>`: the kernel of GLU op <op>, the name the op definitions give."""
    op = attr.removeprefix("cuda_")
    if op != attr and op in ACTIVATIONS:
        return _dispatcher(op)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def _signatures():
    """Every op, float32 and float64: strided 4-D inputs, a flat contiguous output."""
    return [(kernel(op), f"void({t}[:, :, :, :], {t}[:, :, :, :], {t}[::1])")
            for op in ACTIVATIONS for t in ("float32", "float64")]


PTX_SIGNATURES = _signatures()
