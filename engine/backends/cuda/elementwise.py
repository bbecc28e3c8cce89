"""CUDA kernels of the elementwise ops of engine.elementwise's table, keyed by op name, and
the copies cont and broadcast_to.

Each computes what its CPU kernel (engine.backends.cpu.elementwise) computes, element by
element, from the same scalar math: the table's functions compiled as CUDA device functions
(engine.backends.compile_scalar). Plain unary ops and binary ops compute in the tensor's
dtype; activations and their gradients in float64, rounded once when stored. An op's float
parameters reach its scalar math as a tuple in the row's order.

Every op gets kernels of its own (`kernels(name)`, kept in KERNELS): copies of the templates
below whose global names `forward`, `gradient` and `widen` are bound to the op's compiled
scalar math (widen is float for rows computing in float64, the identity otherwise). Op
definitions name them "engine.backends.cuda.elementwise:cuda_<op>": the module's
`__getattr__` makes `cuda_<op>` for any op of the table, a row added later included.

Layouts: `out` is C-contiguous, the inputs any strided views (permuted; broadcast, stride
0). A dispatcher broadcasts every input to out's shape and merges the axes that are
contiguous in every operand. One axis left with unit strides: a flat kernel over 1-D
views. Otherwise a strided kernel over 4-D views: a leading unit axis of stride 0, then up
to 3 merged axes (more: one launch per index of the leading ones). The stride-0 axis makes
numba type every strided view with layout "A", so one compilation per dtype serves all
layouts (a view without one may be typed "C" or "F", a compilation of its own).

Every kernel is a grid-stride loop over out's elements in C order. Under the simulator,
Python evaluates the math: log or sqrt of a negative number raise there (the samples keep
their inputs inside the domains); and a launch there has at most SIM_BLOCKS blocks of
SIM_THREADS threads (engine.backends.cuda.launch.map_shape), since each thread is a Python
thread, costly to start. Each thread then loops over more elements; no value changes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import types

import numpy as np
from numba import cuda

from engine import elementwise as table
from engine.backends.compile_scalar import compile_scalar
from engine.backends.cpu.layout import coalesce
from engine.backends.cuda.arrays import broadcast, strided
from engine.backends.cuda.launch import map_shape, unravel4

STRIDED_AXES = 3        # merged axes per launch of a strided kernel (its views have 4)

_device_jit = cuda.jit(device=True)
_COMPILED: dict = {}


def scalar(fn):
    """Scalar function `fn` of the table compiled as a CUDA device function."""
    return compile_scalar(fn, _device_jit, _COMPILED)


# --- templates: out[i] for i = grid-stride over out's elements (names bound per op) ---------
def _map_flat(x, out, params):
    """out[i] = forward(widen(x[i]), *params); 1-D contiguous arrays."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = forward(widen(x[i]), *params)  # noqa: F821


def _map_strided(x, out, params):
    """out[i] = forward(widen(x[j]), *params), j the 4-D index of position i in x's shape."""
    _, d1, d2, d3 = x.shape
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        out[i] = forward(widen(x[i0, i1, i2, i3]), *params)  # noqa: F821


def _gradient_flat(g, x, out, params):
    """out[i] = gradient(g[i], float(x[i]), *params) = g f'(x); 1-D contiguous arrays."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = gradient(g[i], float(x[i]), *params)  # noqa: F821


def _gradient_strided(g, x, out, params):
    """out[i] = gradient(g[j], float(x[j]), *params), j the 4-D index of position i."""
    _, d1, d2, d3 = x.shape
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        out[i] = gradient(g[i0, i1, i2, i3], float(x[i0, i1, i2, i3]), *params)  # noqa: F821


def _binary_flat(a, b, out):
    """out[i] = forward(a[i], b[i]); 1-D contiguous arrays."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = forward(a[i], b[i])  # noqa: F821


def _binary_strided(a, b, out):
    """out[i] = forward(a[j], b[j]), j the 4-D index of position i (broadcast views)."""
    _, d1, d2, d3 = a.shape
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = unravel4(i, d1, d2, d3)
        out[i] = forward(a[i0, i1, i2, i3], b[i0, i1, i2, i3])  # noqa: F821


