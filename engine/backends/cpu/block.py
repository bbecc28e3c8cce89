"""CPU kernels that copy (or add) one strided array into a block of another.

`copy_block(dst, src)` sets dst = src and `copy_block(dst, src, add=True)` sets dst += src,
for arrays of one shape with any non-negative strides: `dst` is typically a basic-slicing
view of an op's output buffer (the block that concat, pad, set or acc writes), `src` an
input, possibly a permuted view. Axes that are contiguous in both arrays are merged first
(so a block of whole rows is one long axis). What is left runs as a `prange` over rows of at
most four axes; a thread owns whole rows of dst, so no two threads write one element.

The kernels see each array as the 1-D C-contiguous span of memory it covers, with element
strides and offsets, and copy a row as a slice of it: numba then knows that a row with unit
stride is contiguous and vectorises the copy (it does not for a strided 'A'-layout array).
Negative or zero strides (never made by the engine) go to numpy. `fill_zero(out)` zeroes a
contiguous buffer in parallel. None of them allocates.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.jit import parallel_kernel, prange
from engine.backends.cpu.layout import coalesce

as_strided = np.lib.stride_tricks.as_strided


@parallel_kernel
def _copy_flat(src, dst, add):
    """dst[i] = src[i] (or dst[i] += src[i]) over 1-D contiguous arrays."""
    if add:
        for i in prange(dst.size):
            dst[i] += src[i]
    else:
        for i in prange(dst.size):
            dst[i] = src[i]


@parallel_kernel
def _copy_4d(src, so0, sst, dst, do0, dst_st, shape, add):
    """dst = src (or dst += src) over a 4-D index space of `shape`, the arrays given as 1-D
    spans with start offsets so0, do0 and element strides sst, dst_st (4-tuples); a row
    (last axis) per task, copied as a slice (numba's slice copy vectorises; an element loop
    over the spans does not)."""
    n0, n1, n2, n3 = shape
    s3 = max(sst[3], 1)                    # a row of one element may have stride 0
    d3 = max(dst_st[3], 1)
    for p in prange(n0 * n1 * n2):
        i0 = p // (n1 * n2)
        i1 = (p // n2) % n1
        i2 = p % n2
        so = so0 + i0 * sst[0] + i1 * sst[1] + i2 * sst[2]
        do = do0 + i0 * dst_st[0] + i1 * dst_st[1] + i2 * dst_st[2]
        if s3 == 1 and d3 == 1:
            if add:
                dst[do:do + n3] += src[so:so + n3]
            else:
                dst[do:do + n3] = src[so:so + n3]
        elif add:
            dst[do:do + n3 * d3:d3] += src[so:so + n3 * s3:s3]
        else:
            dst[do:do + n3 * d3:d3] = src[so:so + n3 * s3:s3]


@parallel_kernel
def _fill_zero(out):
    zero = out.dtype.type(0)
    for i in prange(out.size):
        out[i] = zero


def fill_zero(out: np.ndarray) -> None:
    """out[...] = 0 for a C-contiguous out."""
    _fill_zero(out.reshape(-1))


def _span(a):
    """The 1-D C-contiguous span of memory that `a` covers (from its first element)."""
    if a.flags.c_contiguous:
        return a.reshape(-1)
    length = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.strides, strict=True)) // a.itemsize
    return as_strided(a, (length,), (a.itemsize,))


def copy_block(dst: np.ndarray, src: np.ndarray, add: bool = False) -> None:
    """dst = src, or dst += src with `add`: arrays of one shape, any non-negative strides."""
    if dst.shape != src.shape:
        raise ValueError(f"copy_block: shapes {list(dst.shape)} and {list(src.shape)} differ")
    if dst.size == 0:
        return
    if any((s <= 0 and n > 1) or s % a.itemsize
           for a in (dst, src) for n, s in zip(a.shape, a.strides, strict=True)):
        (np.add(dst, src, out=dst) if add else np.copyto(dst, src))   # never made by the engine
        return
    dims = coalesce(dst.shape, src.strides, dst.strides) or [(1, [0, 0])]
    sf, df = _span(src), _span(dst)
    if len(dims) == 1 and dims[0][1] == [src.itemsize, dst.itemsize]:
        n = dims[0][0]
        _copy_flat(sf[:n], df[:n], add)
        return
    dims = [(1, [0, 0])] * (4 - len(dims)) + dims
    sizes = [n for n, _ in dims]
    sst = [st[0] // src.itemsize for _, st in dims]
    dst_st = [st[1] // dst.itemsize for _, st in dims]
    lead = len(dims) - 4
    for idx in np.ndindex(*sizes[:lead]):      # only for > 4 irreducible axes
        so = sum(i * s for i, s in zip(idx, sst, strict=False))
        do = sum(i * s for i, s in zip(idx, dst_st, strict=False))
        _copy_4d(sf, so, tuple(sst[lead:]), df, do, tuple(dst_st[lead:]), tuple(sizes[lead:]),
                 add)
