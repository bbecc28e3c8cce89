"""CUDA kernels of attention_fwd and attention_back (the fused scaled-dot-product attention of
engine.ops.attention), one thread per query row or per key row, in float64.

With G = Hq / Hkv, query head h reads kv head h // G, and for a query row (b, h, i) and key j

    u_ij = scale <q[b,h,i,:], k[b,h//G,j,:]>
    s_ij = cap tanh(u_ij / cap) (cap = logit_softcap > 0; u_ij otherwise) + slope_h mask[b,h,i,j]
    s_ij = -inf where causal and j > i + (Tk - Tq)                       (bottom-right aligned)
    lse_i = log sum_j exp(s_ij),   p_ij = exp(s_ij - lse_i),   out_i = sum_j p_ij v[b,h//G,j,:]

(slope_h = engine.backends.alibi_math.alibi_slope(h, Hq, max_bias), 1 without ALiBi; the mask
is read in its own shape, broadcast to (B, Hq, Tq, Tk) with stride 0 on its broadcast axes).
The backward, with lse read from the saved packed forward output and dO, g_lse the two parts
of the packed output's gradient g, recomputes p_ij from q, k and lse_i (the CPU kernel's
formulas, engine.backends.cpu.attention):

    x_ij = exp(s_ij - lse_i),   Z_i = sum_j x_ij,   p_ij = x_ij / Z_i if |log Z_i| <= 2 u
    max(|lse_i|, 1), else x_ij                     (u: the unit roundoff lse was stored in)
    dP_ij = <dO_i, v_j>,   D_i = sum_j p_ij dP_ij,   dS_ij = p_ij ((dP_ij - D_i) + g_lse_i)
    dU_ij = dS_ij (1 - tanh^2(u_ij / cap))  (dS_ij without softcap)
    dq_i = scale sum_j dU_ij k_j,   dk_j = scale sum_{h in j's group, i} dU_hij q_hi,
    dv_j = sum_{h in j's group, i} p_hij dO_hi

Why not lse and D_i = dO_i . O_i as stored (flash attention's form): the saved lse is rounded
to fwd's dtype (off by up to half an ulp of |lse|: 2^-24 |lse| in float32, 2^-9 |lse| in
bfloat16), and exp(s - lse) as much, so a row that sees one key (p = 1) would pass a
gradient it has not; dividing by Z_i where it is that close to 1 gives p as if lse had been
kept in float64, and an lse off by more (not attention_fwd's of these inputs) is used as it
is. D_i from the recomputed p and dP makes dP_ij - D_i vanish exactly where it should: a
one-key row gets p = x / x = 1, D_i = dP_ij and dS = g_lse to the last bit (the CPU kernel
multiplies by 1 / Z_i: the same within an ulp of float64). The saved O is not read.

Kernels (grid-stride loops, engine.backends.cuda.launch):
- `_attention_fwd`, one thread per query row (b, h, i): a first pass over the row's keys
  gives lse_i (a running maximum m and sum l of exp(s - m), rescaled when m grows); then,
  for each chunk of CHUNK output columns, a second pass recomputes s_ij, adds p_ij v_j into
  a float64 accumulator of the thread's own and stores the chunk (Dv > CHUNK recomputes the
  logits once per further chunk). A row with every key masked (m = -inf) stores out 0 and
  lse -inf.
- `_attention_back_q`, one thread per query row: a pass over its keys for Z_i, one for D_i,
  then per chunk of dq's columns one more; it stores dq_i and the row's statistics (lse_i,
  the divisor Z_i or 1, D_i) in a float64 (B, Hq, Tq, 3) buffer that the dispatcher
  allocates per call (a Tk-times-cheaper route than recomputing them per key).
- `_attention_back_kv`, launched after it, one thread per key row (b, hkv, j): dv_j and
  dk_j together, per chunk of columns, in one pass over the G query heads of the group and
  their query rows that see key j (each p_ij recomputed once for both), reading the rows'
  statistics. Rows whose saved lse is -inf
  (fully masked) contribute nothing and get dq 0.
Every output element is written once, by the one thread that owns it, its sums taken in a
fixed order (keys, or heads then rows, ascending): no atomics, the same bits on every run
and with any grid.

Precision: dot products, exponentials, tanh and every accumulation are float64, for float32
and float64 data alike (the CPU kernels use float32 BLAS panels for float32 data; both are
within the precision verdict), rounded once on store; lse is stored in the output's dtype.
16-bit inputs reach the kernels widened to float32 (engine.backends.cuda.half.widened, as
for every op), but the backward widens them itself (`cuda_attention_back.native_half`: the
backend hands it the 16-bit arrays) to know u: float16's 2^-11 or bfloat16's 2^-8, where
the float32 it sees would say 2^-24.

Speed is a non-goal: a thread loops over a whole row of keys (or of the group's queries)
with no shared-memory tiling, and the parallelism is the number of rows. The kernels are
written for correctness and for numba's simulator (few threads, simple loops).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float64

from engine.backends.alibi_math import alibi_slope
from engine.backends.cpu.half import BF16, F16
from engine.backends.cuda import half
from engine.backends.cuda.arrays import broadcast, half_format, strided
from engine.backends.cuda.launch import grid_stride, unravel3

CHUNK = 128             # output columns a thread accumulates at once (float64, local memory)
STATS = 3               # a query row's backward statistics: lse_i, the divisor Z_i or 1, D_i
HALF_UNITS = {F16: 2.0 ** -11, BF16: 2.0 ** -8}     # the 16-bit formats' unit roundoffs


@cuda.jit(device=True)
def _logit(q, k, mask, has_mask, b, h, hk, i, j, scale, cap, slope):
    """(s_ij, ds/du): the logit of query row (b, h, i) and key (b, hk, j) (module doc) and
    the softcap's chain factor 1 - tanh^2(u / cap) (1 without softcap)."""
    u = 0.0
    for d in range(q.shape[3]):
        u += float64(q[b, h, i, d]) * float64(k[b, hk, j, d])
    u *= scale
    chain = 1.0
    if cap > 0.0:
        t = math.tanh(u / cap)
        u = cap * t
        chain = 1.0 - t * t
    if has_mask:
        u += slope * float64(mask[b, h, i, j])
    return u, chain


