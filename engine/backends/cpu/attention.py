"""CPU kernels of attention_fwd and attention_back (fused scaled-dot-product attention,
engine.ops.attention).

q, k, v are seen as 4-D (B, H, T, D) (a 3-D input gets B = 1); query head h reads kv head
c = h // G, G = Hq / Hkv; the mask is numpy's broadcast of it to (B, Hq, Tq, Tk) (stride-0
axes, never copied). For one head the forward computes, in query blocks of rows i0..i1-1:

    S = Q[i0:i1] K[:kend]^T                                      (BLAS, q's dtype)
    s_ij = scale S_ij;  s = cap tanh(s / cap) if cap > 0;  s += slope_h mask_ij
    keys j > i + (Tk - Tq) are masked when causal;  m_i = max_j s_ij
    lse_i = m_i + log sum_j exp(s_ij - m_i),  P_ij = exp(s_ij - lse_i)   (float64 rows)
    O[i0:i1] = P V[:kend]                                        (BLAS)

and stores O and lse side by side: out[..., :Dv] = O, out[..., Dv] = lse. A row with no
visible key (causal with Tq > Tk, or a mask of -inf) gets O = 0 and lse = -inf. The
backward, for each kv head c and each of its G query heads, recomputes P from the saved lse
(P is never stored) and with dO = g[..., :Dv], g_lse = g[..., Dv]:

    dP = dO V^T;  D_i = sum_j P_ij dP_ij;  dS_ij = P_ij (dP_ij - D_i + g_lse_i)
    dS_ij *= 1 - tanh^2 (softcap);  dS *= scale
    dq = dS K;   dk += dS^T Q;   dv += P^T dO       (dk, dv summed over the G query heads)

into one flat output: dq, dk, dv raveled in C order over their logical shapes, concatenated.
D_i is sum_d dO_id O_id (flash attention's form) in exact arithmetic, since O = P V; taken
from the recomputed P and dP (as softmax_back takes it), dP_ij - D_i cancels exactly where
it should: a row that sees one key (P = 1) gets dS = g_lse exactly, where dO.O in float64
against a float32 dP would leave a rounding of dP (relative 1e-7 of |dO| |v|). A block
holds every key its rows see, so D_i is complete when dS is formed; fwd's O is not read.

The products run in BLAS on C-contiguous inputs (q, k, v, the mask, g and fwd that are
not are copied first, once per call: _Geometry.dense, one compiled layout), the row
pieces (scores, maxima, exponentials, log-sum-exps, dS) in numba kernels, in float64 with
exponentials in a polynomial that vectorises
(patterns.exp_into). Each (batch, head) task is one compiled call (_fwd_task, _back_task:
the row kernels and SciPy's BLAS called from numba, engine.backends.cpu.blas), which
holds no GIL from its first product to its last. As a Python loop of numpy matmuls and
row kernels, a head took and gave back the GIL a few dozen times, and two threads gained
1.5x where torch's gained nearly 2 (forward 5.6 -> 3.6 ms, backward 11.0 -> 7.1, the
issue's shape); figures after the change in docs/performance.md (`python
bench/bench_attention.py --part scaling`). float16 and bfloat16 reach the kernels widened to float32
(engine.backends.cpu.half; the backward widens them itself, to know their rounding).

The saved lse is rounded to fwd's dtype: off by up to half an ulp of |lse| (2^-9 |lse| in
bfloat16, 2^-24 |lse| in float32), so exp(s - lse) is off as much, relatively, and a row
that sees one key (P = 1) would pass a gradient it has not. So each recomputed row's sum Z
is taken, and where |log Z| <= 2 u max(|lse|, 1) (u the unit roundoff of fwd's dtype: the
storage rounding, and the exponentials' own) the row is divided by Z: P as exact as if the
lse had been kept in float64. An lse off by more (not attention_fwd's of these inputs) is
used as it is.

Fast paths, each with its plain twin (engine.backends.cpu.paths.plain: one block of every
query row over every key, one thread):
- attention:tiles: query rows in blocks of TILE, each block's products over the keys it
  sees; attention:causal_skip: with `causal`, a block's products stop at the last key
  any of its rows sees (the keys masked for the whole block are never multiplied);
- split:cpu_attention_fwd / split:cpu_attention_back: (batch, head) pairs (backward: (batch,
  kv head) pairs, so that no two threads add into the same dk, dv) handed out one at a
  time to the engine's threads (a thread that starts late takes fewer), from
  threads.MIN_MACS multiply-adds;
- attention:head_tasks: GQA's compiled backward as (batch, query head) tasks, each query
  head's dk, dv into a partial of its own, a kv head's partials summed after in head
  order (_back_heads);
- attention:compiled: each task one compiled call (above), BLAS held to one thread; the
  plain twin is the Python loop over numpy's matmuls (also taken by outputs BLAS cannot
  write as they are, and by dtypes other than float32 and float64).
Each row is computed by the same arithmetic on either path; only the products' shapes (and
so BLAS's order of summation; the compiled backward adds dk and dv in BLAS, beta = 1)
differ. A task computes the same bits on whichever thread runs it: results are the same on
every thread count.
"""

