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
contiguous buffer in parallel. `broadcast_block(dst, src)` writes a numpy broadcast of src
into a contiguous dst, by streaming stores where it is big and a fill or whole rows (see
there); `copy_block` streams a big copy of contiguous rows too (copy:streaming, see there).
None of them allocates.
"""

from __future__ import annotations

import functools
import platform

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from engine.backends.calls import sequence
from engine.backends.cpu import paths, threads
from engine.backends.cpu.jit import call, kernel, parallel_kernel, prange, scalar_math
from engine.backends.cpu.layout import coalesce, flat_base

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


# Streaming (non-temporal) stores: a vector written to memory without first reading its
# cache line in (an ordinary store reads the line, then writes it back: twice the memory
# traffic for a buffer larger than the caches). On x86 only, where they are measured.
STREAM_BYTES = 32                  # a streaming store's vector: 32-byte aligned
# Streamed where the engine's threads write this many bytes together (a chunk's times the
# thread count): a buffer that fits the shared cache is read back faster from there. One
# thread's CPU filling a preallocated float32 buffer (2-core machine, load 8, median of 15,
# alternating in one process), ordinary stores / streaming: 4 MB 0.36 / 0.81 ms, 8 MB
# 0.93 / 1.52, 16 MB 1.99 / 2.21, 32 MB 3.89 / 1.93, 64 MB 7.77 / 3.12.
STREAM_MIN_BYTES = 16 << 20
# A copy streams only where its contiguous runs are this long or longer: runs of a few
# cache lines, each with its unaligned head and tail stored apart, took a permuted cont of
# (8, 16, 1024, 64) float32 (256-byte runs) from 3.6 to 17.5 ms and pad's gradient
# ((64, 32, 56, 56) rows of 224 bytes) from 5.5 to 24.4 ms forward + backward in the quiet
# full run of `python bench/bench_ops.py` after issue 37's sixth round (commit 147fb80);
# concat's rows of 8 KB stream.
STREAM_MIN_RUN = 4096
STREAMING = platform.machine().lower() in ("x86_64", "amd64")


def _nontemporal(builder, store):
    store.set_metadata("nontemporal",
                       builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))


@intrinsic
def _stream_splat(typingctx, arr, i, v):
    """arr[i:i + w] = v (w = STREAM_BYTES / itemsize, &arr[i] aligned to STREAM_BYTES)
    in one streaming store. Compiled code only."""
    def codegen(context, builder, signature, args):
        arrty = signature.args[0]
        a = context.make_array(arrty)(context, builder, args[0])
        elt = context.get_value_type(arrty.dtype)
        vty = ir.VectorType(elt, STREAM_BYTES // context.get_abi_sizeof(elt))
        x = context.cast(builder, args[2], signature.args[2], arrty.dtype)
        vec = ir.Constant(vty, ir.Undefined)
        for k in range(vty.count):
            vec = builder.insert_element(vec, x, ir.Constant(ir.IntType(32), k))
        ptr = builder.bitcast(builder.gep(a.data, [args[1]]), vty.as_pointer())
        _nontemporal(builder, builder.store(vec, ptr, align=STREAM_BYTES))
        return context.get_dummy_value()
    return types.void(arr, i, v), codegen


@intrinsic
def _stream_copy(typingctx, dst, i, src, j):
    """dst[i:i + w] = src[j:j + w] (w as _stream_splat's, &dst[i] aligned, src any): an
    unaligned load, one streaming store. Compiled code only."""
    def codegen(context, builder, signature, args):
        dty, sty = signature.args[0], signature.args[2]
        d = context.make_array(dty)(context, builder, args[0])
        s = context.make_array(sty)(context, builder, args[2])
        elt = context.get_value_type(dty.dtype)
        size = context.get_abi_sizeof(elt)
        vty = ir.VectorType(elt, STREAM_BYTES // size)
        src_ptr = builder.bitcast(builder.gep(s.data, [args[3]]), vty.as_pointer())
        vec = builder.load(src_ptr, align=size)
        dst_ptr = builder.bitcast(builder.gep(d.data, [args[1]]), vty.as_pointer())
        _nontemporal(builder, builder.store(vec, dst_ptr, align=STREAM_BYTES))
        return context.get_dummy_value()
    return types.void(dst, i, src, j), codegen


@intrinsic
def store_fence(typingctx):
    """A sequentially consistent fence (x86's mfence): the streaming stores before it are
    visible to every thread after it (they are weakly ordered). Compiled code only."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


def streams(dst: np.ndarray) -> bool:
    """Whether a write of `dst` (a chunk's, when split) streams: outside plain mode, on x86,
    where the engine's threads write STREAM_MIN_BYTES or more together, dst's elements on
    their own size's boundaries (the vectors then start on STREAM_BYTES ones)."""
    return (not paths.PLAIN and STREAMING
            and dst.nbytes * threads.parts() >= STREAM_MIN_BYTES
            and dst.ctypes.data % dst.itemsize == 0)


@scalar_math
def stream_run(dst, src):
    """dst[:] = src[:] over 1-D contiguous arrays of one size: the elements before dst's
    first STREAM_BYTES boundary and after its last whole vector by ordinary stores, the
    vectors between by _stream_copy. Inlined into compiled kernels, which end with a
    store_fence."""
    n = dst.size
    w = STREAM_BYTES // dst.itemsize
    head = min(n, ((-dst.ctypes.data) % STREAM_BYTES) // dst.itemsize)
    body = head + (n - head) // w * w
    for j in range(head):
        dst[j] = src[j]
    for j in range(head, body, w):
        _stream_copy(dst, j, src, j)
    for j in range(body, n):
        dst[j] = src[j]


@kernel
def _broadcast_rows_streaming(src, s0, s1, dst, rows, n):
    """dst[i n + j] = src[i s0 + j s1] for i < rows, j < n (element strides; s1 is 0 or
    1: a row is a fill of one value or a contiguous copy), by streaming stores: each row's
    elements before its first STREAM_BYTES boundary and after its last whole vector by
    ordinary stores, the vectors between by _stream_splat (a fill; a copy is stream_run's);
    a store fence at the end."""
    w = STREAM_BYTES // dst.itemsize
    for i in range(rows):
        d = dst[i * n:(i + 1) * n]
        if s1 == 0:
            head = min(n, ((-d.ctypes.data) % STREAM_BYTES) // dst.itemsize)
            body = head + (n - head) // w * w
            v = src[i * s0]
            for j in range(head):
                d[j] = v
            for j in range(head, body, w):
                _stream_splat(d, j, v)
            for j in range(body, n):
                d[j] = v
        else:
            stream_run(d, src[i * s0:i * s0 + n])
    store_fence()


def broadcast_block(dst: np.ndarray, src: np.ndarray) -> None:
    """dst = numpy's broadcast of src to dst's shape, dst C-contiguous and of src's dtype.

    Where the engine's threads write STREAM_MIN_BYTES or more together and the broadcast
    coalesces to at most two axes, the inner one read contiguously or not at all (a single
    value everywhere: sum's gradient over all axes; a column of values, each filling a
    row: over the last axis; a row repeated), a compiled loop writes dst row by row with
    streaming stores (the fast path broadcast:streaming): an ordinary store reads each
    cache line before writing it. Filling a preallocated (4096, 4096) float32, one
    thread's CPU time (2-core machine at load 5, median of 15, alternating in one
    process): ndarray.fill 8.7 ms, the same loop with ordinary stores 7.6, streaming 3.3.
    Anything else is numpy's: a single value by ndarray.fill, the rest by numpy's copy
    from the stride-0 view (in the caches, at 4-8 MB, faster than the compiled loop with
    ordinary stores); plain mode copies (the plain twin)."""
    if dst.size == 0:
        return
    view = np.broadcast_to(src, dst.shape)
    item = dst.itemsize
    dims = coalesce(dst.shape, view.strides, dst.strides)
    base = flat_base(src)
    fast = (streams(dst) and dst.flags.c_contiguous and base is not None
            and dst.dtype == src.dtype and len(dims) <= 2
            and all(st[0] % item == 0 for _, st in dims)
            and (not dims or dims[-1][1][0] in (0, item)))
    if fast:
        paths.taken("broadcast:streaming")
        dims = [(1, [0, 0])] * (2 - len(dims)) + dims
        (rows, (s0, _)), (n, (s1, _)) = dims
        _broadcast_rows_streaming(base, s0 // item, s1 // item, dst.reshape(-1), rows, n)
    elif src.size == 1 and not paths.PLAIN:
        dst.fill(src.reshape(-1)[0])
    else:
        np.copyto(dst, view)


def _span(a):
    """The 1-D C-contiguous span of memory that `a` covers (from its first element)."""
    if a.flags.c_contiguous:
        return a.reshape(-1)
    length = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.strides, strict=True)) // a.itemsize
    return as_strided(a, (length,), (a.itemsize,))


@kernel
def _copy_flat_streaming(src, dst):
    """dst = src over 1-D contiguous arrays, by streaming stores (stream_run)."""
    stream_run(dst, src)
    store_fence()


@kernel
def _copy_4d_streaming(src, so0, sst, dst, do0, dst_st, shape):
    """_copy_4d's dst = src for rows contiguous in both arrays, each row by streaming
    stores (stream_run); serial (the engine's threads split it)."""
    n0, n1, n2, n3 = shape
    for p in range(n0 * n1 * n2):
        i0 = p // (n1 * n2)
        i1 = (p // n2) % n1
        i2 = p % n2
        so = so0 + i0 * sst[0] + i1 * sst[1] + i2 * sst[2]
        do = do0 + i0 * dst_st[0] + i1 * dst_st[1] + i2 * dst_st[2]
        stream_run(dst[do:do + n3], src[so:so + n3])
    store_fence()


def copy_block(dst: np.ndarray, src: np.ndarray, add: bool = False) -> None:
    """dst = src, or dst += src with `add`: arrays of one shape, any non-negative strides."""
    copy_block_call(dst, src, add)()


def copy_block_call(dst: np.ndarray, src: np.ndarray, add: bool = False):
    """The zero-argument call of copy_block(dst, src, add), laid out now.

    A copy (not `add`) whose rows, after merging, are contiguous in both arrays streams
    where it is big (streams(dst): the fast path copy:streaming): an ordinary store reads
    each cache line of dst before writing it, so a copy over 32 MB moves three times its
    size through memory, and two with streaming stores. concat's (2048, 4096) float32
    output from two (2048, 2048) halves, and its two gradients made contiguous from their
    strided halves of the upstream gradient (cont), one thread's CPU time per call (python
    bench/profile_op.py --op concat --calls 9, load 5): 7.09 and 2 x 2.6 ms with ordinary
    stores, 3.88-4.30 and 2 x 2.2-2.6 streamed. Where source and destination together fit
    the shared cache (a 16 MiB copy alone, 32 MB in all) ordinary stores are faster (1.23
    against 1.7 ms), as STREAM_MIN_BYTES's fills are: in a graph, its other buffers
    compete for that cache."""
    if dst.shape != src.shape:
        raise ValueError(f"copy_block: shapes {list(dst.shape)} and {list(src.shape)} differ")
    if dst.size == 0:
        return sequence()
    if any((s <= 0 and n > 1) or s % a.itemsize
           for a in (dst, src) for n, s in zip(a.shape, a.strides, strict=True)):
        if add:                              # never made by the engine
            return functools.partial(np.add, dst, src, out=dst)
        return functools.partial(np.copyto, dst, src)
    dims = coalesce(dst.shape, src.strides, dst.strides) or [(1, [0, 0])]
    sf, df = _span(src), _span(dst)
    stream = (not add and dims[-1][1] == [src.itemsize, dst.itemsize]
              and dims[-1][0] * dst.itemsize >= STREAM_MIN_RUN
              and src.dtype == dst.dtype and streams(dst))
    if stream:
        paths.taken("copy:streaming")
    if len(dims) == 1 and dims[0][1] == [src.itemsize, dst.itemsize]:
        n = dims[0][0]
        if stream:
            return functools.partial(_copy_flat_streaming, sf[:n], df[:n])
        return call(_copy_flat, sf[:n], df[:n], add)
    dims = [(1, [0, 0])] * (4 - len(dims)) + dims
    sizes = [n for n, _ in dims]
    sst = [st[0] // src.itemsize for _, st in dims]
    dst_st = [st[1] // dst.itemsize for _, st in dims]
    lead = len(dims) - 4
    calls = []
    for idx in np.ndindex(*sizes[:lead]):      # only for > 4 irreducible axes
        so = sum(i * s for i, s in zip(idx, sst, strict=False))
        do = sum(i * s for i, s in zip(idx, dst_st, strict=False))
        rest = (tuple(sst[lead:]), df, do, tuple(dst_st[lead:]), tuple(sizes[lead:]))
        calls.append(functools.partial(_copy_4d_streaming, sf, so, *rest) if stream
                     else call(_copy_4d, sf, so, *rest, add))
    return sequence(*calls)
