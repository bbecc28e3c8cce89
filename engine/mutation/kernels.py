"""The kernel-bug makers several ops' mutants share: each makes a buggy CPU kernel (or its
preparation, or its chunking, or a 16-bit conversion) from the real one.

The op-specific makers sit with their mutants at the end of the op modules (engine/ops);
attention's in engine.mutation.attention. A bug sits where it would in a real kernel, and
is taken only where the real kernel goes:
- in a fast path (a split over the engine's threads, the chunked sums, the tiled copy, the
  zero-skipping product, a big scatter), only where the real kernel takes that path, which
  the bug finds out as the scale tier does, with engine.backends.cpu.paths.recording()
  (`prepared`), or from the thread count and sizes. Plain mode (paths.plain: no fast
  path), which makes the scale tier's float64 reference, never meets it, and no fast-tier
  case is big enough to;
- in the general code (an edge, a layout, a branch), where every case that reaches it
  shows it.

The buggy kernels compute with the real compiled kernels, called on other bounds, other
slices or other accumulators, or they run the real one and then undo what the bug would
not have done. An element the bug never writes keeps what the buffer held before: NaN on
the poisoned memory gradcheck runs the engine under test on (gradcheck.adapters.
engine_adapter), a lucky zero on fresh memory (`unwritten`). A race is made
deterministic: of two writers of one element, the later one wins.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu import paths, threads

# --- helpers --------------------------------------------------------------------------------


def prepared(prepare, out, ins, params, path: str):
    """(call, taken): `prepare(out, ins, **params)`, and whether it took fast path `path`
    (a name of engine.backends.cpu.paths.KNOWN) while it prepared."""
    with paths.recording() as took:
        run = prepare(out, ins, **params)
    return run, took[path] > 0


def as_if_contiguous(a: np.ndarray) -> np.ndarray:
    """A dense strided view (a permutation of a whole buffer, positive strides) read in the
    buffer's order as if it were C-contiguous; anything else as it is."""
    def c_strides(shape):
        return tuple(int(np.prod(shape[i + 1:])) * a.itemsize for i in range(len(shape)))

    order = np.argsort([-s for s in a.strides], kind="stable")
    stored = tuple(a.shape[i] for i in order)           # the buffer's own axis order
    if a.flags.c_contiguous or min(a.strides, default=1) <= 0 or \
            tuple(a.strides[i] for i in order) != c_strides(stored):
        return a
    return np.lib.stride_tricks.as_strided(a, a.shape, c_strides(a.shape))


def unwritten(run, out: np.ndarray, region):
    """A call that runs `run` and then puts back what out[region] held before it: the
    region is left unwritten."""
    def call():
        before = out[region].copy()
        run()
        out[region] = before
    return call


def reads_as_contiguous(prepare):
    """A preparation that hands `prepare` its first input read in memory order, ignoring
    its strides (as_if_contiguous)."""
    def mutated(out, ins, **params):
        return prepare(out, [as_if_contiguous(ins[0]), *ins[1:]], **params)
    return mutated


# --- thread splits (engine.backends.cpu.threads) ------------------------------------------------
def chunk_ends_one_short(chunks):
    """Chunks whose end is one row short, but the last's (the next chunk's start taken as
    an inclusive end): the last row of every chunk but the last is never computed."""
    def mutated(out, ins, parts):
        pieces = chunks(out, ins, parts)
        if not pieces:
            return pieces
        short = [(o[:-1], [a[:-1] if threads.aligned(a, o) else a for a in i])
                 for o, i in pieces[:-1]]
        return short + pieces[-1:]
    return mutated


def slices_broadcast_operands(chunks):
    """A split that slices every input with as many axes as the output along with it,
    without asking whether it runs along axis 0: a row operand broadcast over the rows,
    shape (1, C), is sliced too (each chunk must read all of it)."""
    def mutated(out, ins, parts):
        if not chunks(out, ins, parts):
            return None
        return [(out[lo:hi], [a[lo:hi] if a.ndim == out.ndim else a for a in ins])
                for lo, hi in threads.bounds(out.shape[0], parts)]
    return mutated