from __future__ import annotations

import functools
import threading

import ml_dtypes
import numpy as np

from engine.backends.alibi_math import alibi_slopes
from engine.backends.calls import sequence
from engine.backends.cpu import blas, half, layout, paths, threads
from engine.backends.cpu.blas import gemm
from engine.backends.cpu.jit import CONTRACT, bindable, njit
from engine.backends.cpu.patterns import (
    dot_any_order,
    exp_into,
    native_half,
    row_extreme,
    sum_any_order,
)
from engine.tensor import is_half

TILE = 128            # query rows per block on the tiled path


def _rows_kernel(fn):
    """A serial kernel whose a * b + c may be fused (jit.CONTRACT): the exponentials'
    polynomial."""
    return njit(fn, **CONTRACT)


@_rows_kernel
def _scores(srow, mask, r, has_mask, slope, scale, cap, lim, x, ch):
    """x[:lim] = the final scores of row r from its dot products srow[:lim]: scale, the
    softcap, slope times the mask; ch[:lim] = d score / d dot product (scale (1 - tanh^2)
    with a softcap, else scale). One loop per step, so that each vectorises."""
    for j in range(lim):
        x[j] = scale * np.float64(srow[j])
    if cap > 0.0:
        for j in range(lim):
            th = np.tanh(x[j] / cap)
            x[j] = cap * th
            ch[j] = scale * (1.0 - th * th)
    else:
        for j in range(lim):
            ch[j] = scale
    if has_mask:
        for j in range(lim):
            x[j] += slope * np.float64(mask[r, j])


@_rows_kernel
def _fwd_rows(s, mask, has_mask, slope, row0, shift, causal, scale, cap, x, ch, lse):
    """Rows row0.. of one head: s (n, kend) holds Q K^T and is overwritten with P; lse (n,)
    gets each row's log-sum-exp; x and ch are float64 scratch rows of at least kend."""
    n, kend = s.shape
    for r in range(n):
        srow = s[r]
        lim = min(kend, max(0, row0 + r + shift + 1)) if causal else kend
        _scores(srow, mask, r, has_mask, slope, scale, cap, lim, x, ch)
        m = row_extreme(x, lim, 0, False) if lim > 0 else -np.inf
        if m == -np.inf:                        # no visible key: P = 0, lse = -inf
            for j in range(kend):
                srow[j] = 0.0
            lse[r] = -np.inf
            continue
        for j in range(lim):
            x[j] = exp_into(x[j] - m, srow)
        total = sum_any_order(x, lim)
        inv = 1.0 / total
        for j in range(lim):
            srow[j] = x[j] * inv
        for j in range(lim, kend):
            srow[j] = 0.0
        lse[r] = m + np.log(total)


