"""16-bit floats for numba kernels: float16 and bfloat16 as uint16 bit patterns.

numba has no 16-bit float type on the CPU, so kernels read and write the patterns and
convert: widen to float32 on load (exact for both formats), compute in float32 or better,
round to nearest, ties to even, on store.

    widen_f16(h) -> float32          narrow_f16(x) -> uint16     (IEEE binary16)
    widen_bf16(h) -> float32         narrow_bf16(x) -> uint16    (bfloat16: float32's top half)
    widen_array(src_bits, dst_f32, fmt)   narrow_array(src_f32, dst_bits, fmt)   fmt: F16, BF16

Conventions, held by tests over all 65,536 patterns each way against numpy's float16 and
ml_dtypes' bfloat16: infinities stay infinities; a float32 beyond the largest finite value
(after rounding) becomes an infinity; float16's subnormals are produced and read; a NaN stays
a NaN of the same sign, keeping the top bits of its payload (float16: a payload that would
vanish becomes 1, as numpy does; bfloat16: the quiet bit is set, so that no NaN becomes an
infinity).
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from engine.backends.cpu import paths, threads
from engine.backends.cpu.jit import parallel_kernel, prange, scalar_math
from engine.backends.widening import HalfArrays, run_widened
from engine.tensor import is_half, line_aligned

F16, BF16 = 0, 1          # the formats' codes (fmt arguments), as compiled constants

_ABS32 = np.uint32(0x7FFFFFFF)
_INF32 = np.uint32(0x7F800000)
_INF16 = np.uint32(0x7C00)             # float16's infinity
_INF16_AT32 = np.uint32(0x7C00 << 13)  # its exponent bits in float32's places
_MIN_NORMAL16 = np.uint32(0x38800000)  # 2^-14 as float32 bits: float16's smallest normal
_MIN_NORMAL16_F = np.float32(2.0 ** -14)
_HIDDEN32 = np.uint32(0x00800000)      # float32's implicit leading significand bit


@scalar_math
def _as_f32(bits):
    """The float32 whose pattern is `bits` (numba widens mixed unsigned arithmetic to 64
    bits: narrowed back here, since a view keeps the itemsize)."""
    return np.uint32(bits).view(np.float32)


@scalar_math
def widen_bf16(h):
    """The float32 of bfloat16 pattern `h` (exact: the pattern is float32's top half)."""
    return _as_f32(np.uint32(h) << np.uint32(16))


@scalar_math
def narrow_bf16(x):
    """bfloat16 pattern of float32 `x`, rounded to nearest, ties to even."""
    bits = np.float32(x).view(np.uint32)
    if (bits & _ABS32) > _INF32:                      # NaN: keep sign and payload, quiet
        return np.uint16((bits >> np.uint32(16)) | np.uint32(0x0040))
    lsb = (bits >> np.uint32(16)) & np.uint32(1)      # ties go to the even pattern
    return np.uint16((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16))


@scalar_math
def widen_f16(h):
    """The float32 of float16 pattern `h` (exact, subnormals, infinities and NaN included).
    Branchless, so that loops over it vectorise: each case's pattern is computed and one
    selected, in 32-bit operations (numba widens unsigned arithmetic to 64 bits: np.uint32
    narrows each result back, or the vectors would hold half as many lanes)."""
    bits = np.uint32(h)
    sign = np.uint32(np.uint32(bits & np.uint32(0x8000)) << np.uint32(16))
    # exponent and mantissa moved to float32's places: the mantissa widens from 10 to 23 bits
    body = np.uint32(np.uint32(bits & np.uint32(0x7FFF)) << np.uint32(13))
    normal = np.uint32(body + np.uint32(112 << 23))     # the exponent rebiased, 15 -> 127
    special = np.uint32(body | _INF32)                  # infinity or NaN (payload kept)
    # zero or a subnormal, mantissa * 2^-24: 2^-14 (1 + mantissa / 1024), the mantissa put
    # below 2^-14's exponent, minus 2^-14; exact, and with no float32 subnormal in or out,
    # so that flushing them to zero (a GPU's fast math) changes nothing
    subnormal = np.float32(_as_f32(body | _MIN_NORMAL16) - _MIN_NORMAL16_F).view(np.uint32)
    magnitude = special if body >= _INF16_AT32 else (
        normal if body >= _HIDDEN32 else subnormal)
    return _as_f32(sign | magnitude)


@scalar_math
def narrow_f16(x):
    """float16 pattern of float32 `x`, rounded to nearest, ties to even. Branchless, as
    widen_f16 is (every case's pattern computed, one selected, in 32-bit operations); the
    CUDA backend compiles this same function into its kernels, so only integer operations
    and one float32 addition (numba-cuda has no rint; rounding subnormals in integers
    instead, by a shift of varying length, ran 1.7 times slower)."""
    xbits = np.float32(x).view(np.uint32)
    sign = np.uint32(np.uint32(xbits >> np.uint32(16)) & np.uint32(0x8000))
    magnitude = np.uint32(xbits & _ABS32)
    top = np.uint32(magnitude >> np.uint32(13))         # the bits float16 keeps
    # NaN: the payload's top 10 bits, 1 where those are all zero (never an infinity)
    nan = _INF16 | max(np.uint32(top & np.uint32(0x3FF)), np.uint32(1))
    # a normal result: drop 13 mantissa bits, rounding to even (add just under half, plus
    # the lowest kept bit), and rebias (127 -> 15: 112 << 23, shifted); a carry out of the
    # mantissa increments the exponent, and out of the largest exponent gives the infinity
    # 0x7C00, at which min holds every larger magnitude, the infinity itself included
    rounded = np.uint32(magnitude + np.uint32(0xFFF) + np.uint32(top & np.uint32(1)))
    normal = min(np.uint32(np.uint32(rounded >> np.uint32(13)) - np.uint32(112 << 10)), _INF16)
    # a subnormal result (or zero), |x| 2^24 rounded to an integer: adding 0.5 rounds |x|
    # to a multiple of 2^-24 (0.5's ulp), to even, and the sum's mantissa is that integer
    # (1024, the smallest normal, included). Exact when float32 subnormals are flushed to
    # zero too (they round to 0 either way). min (any bound >= 2^-14 would do) keeps the
    # addend an integer operation's result: a compiler that fuses a * b + c (a GPU's, by
    # default) could otherwise make a caller's narrow_f16(a * a) one fma(a, a, 0.5),
    # rounded once instead of twice
    tiny = _as_f32(min(magnitude, _MIN_NORMAL16))
    subnormal = np.uint32(np.float32(tiny + np.float32(0.5)).view(np.uint32)
                          - np.uint32(0x3F000000))
    return np.uint16(sign | (nan if magnitude > _INF32 else (
        normal if magnitude >= _MIN_NORMAL16 else subnormal)))


@scalar_math
def widen(h, fmt):
    return widen_f16(h) if fmt == F16 else widen_bf16(h)


@scalar_math
def narrow(x, fmt):
    return narrow_f16(x) if fmt == F16 else narrow_bf16(x)


@parallel_kernel
def widen_array(src, dst, fmt):
    """dst[i] = float32 of pattern src[i], over 1-D contiguous arrays."""
    for i in prange(src.size):
        dst[i] = widen(src[i], fmt)


@parallel_kernel
def narrow_array(src, dst, fmt):
    """dst[i] = pattern of src[i], over 1-D contiguous arrays. A float64 src is rounded to
    float32 first; rounding twice gives the correctly rounded result here, as it does
    whenever the intermediate format has at least 2p + 2 significand bits for a target of
    p (float32: 24 >= 2 * 11 + 2 for float16, >= 2 * 8 + 2 for bfloat16)."""
    for i in prange(src.size):
        dst[i] = narrow(np.float32(src[i]), fmt)


# --- kernels on 16-bit arrays: widen, compute in float32, round on store --------------------
def _patterns(a: np.ndarray) -> np.ndarray:
    """The bit patterns of 16-bit array `a`, 1-D and contiguous (a copy only where `a` is
    strided)."""
    return np.ascontiguousarray(a.view(np.uint16)).reshape(-1)


def _format(dtype) -> int:
    return F16 if np.dtype(dtype) == np.float16 else BF16


def widened_copy(a: np.ndarray, split: bool = False, empty=None) -> np.ndarray:
    """A new float32 array holding 16-bit array `a`'s values (exact): contiguous, or where
    `a` is a permuted view of a contiguous block (a transposed matrix), the same
    permutation of a contiguous float32 block, widened in memory order. Gathered into a
    contiguous copy first, a transposed (1024, 2048) bfloat16 matrix took 77 ms (numpy's
    copy of 16-bit elements across the rows) where widening it in place took 0.5, and
    matmul's backward takes two such operands: bfloat16 matmul over (512, 1024) x (1024,
    2048) ran 1.43 times the engine's float32 product, forward and backward (python
    bench/bench_ops.py --op matmul --repeat 7 --threads 1); BLAS takes the transposed
    float32 view as it takes a float32 graph's. `split`: widened in ranges on the engine's
    threads where it is big enough (in_ranges; the caller runs outside any split).
    `empty(shape)`: where the float32 block comes from (a new array by default; a kept
    scratch buffer: Scratch)."""
    order = _memory_order(a)
    block = a if order is None else a.transpose(order)
    out = np.empty(block.shape, np.float32) if empty is None else empty(block.shape)
    src, dst, fmt = _patterns(block), out.reshape(-1), _format(a.dtype)
    in_ranges(lambda lo, hi: widen_array(src[lo:hi], dst[lo:hi], fmt), src.size,
              "half_widen" if split else None)
    return out if order is None else out.transpose(_inverse(order))


def widened_like(a: np.ndarray, empty) -> np.ndarray:
    """The float32 array, in a's shape, that widened_copy(a, empty=empty) would fill: the
    contiguous block `empty(shape)` gives, viewed in a's layout (widen_into fills it later)."""
    order = _memory_order(a)
    if order is None:
        return empty(a.shape)
    return empty(tuple(a.shape[i] for i in order)).transpose(_inverse(order))


def memory_blocks(a: np.ndarray, dst: np.ndarray):
    """(a as the contiguous block it is a permutation of, dst (widened_like(a)) permuted
    alike: its contiguous float32 block), or None where a is no such view."""
    if a.flags.c_contiguous:
        return a, dst
    order = _memory_order(a)
    return None if order is None else (a.transpose(order), dst.transpose(order))


def widen_into(dst: np.ndarray, a: np.ndarray, split: bool = False) -> None:
    """dst (float32, a's shape) = 16-bit `a`'s values, by widened_copy (looked up in this
    module at each call: the self-test's mutants replace it) writing into dst where dst is
    laid out as widened_copy lays out a's copy (widened_like, or a range of rows of such a
    block), else copied from a new array; `split` as widened_copy's."""
    if a.flags.c_contiguous and dst.flags.c_contiguous:
        got = widened_copy(a, split=split, empty=lambda shape: dst)
        if got is not dst:                 # a replacement's own array
            np.copyto(dst, got)
        return
    order = _memory_order(a)
    block = dst if order is None else dst.transpose(order)
    if block.flags.c_contiguous:
        got = widened_copy(a, split=split, empty=lambda shape: block)
    else:
        got = widened_copy(a, split=split)
    if got is not dst and not np.may_share_memory(got, dst):   # a replacement's own array
        np.copyto(dst, got)


def in_ranges(call, size: int, name: str | None) -> None:
    """call(lo, hi) over [0, size): at once, or, `name` given, in ranges run side by side
    on the engine's threads where `size` is at least SPLIT_MIN_ELEMENTS (the fast path
    split:`name`; one range in plain mode). The conversions are elementwise and exact
    (widening) or correctly rounded (narrowing), so the ranges give the same bits."""
    n = threads.parts()
    if name is None or n == 1 or size < SPLIT_MIN_ELEMENTS:
        call(0, size)
        return
    paths.taken(f"split:{name}")
    threads.side_by_side([functools.partial(call, lo, hi)
                          for lo, hi in threads.bounds(size, n)])()


# A conversion split on the engine's threads from this many elements: one hand-over costs
# about 100 microseconds (engine.backends.cpu.threads), and converting half a million
# elements on one thread about as much (widening 2M bfloat16 took 0.44 ms in cache; in a
# bfloat16 product's graph, where BLAS had evicted them, its operands' widenings took 1.0 ms
# at the median and rounding its 1M outputs 0.45)
SPLIT_MIN_ELEMENTS = 1 << 19


def _inverse(order) -> tuple:
    """The permutation that undoes `order` (np.argsort's, without its cost per call)."""
    return tuple(order.index(i) for i in range(len(order)))


def _memory_order(a: np.ndarray):
    """The permutation of a's axes that makes it C-contiguous (its axes by decreasing
    stride), or None where none does or a is contiguous already."""
    if a.flags.c_contiguous or a.ndim < 2:
        return None
    if a.ndim == 2:                      # the common case without argsort's cost per call
        order = (0, 1) if a.strides[0] >= a.strides[1] else (1, 0)
    else:
        order = tuple(int(i) for i in np.argsort([-s for s in a.strides], kind="stable"))
    return order if a.transpose(order).flags.c_contiguous else None


def store(dst: np.ndarray, values: np.ndarray) -> None:
    """Round float32 (or float64) `values` to 16-bit `dst`'s dtype, to nearest even, into
    `dst` (contiguous, of the same shape)."""
    narrow_array(np.ascontiguousarray(values).reshape(-1), dst.view(np.uint16).reshape(-1),
                 _format(dst.dtype))


def split_store(dst: np.ndarray, values: np.ndarray) -> None:
    """store, in ranges on the engine's threads where big enough (in_ranges, the path
    split:half_store; the caller runs outside any split). store is looked up at each
    range's call (the self-test's store mutants replace it in this module)."""
    if not dst.flags.c_contiguous:
        store(dst, values)
        return
    d, v = dst.reshape(-1), np.ascontiguousarray(values).reshape(-1)
    in_ranges(lambda lo, hi: store(d[lo:hi], v[lo:hi]), d.size, "half_store")


# widened_copy and store are looked up in this module at each call, not bound here: the
# self-test's 16-bit mutants (engine.mutation) replace them in this module, and that must
# reach every widened kernel
HOST_ARRAYS = HalfArrays(
    is_half=lambda a: isinstance(a, np.ndarray) and is_half(a.dtype),
    overlap=np.shares_memory, widened_copy=lambda a: widened_copy(a),
    empty32=lambda shape: np.empty(shape, np.float32),
    store=lambda dst, values: store(dst, values))
# the same, its conversions split on the engine's threads: for a kernel that no split
# encloses (matmul's, whose product is then split itself), where HOST_ARRAYS' serial
# conversions left one core idle: bfloat16 matmul over (512, 1024) x (1024, 2048) ran 1.31
# times the engine's float32 product at 2 threads, its widening and rounding serial
SPLIT_ARRAYS = HOST_ARRAYS._replace(widened_copy=lambda a: widened_copy(a, split=True),
                                    store=lambda dst, values: split_store(dst, values))


# A 16-bit product's float32 temporaries (its operands widened, its output before
# rounding) come from buffers kept between calls on the calling thread (Scratch), up to
# this many elements each: new ones per call took bench_half's bfloat16 forward (512x768 @
# 768x512) to 1.76-1.94 times the float32 product's CPU time on the calling thread at 2
# threads, 1.30-1.35 with its buffers kept (backward 1.44-1.51 -> 1.37-1.41; 30 calls'
# medians, 8 alternating rounds, load 5-8: docs/performance.md, "16-bit kernels"). 2^20
# float32 (4 MiB) a buffer holds that case's and matmul's 16-bit scale case's temporaries
# (two of the three of bench_ops' (512, 1024) x (1024, 2048)) and bounds what a thread
# keeps to three such buffers.
SCRATCH_MAX_ELEMENTS = 1 << 20


class _Kept(threading.local):
    """The calling thread's kept buffers (flat float32, by slot) and whether a call of this
    thread holds them now."""

    def __init__(self):
        self.buffers: list = []
        self.busy = False


_KEPT = _Kept()


class Scratch:
    """The float32 temporaries of one widened call: its i-th `empty(shape)` is the calling
    thread's kept buffer i (grown to the largest size it has held, at most
    SCRATCH_MAX_ELEMENTS), its first elements; a bigger shape gets a new array. Only while
    `held()` runs, and never in a call nested in another's (that one takes new arrays):
    the kept buffers are one call's at a time. Under paths.POISON each buffer is filled
    with 0xFF bytes (NaN) when handed out, as a new arena is: a kernel that leaves part of
    a temporary unwritten must not find the last call's values there."""

    def __init__(self):
        self.next = 0

    def empty(self, shape) -> np.ndarray:
        n = math.prod(shape)
        if n > SCRATCH_MAX_ELEMENTS:
            return np.empty(shape, np.float32)
        kept, i = _KEPT.buffers, self.next
        self.next += 1
        if i == len(kept):
            kept.append(None)
        if kept[i] is None or kept[i].size < n:
            kept[i] = line_aligned(4 * n).view(np.float32)
        out = kept[i][:n].reshape(shape)
        if paths.POISON:
            out.view(np.uint32).fill(0xFFFFFFFF)
        return out

    @staticmethod
    def held(run) -> bool:
        """run(scratch) with the thread's kept buffers, or False (without running) when a
        call of this thread holds them already."""
        if _KEPT.busy:
            return False
        _KEPT.busy = True
        try:
            run(Scratch())
        finally:
            _KEPT.busy = False
        return True


def scratch_arrays(scratch: Scratch) -> HalfArrays:
    """SPLIT_ARRAYS with its float32 temporaries from `scratch` (widened_copy and store
    still looked up in this module at each call: the self-test's mutants)."""
    return SPLIT_ARRAYS._replace(
        widened_copy=lambda a: widened_copy(a, split=True, empty=scratch.empty),
        empty32=scratch.empty)


def widens_on_threads(kernel):
    """Mark CPU kernel `kernel` as one that no split encloses, whose 16-bit nodes the
    backend widens with their conversions on the engine's threads (widened's `split`)."""
    kernel.widens_on_threads = True
    return kernel


def widened(kernel, update: bool = False, split: bool = False):
    """The float32 `kernel(out, ins, **params)` as a kernel on arrays of which some are
    16-bit (engine.tensor.is_half): each call widens the 16-bit inputs into float32
    temporaries, runs `kernel` on them (bound anew, so temporaries live only while the call
    runs: a plan of 16-bit tensors holds 16-bit buffers between calls), and rounds a 16-bit
    output to nearest even on store (engine.backends.widening.run_widened, the CUDA
    backend's too); `update`: the kernel writes its inputs in place too; `split`: the
    conversions on the engine's threads (SPLIT_ARRAYS), for a kernel that no split encloses,
    and its temporaries in the calling thread's kept buffers where they fit (Scratch: the
    fast path widen:scratch; plain mode takes new arrays); a split kernel with a
    `bind_widened` (matmul's) runs its conversions inside its own chunks where that returns
    a run (the fast path widen:fused), with the kept buffers.
    A bindable kernel (engine.backends.cpu.jit.bindable) stays one."""
    inner = getattr(kernel, "bind", None)
    # a kernel that converts inside its own chunks (matmul's: bind_widened(out, ins,
    # **params) -> run(scratch), or None where it does not apply)
    fused = getattr(kernel, "bind_widened", None) if split and not update else None

    def prepare(out, ins, **params):
        def wide_kernel(wide_out, wide_ins):
            if inner is not None:
                inner(wide_out, wide_ins, **params)()
            else:
                kernel(wide_out, wide_ins, **params)

        kept = split and not paths.PLAIN and any(
            is_half(a.dtype) and a.size <= SCRATCH_MAX_ELEMENTS for a in (out, *ins))
        if kept:
            paths.taken("widen:scratch")
        fused_run = None if fused is None or paths.PLAIN else fused(out, ins, **params)

        def run():
            if fused_run is not None and Scratch.held(fused_run):
                return
            if kept and Scratch.held(lambda scratch: run_widened(
                    wide_kernel, out, ins, update, scratch_arrays(scratch))):
                return
            run_widened(wide_kernel, out, ins, update, SPLIT_ARRAYS if split else HOST_ARRAYS)
        return run

    def call(out, ins, **params):
        prepare(out, ins, **params)()
    call.bind = prepare
    call.__name__ = getattr(kernel, "__name__", "kernel")
    call.__doc__ = kernel.__doc__
    return call
