"""CPU kernels of the row normalisations rms_norm and norm (layer norm without affine), and
of their dedicated backward ops.

A row is the last axis (C elements); rows are all leading axes. The op modules make every
input C-contiguous, so the (rows, C) views never copy. Each row is computed by one thread
(a `prange` iteration, in ranges of rows on the engine's threads), so the bits do not depend
on the thread count; every sum over a row is accumulated in float64 vector lanes, for
16-bit, float32 and float64 inputs alike, and each output element is written once. 16-bit
rows are read as their patterns (see the comment above _row_sum).
"""

from __future__ import annotations

import numpy as np
from numba.core import types
from numba.extending import overload

from engine.backends.cpu import threads
from engine.backends.cpu.half import F16
from engine.backends.cpu.jit import any_order, bindable, call, kernel, parallel_kernel, prange
from engine.backends.cpu.patterns import (
    as_patterns,
    fmt_of,
    native_half,
    rounded,
    rounded_number,
    value,
    value_number,
    work_dtype,
)
from engine.backends.cpu.softmax import as_rows
from engine.tensor import is_half


# The row sums run in float64 vector lanes (jit.any_order: LLVM's order, the same bits on
# every run of one machine and at every thread count, a row being one call's). A 16-bit row
# is first widened once into a scratch row of float32 (patterns.value), which the passes
# then read: reading the patterns in every pass cost float16 twice the time of bfloat16
# (conversion with NaN fix-ups each time), and a widening fused with the first sum ran
# float16 1.6-2x slower still (not vectorised). A float32 or float64 row is read where it
# lies (_row_values): widened into a float64 scratch row it took a pass of its own, 4 of
# norm's 14 ms forward. A row whose statistics are finite holds numbers only and gives no
# NaN, so its outputs are stored without the NaN fix-ups (patterns.rounded_number: the same
# bits). In-order sums (one float64 add per element in a chain) on one thread, with 16-bit
# arrays widened to float32 temporaries, had torch's layer norm ahead 2.4x (float32) and
# 5.7-6.6x (16-bit) forward + backward at (4096, 4096), and rms_norm, which kept them
# until issue 37, ran 1.6-1.7x torch's on two threads (one thread of ours against two).
@any_order
def _row_sum(xr, n):
    """sum_k xr[k] in float64 (norm's first pass: the mean)."""
    total = 0.0
    for j in range(n):
        total += np.float64(xr[j])
    return total


@any_order
def _row_sq_dev(xr, n, mu):
    """sum_k (xr[k] - mu)^2 in float64 (norm's second pass: the biased variance times n;
    rms_norm's only, with mu = 0)."""
    ss = 0.0
    for j in range(n):
        d = np.float64(xr[j]) - mu
        ss += d * d
    return ss


@any_order
def _row_back_sums(gr, xr, n, mu):
    """sum_k (x_k - mu)^2, sum_k g_k and sum_k g_k (x_k - mu) in float64, in one pass."""
    ss = 0.0
    gsum = 0.0
    gd = 0.0
    for j in range(n):
        d = np.float64(xr[j]) - mu
        gj = np.float64(gr[j])
        ss += d * d
        gsum += gj
        gd += gj * d
    return ss, gsum, gd


@any_order
def _row_sq_dot(gr, xr, n):
    """sum_k x_k^2 and sum_k g_k x_k in float64, in one pass (rms_norm_back's sums)."""
    ss = 0.0
    gx = 0.0
    for j in range(n):
        v = np.float64(xr[j])
        ss += v * v
        gx += np.float64(gr[j]) * v
    return ss, gx


@kernel
def _widen_row(src, dst, n, fmt):
    """dst[:n] = the values of src[:n] in dst's work type (exact)."""
    for j in range(n):
        dst[j] = value(src[j], fmt)


@kernel
def _widen_row_numbers(src, dst, n, fmt):
    """_widen_row for a row without NaN patterns (patterns.value_number): the fix-ups of
    float16's signalling NaNs took 1.5 of the 4 ms that widening 16M elements cost."""
    for j in range(n):
        dst[j] = value_number(src[j], fmt)


def _row_values(xr, scratch, n, fmt, numbers):
    """A row whose elements are the values of xr[:n]: a 16-bit row (patterns) widened into
    `scratch` (`numbers`: by _widen_row_numbers, for a row holding no NaN), a float row
    itself. Compiled code only."""
    raise NotImplementedError("norm._row_values runs inside numba kernels only")