@_rows_kernel
def _back_rows(s, dp, mask, has_mask, slope, row0, shift, causal, scale, cap, x, ch, lse,
               glse, unit):
    """Rows row0.. of one head: s (n, kend) holds Q K^T and is overwritten with P =
    exp(s' - lse) (s' the row's final scores; divided by its sum Z where |log Z| is within
    the lse's storage rounding, 2 unit max(|lse|, 1)), dp holds dO V^T and is overwritten
    with scale dS, dS_ij = P_ij (dP_ij - D_i + g_lse_i) (1 - tanh^2 with softcap), D_i =
    sum_j P_ij dP_ij; x and ch are float64 scratch rows (P, the chain factor)."""
    n, kend = s.shape
    for r in range(n):
        srow = s[r]
        drow = dp[r]
        lim = min(kend, max(0, row0 + r + shift + 1)) if causal else kend
        l_r = np.float64(lse[r])
        if l_r == -np.inf:
            lim = 0
        _scores(srow, mask, r, has_mask, slope, scale, cap, lim, x, ch)
        for j in range(lim):
            x[j] = exp_into(x[j] - l_r, srow)
        if lim > 0:
            z = sum_any_order(x, lim)
            if abs(np.log(z)) <= 2.0 * unit * max(abs(l_r), 1.0):
                inv = 1.0 / z
                for j in range(lim):
                    x[j] *= inv
        c = np.float64(glse[r]) - dot_any_order(x, drow, lim, 0)
        for j in range(lim):
            srow[j] = x[j]
            drow[j] = ch[j] * x[j] * (np.float64(drow[j]) + c)
        for j in range(lim, kend):
            srow[j] = 0.0
            drow[j] = 0.0


@njit
def _fwd_task(qh, kh, vh, mask, has_mask, slope, shift, causal, scale, cap, blocks, o, lse,
              sbuf, x, ch):
    """One (batch, head) task of the forward, every block of query rows (blocks: rows
    [i0, i1) over kend keys), in one call: S = Q K^T, the rows (_fwd_rows), O = P V. The
    same steps as the Python loop of the plain twin, the products in SciPy's BLAS."""
    for i in range(blocks.shape[0]):
        i0, i1, kend = blocks[i, 0], blocks[i, 1], blocks[i, 2]
        s = sbuf[:(i1 - i0) * kend].reshape(i1 - i0, kend)
        gemm(False, True, qh[i0:i1], kh[:kend], s, 0.0)
        _fwd_rows(s, mask[i0:i1, :kend], has_mask, slope, i0, shift, causal, scale, cap,
                  x, ch, lse[i0:i1])
        gemm(False, False, s, vh[:kend], o[i0:i1], 0.0)


@njit
def _back_task(q, kh, vh, g, fwd, mask, has_mask, slopes, h0, group, dvn, shift, causal,
               scale, cap, blocks, unit, dq, dkh, dvh, sbuf, pbuf, x, ch):
    """One (batch, kv head) task of the backward in one call: for each of its query heads
    h0..h0+group-1 (q, g, fwd, mask and dq indexed by query head), every block of rows:
    S = Q K^T,
    dP = dO V^T, the rows (_back_rows: P and scale dS), dq = dS K, dk += dS^T Q,
    dv += P^T dO (BLAS adding into dk and dv: beta = 1)."""
    dkh[:, :] = 0.0
    dvh[:, :] = 0.0
    for h in range(h0, h0 + group):
        qh, gh, fh = q[h], g[h], fwd[h]
        for i in range(blocks.shape[0]):
            i0, i1, kend = blocks[i, 0], blocks[i, 1], blocks[i, 2]
            n = i1 - i0
            s = sbuf[:n * kend].reshape(n, kend)
            dp = pbuf[:n * kend].reshape(n, kend)
            gemm(False, True, qh[i0:i1], kh[:kend], s, 0.0)
            gemm(False, True, gh[i0:i1, :dvn], vh[:kend], dp, 0.0)
            _back_rows(s, dp, mask[h, i0:i1, :kend], has_mask, slopes[h], i0, shift, causal,
                       scale, cap, x, ch, fh[i0:i1, dvn], gh[i0:i1, dvn], unit)
            gemm(False, False, dp, kh[:kend], dq[h, i0:i1], 0.0)
            gemm(True, False, dp, qh[i0:i1], dkh[:kend], 1.0)
            gemm(True, False, s, gh[i0:i1, :dvn], dvh[:kend], 1.0)


def _blas_rows(a) -> bool:
    """Whether BLAS can read (or write) `a`'s last two axes as they are: unit stride along
    the last, a row stride of whole elements no shorter than a row (numpy's matmul copies
    any other view itself)."""
    if a.shape[-1] > 1 and a.strides[-1] != a.itemsize:
        return False
    row = a.strides[-2]
    return a.shape[-2] <= 1 or (row % a.itemsize == 0 and row >= a.shape[-1] * a.itemsize)


def _as_4d(a):
    return a if a.ndim == 4 else a[None]


