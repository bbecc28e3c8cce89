"""CPU kernels of the elementwise ops of engine.elementwise's table, keyed by op name.

Every op gets kernels of its own, made from the templates below: each template is a plain,
vectorisable `prange` loop that calls scalar math by a global name (`forward`, `gradient`,
`widen`), and `specialise` makes a copy of it whose globals bind those names to the op
row's scalar math, compiled with numba.njit (engine.backends.compile_scalar), which LLVM
inlines into the loop. numba compiles each copy once per dtype and caches it on disk under
a name of its own (the template's, the op's and a digest of the row's source).

`unary(name)`, `unary_back(name)` and `binary(name)` make the kernels of the table's op
`name` (engine.ops registers each in its op's definition). A kernel's dispatcher takes the
op's output buffer and its inputs (possibly strided or broadcast views), and never
allocates.

Rows with `in_float64` (the activations) compute in float64 whatever the dtype, rounded
once when stored; but their plain kernels widen with `float()`, which numba types as a
float32 for a float32 element, so on float32 tensors the row's libm calls are float32's
(sin as sinf: within an ulp) and its arithmetic float32 where no float64 constant enters
(the vector kernels below widen to float64 truly). The plain unary ops and the binary ops
compute in the inputs' dtype. An op's float parameters reach its scalar math as a tuple in
the row's order (of the dtype the math computes in).

The ops of engine.backends.cpu.vector_unary.FAST (the activations on exp, tanh, erfc and
log1p, and exp and log) have a second pair of kernels for float32 outputs (16-bit ones
too, which reach them widened: engine.backends.cpu.half), compiled `contracting`: the
same values from vectorised float64 math instead of a libm call per element (the fast
path `vector:<op>`; its plain twin, the row's math, runs in plain mode and for float64).
"""

from __future__ import annotations

import types

import numba
import numpy as np

from engine import elementwise as table
from engine.backends import sequence
from engine.backends.compile_scalar import compile_scalar, source_digest
from engine.backends.cpu import layout, paths, threads
from engine.backends.cpu.jit import (
    CONTRACT,
    OPTIONS,
    bindable,
    call,
    parallel_kernel,
    prange,
    scalar_math,
)
from engine.backends.cpu.vector_unary import FAST

# the scalar math is compiled into each kernel that calls it (LLVM inlines it there) and
# cached with it; the functions themselves get no cache entries of their own
_scalar_jit = numba.njit(**{**OPTIONS, "cache": False})
_COMPILED: dict = {}


def scalar(fn):
    """Scalar function `fn` of the table compiled for the CPU (numba.njit)."""
    return compile_scalar(fn, _scalar_jit, _COMPILED)


# --- templates: the names forward, gradient and widen are bound per op (specialise) -------
def _map(x, out, params):
    """out[i] = forward(widen(x[i]), *params) over 1-D contiguous arrays (out may alias x);
    widen is float for rows computing in float64, else the identity."""
    for i in prange(x.size):
        out[i] = forward(widen(x[i]), *params)  # noqa: F821


def _gradient_map(g, x, out, params):
    """out[i] = gradient(g[i], float(x[i]), *params) = g f'(x) over 1-D contiguous arrays
    (out may alias x)."""
    for i in prange(x.size):
        out[i] = gradient(g[i], float(x[i]), *params)  # noqa: F821


def _vector_map(x, out, params):
    """out[i] = forward(float64 of x[i], params) over 1-D contiguous arrays (out may alias
    x): a vector_unary function, params a tuple."""
    for i in prange(x.size):
        out[i] = forward(_float64(x[i]), params)  # noqa: F821


def _vector_gradient_map(g, x, out, params):
    """out[i] = gradient(g[i], float64 of x[i], params) over 1-D contiguous arrays."""
    for i in prange(x.size):
        out[i] = gradient(g[i], _float64(x[i]), params)  # noqa: F821


@scalar_math
def _float64(v):
    """v in float64: the vector kernels' widening (numba types float() of a float32 as a
    float32)."""
    return np.float64(v)


def _binary_flat(a, b, out):
    """out[i] = forward(a[i], b[i]) over 1-D contiguous arrays of one size."""
    for i in prange(out.size):
        out[i] = forward(a[i], b[i])  # noqa: F821


