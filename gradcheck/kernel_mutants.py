"""The kernel bugs of gradcheck's self-test: each function makes a buggy CPU kernel (or its
preparation, or its chunking) from the real one, for gradcheck.mutants.

A bug sits where it would in a real kernel, and is taken only where the real kernel goes:
- in a fast path (a split over the engine's threads, the chunked sums, the tiled copy, the
  zero-skipping product, a big scatter), only where the real kernel takes that path, which
  the bug finds out as the scale tier does, with engine.backends.cpu.paths.recording(), or
  from the thread count and sizes. Plain mode (paths.plain: no fast path), which makes the
  scale tier's float64 reference, never meets it, and no fast-tier case is big enough to;
- in the general code (an edge, a layout, a branch), where every case that reaches it
  shows it.

The buggy kernels compute with the real compiled kernels, called on other bounds, other
slices or other accumulators, or they run the real one and then undo what the bug would
not have done. An element the bug never writes keeps what the buffer held before: NaN on
the poisoned memory gradcheck runs the engine under test on (gradcheck.adapters.
engine_adapter), a lucky zero on fresh memory. A race is made deterministic: of two writers
of one element, the later one wins.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from engine.backends.cpu import attention as cpu_attention
from engine.backends.cpu import layout, paths, threads
from engine.backends.cpu.jit import bindable
from engine.tensor import is_half

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


# --- sum (engine.backends.cpu.reduce) -----------------------------------------------------------
def sum_chunks_drop_tail(prepare):
    """sum:chunks: when x.size is not a multiple of the chunk count, the last chunk stops
    one element short (its bound taken as size - 1): the last element is never added."""
    def mutated(out, ins, **params):
        run, chunked = prepared(prepare, out, ins, params, "sum:chunks")
        if not chunked:
            return run
        x_flat, acc = run.args[0], run.args[1]          # call(_sum_all, x, acc, out)
        if x_flat.size % acc.shape[0] == 0:
            return run
        return functools.partial(run.func, x_flat[:-1], *run.args[1:])
    return mutated


def sum_chunks_overlap(prepare):
    """sum:chunks: each chunk runs one element past its bound (an inclusive end), so the
    first element of every chunk after the first is added twice."""
    def mutated(out, ins, **params):
        run, chunked = prepared(prepare, out, ins, params, "sum:chunks")
        if not chunked:
            return run
        x_flat, acc, flat_out = run.args[0], run.args[1], run.args[2]
        size = -(-x_flat.size // acc.shape[0])          # the kernel's chunk length

        def call():
            run()
            again = x_flat[size::size][:acc.shape[0] - 1]
            flat_out[0] += np.sum(again, dtype=np.float64)
        return call
    return mutated


def sum_rows_float32_accumulator(prepare):
    """sum:rows: the rows added into one accumulator row of the input's dtype (float32 for
    a float32 x) instead of float64 rows, one per chunk: a chain of float32 additions as
    long as the reduced axis (over 1.5 million rows a relative error of about 1e-5, well
    inside float32's fixed tolerance of 1e-3, 23 times torch's float32 error)."""
    def mutated(out, ins, **params):
        run, chunked = prepared(prepare, out, ins, params, "sum:rows")
        if not chunked:
            return run
        # call(_sum_rows, x, rows, run, acc, out, fmt)
        x, acc = ins[0], run.args[3]
        return functools.partial(run.func, *run.args[:3], np.empty((1, acc.shape[1]), x.dtype),
                                 *run.args[4:])
    return mutated


def sum_runs_split_drops_tail(prepare):
    """sum:runs_split: the ranges of kept elements given to the threads are n // parts
    long each, so the last n % parts kept elements are never summed (never written)."""
    def mutated(out, ins, **params):
        run, split = prepared(prepare, out, ins, params, "sum:runs_split")
        parts = threads.parts()
        covered = out.size // parts * parts
        if not split or covered == out.size:
            return run
        return unwritten(run, out.reshape(-1), slice(covered, None))
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


# --- the tiled transposed copy (engine.backends.cpu.layout) -------------------------------------
def tiled_copy_skips_ragged_rows(prepare):
    """cont of a transposed view: the tiled copy (copy:tiled) copies whole 8 x 8 tiles and
    the ragged columns, but not the rows past the last whole tile (x.shape[-2] % 8 of
    them, per thread's chunk), which are never written."""
    def mutated(out, ins, **params):
        run, tiled = prepared(prepare, out, ins, params, "copy:tiled")
        (x,) = ins
        whole = x.shape[-2] // 8 * 8
        if not tiled or whole == x.shape[-2]:
            return run
        return layout.copy_call(out[..., :whole, :], x[..., :whole, :])
    return mutated


# --- the zero-skipping product (engine.backends.cpu.matmul) -------------------------------------
def sparse_product_drops_last_nonzero(prepare):
    """matmul:sparse: each row of the sparse operand's CSR loses its last entry (its row
    end taken one short): that non-zero's term is missing from the product. Rows denser
    than 1 / SPARSE_ENTRY_COST (which a row split gives to BLAS) are left right."""
    from engine.backends.cpu.matmul import dense_lines

    def mutated(out, ins, **params):
        run = prepare(out, ins, **params)
        a, b = ins

        def call():
            with paths.recording() as took:
                run()
            side = next((p for p in took if p.startswith("matmul:sparse")), None)
            if side is None:
                return
            left = side.startswith("matmul:sparse_left")
            s, d, dest = (a, b, out) if left else (b.T, a.T, out.T)
            nonzero = s != 0
            counts = nonzero.sum(axis=1)
            rows = np.flatnonzero((counts > 0) & ~dense_lines(counts, s.shape[1]))
            last = s.shape[1] - 1 - np.argmax(nonzero[rows, ::-1], axis=1)
            dest[rows] -= s[rows, last][:, None] * d[last]
        return call
    return mutated


# --- get_rows_back's scatter-add (engine.backends.cpu.get_rows) ---------------------------------
def scatter_split_by_indices(kernel):
    """get_rows_back split among the engine's threads by ranges of the indices (instead of
    column bands) once the work is big enough to split: a table row indexed from two
    ranges is written by two threads, and one thread's adds are lost. Deterministically:
    each range's sums are written, not added, over the rows it indexes, in range order."""
    def mutated(out, ins, nrows):
        g, idx = ins
        parts = threads.parts()
        if parts == 1 or g.size + out.size < threads.MIN_ELEMENTS:
            return kernel(out, ins, nrows=nrows)
        g2, idx1 = g.reshape(-1, g.shape[-1]), idx.reshape(-1)
        out[...] = 0
        mine = np.empty_like(out)
        for lo, hi in threads.bounds(idx1.size, parts):
            kernel(mine, [g2[lo:hi], idx1[lo:hi]], nrows=nrows)    # this range's sums
            rows = np.unique(idx1[lo:hi])
            out[rows] = mine[rows]                     # a store where an add was due
    return mutated


# --- edges and layouts of the general kernels ------------------------------------------------
def pool_back_tiled_edge_unzeroed(kernel):
    """pool_2d_back (max, windows tiling the image, pool_2d_back:tiled): the rows and
    columns past the last window (H > OH*kh or W > OW*kw) are not zeroed; right only on a
    buffer that was zero before."""
    def mutated(out, ins, **params):
        kh, kw = params["kernel"]
        oh, ow = ins[0].shape[2], ins[0].shape[3]
        before = out.copy()
        with paths.recording() as took:
            kernel(out, ins, **params)
        if took["pool_2d_back:tiled"]:
            out[:, :, oh * kh:, :] = before[:, :, oh * kh:, :]
            out[:, :, :, ow * kw:] = before[:, :, :, ow * kw:]
    return mutated


def pad_border_unwritten(kernel):
    """pad copies x into the interior block but never zeroes the border (the padding):
    right only on a buffer that was zero before."""
    def mutated(out, ins, pads):
        before = out.copy()
        kernel(out, ins, pads=pads)
        interior = tuple(slice(b, b + n) for (b, _), n in zip(pads, ins[0].shape, strict=True))
        inside = out[interior].copy()
        out[...] = before
        out[interior] = inside
    return mutated


def softmax_ragged_row_sum(prepare):
    """softmax over rows whose length is not a multiple of 8: the row sum stops one element
    short, so every element is divided by the sum without the last exponential:
    y'_j = e_j / (S - e_last) = y_j / (1 - y_last)."""
    def mutated(out, ins, **params):
        run = prepare(out, ins, **params)
        if out.shape[-1] % 8 == 0:
            return run

        def call():
            run()
            with np.errstate(divide="ignore", invalid="ignore"):
                out[...] = out / (1.0 - out[..., -1:].astype(np.float64))
        return call
    return mutated


def dropout_mask_in_memory_order(kernel):
    """dropout of a strided (permuted) x: the mask taken by each element's position in x's
    memory instead of its index in the output (C order); right on contiguous inputs."""
    def mutated(out, ins, p, seed):
        (x,) = ins
        order = np.argsort([-s for s in x.strides], kind="stable")
        stored = x.transpose(order)                  # x in its memory's axis order
        if x.flags.c_contiguous or not stored.flags.c_contiguous:
            return kernel(out, ins, p=p, seed=seed)
        masked = np.empty(stored.shape, out.dtype)
        kernel(masked, [stored], p=p, seed=seed)
        out[...] = masked.transpose(np.argsort(order))
    return mutated


def hardswish_back_middle_slope_beyond_3(prepare):
    """hardswish_back: above 3 the slope of the middle piece, x/3 + 1/2, instead of 1 (the
    branch for x > 3 lost): only inputs beyond 3 show it."""
    def mutated(out, ins, **params):
        run = prepare(out, ins, **params)
        g, x = ins

        def call():
            run()
            beyond = np.asarray(x) > 3.0
            out[beyond] = (g * (x / 3.0 + 0.5))[beyond]
        return call
    return mutated


# --- the 16-bit floats (engine.backends.cpu.half) ---------------------------------------------
def sum_accumulated_in_half(real_sum):
    """sum on 16-bit nodes accumulated serially in the 16-bit type (each partial sum rounded
    to nearest in it) instead of in float32: over 256 rows of values in [0.5, 1] the
    partial sums reach 256, where float16's spacing is 0.25."""
    def mutated(out, ins, axes, keepdims):
        (x,) = ins
        if not is_half(out.dtype):
            return real_sum(out, ins, axes=axes, keepdims=keepdims)
        reduced = [a % x.ndim for a in axes]
        kept = [a for a in range(x.ndim) if a not in reduced]
        rows = np.transpose(x, reduced + kept).reshape(-1, *[x.shape[a] for a in kept])
        out[...] = np.add.accumulate(rows, axis=0, dtype=out.dtype)[-1].reshape(out.shape)
    return mutated


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
    def wrong(a):
        if a.dtype == np.float16:
            return widened_copy(a)
        h = np.ascontiguousarray(a).view(np.uint16).astype(np.uint32)
        return ((h >> 1) << 17).view(np.float32).reshape(a.shape)
    return wrong


def identity(real):
    """The control's change: none (the real kernel, preparation or chunking, wrapped)."""
    def same(*args, **kwargs):
        return real(*args, **kwargs)
    same.__name__ = getattr(real, "__name__", "same")
    return same


# --- attention (engine.backends.cpu.attention) -------------------------------------------------
def _attention_parts(ins):
    """attention_back's inputs as (g, q, k, v, mask or None, fwd)."""
    g, q, k, v, *rest = ins
    return g, q, k, v, (rest[0] if len(rest) == 2 else None), rest[-1]


def attention_back_without_d(real):
    """attention_back with the softmax Jacobian's -D_i dropped: dS = P (dP + g_lse) where
    it is P (dP - D_i + g_lse), D_i = sum_d dO_id O_id = sum_j P_ij dP_ij. The real kernel
    handed an lse gradient g_lse + D_i (D_i from g and fwd's saved O), which cancels its
    -D_i; dv (P^T dO) is untouched, as in the bug."""
    def kernel(out, ins, **params):
        g, q, k, v, mask, fwd = _attention_parts(ins)
        g2 = np.array(g)
        g2[..., -1] += np.einsum("...d,...d->...", g[..., :-1], fwd[..., :-1])
        real(out, [g2, q, k, v, *([] if mask is None else [mask]), fwd], **params)
    return kernel


def _wrong_lse(q, k, mask, scale, causal, logit_softcap, max_bias, masked, scaled):
    """Each row's log-sum-exp of attention's scores in float64, without the mask and
    the causal cut (`masked` False) or without `scale` (`scaled` False)."""
    from engine.backends.alibi_math import alibi_slopes
    hq, tq, tk = q.shape[-3], q.shape[-2], k.shape[-2]
    kr = np.repeat(np.asarray(k, np.float64), hq // k.shape[-3], axis=-3)
    s = np.asarray(q, np.float64) @ np.swapaxes(kr, -1, -2) * (scale if scaled else 1.0)
    if logit_softcap > 0.0:
        s = logit_softcap * np.tanh(s / logit_softcap)
    if masked and mask is not None:
        s = s + alibi_slopes(hq, max_bias)[:, None, None] * mask
    if masked and causal:
        s = np.where(np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq), -np.inf, s)
    m = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):          # rows with no visible key: NaN, unread
        return (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]


