"""CUDA kernels of the block and tiling ops: concat, pad, set, acc, repeat, repeat_back.

Every kernel is a gather: one thread computes one output element (a grid-stride loop over
the C-contiguous output, engine.backends.cuda.launch) and reads the inputs it needs, so each
element is written exactly once, with no atomics, and the result never depends on the launch
configuration. Arrays are brought to rank 4 with unit axes in front (arrays.with_rank);
inputs may be strided views.

concat, pad, set and acc are one kernel, `_fill_block`: a block of the output, lo <= i < hi
on every axis, is read from `inside` at i - lo, and the rest of the output from `outside`:

    SELECT:  out[i] = inside[i - lo] in the block,              outside[i] elsewhere
    ADD:     out[i] = outside[i] + inside[i - lo] in the block, outside[i] elsewhere
    ZERO:    out[i] = inside[i - lo] in the block,              0 elsewhere

set is SELECT (outside = a, inside = b at `offset`), acc is ADD, pad is ZERO (inside = x at
the `before` pads), and concat is SELECT with outside = a (only read where the output lies
before b's block, that is inside a) and inside = b at offset n_a along `axis`.

repeat and repeat_back tile x's shape s (left-padded with 1s) r times per axis:

    repeat(x)[i]      = x[i mod s]
    repeat_back(g)[k] = sum over tiles (t0, t1, t2, t3), in that lexicographic order, of
                        g[t*s + k], accumulated in float64 from 0 (rounded once
                        to g's dtype at the end),

the CPU kernel's order, so both backends give the same bits.
"""

from __future__ import annotations

from numba import cuda, float64

from engine.backends.cuda.arrays import with_rank
from engine.backends.cuda.launch import grid_stride, unravel4
from engine.errors import BackendError

RANK = 4                                   # kernels see every array with four axes
SELECT, ADD, ZERO = 0, 1, 2                # the modes of _fill_block


@cuda.jit
def _fill_block(out, outside, inside, lo, hi, mode):
    """out = inside on the block lo <= i < hi, outside (or 0) elsewhere: see the module doc
    for the three modes. All arrays 4-D; lo, hi: 4-tuples of output indices."""
    _, n1, n2, n3 = out.shape
    zero = out.dtype.type(0)
    for flat in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(flat, n1, n2, n3)
        in_block = (lo[0] <= i0 < hi[0] and lo[1] <= i1 < hi[1] and lo[2] <= i2 < hi[2]
                    and lo[3] <= i3 < hi[3])
        if in_block:
            value = inside[i0 - lo[0], i1 - lo[1], i2 - lo[2], i3 - lo[3]]
            if mode == ADD:
                value = outside[i0, i1, i2, i3] + value
        elif mode == ZERO:
            value = zero
        else:
            value = outside[i0, i1, i2, i3]
        out[i0, i1, i2, i3] = value


@cuda.jit
def _repeat(out, x):
    """out[i] = x[i mod x.shape] per axis (4-D arrays, out's sides multiples of x's)."""
    s0, s1, s2, s3 = x.shape
    _, n1, n2, n3 = out.shape
    for flat in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(flat, n1, n2, n3)
        out[i0, i1, i2, i3] = x[i0 % s0, i1 % s1, i2 % s2, i3 % s3]


@cuda.jit
def _repeat_back(out, g):
    """out[k] = sum over tiles t, lexicographically, of g[t*s + k], s = out.shape (4-D
    arrays, g's sides multiples of out's), accumulated in float64."""
    s0, s1, s2, s3 = out.shape
    r0, r1, r2, r3 = g.shape[0] // s0, g.shape[1] // s1, g.shape[2] // s2, g.shape[3] // s3
    for flat in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        k0, k1, k2, k3 = unravel4(flat, s1, s2, s3)
        total = float64(0)               # as the CPU kernel's accumulators (the simulator too)
        for t0 in range(r0):
            for t1 in range(r1):
                for t2 in range(r2):
                    for t3 in range(r3):
                        total += g[t0 * s0 + k0, t1 * s1 + k1, t2 * s2 + k2, t3 * s3 + k3]
        out[k0, k1, k2, k3] = total