@dataclasses.dataclass
class Kernels:
    """The kernel of op `name` (table row `row`; None for the copy), compiled over flat
    arrays and over strided 4-D views."""

    name: str
    row: object
    flat: object
    strided: object

    def signatures(self, t: str) -> tuple[str, str]:
        """The argument types of (flat, strided) for dtype `t`: flat arrays C-contiguous
        1-D, strided ones 4-D of layout "A", the parameters a tuple of float64 (of the dtype
        for rows computing in it)."""
        flat, view = f"{t}[::1]", f"{t}[:, :, :, :]"
        row = self.row
        if row is None:
            inputs, params = 1, ["Tuple(())"]
        elif isinstance(row, table.Binary):
            inputs, params = 2, []
        elif self.name == row.back_name:
            inputs, params = 2, [_tuple_type(len(row.params), "float64")]
        else:
            inputs = 1
            params = [_tuple_type(len(row.params), "float64" if row.in_float64 else t)]
        return tuple(f"void({', '.join([kind] * inputs + [flat, *params])})"
                     for kind in (flat, view))


def _tuple_type(n: int, t: str) -> str:
    return f"UniTuple({t}, {n})" if n else "Tuple(())"


def _specialise(template, op_name, **bound):
    """`template` for op `op_name`: a copy whose global names `bound` are its scalar math."""
    fn = types.FunctionType(template.__code__, {**template.__globals__, **bound},
                            f"{template.__name__}__{op_name}")
    fn.__doc__ = template.__doc__
    return cuda.jit(fn)


def _make(name: str, row) -> Kernels:
    if row is None:                                  # the copy of cont and broadcast_to
        same = scalar(table.identity)
        templates, bound = (_map_flat, _map_strided), {"forward": same, "widen": same}
    elif isinstance(row, table.Binary):
        templates, bound = (_binary_flat, _binary_strided), {"forward": scalar(row.forward)}
    elif name == row.back_name:
        templates = (_gradient_flat, _gradient_strided)
        bound = {"gradient": scalar(row.gradient)}
    else:
        templates = (_map_flat, _map_strided)
        bound = {"forward": scalar(row.forward),
                 "widen": float if row.in_float64 else scalar(table.identity)}
    flat, strided_kernel = (_specialise(t, name, **bound) for t in templates)
    return Kernels(name, row, flat, strided_kernel)


def _row_of(name: str):
    """The table row of op `name` (a unary row, `<row>_back`, or a binary row); None for
    the copy."""
    if name == "copy":
        return None
    if name in table.UNARY:
        return table.UNARY[name]
    if name in table.BINARY:
        return table.BINARY[name]
    base = name.removesuffix("_back")
    if base != name and base in table.UNARY and table.UNARY[base].gradient is not None:
        return table.UNARY[base]
    raise KeyError(f"{name} is no op of the elementwise table")


KERNELS: dict[str, Kernels] = {}    # op name -> its kernels, made on first use


def kernels(name: str) -> Kernels:
    """The kernels of op `name` of the table (or of `copy`), made once per table row."""
    row = _row_of(name)
    made = KERNELS.get(name)
    if made is None or made.row is not row:
        made = KERNELS[name] = _make(name, row)
    return made


def _signatures():
    """(kernel, signature) of every compilation the dispatchers launch: every op of the
    table (and the copy), both dtypes, both layouts (Kernels.signatures)."""
    names = ["copy", *table.UNARY, *table.BINARY,
             *(u.back_name for u in table.UNARY.values() if u.back_name)]
    sigs = []
    for name in names:
        k = kernels(name)
        for t in ("float32", "float64"):
            flat_sig, strided_sig = k.signatures(t)
            sigs += [(k.flat, flat_sig), (k.strided, strided_sig)]
    copy = kernels("copy")       # cast's conversions: the copy from one dtype into the other
    for src, dst in (("float32", "float64"), ("float64", "float32")):
        sigs += [(copy.flat, f"void({src}[::1], {dst}[::1], Tuple(()))"),
                 (copy.strided, f"void({src}[:, :, :, :], {dst}[::1], Tuple(()))")]
    return sigs


