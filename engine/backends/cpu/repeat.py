"""CPU kernels of repeat (tiling) and repeat_back (summing the tiles back).

Both work on x's shape s (left-padded with 1s to the tiled rank) and the repeat counts r,
the tiled tensor T having sides r*s: T[t*s + k] = x[k] per axis. Axes are first simplified:
size-1 axes that are not repeated are dropped, and an axis that is not repeated is merged
into the axis before it when both arrays are contiguous across the two (so a repeat along
axis 0 of a matrix is a repeat of one long row). What is left, padded to four axes, runs
as a `prange` over rows of the output, a thread owning whole rows; more than four
irreducible axes (rare) go to numpy.

repeat_back accumulates each row of x's gradient over all the tiles in a fixed order, in
float64 whatever the gradient's dtype (as sum does: a float32 accumulator over the 1031
tiles of the scale tier's case erred 12 times more than torch's float32 sum), so its
result never depends on the thread count.
"""

from __future__ import annotations

import functools

import numpy as np

from engine.backends.calls import sequence
from engine.backends.cpu.jit import bindable, call, parallel_kernel, prange

as_strided = np.lib.stride_tricks.as_strided


@parallel_kernel
def _repeat_4d(x, out):
    """out[t*s + k] = x[k] per axis, s = x.shape, out 4-D C-contiguous."""
    s0, s1, s2, s3 = x.shape
    o0, o1, o2, o3 = out.shape
    for p in prange(o0 * o1 * o2):
        k0 = p // (o1 * o2)
        k1 = (p // o2) % o1
        k2 = p % o2
        xrow = x[k0 % s0, k1 % s1, k2 % s2]
        orow = out[k0, k1, k2]
        for t in range(o3 // s3):
            for i in range(s3):
                orow[t * s3 + i] = xrow[i]


@parallel_kernel
def _repeat_back_4d(g, out):
    """out[k] = sum over tiles t of g[t*s + k] per axis, s = out.shape, g 4-D strided."""
    s0, s1, s2, s3 = out.shape
    r0, r1, r2, r3 = g.shape[0] // s0, g.shape[1] // s1, g.shape[2] // s2, g.shape[3] // s3
    for p in prange(s0 * s1 * s2):
        k0 = p // (s1 * s2)
        k1 = (p // s2) % s1
        k2 = p % s2
        orow = out[k0, k1, k2]
        acc = np.zeros(s3, np.float64)
        for t0 in range(r0):
            for t1 in range(r1):
                for t2 in range(r2):
                    grow = g[t0 * s0 + k0, t1 * s1 + k1, t2 * s2 + k2]
                    for t3 in range(r3):
                        for i in range(s3):
                            acc[i] += grow[t3 * s3 + i]
        for i in range(s3):
            orow[i] = acc[i]


def _simplified(small, big):
    """Axes [(s, r, small stride, big stride)] of a tiling of `small` (x or dx, logical shape
    s) into `big` (out or g, shape r*s), simplified as the module doc says."""
    pad = big.ndim - small.ndim
    sizes = (1,) * pad + small.shape
    sstr = (0,) * pad + small.strides
    axes = []
    for n, m, ss, bs in zip(sizes, big.shape, sstr, big.strides, strict=True):
        r = m // n
        if n == 1 and r == 1:
            continue
        if axes and r == 1:
            pn, pr, pss, pbs = axes[-1]
            if pss == ss * n and pbs == bs * n:
                axes[-1] = (pn * n, pr, ss, bs)
                continue
        axes.append((n, r, ss, bs))
    return axes or [(1, 1, 0, 0)]


def _views(small, big):
    """4-D views (small, big) of the simplified tiling, or None beyond four axes."""
    axes = _simplified(small, big)
    if len(axes) > 4:
        return None
    axes = [(1, 1, 0, 0)] * (4 - len(axes)) + axes
    sv = as_strided(small, [n for n, _, _, _ in axes], [ss for _, _, ss, _ in axes])
    bv = as_strided(big, [n * r for n, r, _, _ in axes], [bs for _, _, _, bs in axes])
    return sv, bv


def _tiles(small, big):
    """A 2N-axis view of `big` as (r0, s0, r1, s1, ...) (the numpy fallback)."""
    pad = big.ndim - small.ndim
    sizes = (1,) * pad + small.shape
    shape, strides = [], []
    for n, m, bs in zip(sizes, big.shape, big.strides, strict=True):
        shape += [m // n, n]
        strides += [bs * n, bs]
    return as_strided(big, shape, strides), sizes


@bindable
def cpu_repeat(out, ins, shape):
    """Dispatcher of repeat: kernel(out, [x], shape)."""
    (x,) = ins
    if out.size == 0:
        return sequence()
    views = _views(x, out)
    if views is not None:
        return call(_repeat_4d, views[0], views[1])
    tiled, sizes = _tiles(x, out)
    return functools.partial(np.copyto, tiled, _interleaved(x, sizes))


def _interleaved(x, sizes):
    """x viewed as (1, s0, 1, s1, ...): broadcasts against the tiles."""
    pad = len(sizes) - x.ndim
    strides = (0,) * pad + x.strides
    shape, st = [], []
    for n, s in zip(sizes, strides, strict=True):
        shape += [1, n]
        st += [0, s]
    return as_strided(x, shape, st)


@bindable
def cpu_repeat_back(out, ins, shape):
    """Dispatcher of repeat_back: kernel(dx, [g], shape), shape = dx's shape."""
    (g,) = ins
    if out.size == 0:
        return sequence()
    views = _views(out, g)
    if views is not None:
        return call(_repeat_back_4d, views[1], views[0])
    tiled, _ = _tiles(out, g)
    return functools.partial(np.sum, tiled, axis=tuple(range(0, tiled.ndim, 2)),
                             out=out.reshape(tuple(tiled.shape[1::2])))