class _Geometry:
    """The 4-D views and sizes of one call, the ALiBi slopes and the blocks of rows."""

    def __init__(self, q, k, v, mask, scale, causal, logit_softcap, max_bias):
        self.copies: list = []          # the calls that fill the dense copies (dense)
        self.q, self.k, self.v = (self.dense(_as_4d(a)) for a in (q, k, v))
        mask = None if mask is None else self.dense(mask)
        self.b, self.hq, self.tq, self.d = self.q.shape
        self.hkv, self.tk, self.dv = self.k.shape[1], self.k.shape[2], self.v.shape[3]
        self.group = self.hq // self.hkv
        self.mask = None if mask is None else np.broadcast_to(
            mask[(None,) * (4 - mask.ndim)], (self.b, self.hq, self.tq, self.tk))
        self.slopes = alibi_slopes(self.hq, float(max_bias))
        self.scale, self.causal, self.cap = float(scale), bool(causal), float(logit_softcap)
        self.shift = self.tk - self.tq
        tile = self.tq if paths.PLAIN or self.tq <= TILE else TILE
        self.blocks = [(i0, min(self.tq, i0 + tile), self.keys(i0, min(self.tq, i0 + tile),
                                                               tile < self.tq))
                       for i0 in range(0, self.tq, max(tile, 1))]
        self.block_array = np.array(self.blocks, np.int64).reshape(-1, 3)
        if len(self.blocks) > 1:
            paths.taken("attention:tiles")
            if any(kend < self.tk for _, _, kend in self.blocks):
                paths.taken("attention:causal_skip")

    def dense(self, a):
        """`a`, or a C-contiguous copy of it filled when the call runs (layout.dense, the
        copy added to `copies`): the compiled tasks and the row kernels then see one
        layout, and numba compiles each once per dtype (and mask kind), not again for every
        layout of the inputs: the (B, T, H, D) leaves, the sliced and transposed inputs and
        the permuted or broadcast upstream gradients of gradcheck's cases made 18
        compilations of _back_task and 9 of _fwd_task in a cold `gradcheck --all`, 27 s of
        CPU of its 202 s of compiling (`python bench/bench_first_run.py --breakdown`, load
        5-6), now 4 and 2. The copy is of the inputs' size; a head's products take Tk
        times as many multiply-adds."""
        return layout.dense(a, self.copies)

    def keys(self, i0, i1, tiled):
        """How many keys the block of rows i0..i1-1 multiplies: all, or with `causal` on
        the tiled path, up to the last one its last row sees."""
        if not (self.causal and tiled):
            return self.tk
        return min(self.tk, max(0, i1 + self.shift))

    def compiled(self, *outs) -> bool:
        """Whether each task runs as one compiled call (attention:compiled, recorded): not
        in plain mode, for float32 or float64 alike, with inputs and outputs BLAS reads
        as they are (else numpy's matmuls, which copy what they must)."""
        arrays = (self.q, self.k, self.v, *outs)
        fast = (not paths.PLAIN and self.q.dtype in (np.float32, np.float64)
                and all(a.dtype == self.q.dtype and _blas_rows(a) for a in arrays))
        if fast:
            paths.taken("attention:compiled")
        return fast

    def mask_or(self):
        """The 4-D mask, or (no mask) a stand-in the kernels never read (_no_mask)."""
        return _no_mask(self.q.dtype, max(self.hq, 2)) if self.mask is None else self.mask

    def macs(self) -> int:
        return self.b * self.hq * self.tq * self.tk * (self.d + self.dv)

    def row_args(self, b, h, i0, i1, kend, s):
        """The rows kernels' mask, has_mask, slope, row0, shift, causal, scale and cap."""
        mask = _no_mask(s.dtype) if self.mask is None else self.mask[b, h, i0:i1, :kend]
        return (mask, self.mask is not None, float(self.slopes[h]), i0, self.shift,
                self.causal, self.scale, self.cap)

    def scratch(self, dtype, *widths):
        """One flat buffer per width, of a block's rows times that width."""
        rows = max((i1 - i0 for i0, i1, _ in self.blocks), default=0)
        return [np.empty(rows * w, dtype) for w in widths]