@cuda.jit(device=True)
def _query_row(row, nh, nq, group):
    """(b, h, i, hk): batch, head and index of query row `row` of (B, nh, nq) in C order,
    and its kv head h // group."""
    b, h, i = unravel3(row, nh, nq)
    return b, h, i, h // group


@cuda.jit(device=True)
def _chunk(acc, c0, total):
    """The number of columns n of the chunk from column c0 of `total` (at most CHUNK), with
    acc[:n] cleared for its sums."""
    n = min(CHUNK, total - c0)
    for e in range(n):
        acc[e] = 0.0
    return n


@cuda.jit(device=True)
def _keys_end(i, nq, nk, causal):
    """One past the last key query row i sees: j <= i + (nk - nq) when causal."""
    if causal:
        return min(nk, max(0, i + nk - nq + 1))
    return nk


@cuda.jit(device=True)
def _exp(x):
    """exp(x), +inf past float64's range (where the simulator's math.exp raises): an lse
    far off (not attention_fwd's) is used as it is."""
    if x > 709.78:
        return math.inf
    return math.exp(x)


@cuda.jit(device=True)
def _dot_g_v(g, v, b, h, hk, i, j, nv):
    """dP_ij = <dO[b, h, i, :], v[b, hk, j, :]>, float64, in ascending columns."""
    dp = 0.0
    for e in range(nv):
        dp += float64(g[b, h, i, e]) * float64(v[b, hk, j, e])
    return dp


