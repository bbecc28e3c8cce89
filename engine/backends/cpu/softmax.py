"""CPU kernels of the row-wise ops: softmax (with an optional additive mask, ALiBi slopes and
attention sinks), its backward ops softmax_back and softmax_sink_back, and log_softmax.

A row is the last axis; rows are all leading axes. The op modules make every input
C-contiguous (they insert `cont` for strided views), so a (rows, C) view never copies.
Each row is computed by one thread, in float64 for float32 and float64 rows and in float32
for 16-bit ones (patterns.work): exponentials in a polynomial that vectorises (libm's for
float64 outputs: patterns.exp_into), row maxima through integer keys (patterns.row_extreme),
sums in float64 in vector lanes (patterns.sum_any_order, dot_any_order). float16 and
bfloat16 rows are read and written as their bit patterns (engine.backends.cpu.patterns),
widened in the loads and rounded once, on store. Inputs of at least threads.MIN_ELEMENTS
elements run as ranges of rows on the engine's threads (the fast path split:cpu_softmax;
its plain twin is one range).

The masked softmax sees x and out as 4-D (B, H, R, C) (leading axes of size 1 prepended;
H, axis 1, the heads) and the mask as numpy's broadcast of it to that shape, given to the
kernels as the mask's flat memory and the broadcast's element strides (broadcast axes of
stride 0), so a mask shared by every batch and head is read in place, never copied (ggml's
mask of shape (rows, C) broadcast over dims 2 and 3), and a contiguous mask row as a
contiguous slice (_masked_logits). Row r of
head h computes, in its work type (float64 for float rows; float32 for 16-bit ones, read and
written as their patterns like the unmasked rows),

    z_j = s x_j + slope_h mask_j,     slope_h = alibi_slope(h, H, max_bias)  (alibi_math)
    m = max(max_j z_j, sink_h),       out_j = exp(z_j - m) / (sum_k exp(z_k - m) + exp(sink_h - m))

the sink terms only with sinks (one logit per head), in four passes over a scratch row per
prange part: z (the only strided read: the mask row), its maximum by integer keys, the
exponentials (exp_into's polynomial) and their sum in vector lanes, the normalised store.
Each pass vectorises. The former kernel took a libm exp per element in float64, a float
maximum (which does not vectorise) over z recomputed from x and the mask, and, for 16-bit
rows, half.widened's float32 copies of x, the mask and out: the forward with ALiBi and
sinks over (8, 512, 512) went from 57-62 ms to 12-20 ms in float32, float16 and bfloat16
alike (python bench/bench_ops.py --op softmax --repeat 7, 2 threads, a loaded machine).
log_softmax_back (log_softmax's gradient, g - exp(y) sum_k g_k, in one pass over each row
after the float64 sum of g) replaces the four generic nodes (exp, a row sum, mul, sub) it
was composed of, which took log_softmax's forward and backward to 2.0 times torch's over
(256, 32000) (python bench/bench_ops.py --op log_softmax --repeat 7 --threads 1).
softmax_sink_back recomputes each row the same way, in float64 whatever the dtype
(exp_into's float64 polynomial; libm's for float64), and adds -p_sink (sum_j g_j out_j),
p_sink = exp(sink_h - m) / normaliser, into its head's gradient: per-row values first, then
each head's sum in a fixed order, so the result does not depend on the thread count. Both
run as ranges of rows on the engine's threads from threads.MIN_ELEMENTS elements
(split:cpu_softmax_masked, split:cpu_softmax_sink_back; the plain twin is one range).
"""

from __future__ import annotations

import math

import numpy as np
from numba import types
from numba.extending import overload

from engine.backends.alibi_math import alibi_slope
from engine.backends.cpu import paths, threads
from engine.backends.cpu.half import F16
from engine.backends.cpu.jit import (
    any_order_contracting,
    bindable,
    call,
    contracting,
    kernel,
    prange,
)
from engine.backends.cpu.layout import flat_base
from engine.backends.cpu.patterns import (
    as_patterns,
    dot_any_order,
    exp_capped,
    exp_into,
    fmt_of,
    native_half,
    number_dot_any_order,
    number_sum_any_order,
    rounded,
    rounded_number,
    row_extreme,
    sum_any_order,
    value,
    value_number,
    value_sum_any_order,
    work,
    work_dtype,
)
from engine.errors import BackendError


