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
permuted, sliced or stride-0 views; the kernel reads them through their strides as 4-D
views (unit axes in front: at most 4 axes, as ggml's tensors), and writes a C-contiguous
out. It never allocates. An output of at least threads.MIN_ELEMENTS elements (counting
the inputs) is split along axis 0 into chunks on the engine's threads (`split:cpu_<op>`).
"""

from __future__ import annotations

from engine import elementwise as table
from engine.backends.cpu import threads
from engine.backends.cpu.elementwise import row_index, scalar, specialise
from engine.backends.cpu.jit import bindable, call, prange

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
    """The CPU kernel of GLU op `op`: kernel(out, ins, swapped), ins [x] or [a, b]."""
    kernel = _specialise(op)

    def prepare(out, ins, swapped):
        a, b = halves(ins, out.shape[-1] if out.ndim else 1, swapped)
        return call(kernel, as_4d(a), as_4d(b), as_4d(out))
    prepare.__name__ = f"cpu_{op}"
    return threads.split(bindable(prepare), chunks=glu_chunks)