def attention_back_wrong_lse(masked=True, scaled=True):
    """attention_back recomputing P from a wrong log-sum-exp: the real kernel handed a fwd
    whose lse column is that of the scores without the mask and causal cut (masked False)
    or without the scale (scaled False)."""
    def make(real):
        def kernel(out, ins, **params):
            g, q, k, v, mask, fwd = _attention_parts(ins)
            f = np.array(fwd)
            f[..., -1] = _wrong_lse(q, k, mask, masked=masked, scaled=scaled, **params)
            real(out, [g, q, k, v, *([] if mask is None else [mask]), f], **params)
        return kernel
    return make


def attention_back_gqa_wrong_groups(real):
    """attention_back summing the K and V gradients of query head h into kv head h % Hkv
    instead of h // G (G = Hq / Hkv; P and dS still from the right kv head): the real
    kernel run on k and v repeated to every query head (each gets its own head's
    contribution), summed over the wrong groups."""
    def kernel(out, ins, **params):
        g, q, k, v, mask, fwd = _attention_parts(ins)
        hkv = k.shape[-3]
        group = q.shape[-3] // hkv
        kr, vr = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
        flat = np.empty(q.size + kr.size + vr.size, out.dtype)
        real(flat, [g, q, kr, vr, *([] if mask is None else [mask]), fwd], **params)
        pieces, at = [flat[:q.size]], q.size
        for full in (kr, vr):
            per_head = flat[at:at + full.size].reshape(full.shape)
            lead = full.shape[:-3]
            # query head h = i * hkv + c has h % hkv = c: the groups strided by hkv
            pieces.append(per_head.reshape(*lead, group, hkv, *full.shape[-2:])
                          .sum(axis=-4).reshape(-1))
            at += full.size
        out[...] = np.concatenate(pieces)
    return kernel


@contextlib.contextmanager
def _blocks_one_key_short():
    geometry = cpu_attention._Geometry
    real = geometry.keys

    def keys(self, i0, i1, tiled):
        n = real(self, i0, i1, tiled)
        return n - 1 if tiled and self.causal and 0 < n < self.tk else n
    geometry.keys = keys
    try:
        yield
    finally:
        geometry.keys = real


def attention_causal_skip_one_key_short(real):
    """attention's causal block skipping (attention:causal_skip) stops each query block's
    products one key before the last one its last row sees: that row loses its diagonal
    key. Only the tiled path (more than TILE query rows) computes blocks; the plain twin
    multiplies every key. The blocks are laid out when the kernel is prepared."""
    def prepare(out, ins, **params):
        with _blocks_one_key_short():
            return real.bind(out, ins, **params)
    prepare.__name__ = getattr(real, "__name__", "kernel")
    return bindable(prepare)