@overload(_row_values)
def _row_values_impl(xr, scratch, n, fmt, numbers):
    if isinstance(xr.dtype, types.Integer):
        def widened(xr, scratch, n, fmt, numbers):
            if numbers:
                _widen_row_numbers(xr, scratch, n, fmt)
            else:
                _widen_row(xr, scratch, n, fmt)
            return scratch
        return widened
    return lambda xr, scratch, n, fmt, numbers: xr


# Each kernel reads its rows as numbers first (_row_values(..., True)); a row whose sums come
# out infinite or NaN holds an infinity or a NaN, and is read again exactly (False), so
# that its NaN patterns reach the arithmetic as _widen_row gives them: the same bits as
# widening every row exactly.
@parallel_kernel
def _rms_norm_rows(x, out, eps, fmt, e):
    """out[r, j] = x[r, j] / sqrt(mean_k x[r, k]^2 + eps). The rows are cut into
    e.shape[0] parts (the prange); part p widens each of its 16-bit rows into scratch row
    e[p, 0] and reads that, not x, in its two passes."""
    rows, n = x.shape
    per = (rows + e.shape[0] - 1) // e.shape[0]
    for p in prange(e.shape[0]):
        for r in range(p * per, min(rows, (p + 1) * per)):
            orow = out[r]
            xs = _row_values(x[r], e[p, 0], n, fmt, True)
            ss = _row_sq_dev(xs, n, 0.0)
            if not np.isfinite(ss):
                xs = _row_values(x[r], e[p, 0], n, fmt, False)
                ss = _row_sq_dev(xs, n, 0.0)
            inv = 1.0 / np.sqrt(ss / n + eps)
            if np.isfinite(ss) and np.isfinite(inv):
                for j in range(n):
                    orow[j] = rounded_number(np.float64(xs[j]) * inv, orow, fmt)
            else:
                for j in range(n):
                    orow[j] = rounded(np.float64(xs[j]) * inv, orow, fmt)


@parallel_kernel
def _rms_norm_back_rows(g, x, out, eps, fmt, e):
    """out[r, j] = s g[r, j] - x[r, j] s^3 (sum_k g[r, k] x[r, k]) / C,
    s = 1 / sqrt(mean_k x[r, k]^2 + eps). Scratch as _rms_norm_rows': e[p, 0] holds the
    widened row of x, e[p, 1] that of g."""
    rows, n = x.shape
    per = (rows + e.shape[0] - 1) // e.shape[0]
    for p in prange(e.shape[0]):
        for r in range(p * per, min(rows, (p + 1) * per)):
            orow = out[r]
            xs = _row_values(x[r], e[p, 0], n, fmt, True)
            gs = _row_values(g[r], e[p, 1], n, fmt, True)
            ss, gx = _row_sq_dot(gs, xs, n)
            if not np.isfinite(ss + gx):
                xs = _row_values(x[r], e[p, 0], n, fmt, False)
                gs = _row_values(g[r], e[p, 1], n, fmt, False)
                ss, gx = _row_sq_dot(gs, xs, n)
            s = 1.0 / np.sqrt(ss / n + eps)
            c = s * s * s * gx / n
            if np.isfinite(ss) and np.isfinite(c):     # then g and x hold numbers only
                for j in range(n):
                    orow[j] = rounded_number(s * np.float64(gs[j]) - c * np.float64(xs[j]),
                                             orow, fmt)
            else:
                for j in range(n):
                    orow[j] = rounded(s * np.float64(gs[j]) - c * np.float64(xs[j]),
                                      orow, fmt)


@parallel_kernel
def _norm_rows(x, out, eps, fmt, e):
    """out[r, j] = (x[r, j] - mu_r) / sqrt(var_r + eps), mean mu_r and biased variance var_r
    of row r (two passes: the variance sums squared deviations from the mean). The rows
    are cut into e.shape[0] parts (the prange); part p widens each of its 16-bit rows into
    scratch row e[p, 0] and reads that, not x, in its three passes."""
    rows, n = x.shape
    per = (rows + e.shape[0] - 1) // e.shape[0]
    for p in prange(e.shape[0]):
        for r in range(p * per, min(rows, (p + 1) * per)):
            orow = out[r]
            xs = _row_values(x[r], e[p, 0], n, fmt, True)
            mu = _row_sum(xs, n) / n
            if not np.isfinite(mu):
                xs = _row_values(x[r], e[p, 0], n, fmt, False)
                mu = _row_sum(xs, n) / n
            inv = 1.0 / np.sqrt(_row_sq_dev(xs, n, mu) / n + eps)
            if np.isfinite(mu) and np.isfinite(inv):
                for j in range(n):
                    orow[j] = rounded_number((np.float64(xs[j]) - mu) * inv, orow, fmt)
            else:
                for j in range(n):
                    orow[j] = rounded((np.float64(xs[j]) - mu) * inv, orow, fmt)