@cuda.jit
def _attention_fwd(q, k, v, mask, has_mask, out, scale, causal, cap, max_bias):
    """out[b, h, i, :Dv] = sum_j p_ij v[b, h // G, j], out[b, h, i, Dv] = lse_i."""
    nb, nh, nq = out.shape[0], out.shape[1], out.shape[2]
    nhk, nk, nv = k.shape[1], k.shape[2], v.shape[3]
    group = nh // nhk
    acc = cuda.local.array(CHUNK, float64)
    for row in range(cuda.grid(1), nb * nh * nq, cuda.gridsize(1)):
        b, h, i, hk = _query_row(row, nh, nq, group)
        slope = alibi_slope(float(h), float(nh), max_bias)
        end = _keys_end(i, nq, nk, causal)
        m = -math.inf
        total = 0.0
        for j in range(end):
            s, _ = _logit(q, k, mask, has_mask, b, h, hk, i, j, scale, cap, slope)
            if s == -math.inf:
                continue
            if s > m:
                total = total * math.exp(m - s) + 1.0
                m = s
            else:
                total += math.exp(s - m)
        if total == 0.0:                       # every key masked
            for e in range(nv):
                out[b, h, i, e] = 0.0
            out[b, h, i, nv] = -math.inf
            continue
        lse = m + math.log(total)
        for c0 in range(0, nv, CHUNK):
            n = _chunk(acc, c0, nv)
            for j in range(end):
                s, _ = _logit(q, k, mask, has_mask, b, h, hk, i, j, scale, cap, slope)
                p = math.exp(s - lse)
                for e in range(n):
                    acc[e] += p * float64(v[b, hk, j, c0 + e])
            for e in range(n):
                out[b, h, i, c0 + e] = acc[e]
        out[b, h, i, nv] = lse


@cuda.jit
def _attention_back_q(g, q, k, v, mask, has_mask, fwd, dq, stats, scale, causal, cap,
                      max_bias, unit):
    """dq[b, h, i] = scale sum_j dU_ij k[b, h // G, j] and stats[b, h, i] = (lse_i, the
    divisor of the row's p (Z_i or 1), D_i) (module doc)."""
    nb, nh, nq, nd = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
    nhk, nk, nv = k.shape[1], k.shape[2], v.shape[3]
    group = nh // nhk
    acc = cuda.local.array(CHUNK, float64)
    for row in range(cuda.grid(1), nb * nh * nq, cuda.gridsize(1)):
        b, h, i, hk = _query_row(row, nh, nq, group)
        lse = float64(fwd[b, h, i, nv])
        end = _keys_end(i, nq, nk, causal)
        if lse == -math.inf:                   # every key masked: no gradient
            end = 0
        slope = alibi_slope(float(h), float(nh), max_bias)
        z = 0.0
        for j in range(end):
            s, _ = _logit(q, k, mask, has_mask, b, h, hk, i, j, scale, cap, slope)
            z += _exp(s - lse)
        if not (z > 0.0 and abs(math.log(z)) <= 2.0 * unit * max(abs(lse), 1.0)):
            z = 1.0                            # an lse off by more: used as it is
        di = 0.0
        for j in range(end):
            s, _ = _logit(q, k, mask, has_mask, b, h, hk, i, j, scale, cap, slope)
            p = _exp(s - lse) / z
            if p != 0.0:
                di += p * _dot_g_v(g, v, b, h, hk, i, j, nv)
        stats[b, h, i, 0] = lse
        stats[b, h, i, 1] = z
        stats[b, h, i, 2] = di
        g_lse = float64(g[b, h, i, nv])
        for c0 in range(0, nd, CHUNK):
            n = _chunk(acc, c0, nd)
            for j in range(end):
                s, chain = _logit(q, k, mask, has_mask, b, h, hk, i, j, scale, cap, slope)
                p = _exp(s - lse) / z
                if p == 0.0:
                    continue
                du = p * ((_dot_g_v(g, v, b, h, hk, i, j, nv) - di) + g_lse) * chain
                for d in range(n):
                    acc[d] += du * float64(k[b, hk, j, c0 + d])
            for d in range(n):
                dq[b, h, i, c0 + d] = scale * acc[d]


