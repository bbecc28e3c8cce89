"""CPU kernels of the GLU family (engine.ops.glu): out = act(a) * b elementwise, with a and
b the two halves of one input's last axis (fused) or two inputs of one shape (split).

    fused:   x of shape (..., 2n)   a = x[..., :n], b = x[..., n:]   (swapped: exchanged)
    split:   a, b of shape (..., n)
    out[...] = act(a[...]) * b[...]                                  shape (..., n)

One kernel source serves every activation: the template `_glu_4d` calls the scalar math by
the global name `forward`, and `glu(op)` makes a copy of it whose `forward` is the
activation's row of engine.elementwise, compiled with numba.njit (as
engine.backends.cpu.elementwise does for the table's own kernels), under a cache name of
its own. The product is taken in float64 and rounded once when stored; 16-bit inputs
reach the kernel widened to float32 (engine.backends.cpu.half).

Layouts: the halves of a fused input are strided views of it, and split inputs may be
permuted, sliced or stride-0 views; the kernel reads a fused input's halves through their
strides as 4-D views (unit axes in front: at most 4 axes, as ggml's tensors), split inputs
that are not C-contiguous copied first (layout.dense: one compiled layout for all of them,
where each layout its inputs came in compiled the kernel again), and writes a C-contiguous
out. An output of at least threads.MIN_ELEMENTS elements (counting
the inputs) is split along axis 0 into chunks on the engine's threads (`split:cpu_<op>`).

That kernel is the plain twin. The activations of engine.backends.cpu.vector_unary.FAST
(all but reglu's relu) also have vector kernels (the fast path `vector:<op>`, as the
activations' own, engine.backends.cpu.elementwise): out = rounded(f(a) b), f the
activation's vectorised float64 math, the product in float64 and rounded once, so that
each element is within 0.5001 ulp of float32 of act(a) b (f's own bound: the product of
two float64 values adds half an ulp of float64); geglu_erf's and swiglu's float32 kernels
take their activation's float32 math (vector_unary.gelu_erf_f32 and silu_f32: its bound
plus the product's half ulp), so that a gate of one still gives the activation's bits. A
libm call per element kept LLVM from vectorising the plain loop: geglu_erf's forward and
backward over a fused (2048, 8192) input ran 4.0 times torch's, geglu 3.0, geglu_quick 2.1
(python bench/bench_ops.py --op geglu_erf --repeat 7 --threads 1, load 2-6). They take a
float32 output, and a 16-bit one as its patterns in one pass (patterns.value and rounded:
no widened copies), f there the activation's float32 math where it has one (vector_unary's
forward16: swiglu, geglu_erf, geglu_quick), as the activation's own 16-bit kernels take
it, so that a gate of one gives their bits (the product still in float64, rounded once); a
contiguous fused input or contiguous split inputs as rows of flat arrays
(`_vector_glu_rows`, whose row slices are contiguous, so that the loop vectorises), inputs
in any other layout copied C-contiguous first (layout.dense). Those took a 4-D strided
twin of the template, compiled again for every layout: 48 compilations, 21 s of CPU of the
202 s a cold `gradcheck --all` spent compiling (`python bench/bench_first_run.py
--breakdown`, load 5-6), for layouts that only gradcheck's transposed and sliced cases
make.
"""

from __future__ import annotations

from engine import elementwise as table
from engine.backends.calls import sequence
from engine.backends.cpu import half, layout, threads
from engine.backends.cpu.elementwise import (
    F32,
    by_output,
    dispatcher,
    float32,
    float32_element,
    row_index,
    scalar,
    specialise,
)
from engine.backends.cpu.jit import CONTRACT, call, prange
from engine.backends.cpu.patterns import as_patterns, rounded, value
from engine.backends.cpu.vector_unary import FAST
from engine.tensor import is_half

# op -> the elementwise row of its activation (ggml's GLU_OP_* and their unary ops)
ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu", "geglu_erf": "gelu_erf",
               "geglu_quick": "gelu_quick", "reglu": "relu"}
MAX_DIMS = 4


def _glu_4d(a, b, out):
    """out[i] = forward(a[i]) * b[i] in float64 over 4-D views of out's shape (a, b any
    strides; `forward` is bound per activation)."""
    d0, d1, d2, d3 = out.shape
    for r in prange(d0 * d1 * d2):
        i0, i1, i2 = row_index(r, d1, d2)
        for i3 in range(d3):
            out[i0, i1, i2, i3] = (forward(float(a[i0, i1, i2, i3]))  # noqa: F821
                                   * float(b[i0, i1, i2, i3]))


FMT = half.F16      # the vector templates' 16-bit format: each copy binds its own