# --- the 16-bit conversions (engine.backends.cpu.half) ----------------------------------------
def store_truncated(store):
    """half.store rounding toward zero (the float32's low bits dropped) instead of to
    nearest, ties to even: at most one ulp off, never more than twice a correct store."""
    def truncating(dst, values):
        v = np.ascontiguousarray(values, np.float32)
        if dst.dtype == np.float16:
            r = v.astype(np.float16)                     # to nearest; then one step back
            over = np.abs(r.astype(np.float32)) > np.abs(v)   # where it rounded away
            r[over] = np.nextafter(r[over], np.float16(0))
            dst[...] = r.reshape(dst.shape)
        else:
            dst.view(np.uint16)[...] = (v.view(np.uint32) >> 16).astype(np.uint16).reshape(
                dst.shape)
    return truncating


def bf16_widened_wrong_shift(widened_copy):
    """bfloat16 widened as (h >> 1) << 17 instead of h << 16 (a packed pair unpacked with
    its shifts one bit apart): the mantissa's last bit is lost, so every input whose last
    bit is set reads one bfloat16 ulp nearer zero; float16 widens right."""
    def wrong(a, **kwargs):
        if a.dtype == np.float16:
            return widened_copy(a, **kwargs)
        h = np.ascontiguousarray(a).view(np.uint16).astype(np.uint32)
        return ((h >> 1) << 17).view(np.float32).reshape(a.shape)
    return wrong


def split_ranges_end_early(in_ranges):
    """half.in_ranges (a 16-bit product's conversions in ranges on the engine's threads)
    with every range but the last ending one element early: the element at each inner
    boundary is never widened (its float32 temporary holds whatever the allocation held)
    or never rounded into the output (it keeps the buffer's old value). One range, as in
    plain mode or below the split's size, stays right."""
    def early(call, size, name):
        return in_ranges(lambda lo, hi: call(lo, hi if hi == size else hi - 1), size, name)
    return early


def _rounded(dst, values):
    """(float32 values, their 16-bit patterns rounded to nearest even, the dtype) for a store
    into `dst` (float64 values reach float32 first, as half.narrow takes them)."""
    v = np.ascontiguousarray(values, np.float32).reshape(dst.shape)
    return v, np.array(v.astype(dst.dtype)).view(np.uint16), dst.dtype


def store_ties_away(store):
    """half.store rounding ties away from zero instead of to even (the float32 exactly
    halfway between two 16-bit values goes to the larger magnitude): half an ulp on the
    ties only, which sums of 16-bit values at two exponents make often."""
    def rounding(dst, values):
        v, bits, dtype = _rounded(dst, values)
        near = bits.view(dtype).astype(np.float32)
        up = (bits + np.uint16(1)).view(dtype).astype(np.float32)   # one ulp further out
        with np.errstate(invalid="ignore"):
            tie = (np.abs(near) < np.abs(v)) & (np.abs(up) - np.abs(v) == np.abs(v) - np.abs(near))
        bits[tie] += np.uint16(1)
        dst.view(np.uint16)[...] = bits
    return rounding


def store_flushes_subnormals(store):
    """half.store flushing subnormal results to a signed zero (float16's below 2^-14,
    bfloat16's below 2^-126), as a narrowing that handles the normal exponents only."""
    def flushing(dst, values):
        v, bits, dtype = _rounded(dst, values)
        smallest_normal = 2.0 ** -14 if dtype == np.float16 else 2.0 ** -126
        r = bits.view(dtype).astype(np.float32)
        bits[(r != 0) & (np.abs(r) < smallest_normal)] &= np.uint16(0x8000)
        dst.view(np.uint16)[...] = bits
    return flushing


def store_nan_unquieted(store):
    """half.store keeping a NaN's payload bits but dropping its quiet bit: the payload of a
    float32 NaN made by arithmetic is the quiet bit alone, so the NaN is stored as an
    infinity of its sign."""
    def unquieting(dst, values):
        v, bits, dtype = _rounded(dst, values)
        quiet = np.uint16(0x0200 if dtype == np.float16 else 0x0040)
        bits[np.isnan(v)] &= ~quiet
        dst.view(np.uint16)[...] = bits
    return unquieting