@parallel_kernel
def _norm_back_rows(g, x, out, eps, fmt, e):
    """out[r, j] = s (g[r, j] - mean_k g[r, k] - xhat[r, j] mean_k g[r, k] xhat[r, k]),
    xhat = (x - mu) s, s = 1 / sqrt(var + eps). Scratch as _norm_rows': e[p, 0] holds the
    widened row of x, e[p, 1] that of g."""
    rows, n = x.shape
    per = (rows + e.shape[0] - 1) // e.shape[0]
    for p in prange(e.shape[0]):
        for r in range(p * per, min(rows, (p + 1) * per)):
            orow = out[r]
            xs = _row_values(x[r], e[p, 0], n, fmt, True)
            gs = _row_values(g[r], e[p, 1], n, fmt, True)
            mu = _row_sum(xs, n) / n
            ss, gsum, gd = _row_back_sums(gs, xs, n, mu)
            if not np.isfinite(mu + gsum + gd):
                xs = _row_values(x[r], e[p, 0], n, fmt, False)
                gs = _row_values(g[r], e[p, 1], n, fmt, False)
                mu = _row_sum(xs, n) / n
                ss, gsum, gd = _row_back_sums(gs, xs, n, mu)
            s = 1.0 / np.sqrt(ss / n + eps)
            gmean = gsum / n
            c = s * s * gd / n      # mean(g xhat) * s, so that xhat_j * it = d_j * c
            if np.isfinite(mu) and np.isfinite(gmean) and np.isfinite(s * c):
                for j in range(n):                  # g and x hold numbers only
                    orow[j] = rounded_number(s * (np.float64(gs[j]) - gmean
                                                  - (np.float64(xs[j]) - mu) * c), orow, fmt)
            else:
                for j in range(n):
                    orow[j] = rounded(s * (np.float64(gs[j]) - gmean
                                           - (np.float64(xs[j]) - mu) * c), orow, fmt)


def _split_dispatcher(rows_kernel, op: str):
    """The dispatcher of `op` reading 16-bit arrays as their patterns (patterns.native_half):
    kernel(out, ins, eps) runs `rows_kernel` on ranges of rows of the (rows, C) views of its
    inputs and out, side by side on the engine's threads (the fast path split:cpu_`op`;
    one range below threads.MIN_ELEMENTS elements). A row is computed by the same code
    whatever range holds it: the same bits at every thread count."""
    name = f"cpu_{op}"

    def prepare(out, ins, eps):
        arrays = [as_rows(a, op) for a in (*ins, out)]
        fmt = next((fmt_of(a) for a in arrays if is_half(a.dtype)), F16)
        rows = arrays[0].shape[0]
        cols = arrays[0].shape[1] if is_half(arrays[-1].dtype) else 0    # scratch rows
        ranges = threads.row_ranges(name, rows, sum(a.size for a in arrays))
        return threads.side_by_side([
            call(rows_kernel, *(as_patterns(a[lo:hi]) for a in arrays), float(eps), fmt,
                 np.empty((min(16, hi - lo), len(ins), cols), work_dtype(arrays[-1])))
            for lo, hi in ranges])
    prepare.__name__ = prepare.__qualname__ = name
    prepare.__doc__ = f"Dispatcher of {op}: kernel(out, ins, eps)."
    return native_half(bindable(prepare))


cpu_rms_norm = _split_dispatcher(_rms_norm_rows, "rms_norm")
cpu_rms_norm_back = _split_dispatcher(_rms_norm_back_rows, "rms_norm_back")
cpu_norm = _split_dispatcher(_norm_rows, "norm")
cpu_norm_back = _split_dispatcher(_norm_back_rows, "norm_back")