@cuda.jit
def _attention_back_kv(g, q, k, v, mask, has_mask, stats, dk, dv, scale, causal, cap,
                       max_bias):
    """dv[b, hk, j] = sum p_hij dO_hi and dk[b, hk, j] = scale sum dU_hij q_hi over the
    group's heads h and their rows i that see key j, with the rows' statistics from
    `_attention_back_q` (module doc)."""
    nb, nhk, nk, nd = k.shape[0], k.shape[1], k.shape[2], k.shape[3]
    nh, nq, nv = q.shape[1], q.shape[2], v.shape[3]
    group = nh // nhk
    acc_v = cuda.local.array(CHUNK, float64)
    acc_k = cuda.local.array(CHUNK, float64)
    for row in range(cuda.grid(1), nb * nhk * nk, cuda.gridsize(1)):
        b, hk, j = unravel3(row, nhk, nk)
        first = max(0, j - (nk - nq)) if causal else 0     # the first row that sees key j
        # dv's and dk's columns CHUNK at a time, both from one recomputation of each p
        for c0 in range(0, max(nv, nd), CHUNK):
            nvc = max(0, min(CHUNK, nv - c0))
            ndc = max(0, min(CHUNK, nd - c0))
            for e in range(CHUNK):
                acc_v[e] = 0.0
                acc_k[e] = 0.0
            for h in range(hk * group, hk * group + group):
                slope = alibi_slope(float(h), float(nh), max_bias)
                for i in range(first, nq):
                    lse = stats[b, h, i, 0]
                    if lse == -math.inf:
                        continue
                    s, chain = _logit(q, k, mask, has_mask, b, h, hk, i, j, scale, cap,
                                      slope)
                    p = _exp(s - lse) / stats[b, h, i, 1]
                    for e in range(nvc):
                        acc_v[e] += p * float64(g[b, h, i, c0 + e])
                    if p == 0.0 or ndc == 0:
                        continue
                    dp = _dot_g_v(g, v, b, h, hk, i, j, nv)
                    du = p * ((dp - stats[b, h, i, 2]) + float64(g[b, h, i, nv])) * chain
                    for d in range(ndc):
                        acc_k[d] += du * float64(q[b, h, i, c0 + d])
            for e in range(nvc):
                dv[b, hk, j, c0 + e] = acc_v[e]
            for d in range(ndc):
                dk[b, hk, j, c0 + d] = scale * acc_k[d]


def _rank4(arr):
    """`arr` with unit axes in front up to four (a view). Their strides are the item size,
    not arrays.with_rank's 0: numba types an array with a stride-0 axis as non-contiguous,
    and a contiguous array should reach the kernels as one (PTX_SIGNATURES)."""
    pad = 4 - arr.ndim
    item = arr.dtype.itemsize
    return strided(arr, (1,) * pad + tuple(arr.shape), (item,) * pad + tuple(arr.strides))


def _mask_view(q, k, extra, like):
    """(mask, has_mask): the mask in `extra` broadcast to (.., Hq, Tq, Tk) as a 4-D view,
    or a one-element stand-in (never read) of `like`'s dtype."""
    if not extra:
        item = like.dtype.itemsize
        return strided(like, (1, 1, 1, 1), (item,) * 4), False
    shape = (*q.shape[:q.ndim - 1], k.shape[k.ndim - 2])     # (simulator: no shape[-1])
    mask = extra[0]
    if tuple(mask.shape) != shape:
        mask = broadcast(mask, shape)
    return _rank4(mask), True


def _c_view(buf, shape, offset_items: int):
    """A C-contiguous view of `shape` into 1-D contiguous `buf` from element offset_items."""
    item = buf.dtype.itemsize
    strides, acc = [], item
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(int(n), 1)
    return strided(buf, shape, tuple(reversed(strides)), offset_items * item)