def as_rows(arr: np.ndarray, op: str) -> np.ndarray:
    """The (rows, C) view of a C-contiguous array whose last axis has C elements."""
    if not arr.flags.c_contiguous:
        raise BackendError(f"{op}: the cpu kernel needs C-contiguous inputs, got strides "
                           f"{arr.strides} for shape {list(arr.shape)}")
    return arr.reshape(math.prod(arr.shape[:-1]), arr.shape[-1])


@any_order_contracting
def exp_sum(xr, n, m, fmt, dst):
    """sum_j exp(value(xr[j]) - m) over j < n (m >= every value), in float64 in vector
    lanes (sum_any_order), each exponential exp_into's for an element of `dst`, its
    polynomial's steps fused multiply-adds (under `any_order` alone each was a
    multiplication and an addition: log_softmax's forward over (256, 32000) float32 took
    15.8 ms of one thread's CPU time, 12.7 ms fused; its kernel bound and called alone)."""
    total = 0.0
    for j in range(n):
        total += exp_into(value(xr[j], fmt) - m, dst)
    return total


@kernel
def row_logsumexp(xr, n, fmt, dst):
    """log(sum_j exp(xr[j])) over j < n, stably: m + log(sum_j exp(xr[j] - m)), m the row
    max (row_extreme), the sum exp_sum's, for an output `dst`. Shared by log_softmax and the
    cross-entropy kernels: a libm exp per element in float64 took log_softmax's forward
    to 3.6x torch's over (256, 32000) (python bench/bench_ops.py --op log_softmax)."""
    if n == 0:
        return -np.inf
    m = row_extreme(xr, n, fmt, False)
    return m + np.log(exp_sum(xr, n, m, fmt, dst))


@kernel
def _store_normalised(er, inv, total, orow, n, fmt):
    """orow[j] = er[j] inv, rounded once, for j < n: the exponentials of a row normalised
    by inv = 1 / total, total their sum (with a sink's). A finite total means every er[j]
    was finite (they are at most 1), so the products are stored without the NaN fix-ups
    (patterns.rounded_number: the same bits; a row with a NaN takes rounded): the store
    pass of 16-bit rows took most of its time in them."""
    if math.isfinite(total):
        for j in range(n):
            orow[j] = rounded_number(er[j] * inv, orow, fmt)
    else:
        for j in range(n):
            orow[j] = rounded(er[j] * inv, orow, fmt)


@contracting
def _softmax_rows(x, out, scale, e, fmt):
    """out[r, j] = exp(s x[r, j] - m_r) / sum_k exp(s x[r, k] - m_r), m_r = max_k s x[r, k].
    The rows are cut into e.shape[0] parts (the prange); part p keeps its exponentials in
    scratch row e[p] (of x's work type) and rounds each once, when normalised into out;
    their sum is float64."""
    rows, n = x.shape
    s = work(scale, x)
    per = (rows + e.shape[0] - 1) // e.shape[0]
    for p in prange(e.shape[0]):
        er = e[p]
        for r in range(p * per, min(rows, (p + 1) * per)):
            xr = x[r]
            orow = out[r]
            m = s * row_extreme(xr, n, fmt, s < 0)    # max_k s x[r, k]: rounding is monotone
            for j in range(n):
                er[j] = exp_into(s * value(xr[j], fmt) - m, orow)
            total = sum_any_order(er, n)
            _store_normalised(er, work(1.0 / total, x), total, orow, n, fmt)