# --- dispatchers ----------------------------------------------------------------------------
def _rank4(op: str, out, ins):
    """out and ins as 4-D views (unit axes in front), or BackendError beyond four axes."""
    if out.ndim > RANK or any(a.ndim > RANK for a in ins):
        shapes = ", ".join(str(list(a.shape)) for a in (out, *ins))
        raise BackendError(f"{op}: the cuda kernel takes at most {RANK} axes, got shapes "
                           f"{shapes} (out first)")
    return with_rank(out, RANK), [with_rank(a, RANK) for a in ins]


def _padded(values, ndim: int, fill: int) -> tuple[int, ...]:
    """Per-axis `values` of an ndim-axis array for its rank-4 view (fill on the new axes)."""
    return (fill,) * (RANK - ndim) + tuple(int(v) for v in values)


def _launch_fill_block(op, out, outside, inside, lo, mode):
    """_fill_block over out with the block of inside's shape at lo (per axis of out)."""
    if out.size == 0:
        return
    hi = [o + n for o, n in zip(lo, inside.shape, strict=True)]
    lo, hi = _padded(lo, out.ndim, 0), _padded(hi, out.ndim, 1)
    out4, (outside4, inside4) = _rank4(op, out, [outside, inside])
    grid_stride(_fill_block, out.size, out4, outside4, inside4, lo, hi, mode)


def cuda_concat(out, ins, axis):
    """Dispatcher of concat: kernel(out, [a, b], axis)."""
    a, b = ins
    lo = [0] * out.ndim
    lo[axis] = a.shape[axis]
    _launch_fill_block("concat", out, a, b, lo, SELECT)


def cuda_pad(out, ins, pads):
    """Dispatcher of pad: kernel(out, [x], pads), pads = ((before, after), ...) per axis."""
    (x,) = ins
    _launch_fill_block("pad", out, x, x, [before for before, _ in pads], ZERO)


def cuda_set(out, ins, offset):
    """Dispatcher of set: kernel(out, [a, b], offset)."""
    a, b = ins
    _launch_fill_block("set", out, a, b, offset, SELECT)


def cuda_acc(out, ins, offset):
    """Dispatcher of acc: kernel(out, [a, b], offset)."""
    a, b = ins
    _launch_fill_block("acc", out, a, b, offset, ADD)


def cuda_repeat(out, ins, shape):
    """Dispatcher of repeat: kernel(out, [x], shape)."""
    if out.size == 0:
        return
    out4, (x4,) = _rank4("repeat", out, ins)
    grid_stride(_repeat, out.size, out4, x4)


def cuda_repeat_back(out, ins, shape):
    """Dispatcher of repeat_back: kernel(dx, [g], shape), shape = dx's shape."""
    if out.size == 0:
        return
    out4, (g4,) = _rank4("repeat_back", out, ins)
    grid_stride(_repeat_back, out.size, out4, g4)


# --- signatures for the cuda-compile check --------------------------------------------------
def _signatures():
    """Every kernel for float32 and float64, with contiguous and with strided inputs."""
    sigs = []
    for dt in ("float32", "float64"):
        out, dense, view = f"{dt}[:, :, :, ::1]", f"{dt}[:, :, :, ::1]", f"{dt}[:, :, :, :]"
        for src in (dense, view):
            sigs += [(_fill_block, f"void({out}, {src}, {src}, UniTuple(int64, 4), "
                                   "UniTuple(int64, 4), int64)"),
                     (_repeat, f"void({out}, {src})"),
                     (_repeat_back, f"void({out}, {src})")]
    return sigs


PTX_SIGNATURES = _signatures()