def cuda_attention_fwd(out, ins, *, scale, causal, logit_softcap, max_bias):
    """Dispatcher of attention_fwd: kernel(out, [q, k, v] or [q, k, v, mask], **params),
    out the packed (.., Hq, Tq, Dv + 1) = out | lse."""
    if out.size == 0:
        return
    q, k, v = ins[:3]
    mask, has_mask = _mask_view(q, k, ins[3:], out)
    out4 = _rank4(out)
    rows = out4.shape[0] * out4.shape[1] * out4.shape[2]
    grid_stride(_attention_fwd, rows, _rank4(q), _rank4(k), _rank4(v), mask, has_mask, out4,
                float(scale), bool(causal), float(logit_softcap), float(max_bias))


def _attention_back(out, ins, *, scale, causal, logit_softcap, max_bias, unit=None):
    """attention_back on float32 or float64 device arrays; `unit`: the unit roundoff of the
    dtype fwd's lse was stored in (None: fwd's own)."""
    if out.size == 0:
        return
    g, q, k, v, *extra, fwd = ins
    unit = float(np.finfo(fwd.dtype).eps) / 2 if unit is None else float(unit)
    mask, has_mask = _mask_view(q, k, extra, out)
    g4, q4, k4, v4, fwd4 = (_rank4(a) for a in (g, q, k, v, fwd))
    dq = _c_view(out, q4.shape, 0)
    dk = _c_view(out, k4.shape, q.size)
    dv = _c_view(out, v4.shape, q.size + k.size)
    # the query rows' statistics for the key threads (at least one row: never empty)
    stats = cuda.device_array((*(max(int(n), 1) for n in q4.shape[:3]), STATS), np.float64)
    params = (float(scale), bool(causal), float(logit_softcap), float(max_bias))
    rows_q = q4.shape[0] * q4.shape[1] * q4.shape[2]
    rows_k = k4.shape[0] * k4.shape[1] * k4.shape[2]
    grid_stride(_attention_back_q, rows_q, g4, q4, k4, v4, mask, has_mask, fwd4, dq, stats,
                *params, unit)
    grid_stride(_attention_back_kv, rows_k, g4, q4, k4, v4, mask, has_mask, stats, dk, dv,
                *params)


def cuda_attention_back(out, ins, **params):
    """Dispatcher of attention_back: kernel(out, [g, q, k, v, fwd] or [g, q, k, v, mask,
    fwd], **params), out 1-D: dq, dk, dv raveled in C order and concatenated. 16-bit
    arrays are widened to float32 here (half.widened), the renormalisation of p told the
    unit roundoff of the 16-bit dtype fwd's lse was stored in (module doc)."""
    if any(half_format(a) is not None for a in (out, *ins)):
        fmt = half_format(ins[-1])
        unit = HALF_UNITS[fmt] if fmt is not None else None
        half.widened(functools.partial(_attention_back, unit=unit))(out, ins, **params)
    else:
        _attention_back(out, ins, **params)


cuda_attention_back.native_half = True     # the backend hands it 16-bit arrays as they are


def _signatures():
    """float32 and float64; q, k, v all contiguous or all strided; g contiguous or strided;
    the mask contiguous (a full mask, and the stand-in without one) or strided (broadcast);
    out, fwd, dq, dk, dv and the float64 row statistics contiguous. (The launches a GPU
    run made are all listed here.)"""
    sigs = []
    scalars = "float64, boolean, float64, float64"
    layouts = ("[:, :, :, ::1]", "[:, :, :, :]")
    stats = "float64[:, :, :, ::1]"
    for dt in ("float32", "float64"):
        o = f"{dt}[:, :, :, ::1]"
        for lay in layouts:
            qkv = ", ".join([f"{dt}{lay}"] * 3)
            for mlay in layouts:
                m = f"{dt}{mlay}, boolean"
                sigs.append((_attention_fwd, f"void({qkv}, {m}, {o}, {scalars})"))
                for glay in layouts:
                    g = f"{dt}{glay}"
                    sigs.append((_attention_back_q,
                                 f"void({g}, {qkv}, {m}, {o}, {o}, {stats}, {scalars}, "
                                 "float64)"))
                    sigs.append((_attention_back_kv,
                                 f"void({g}, {qkv}, {m}, {stats}, {o}, {o}, {scalars})"))
    return sigs


PTX_SIGNATURES = _signatures()
