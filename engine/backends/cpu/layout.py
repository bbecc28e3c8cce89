"""Strided operands described as rows of one run, for the CPU kernels' dispatchers.

Kernels that read broadcast or strided views get each operand as its *flat base* (a 1-D
contiguous array over the memory the view spans), the element offset of each of its rows
and its step along a row (1: contiguous, 0: one value broadcast along the row). The output
is C-contiguous, row r being out[r * run : (r + 1) * run]. Over such 1-D slices numba emits
plain loops that LLVM vectorises, where indexing a 4-D strided view does not.

Axes are first coalesced (size-1 axes dropped, neighbours merged where every operand is
contiguous across them), so a bias of shape (C,) added to an (N, C) matrix is N rows of C,
and a channel bias (C, 1, 1) added to (N, C, H, W) is N C rows of H W with step 0.

All of this is plain numpy on shapes and strides: dispatchers call it once per plan (in
their `bind`) or once per call, never per element. The kernels here copy transposed views
in tiles (`copy_call`, `transpose_into`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from engine.backends.cpu import paths
from engine.backends.cpu.jit import kernel
from engine.tensor import is_half

as_strided = np.lib.stride_tricks.as_strided


def coalesce(shape, *strides_list):
    """Merge adjacent axes that are contiguous in every operand; drop size-1 axes.
    Returns [(size, [stride of each operand])] from the outermost axis in."""
    dims = [(n, [s[i] for s in strides_list]) for i, n in enumerate(shape) if n != 1]
    merged: list[tuple[int, list[int]]] = []
    for n, st in dims:
        if merged:
            pn, pst = merged[-1]
            if all(ps == s * n for ps, s in zip(pst, st, strict=True)):
                merged[-1] = (pn * n, st)
                continue
        merged.append((n, st))
    return merged


def flat_base(arr: np.ndarray) -> np.ndarray | None:
    """A 1-D contiguous view over the memory `arr` spans (from its first element to its
    last), or None where a stride is negative or not a multiple of the item size."""
    item = arr.itemsize
    if any(s < 0 or s % item for s in arr.strides):
        return None
    if arr.size == 0:
        return arr.reshape(-1)[:0]
    span = 1 + sum((n - 1) * (s // item) for n, s in zip(arr.shape, arr.strides, strict=True))
    return as_strided(arr, (span,), (item,), writeable=arr.flags.writeable)


def row_offsets(dims, k: int, item: int) -> np.ndarray:
    """Element offsets (int64) of the rows spanned by the outer `dims` of operand k, rows
    in C order."""
    offsets = np.zeros(1, np.int64)
    for n, st in dims:
        step = np.arange(n, dtype=np.int64) * (st[k] // item)
        offsets = (offsets[:, None] + step[None, :]).reshape(-1)
    return offsets


class Rows:
    """Operands of one shape (broadcast views allowed) as rows of `run` elements:
    `bases[k]`, `offsets[k]` (int64, one per row) and `steps[k]` (0 or 1) for operand k,
    `nrows` rows in all. `Rows.of(shape, arrays)` is None where an operand's innermost
    coalesced axis is neither contiguous nor broadcast, or its base cannot be had."""

    __slots__ = ("run", "nrows", "bases", "offsets", "steps")

    def __init__(self, run, nrows, bases, offsets, steps):
        self.run, self.nrows = run, nrows
        self.bases, self.offsets, self.steps = bases, offsets, steps

    @classmethod
    def of(cls, shape, arrays) -> Rows | None:
        item = arrays[0].itemsize
        if any(a.itemsize != item for a in arrays):
            return None
        views = [np.broadcast_to(a, shape) if a.shape != tuple(shape) else a for a in arrays]
        dims = coalesce(shape, *(v.strides for v in views)) or [(1, [0] * len(views))]
        run, inner = dims[-1]
        steps = []
        for s in inner:
            if s not in (0, item):
                return None
            steps.append(1 if s == item else 0)
        # the base of the array itself, not of its broadcast (which numpy makes read-only):
        # the same memory, and one numba type (writeable arrays) for every operand
        bases = [flat_base(a) for a in arrays]
        if any(b is None for b in bases):
            return None
        outer = dims[:-1]
        offsets = [row_offsets(outer, k, item) for k in range(len(views))]
        return cls(run, math.prod(n for n, _ in outer), bases, offsets, steps)


# The tiles are visited in blocks of 64 x 64 elements: sweeping a whole row band of tiles
# reads 8 elements from each of thousands of source rows, a page each, and comes back for
# the rest of their cache lines only on the next band. In blocks, a (4096, 2048) float32
# transposed copy took 21 ms of one core against 30 unblocked and torch's 25 (uint16: 11
# against 20; 16 x 16 tiles: 34; a one-off script timing process_time, median of 7).
_BLOCK = 64


@kernel
def transpose_into(src, out, col0):
    """out[:, col0:col0 + m] = src.T for 2-D src (m, n) and out (n, >= col0 + m), both
    contiguous along their last axis, in tiles of 8 x 8 (blocks of _BLOCK x _BLOCK of
    them): every cache line read (of src) and written (of out) is used whole while it is
    in the L1 cache. col0 > 0: a band of columns of a wider array (a thread's part of a
    transposed result)."""
    m, n = src.shape
    m8, n8 = m // 8 * 8, n // 8 * 8
    for cb in range(0, m8, _BLOCK):
        for rb in range(0, n8, _BLOCK):
            for r0 in range(rb, min(n8, rb + _BLOCK), 8):
                for c0 in range(cb, min(m8, cb + _BLOCK), 8):
                    for c in range(c0, c0 + 8):
                        for r in range(r0, r0 + 8):
                            out[r, col0 + c] = src[c, r]
    for r in range(n8):                      # the ragged columns of the whole tiles' rows
        for c in range(m8, m):
            out[r, col0 + c] = src[c, r]
    for r in range(n8, n):                   # the ragged rows
        for c in range(m):
            out[r, col0 + c] = src[c, r]


@kernel
def _transpose_tiles(src, out):
    """out[b] = src[b].T for 3-D arrays, each by transpose_into."""
    for b in range(out.shape[0]):
        transpose_into(src[b], out[b], 0)


# 16-bit floats are copied as their uint16 patterns (a copy moves bits, whatever they mean)
_TILED_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64,
                                            np.uint16))


def copy_call(out, x):
    """A zero-argument call that copies view `x` into C-contiguous `out` (same shape and
    dtype): a transposed view (its second-last axis the contiguous one, not its last) by
    `_transpose_tiles`, about twice as fast as numpy's copy there (1.5 times where the
    untransposed view is not contiguous), for the dtypes numba compiles it for (float16 and
    bfloat16 as their uint16 patterns); anything else by numpy."""
    if is_half(x.dtype) and x.dtype == out.dtype:
        x, out = x.view(np.uint16), out.view(np.uint16)
    item = x.itemsize
    if (not paths.PLAIN and x.ndim >= 2 and x.strides[-2] == item and x.strides[-1] != item
            and x.shape[-2] >= 8 and x.shape[-1] > 1
            and out.flags.c_contiguous and x.dtype == out.dtype and x.dtype in _TILED_DTYPES):
        nr, nc = x.shape[-2:]
        lead = [(n, s) for n, s in zip(x.shape[:-2], x.strides[:-2], strict=True) if n != 1]
        if all(s == s2 * n2 for (_, s), (n2, s2) in zip(lead, lead[1:], strict=False)):
            nb = math.prod(n for n, _ in lead)             # the batch axes as one
            step = lead[-1][1] if lead else 0
            src = as_strided(x, (nb, nc, nr), (step, x.strides[-1], item), writeable=False)
            paths.taken("copy:tiled")
            return functools.partial(_transpose_tiles, src, out.reshape(nb, nr, nc))
    return functools.partial(np.copyto, out, x)


def dense(a: np.ndarray, copies: list) -> np.ndarray:
    """`a` itself where it is C-contiguous, else a new C-contiguous array of its shape and
    dtype, the call that fills it from `a` when the kernel runs (copy_call) appended to
    `copies`. For dispatchers whose kernels would otherwise be compiled once more for every
    layout their inputs come in (numba types an array by its layout: C, F or any):
    copied at the dispatch boundary, a kernel has one machine code for every layout, and
    gradcheck's cases with transposed, sliced and broadcast inputs and upstream gradients
    check that one (docs/performance.md, "Start-up and the first run"). A read-only `a`
    gets a read-only view of its copy: numba types writability too, and the kernel then
    sees the type a contiguous read-only input of the same place gives it."""
    if a.flags.c_contiguous:
        return a
    out = np.empty(a.shape, a.dtype)
    copies.append(copy_call(out, a))
    if not a.flags.writeable:
        out = out.view()
        out.flags.writeable = False
    return out


def contiguous(a: np.ndarray) -> np.ndarray:
    """`a`, or a C-contiguous copy of it made now (read-only where `a` is), for the
    dispatchers that run their kernel at once (no bind): `dense`'s reason, its copy taken
    when the call reads the data."""
    if a.flags.c_contiguous:
        return a
    out = np.ascontiguousarray(a)
    if not a.flags.writeable:
        out.flags.writeable = False
    return out