PTX_SIGNATURES = _signatures()


# --- launching --------------------------------------------------------------------------------
def _launch(k: Kernels, out, ins, *args) -> None:
    """Run `kernel(*inputs, out, *args)` over out's elements, the inputs broadcast to out's
    shape: the flat kernel if every operand is contiguous, else the strided one."""
    n = out.size
    if n == 0:
        return
    views = [broadcast(x, out.shape) for x in ins]
    itemsizes = [v.dtype.itemsize for v in views] + [out.dtype.itemsize]
    dims = coalesce(out.shape, *(v.strides for v in views), out.strides)
    if not dims or len(dims) == 1 and dims[0][1] == itemsizes:
        flat = [strided(v, (n,), (v.dtype.itemsize,)) for v in (*views, out)]
        k.flat[map_shape(n)](*flat, *args)
        return
    lead, inner = dims[:-STRIDED_AXES], dims[-STRIDED_AXES:]
    pad = 1 + STRIDED_AXES - len(inner)
    shape = (1,) * pad + tuple(d for d, _ in inner)
    m = math.prod(shape)
    for index in itertools.product(*(range(d) for d, _ in lead)):
        offsets = [sum(i * st[k] for i, (_, st) in zip(index, lead, strict=True))
                   for k in range(len(views) + 1)]
        inputs = [strided(v, shape, (0,) * pad + tuple(st[k] for _, st in inner), offsets[k])
                  for k, v in enumerate(views)]
        out_part = strided(out, (m,), (out.dtype.itemsize,), offsets[-1])
        k.strided[map_shape(m)](*inputs, out_part, *args)


# --- dispatchers: kernel(out, ins, **params) of op `name` -------------------------------------
def unary(name: str):
    """The kernel of unary op `name` of the table: kernel(out, [x], **params)."""
    row = table.UNARY[name]

    def kernel(out, ins, **params):
        cast = float if row.in_float64 else np.dtype(out.dtype).type
        _launch(kernels(name), out, ins, row.kernel_args(name, params, cast))
    kernel.__name__ = f"cuda_{name}"
    return kernel


def unary_back(name: str):
    """The kernel of `<name>_back`: kernel(out, [g, x], **params) = g * f'(x)."""
    row = table.UNARY[name]
    back = row.back_name

    def kernel(out, ins, **params):
        _launch(kernels(back), out, ins, row.kernel_args(back, params))
    kernel.__name__ = f"cuda_{back}"
    return kernel


def binary(name: str):
    """The kernel of binary op `name` of the table: kernel(out, [a, b]), numpy
    broadcasting."""
    def kernel(out, ins):
        _launch(kernels(name), out, ins)
    kernel.__name__ = f"cuda_{name}"
    return kernel


def cuda_cont(out, ins):
    """out = a contiguous copy of ins[0]."""
    _launch(kernels("copy"), out, ins, ())


def cuda_cast(out, ins, dtype):
    """out = ins[0] in out's dtype (float32 and float64: the copy kernel compiled for the
    pair converts, rounding to nearest even). A 16-bit side reaches this kernel widened to
    float32 (engine.backends.cuda.half.widened): the input widened exactly, the output
    rounded from float32 on store, as on the CPU."""
    _launch(kernels("copy"), out, ins, ())


def cuda_broadcast_to(out, ins, shape):
    """out = ins[0] broadcast (numpy rules) to out's shape `shape`."""
    _launch(kernels("copy"), out, ins, ())


def __getattr__(attr: str):
    """`cuda_<op>`: the kernel of op <op> of the elementwise table (a unary op, its
    `<op>_back`, a binary op), the name that op definitions give."""
    name = attr.removeprefix("cuda_")
    if name != attr:
        try:
            row = _row_of(name)
        except KeyError:
            row = None
        if row is not None:
            if isinstance(row, table.Binary):
                return binary(name)
            return unary(name) if name == row.name else unary_back(row.name)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