def _vector_glu_rows(a, a0, b, b0, step, out, n, params):
    """out[r n + j] = rounded(forward(a[a0 + r step + j]) b[b0 + r step + j]) over flat
    contiguous arrays (a and b may be one array, a fused input: a0 and b0 its halves'
    offsets, step its row length), the product in float64; 16-bit arrays as patterns of
    format FMT; forward a vector_unary function of a float64, params a tuple."""
    rows = out.size // n if n else 0
    for r in prange(rows):
        ar = a[a0 + r * step:a0 + r * step + n]
        br = b[b0 + r * step:b0 + r * step + n]
        orow = out[r * n:(r + 1) * n]
        for j in range(n):
            orow[j] = rounded(forward(arith(value(ar[j], FMT)), params)  # noqa: F821
                              * value(br[j], FMT), orow, FMT)


def _vector_kernels(op: str):
    """{F32: rows, F16: rows, BF16: rows}: the vector template bound to op's activation's
    vectorised math, compiled contracting: the float64 math for float32 outputs, and for
    16-bit ones the math the activation's own 16-bit kernels take (its float32 math where
    it has one, vector_unary's forward16; elementwise._vector_kernels), so that a gate of
    one gives the activation's bits; None for an activation without any (reglu)."""
    fast = FAST.get(ACTIVATIONS[op])
    if fast is None:
        return None

    def one(label, fmt, fn, arith, **more):
        return specialise(_vector_glu_rows, f"{op}_{label}", fn.py_func, options=CONTRACT,
                          forward=fn, FMT=fmt, arith=arith, **more)
    kernels = by_output(one, fast.forward, fast.forward16)
    if fast.forward32 is not None:      # geglu_erf, swiglu: float32 math, read as the op's own
        kernels[F32] = one("f32_in_f32", half.F16, fast.forward32, float32,
                           value=float32_element)
    return kernels


def _flat_rows(out, ins, swapped):
    """(a, a0, b, b0, step): a contiguous fused input [x] or contiguous split inputs [a, b]
    as flat arrays with their halves' offsets and row length (_vector_glu_rows)."""
    n = out.shape[-1] if out.ndim else 1
    if len(ins) == 2:
        return ins[0].reshape(-1), 0, ins[1].reshape(-1), 0, n
    x = ins[0].reshape(-1)
    return x, (n if swapped else 0), x, (0 if swapped else n), 2 * n


def _specialise(op: str):
    """_glu_4d with `forward` bound to op's activation, under a cache name of its own that
    carries the digest of the activation's source (numba watches this file only)."""
    row = table.UNARY[ACTIVATIONS[op]]
    return specialise(_glu_4d, op, row.forward, forward=scalar(row.forward))


def halves(ins, n: int, swapped: bool):
    """(a, b): the activated input and the gate, from the fused [x] (its last axis cut at
    n, exchanged when `swapped`) or the split [a, b]; views, never copies."""
    if len(ins) == 2:
        return ins[0], ins[1]
    (x,) = ins
    first, second = x[..., :n], x[..., n:]
    return (second, first) if swapped else (first, second)


def as_4d(arr):
    """`arr` with unit axes in front up to 4 axes (a view)."""
    return arr[(None,) * (MAX_DIMS - arr.ndim)]


def glu_chunks(out, ins, parts: int):
    """Chunks along axis 0 of out, every input sliced with it (a fused input's axis 0 is
    out's, only its last axis is twice as long), or None below threads.MIN_ELEMENTS or for
    one axis (a 1-D fused input could not be sliced with out)."""
    if out.ndim < 2 or out.size + sum(a.size for a in ins) < threads.MIN_ELEMENTS:
        return None
    return [(out[lo:hi], [a[lo:hi] for a in ins])
            for lo, hi in threads.bounds(out.shape[0], parts)]


def glu(op: str):
    """The CPU kernel of GLU op `op`: kernel(out, ins, swapped), ins [x] or [a, b]; the
    vector kernels for a float32 or 16-bit out outside plain mode (the path `vector:<op>`,
    elementwise.dispatcher), else the plain one (16-bit through float32 temporaries)."""
    kernel = _specialise(op)
    vector = _vector_kernels(op)

    def plain_call(out, ins, params):
        copies: list = []
        if len(ins) == 2:                    # a fused input's halves are strided anyway
            ins = [layout.dense(t, copies) for t in ins]
        a, b = halves(ins, out.shape[-1] if out.ndim else 1, params["swapped"])
        return sequence(*copies, call(kernel, as_4d(a), as_4d(b), as_4d(out)))

    def vector_call(out, ins, params, fmt):
        copies: list = []
        ins = [layout.dense(t, copies) for t in ins]
        a, a0, b, b0, step = _flat_rows(out, ins, params["swapped"])
        return sequence(*copies, call(
            vector[fmt if is_half(out.dtype) else F32], as_patterns(a), a0, as_patterns(b),
            b0, step,
            as_patterns(out).reshape(-1), out.shape[-1] if out.ndim else 1, ()))
    return dispatcher(op, plain_call, vector and vector_call, native=True, chunks=glu_chunks)