def _binary_rows(a, a_rows, a_step, b, b_rows, b_step, out, run):
    """Row r of a broadcast binary op (see engine.backends.cpu.layout):
    out[r run + j] = forward(a[a_rows[r] + a_step j], b[b_rows[r] + b_step j]), steps 0
    or 1. Each case is a loop over contiguous slices, which LLVM vectorises."""
    for r in prange(a_rows.size):
        o = out[r * run:(r + 1) * run]
        ao = a_rows[r]
        bo = b_rows[r]
        if a_step == 1 and b_step == 1:
            x = a[ao:ao + run]
            y = b[bo:bo + run]
            for j in range(run):
                o[j] = forward(x[j], y[j])  # noqa: F821
        elif a_step == 1:
            x = a[ao:ao + run]
            w = b[bo]
            for j in range(run):
                o[j] = forward(x[j], w)  # noqa: F821
        elif b_step == 1:
            v = a[ao]
            y = b[bo:bo + run]
            for j in range(run):
                o[j] = forward(v, y[j])  # noqa: F821
        else:
            value = forward(a[ao], b[bo])  # noqa: F821
            for j in range(run):
                o[j] = value


@scalar_math
def row_index(r, d1, d2):
    """(i0, i1, i2): where row r of the d0*d1*d2 rows of a (d0, d1, d2, d3) array lies
    (the 4-D templates' outer loop, here and in engine.backends.cpu.glu)."""
    return r // (d1 * d2), (r // d2) % d1, r % d2


def _binary_4d(a, b, out):
    """out = forward(a, b) over 4-D arrays of out's shape (any strides; the general
    fallback)."""
    d0, d1, d2, d3 = out.shape
    for r in prange(d0 * d1 * d2):
        i0, i1, i2 = row_index(r, d1, d2)
        for i3 in range(d3):
            out[i0, i1, i2, i3] = forward(a[i0, i1, i2, i3], b[i0, i1, i2, i3])  # noqa: F821


def specialise(template, op_name: str, *sources, options=None, **bound):
    """`template` compiled for op `op_name` (serial and parallel, jit.parallel_kernel, with
    numba `options` beside jit's), its global names `bound` to compiled scalar math.
    numba's disk cache keys a function by its qualified name: each op's copy gets its own,
    which also carries the digest of the row's `sources`, so that editing a row's math (in
    another file than this one, which is all numba watches) recompiles it."""
    fn = types.FunctionType(template.__code__, {**template.__globals__, **bound},
                            f"{template.__name__}__{op_name}")
    fn.__qualname__ = f"{template.__qualname__}__{op_name}_{source_digest(*sources)}"
    fn.__doc__ = template.__doc__
    return parallel_kernel(fn, **(options or {}))


def _vector_twin(template, op_name: str, fn, **bound):
    """`template` for op `op_name`'s float32 fast path, its global names `bound` to
    vector_unary's `fn` (whose source keys the cache name), compiled contracting."""
    return specialise(template, op_name, fn.py_func, options=CONTRACT, **bound)


def _choice(op_name: str, plain, vector):
    """pick(dtype) -> (kernel, cast): for a float32 output, outside plain mode, op
    `op_name`'s vector kernel (fast path `vector:<op>`, parameters as floats); else its
    plain one (cast None: the caller's)."""
    def pick(dtype):
        if vector is not None and dtype == np.float32 and not paths.PLAIN:
            paths.taken(f"vector:{op_name}")
            return vector, float
        return plain, None
    return pick


# --- dispatchers: the kernel of op `name`, kernel(out, ins, **params) -----------------------
def _map_dispatcher(op_name, pick, args):
    """kernel(out, [x], **params) running the map kernel pick(out's dtype) gives (with the
    cast of its parameters) with args(out's dtype, params, cast): a strided x is first
    copied into out (layout.copy_call: a transposed view in tiles, any other by numpy,
    whose copy picks the best loop order for any strides) and mapped in place."""
    def prepare(out, ins, **params):
        (x,) = ins
        kernel, cast = pick(out.dtype)
        flat_out = out.reshape(-1)
        src = x.reshape(-1) if x.flags.c_contiguous else flat_out
        run = call(kernel, src, flat_out, args(out.dtype, params, cast))
        return run if x.flags.c_contiguous else sequence(layout.copy_call(out, x), run)
    prepare.__name__ = f"cpu_{op_name}"
    return threads.split(bindable(prepare))