@kernel
def _row_place(x, r, max_bias):
    """Row r of (B, H, R, C) x (rows in C order over B, H, R): its (a, h, i) and head h's
    ALiBi slope (float64)."""
    _, nh, nr, _ = x.shape
    h = (r // nr) % nh
    return r // (nh * nr), h, r % nr, alibi_slope(np.float64(h), np.float64(nh), max_bias)


@kernel
def _masked_logits(xr, mask, ms, a, h, i, s, slope, er, fmt):
    """z_j = s xr[j] + slope m_j into the scratch row er (s and slope in er's type), and
    max_j z_j (float64). The mask row (a, h, i) read from its flat memory `mask` through
    element strides ms (broadcast axes: stride 0): m_j = mask[at + j ms[3]], a contiguous
    slice where ms[3] is 1, which numba knows to be contiguous and vectorises (the 4-D
    broadcast view's row, of unknown stride, it did not: the pass took 4.8 ms of the sink
    gradient's 8.3 over (8, 512, 512) float16, one thread). Then the maximum by integer
    keys over the contiguous er (row_extreme), which vectorises where a float maximum does
    not; -inf for an empty row (row_extreme reads one element)."""
    n = xr.shape[0]
    if n == 0:
        return -np.inf
    at = a * ms[0] + h * ms[1] + i * ms[2]
    if ms[3] == 1:
        mr = mask[at:at + n]
        for j in range(n):
            er[j] = s * value(xr[j], fmt) + slope * value(mr[j], fmt)
    else:
        step = ms[3]
        for j in range(n):
            er[j] = s * value(xr[j], fmt) + slope * value(mask[at + j * step], fmt)
    return row_extreme(er, n, fmt, False)


@contracting
def _softmax_masked_rows(x, mask, ms, sinks, has_sinks, out, e, scale, max_bias, lo, hi,
                         fmt):
    """Rows lo..hi-1 of (B, H, R, C) x and out (rows in C order over B, H, R; the mask
    broadcast to that shape, as its flat memory and element strides ms: _masked_logits):
    out_j = exp(z_j - m) / (sum_k exp(z_k - m) +
    exp(sink_h - m)), z = s x + slope_h mask, m = max(max_k z_k, sink_h), the sink terms
    only if has_sinks (module doc). As _softmax_rows: the rows cut into e.shape[0] parts,
    part p's logits and then exponentials in scratch row e[p] (of x's work type: float64
    for float rows, float32 for 16-bit ones), each rounded once, into out."""
    n = x.shape[3]
    per = (hi - lo + e.shape[0] - 1) // e.shape[0]
    for p in prange(e.shape[0]):
        er = e[p]
        for r in range(lo + p * per, min(hi, lo + (p + 1) * per)):
            a, h, i, slope = _row_place(x, r, max_bias)
            m = work(_masked_logits(x[a, h, i], mask, ms, a, h, i, work(scale, x),
                                    work(slope, x), er, fmt), x)
            sink = work(value(sinks[h], fmt), x) if has_sinks else work(-np.inf, x)
            m = max(m, sink)
            orow = out[a, h, i]
            for j in range(n):
                er[j] = exp_into(er[j] - m, orow)
            total = sum_any_order(er, n)
            if has_sinks:
                total += exp_into(sink - m, orow)
            _store_normalised(er, work(1.0 / total, x), total, orow, n, fmt)


@contracting
def _sink_grad_rows(g, x, mask, ms, sinks, part, e, prec, scale, max_bias, lo, hi, fmt):
    """part[r] = -p_sink sum_j g_j y_j for rows lo..hi-1 of (B, H, R, C) g, x and mask (as
    _softmax_masked_rows takes it),
    with y and p_sink = exp(sink_h - m) / normaliser recomputed as _softmax_masked_rows
    computes them, but in float64 (scratch e of float64 rows, cut in parts as there) and
    never rounded to x's dtype; the exponentials exp_into's for an element of `prec` (libm
    for float64 outputs, the float64 polynomial otherwise)."""
    n = x.shape[3]
    per = (hi - lo + e.shape[0] - 1) // e.shape[0]
    for p in prange(e.shape[0]):
        er = e[p]
        for r in range(lo + p * per, min(hi, lo + (p + 1) * per)):
            a, h, i, slope = _row_place(x, r, max_bias)
            m = _masked_logits(x[a, h, i], mask, ms, a, h, i, np.float64(scale), slope, er,
                               fmt)
            sink = np.float64(value(sinks[h], fmt))
            m = max(m, sink)
            for j in range(n):
                er[j] = exp_into(er[j] - m, prec)
            e_sink = exp_into(sink - m, prec)
            total = sum_any_order(er, n) + e_sink
            dot = dot_any_order(er, g[a, h, i], n, fmt)
            part[r] = -(e_sink / total) * (dot / total)


@kernel
def _sum_heads(part, out, nb, nh, nr, fmt):
    """out[h] = sum over a < nb, i < nr of part[(a nh + h) nr + i], in float64, in that
    order (the rows of head h across the batch)."""
    for h in range(nh):
        total = 0.0
        for a in range(nb):
            base = (a * nh + h) * nr
            for i in range(nr):
                total += part[base + i]
        out[h] = rounded(total, out, fmt)


# the largest |s| for which s y is finite in float32 for every float16 y (|y| <= 65504)
_S_MAX = 3.4e38 / 65504.0


def float16_patterns(arr, fmt):
    """Whether `arr` holds float16 patterns (a compile-time constant for float arrays, so
    their kernels compile as before). Compiled code only."""
    raise NotImplementedError("softmax.float16_patterns runs inside numba kernels only")


@overload(float16_patterns, inline="always")
def _float16_patterns(arr, fmt):
    if isinstance(arr.dtype, types.Integer):
        return lambda arr, fmt: fmt == F16
    return lambda arr, fmt: False


@kernel
def _back_sums(gr, yr, n, renormalize, fmt):
    """(1 / t, sum_k g_k y_k / t) of softmax_back's row, t = sum_k y_k (1 without
    renormalize), in float64: value_sum_any_order's and dot_any_order's sums, read without
    value()'s signalling-NaN fix-up (patterns' number_sum_any_order and
    number_dot_any_order) and read again with it only
    where a sum is not finite (a NaN or an infinity in the row). The two loops are
    compiled apart, and LLVM may order each one's lanes its own way: the same sums up to the
    float32 blocks' rounding, the same bits on some machines (the AVX-512 one) and not on
    others (the AVX2 one); each row's sums come from one of them, chosen by the row.
    float16's fix-ups had taken half of the kernel's time: its backward over
    (1024, 1024) took 0.72 ms of one thread's CPU, 0.45 without (the kernel bound and called
    alone, the bench_half case's rows)."""
    inv = 1.0
    if renormalize:
        t = number_sum_any_order(yr, n, fmt)
        if not math.isfinite(t):
            t = value_sum_any_order(yr, n, fmt)
        inv = 1.0 / t
    dot = number_dot_any_order(gr, yr, n, fmt)
    if not math.isfinite(dot):
        dot = dot_any_order(gr, yr, n, fmt)
    return inv, dot * inv


@contracting
def _softmax_back_rows(g, y, out, scale, renormalize, fmt):
    """out[r, j] = s y[r, j] (g[r, j] - sum_k g[r, k] y[r, k]), the sum in float64
    (dot_any_order), the rest in y's work type; with renormalize, of y[r] / t_r, t_r =
    sum_k y[r, k] (float64): s / t_r y[r, j] (g[r, j] - sum_k g[r, k] y[r, k] / t_r)."""
    rows, n = y.shape
    for r in prange(rows):
        gr = g[r]
        yr = y[r]
        orow = out[r]
        inv, wide = _back_sums(gr, yr, n, renormalize, fmt)
        dot = work(wide, y)
        s = work(scale * inv, y)
        if float16_patterns(y, fmt) and math.isfinite(wide) and abs(s) <= _S_MAX:
            # a finite dot means every g[r, j] and y[r, j] finite (an infinite or NaN one
            # makes the sum inf or NaN), float16's at most 65504: s y and g - dot are
            # finite, so is the product or it overflows (never a NaN); read and stored
            # without the NaN fix-ups (patterns.value_number, rounded_number: the same bits)
            for j in range(n):
                orow[j] = rounded_number(s * value_number(yr[j], fmt)
                                         * (value_number(gr[j], fmt) - dot), orow, fmt)
        else:
            for j in range(n):
                orow[j] = rounded(s * value(yr[j], fmt) * (value(gr[j], fmt) - dot), orow,
                                  fmt)


@contracting
def _log_softmax_rows(x, out, fmt):
    """out[r, j] = x[r, j] - m_r - log(sum_k exp(x[r, k] - m_r)), m_r = max_k x[r, k]."""
    rows, n = x.shape
    for r in prange(rows):
        xr = x[r]
        orow = out[r]
        lse = row_logsumexp(xr, n, fmt, orow)
        for j in range(n):
            orow[j] = value(xr[j], fmt) - lse


def exp_any(v, dst):
    """e^v for any v, for an element of array `dst`. Compiled code only."""
    raise NotImplementedError("softmax.exp_any runs inside numba kernels only")


@overload(exp_any)
def _exp_any(v, dst):
    if dst.dtype == types.float64:
        return lambda v, dst: np.exp(v)          # libm: float64's own accuracy
    return lambda v, dst: exp_capped(np.float64(v))


@contracting
def _log_softmax_back_rows(g, y, out, fmt):
    """out[r, j] = g[r, j] - exp(y[r, j]) sum_k g[r, k]: the sum in float64
    (value_sum_any_order), the rest in float64 for float rows and float32 for 16-bit ones; the
    exponential patterns.exp_capped's (libm's for float64 rows), any y (log_softmax's
    outputs are <= 0). vector_math.exp's polynomial of degree 13 had taken the backward
    over (256, 32000) float32 to 9.5 ms of one thread's CPU time, 8.0 ms on this one."""
    rows, n = y.shape
    for r in prange(rows):
        gr = g[r]
        yr = y[r]
        orow = out[r]
        total = work(value_sum_any_order(gr, n, fmt), y)
        for j in range(n):
            orow[j] = rounded(value(gr[j], fmt)
                              - work(exp_any(value(yr[j], fmt), orow), y) * total, orow, fmt)


def as_4d(arr: np.ndarray) -> np.ndarray:
    """arr (at most 4 axes) viewed with leading axes of size 1 prepended up to 4 axes."""
    return arr[(None,) * (4 - arr.ndim)]


def _row_chunks(arrays, parts):
    """The (rows, C) views of same-shaped `arrays` cut into `parts` ranges of rows (one
    range when the arrays are too small to pay for the threads' hand-over)."""
    rows = [as_rows(a, "softmax") for a in arrays]
    if parts == 1 or sum(a.size for a in arrays) < threads.MIN_ELEMENTS:
        return [rows]
    return [[a[lo:hi] for a in rows] for lo, hi in threads.bounds(rows[0].shape[0], parts)]


def _split_rows(name, arrays, make):
    """One call running make(chunk) for each range of rows of `arrays` (see _row_chunks),
    side by side on the engine's threads; recorded as the fast path split:`name`."""
    chunks = _row_chunks(arrays, threads.parts())
    if len(chunks) > 1:
        paths.taken(f"split:{name}")
    return threads.side_by_side([make(*c) for c in chunks])


def _masked_views(x, mask, op):
    """x (C-contiguous, at most 4 axes) as 4-D (B, H, R, C), and the mask broadcast to it
    as the kernels read it: its patterns' flat memory and the broadcast's element strides
    (never copied: a mask shared by every batch and head is read in place)."""
    as_rows(x, op)              # checks that x is C-contiguous
    x4 = as_4d(x)
    m = as_patterns(mask)
    flat = flat_base(m)
    if flat is None:
        raise BackendError(f"{op}: the cpu kernel needs a mask of non-negative strides, got "
                           f"strides {mask.strides} for shape {list(mask.shape)}")
    strides = np.broadcast_to(m, x4.shape).strides
    return x4, flat, tuple(st // m.itemsize for st in strides)


def _no_sinks(x4):
    """A stand-in for the sinks of a softmax without them (never read)."""
    return x4.reshape(-1)[:1]


def scratch_rows(rows, n, dtype):
    """Scratch rows for a kernel cutting `rows` rows of n elements into prange parts: one
    row per part (at most 16), of `dtype`."""
    return np.empty((max(1, min(16, rows)), max(1, n)), dtype)


def _cpu_softmax_masked(out, ins, scale, max_bias):
    x, mask, *sinks = ins
    x4, mflat, ms = _masked_views(x, mask, "softmax")
    sk = sinks[0] if sinks else _no_sinks(x4)
    rows = x4.size // max(1, x4.shape[3])
    fmt = fmt_of(x)
    return threads.side_by_side([
        call(_softmax_masked_rows, as_patterns(x4), mflat, ms, as_patterns(sk),
             bool(sinks), as_patterns(as_4d(out)), scratch_rows(hi - lo, x4.shape[3],
                                                            work_dtype(x)),
             float(scale), float(max_bias), lo, hi, fmt)
        for lo, hi in threads.row_ranges("cpu_softmax_masked", rows, 2 * x.size)])


@native_half
@bindable
def cpu_softmax(out, ins, scale=1.0, max_bias=0.0):
    """Softmax over the last axis: ins = [x], [x, mask] or [x, mask, sinks]. Unmasked, a
    16-bit x is read and written as its patterns (engine.backends.cpu.patterns), and big
    inputs run as ranges of rows on the engine's threads."""
    if len(ins) > 1:
        return _cpu_softmax_masked(out, ins, scale, max_bias)
    (x,) = ins
    fmt = fmt_of(x)

    def make(xr, outr):
        # a scratch row per prange part, in the work type
        e = np.empty((min(16, xr.shape[0]), xr.shape[1]), work_dtype(xr))
        return call(_softmax_rows, as_patterns(xr), as_patterns(outr), float(scale), e, fmt)
    return _split_rows("cpu_softmax", [x, out], make)


@native_half
@bindable
def cpu_softmax_back(out, ins, scale=1.0, renormalize=False):
    """softmax_back; 16-bit arrays as their patterns, big ones in ranges of rows on the
    engine's threads (see cpu_softmax)."""
    g, y = ins
    fmt = fmt_of(y)
    return _split_rows("cpu_softmax_back", [g, y, out], lambda gr, yr, outr: call(
        _softmax_back_rows, as_patterns(gr), as_patterns(yr), as_patterns(outr),
        float(scale), bool(renormalize), fmt))


@native_half
@bindable
def cpu_softmax_sink_back(out, ins, scale=1.0, max_bias=0.0):
    """softmax_sink_back: ins = [g, x, mask, sinks], out of shape (H,): the gradient of
    each head's sink (module doc). A scratch of one float64 per row holds the rows' terms;
    16-bit arrays are read as their patterns and out rounded once, on store."""
    g, x, mask, sinks = ins
    x4, mflat, ms = _masked_views(x, mask, "softmax_sink_back")
    g4 = as_4d(as_rows(g, "softmax_sink_back").reshape(x.shape))
    nb, nh, nr, n = x4.shape
    part = np.empty(nb * nh * nr, np.float64)
    fmt = fmt_of(x)
    # exp_into's accuracy for out's dtype: libm for float64, the polynomial otherwise
    prec = np.empty(0, np.float64 if x.dtype == np.float64 else np.float32)
    rows = threads.side_by_side([
        call(_sink_grad_rows, as_patterns(g4), as_patterns(x4), mflat, ms, as_patterns(sinks),
             part, scratch_rows(hi - lo, n, np.float64), prec, float(scale), float(max_bias),
             lo, hi, fmt)
        for lo, hi in threads.row_ranges("cpu_softmax_sink_back", part.size, 2 * x.size)])
    heads = call(_sum_heads, part, as_patterns(out).reshape(-1), nb, nh, nr, fmt)

    def run():
        rows()
        heads()
    return run


@native_half
@bindable
def cpu_log_softmax_back(out, ins):
    """log_softmax_back: ins = [g, y]; 16-bit arrays as their patterns, big ones in ranges
    of rows on the engine's threads (see cpu_softmax)."""
    g, y = ins
    fmt = fmt_of(y)
    return _split_rows("cpu_log_softmax_back", [g, y, out], lambda gr, yr, outr: call(
        _log_softmax_back_rows, as_patterns(gr), as_patterns(yr), as_patterns(outr), fmt))


@bindable
def cpu_log_softmax(out, ins):
    """log_softmax; big inputs in ranges of rows on the engine's threads (see cpu_softmax):
    on one thread alone its forward over (256, 32000) took 2.4 times torch's two threads'
    (python bench/bench_ops.py on a quiet machine)."""
    (x,) = ins
    fmt = fmt_of(x)
    as_rows(x, "log_softmax")          # checks that x is C-contiguous
    return _split_rows("cpu_log_softmax", [x, out], lambda xr, outr: call(
        _log_softmax_rows, xr, outr, fmt))