# A call without a mask hands the kernels a stand-in of the numba type a broadcast mask
# gives them, so that masked and unmasked calls share one compilation: read-only (numpy's
# broadcast views are), and laid out as a mask broadcast over the heads (a stride of 0 on
# an axis of 2 or more: 'A' to numba) where the kernel takes the heads' axis, _back_task's
# (mask[b], 3-D), but C-contiguous where it takes one head's rows, _fwd_task's (mask[b, h],
# 2-D, a (Tq, Tk) mask's rows). The row kernels' stand-in (2-D, 'A') is the type of the
# slice mask[i0:i1, :kend] that the tasks hand them, so that the plain twin's calls from
# Python load those compilations. An empty C-contiguous stand-in made one more
# compilation of _back_task per dtype and of the plain twin's _fwd_rows and _back_rows in
# a cold `gradcheck --all` (`python bench/bench_first_run.py --breakdown --records F`).
@functools.lru_cache(maxsize=16)
def _no_mask(dtype, heads: int | None = None) -> np.ndarray:
    """The stand-in for a missing mask, read-only: (1, heads, 2, 2), heads >= 2, every
    head the same memory (its [b] 'A', its [b, h] C), or without `heads` (2, 2) ('A')."""
    if heads is not None:
        return np.broadcast_to(np.zeros((2, 2), dtype), (1, heads, 2, 2))
    return np.broadcast_to(np.zeros(2, dtype), (2, 2))


def _panel(buf, n, m):
    return buf[:n * m].reshape(n, m)


class _Tasks:
    """The (batch, head) tasks of one call, handed out one at a time to the calls that
    run side by side (`take`), so that a thread that starts late takes fewer: which thread
    computes a task changes nothing in its result. The last call to finish a run sets the
    queue back for the next run (a run starts only when every call of the last one has
    returned)."""

    def __init__(self, tasks, calls):
        self.tasks, self.calls = tasks, calls
        self.lock = threading.Lock()
        self.next = self.done = 0

    def take(self):
        with self.lock:
            i, self.next = self.next, self.next + 1
        return self.tasks[i] if i < len(self.tasks) else None

    def finished(self):
        with self.lock:
            self.done += 1
            if self.done == self.calls:
                self.next = self.done = 0


def _chunked(name, geo, tasks, make, compiled):
    """One call computing every task of `tasks` with make(take)'s calls (take() gives the
    next task or None), side by side on the engine's threads when the work pays for it
    (recorded as split:`name`). `compiled`: the tasks call BLAS themselves (_fwd_task,
    _back_task), which is held to one thread while they run, on any number of the engine's
    threads: a product then sums in the same order whoever runs it (SciPy's OpenBLAS on two
    threads gave float64 products other bits than on one), and tasks side by side do not
    share the cores with BLAS's workers. Outside a plan nothing else holds it."""
    n = min(threads.parts() if geo.macs() >= threads.MIN_MACS else 1, len(tasks))
    if n > 1:
        paths.taken(f"split:{name}")
    queue = _Tasks(tasks, max(n, 1))

    def call(run):
        def whole():
            try:
                run()
            finally:
                queue.finished()
        return whole
    every = threads.side_by_side([call(make(queue.take)) for _ in range(max(n, 1))])
    if not compiled:
        return every

    def held():
        with threads.one_blas_thread():
            every()
    return held


def _fwd_compiled(geo, out4):
    """The forward's tasks, each one call of _fwd_task."""
    mask = geo.mask_or()
    blas.ready()                       # gemm's two compilations (blas.ready)

    def make(take):
        sbuf, = geo.scratch(geo.q.dtype, geo.tk)
        x, ch = np.empty(geo.tk, np.float64), np.empty(geo.tk, np.float64)

        def run():
            while (task := take()) is not None:
                b, h = task
                c = h // geo.group
                _fwd_task(geo.q[b, h], geo.k[b, c], geo.v[b, c], mask[min(b, len(mask) - 1), h],
                          geo.mask is not None, float(geo.slopes[h]), geo.shift, geo.causal,
                          geo.scale, geo.cap, geo.block_array, out4[b, h, :, :geo.dv],
                          out4[b, h, :, geo.dv], sbuf, x, ch)
        return run
    return make