def unary(name: str):
    """The kernel of unary op `name` of the table: kernel(out, [x], **params); for `cont`
    (engine.ops.shape's), the copy alone."""
    if name == "cont":
        return cont
    row = table.UNARY[name]
    widen = float if row.in_float64 else scalar(table.identity)
    plain = specialise(_map, name, row.forward, forward=scalar(row.forward), widen=widen)
    fast = FAST.get(name)
    vector = fast and _vector_twin(_vector_map, name, fast.forward, forward=fast.forward)
    return _map_dispatcher(name, _choice(name, plain, vector),
                           lambda dtype, params, cast: row.kernel_args(
                               name, params, cast or (float if row.in_float64 else dtype.type)))


def unary_back(name: str):
    """The kernel of `<name>_back`: kernel(out, [g, x], **params) = g f'(x) in one pass,
    for unary op `name` of the table. g must be C-contiguous (the op's builder makes it
    so); a strided x is gathered into out and mapped in place."""
    row = table.UNARY[name]
    plain = specialise(_gradient_map, name, row.gradient, gradient=scalar(row.gradient))
    fast = FAST.get(name)
    vector = fast and fast.gradient and _vector_twin(_vector_gradient_map, name,
                                                     fast.gradient, gradient=fast.gradient)
    pick = _choice(row.back_name, plain, vector)

    def prepare(out, ins, **params):
        g, x = ins
        kernel, _ = pick(out.dtype)
        flat_out = out.reshape(-1)
        src = x.reshape(-1) if x.flags.c_contiguous else flat_out
        run = call(kernel, g.reshape(-1), src, flat_out, row.kernel_args(row.back_name, params))
        return run if x.flags.c_contiguous else sequence(layout.copy_call(out, x), run)
    prepare.__name__ = f"cpu_{row.back_name}"
    return threads.split(bindable(prepare))


def binary(name: str):
    """The kernel of binary op `name` of the table: kernel(out, [a, b]) with numpy
    broadcasting. Same-shape contiguous operands run flat; broadcast ones as rows
    (layout.Rows: a bias over the rows of a matrix, a channel bias over images); other
    layouts as 4-D views."""
    row = table.BINARY[name]
    forward = scalar(row.forward)
    flat, by_rows, general = (specialise(t, name, row.forward, forward=forward)
                              for t in (_binary_flat, _binary_rows, _binary_4d))

    def prepare(out, ins):
        a, b = ins
        if a.shape == b.shape == out.shape and a.flags.c_contiguous and b.flags.c_contiguous:
            return call(flat, a.reshape(-1), b.reshape(-1), out.reshape(-1))
        rows = layout.Rows.of(out.shape, [a, b]) if out.flags.c_contiguous else None
        if rows is not None:
            (ab, bb), (ar, br), (sa, sb) = rows.bases, rows.offsets, rows.steps
            return call(by_rows, ab, ar, sa, bb, br, sb, out.reshape(-1), rows.run)
        return _binary_views(general, np.broadcast_to(a, out.shape),
                             np.broadcast_to(b, out.shape), out)
    prepare.__name__ = f"cpu_{name}"
    return threads.split(bindable(prepare))


def _binary_views(kernel, a, b, out):
    """The general case: coalesced axes as 4-D views, a loop in Python over any more."""
    dims = layout.coalesce(out.shape, a.strides, b.strides, out.strides) or [(1, [0, 0, 0])]
    pad = [(1, [0, 0, 0])] * max(4 - len(dims), 0)
    dims = pad + dims
    shape = [n for n, _ in dims]
    views = [layout.as_strided(arr, shape, [st[k] for _, st in dims])
             for k, arr in enumerate((a, b, out))]
    lead = len(dims) - 4
    return sequence(*(call(kernel, *(v[idx] for v in views))
                      for idx in np.ndindex(*shape[:lead])))   # several for > 4 axes only


_copy = specialise(_map, "copy", table.identity, forward=scalar(table.identity),
                    widen=scalar(table.identity))


def _cont_prepare(out, ins):
    """cont: a contiguous x copied by the copy map, a strided one gathered into out."""
    (x,) = ins
    if x.flags.c_contiguous:
        return call(_copy, x.reshape(-1), out.reshape(-1), ())
    return layout.copy_call(out, x)


_cont_prepare.__name__ = "cpu_cont"
cont = threads.split(bindable(_cont_prepare))