def _fwd_numpy(geo, out4):
    """The forward's tasks as a Python loop over blocks: numpy's matmuls and _fwd_rows (the
    plain twin of _fwd_compiled)."""

    def make(take):
        sbuf, = geo.scratch(geo.q.dtype, geo.tk)
        x, ch = np.empty(geo.tk, np.float64), np.empty(geo.tk, np.float64)

        def run():
            while (task := take()) is not None:
                b, h = task
                qh, kh, vh = geo.q[b, h], geo.k[b, h // geo.group], geo.v[b, h // geo.group]
                for i0, i1, kend in geo.blocks:
                    s = _panel(sbuf, i1 - i0, kend)
                    np.matmul(qh[i0:i1], kh[:kend].T, out=s)
                    _fwd_rows(s, *geo.row_args(b, h, i0, i1, kend, s), x, ch,
                              out4[b, h, i0:i1, geo.dv])
                    np.matmul(s, vh[:kend], out=out4[b, h, i0:i1, :geo.dv])
        return run
    return make


@bindable
def cpu_attention_fwd(out, ins, scale, causal=False, logit_softcap=0.0, max_bias=0.0):
    """kernel(out, [q, k, v] or [q, k, v, mask], **params): out (.., Hq, Tq, Dv + 1) gets O
    and the log-sum-exp (module doc)."""
    q, k, v, *mask = ins
    geo = _Geometry(q, k, v, mask[0] if mask else None, scale, causal, logit_softcap,
                    max_bias)
    out4 = _as_4d(out)
    compiled = geo.compiled(out4)
    make = (_fwd_compiled if compiled else _fwd_numpy)(geo, out4)
    return sequence(*geo.copies, _chunked("cpu_attention_fwd", geo, [
        (b, h) for b in range(geo.b) for h in range(geo.hq)], make, compiled))


def _back_calls(geo, unit, fwd4, g4, dq, place):
    """make(take) for the compiled backward: each task one call of _back_task, with
    place(task) = (b, c, h0, group, dkh, dvh): batch b, kv head c, query heads h0 ..
    h0 + group - 1, and where their dk, dv go."""
    mask = geo.mask_or()
    blas.ready()                       # gemm's two compilations (blas.ready)

    def make(take):
        sbuf, pbuf = geo.scratch(geo.q.dtype, geo.tk, geo.tk)
        x, ch = np.empty(geo.tk, np.float64), np.empty(geo.tk, np.float64)

        def run():
            while (task := take()) is not None:
                b, c, h0, group, dkh, dvh = place(task)
                _back_task(geo.q[b], geo.k[b, c], geo.v[b, c], g4[b], fwd4[b],
                           mask[min(b, len(mask) - 1)], geo.mask is not None, geo.slopes,
                           h0, group, geo.dv, geo.shift, geo.causal, geo.scale, geo.cap,
                           geo.block_array, unit, dq[b], dkh, dvh, sbuf, pbuf, x, ch)
        return run
    return make


def _back_compiled(geo, unit, fwd4, g4, dq, dk, dv):
    """The backward's (batch, kv head) tasks, each one call of _back_task over the kv
    head's query heads."""
    def place(task):
        b, c = task
        return b, c, c * geo.group, geo.group, dk[b, c], dv[b, c]
    return _back_calls(geo, unit, fwd4, g4, dq, place)


def _back_heads(geo, unit, fwd4, g4, dq, dk, dv):
    """GQA's backward on the compiled path (attention:head_tasks): (batch, query head)
    tasks, each a _back_task of one head into that head's own dk and dv partials, and each
    kv head's G partials summed after the tasks, in head order. As (batch, kv head) tasks
    the issue's GQA shape (8 query heads on 2 kv heads, batch 1) had 2 tasks for 2 threads,
    so a thread that started late delayed the whole call by as much (thread gain 1.55 in
    one quiet run of `python bench/bench_attention.py`, 1.86 in another); G times as many
    tasks let the other thread take more. Which thread runs a task, and how many threads
    there are, changes no bit: the sums' order is fixed."""
    dkp = np.empty((geo.b, geo.hq, geo.tk, geo.d), dk.dtype)
    dvp = np.empty((geo.b, geo.hq, geo.tk, geo.dv), dv.dtype)
    paths.taken("attention:head_tasks")

    def place(task):
        b, h = task
        return b, h // geo.group, h, 1, dkp[b, h], dvp[b, h]
    make = _back_calls(geo, unit, fwd4, g4, dq, place)
    every = _chunked("cpu_attention_back", geo, [(b, h) for b in range(geo.b)
                                                  for h in range(geo.hq)], make, True)

    def call():
        every()
        for parts, grad in ((dkp, dk), (dvp, dv)):
            for c in range(geo.hkv):
                heads = parts[:, c * geo.group:(c + 1) * geo.group]
                np.copyto(grad[:, c], heads[:, 0])
                for j in range(1, geo.group):
                    grad[:, c] += heads[:, j]
    return call


def _back_numpy(geo, unit, fwd4, g4, dq, dk, dv):
    """The backward's tasks as a Python loop over heads and blocks: numpy's matmuls and
    _back_rows (the plain twin of _back_compiled)."""
    def make(take):
        sbuf, pbuf = geo.scratch(geo.q.dtype, geo.tk, geo.tk)
        kbuf = np.empty(geo.tk * geo.d, geo.q.dtype)
        vbuf = np.empty(geo.tk * geo.dv, geo.q.dtype)
        x, ch = np.empty(geo.tk, np.float64), np.empty(geo.tk, np.float64)

        def run():
            while (task := take()) is not None:
                b, kv = task
                kh, vh, dkh, dvh = geo.k[b, kv], geo.v[b, kv], dk[b, kv], dv[b, kv]
                dkh[...] = 0.0
                dvh[...] = 0.0
                for h in range(kv * geo.group, (kv + 1) * geo.group):
                    qh, gh, fh = geo.q[b, h], g4[b, h], fwd4[b, h]
                    for i0, i1, kend in geo.blocks:
                        n = i1 - i0
                        s, dp = _panel(sbuf, n, kend), _panel(pbuf, n, kend)
                        np.matmul(qh[i0:i1], kh[:kend].T, out=s)
                        np.matmul(gh[i0:i1, :geo.dv], vh[:kend].T, out=dp)
                        _back_rows(s, dp, *geo.row_args(b, h, i0, i1, kend, s),
                                   x, ch, fh[i0:i1, geo.dv], gh[i0:i1, geo.dv],
                                   unit)
                        np.matmul(dp, kh[:kend], out=dq[b, h, i0:i1])
                        tk = _panel(kbuf, kend, geo.d)
                        np.matmul(dp.T, qh[i0:i1], out=tk)
                        dkh[:kend] += tk
                        tv = _panel(vbuf, kend, geo.dv)
                        np.matmul(s.T, gh[i0:i1, :geo.dv], out=tv)
                        dvh[:kend] += tv
        return run
    return make


def _back_prepare(out, ins, scale, causal=False, logit_softcap=0.0, max_bias=0.0,
                  unit=None):
    """The backward on float32 or float64 arrays (module doc); `unit`: the unit roundoff
    of the dtype fwd's lse was stored in (None: fwd's own)."""
    g, q, k, v, *mask, fwd = ins
    unit = float(np.finfo(fwd.dtype).eps) / 2 if unit is None else float(unit)
    geo = _Geometry(q, k, v, mask[0] if mask else None, scale, causal, logit_softcap,
                    max_bias)
    g4, fwd4 = geo.dense(_as_4d(g)), geo.dense(_as_4d(fwd))
    nq, nk = geo.q.size, geo.k.size
    dq = out[:nq].reshape(geo.q.shape)
    dk = out[nq:nq + nk].reshape(geo.k.shape)
    dv = out[nq + nk:].reshape(geo.v.shape)

    grads = (g4, dq, dk, dv)
    compiled = geo.compiled(*grads)
    if compiled and geo.group > 1:
        return sequence(*geo.copies, _back_heads(geo, unit, fwd4, *grads))
    make = (_back_compiled if compiled else _back_numpy)(geo, unit, fwd4, *grads)
    return sequence(*geo.copies, _chunked("cpu_attention_back", geo, [
        (b, c) for b in range(geo.b) for c in range(geo.hkv)], make, compiled))


_back_float = bindable(_back_prepare)


@native_half
@bindable
def cpu_attention_back(out, ins, **params):
    """kernel(out, [g, q, k, v, fwd] or [g, q, k, v, mask, fwd], **params): out (1-D)
    gets dq, dk, dv raveled and concatenated (module doc). 16-bit arrays are widened to
    float32 here (half.widened), the renormalisation of P told the 16-bit dtype's unit
    roundoff (the saved lse's rounding)."""
    fwd = ins[-1]
    if any(is_half(a.dtype) for a in (out, *ins)):
        unit = float(ml_dtypes.finfo(fwd.dtype).eps) / 2
        return half.widened(bindable(functools.partial(_back_prepare, unit=unit))).bind(
            out, ins, **params)
    return _back_float.bind(out, ins, **params)
