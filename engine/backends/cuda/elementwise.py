"""CUDA kernels of elementwise ops: unary maps, activations and their one-pass gradients,
broadcasting binary ops, and the copies cont and broadcast_to.

Each computes what its CPU kernel (engine.backends.cpu.elementwise) computes, element by
element: plain unary and binary ops in the tensor's dtype; activations and their gradients
in float64, from the CPU module's scalar functions f(v) and f'(v) (called here, not
rewritten), rounded once when stored. p0 and p1 are the op's float parameters (elu's alpha,
leaky_relu's negative_slope, clamp's min and max).

Layouts: `out` is C-contiguous, the inputs any strided views (permuted; broadcast, stride
0). A dispatcher broadcasts every input to out's shape and merges the axes that are
contiguous in every operand. One axis left with unit strides: a flat kernel over 1-D
views. Otherwise a strided kernel over 4-D views: a leading unit axis of stride 0, then up
to 3 merged axes (more: one launch per index of the leading ones). The stride-0 axis makes
numba type every strided view with layout "A", so one compilation per dtype serves all
layouts (a view without one may be typed "C" or "F", a compilation of its own).

Every kernel is a grid-stride loop over out's elements in C order. The op code is a kernel
argument, the same in every thread, so branching on it does not diverge a warp. Under the
simulator, Python evaluates the math: log or sqrt of a negative number raise there (the
samples keep their inputs inside the domains); and a launch there has at most SIM_BLOCKS
blocks of SIM_THREADS threads (arrays.grid_stride_shape), since each thread is a Python
thread, costly to start. Each thread then loops over more elements; no value changes.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numba import cuda

from engine.backends.cpu import elementwise as scalar
from engine.backends.cpu.elementwise import (
    ACTIVATION_CODES,
    BINARY_CODES,
    UNARY_CODES,
    _coalesce,
)
from engine.backends.cuda.arrays import broadcast, grid_stride_shape, strided

THREADS_PER_BLOCK = 128
MAX_BLOCKS = 4096       # the grid-stride loop covers any size
STRIDED_AXES = 3        # merged axes per launch of a strided kernel (its views have 4)

_NEG, _SCALE, _SQR, _SQRT, _LOG, _EXP, _ABS, _SGN, _STEP, _RELU, _CONT = (
    UNARY_CODES[k] for k in ("neg", "scale", "sqr", "sqrt", "log", "exp", "abs", "sgn",
                             "step", "relu", "cont"))
_SIN, _COS, _TANH, _SIGMOID, _GELU, _GELU_ERF, _SILU, _ELU, _LEAKY_RELU, _SOFTPLUS, \
    _HARDSWISH, _CLAMP = (ACTIVATION_CODES[k] for k in scalar.ACTIVATIONS)
_ADD, _SUB, _MUL, _DIV, _RELU_BACK = (
    BINARY_CODES[k] for k in ("add", "sub", "mul", "div", "relu_back"))


# --- the math of one element ------------------------------------------------------------------
@cuda.jit(device=True, inline="always")
def _unary_value(v, code, a):
    """f_code(v) in v's dtype; `a` (of v's dtype) is scale's factor."""
    if code == _NEG:
        return -v
    if code == _SCALE:
        return a * v
    if code == _SQR:
        return v * v
    if code == _SQRT:
        return math.sqrt(v)
    if code == _LOG:
        return math.log(v)
    if code == _EXP:
        return math.exp(v)
    if code == _ABS:
        return math.fabs(v)
    if code == _SGN:
        return 1.0 if v > 0 else (-1.0 if v < 0 else 0.0)
    if code == _STEP:
        return 1.0 if v > 0 else 0.0
    if code == _RELU:
        return v if v > 0 else 0.0
    return v                                            # cont, broadcast_to: a copy


@cuda.jit(device=True, inline="always")
def _activation_value(v, code, p0, p1):
    """f_code(v; p0, p1) of a float64 v, in float64."""
    if code == _SIN:
        return math.sin(v)
    if code == _COS:
        return math.cos(v)
    if code == _TANH:
        return math.tanh(v)
    if code == _SIGMOID:
        return scalar.sigmoid(v)
    if code == _GELU:
        return scalar.gelu(v)
    if code == _GELU_ERF:
        return scalar.gelu_erf(v)
    if code == _SILU:
        return v * scalar.sigmoid(v)
    if code == _ELU:
        return v if v > 0.0 else p0 * math.expm1(v)
    if code == _LEAKY_RELU:
        return v if v > 0.0 else p0 * v
    if code == _SOFTPLUS:
        return scalar.softplus(v)
    if code == _HARDSWISH:
        return scalar.hardswish(v)
    return p0 if v < p0 else (p1 if v > p1 else v)     # clamp to [p0, p1]; NaN stays NaN


@cuda.jit(device=True, inline="always")
def _activation_back_value(g, v, code, p0, p1):
    """g f_code'(v; p0, p1) for g of the tensor's dtype and a float64 v, in float64 (the
    products and the pass-throughs of g as the CPU kernel forms them)."""
    if code == _SIN:
        return g * math.cos(v)
    if code == _COS:
        return -g * math.sin(v)
    if code == _TANH:
        t = math.tanh(v)
        return g * (1.0 - t * t)
    if code == _SIGMOID:
        s = scalar.sigmoid(v)
        return g * (s * (1.0 - s))
    if code == _GELU:
        return g * scalar.gelu_grad(v)
    if code == _GELU_ERF:
        return g * scalar.gelu_erf_grad(v)
    if code == _SILU:
        return g * scalar.silu_grad(v)
    if code == _ELU:
        return g if v > 0.0 else g * (p0 * math.exp(v))
    if code == _LEAKY_RELU:
        return g if v > 0.0 else g * p0
    if code == _SOFTPLUS:
        return g if v > scalar.SOFTPLUS_THRESHOLD else g * scalar.sigmoid(v)
    if code == _HARDSWISH:
        return g * scalar.hardswish_grad(v)
    return g if p0 <= v <= p1 else 0.0                  # clamp


@cuda.jit(device=True, inline="always")
def _binary_value(a, b, code):
    """a (op) b in their dtype; relu_back is a where b > 0, else 0."""
    if code == _ADD:
        return a + b
    if code == _SUB:
        return a - b
    if code == _MUL:
        return a * b
    if code == _DIV:
        return a / b
    return a if b > 0 else 0.0


@cuda.jit(device=True, inline="always")
def _index(i, d1, d2, d3):
    """The 4-D index (i0, i1, i2, i3) of C-order position i in a shape (d0, d1, d2, d3)."""
    i3 = i % d3
    i //= d3
    i2 = i % d2
    i //= d2
    return i // d1, i % d1, i2, i3


# --- kernels: out[i] for i = grid-stride over out's elements ----------------------------------
@cuda.jit
def _unary_flat(x, out, code, a):
    """out[i] = f_code(x[i]), 1-D contiguous arrays."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = _unary_value(x[i], code, a)


@cuda.jit
def _unary_strided(x, out, code, a):
    """out[i] = f_code(x[j]), j the 4-D index of C-order position i in x's shape."""
    _, d1, d2, d3 = x.shape
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = _index(i, d1, d2, d3)
        out[i] = _unary_value(x[i0, i1, i2, i3], code, a)


@cuda.jit
def _activation_flat(x, out, code, p0, p1):
    """out[i] = f_code(x[i]; p0, p1), computed in float64; 1-D contiguous arrays."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = _activation_value(float(x[i]), code, p0, p1)


@cuda.jit
def _activation_strided(x, out, code, p0, p1):
    """out[i] = f_code(x[j]; p0, p1), j the 4-D index of position i, computed in float64."""
    _, d1, d2, d3 = x.shape
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = _index(i, d1, d2, d3)
        out[i] = _activation_value(float(x[i0, i1, i2, i3]), code, p0, p1)


@cuda.jit
def _activation_back_flat(g, x, out, code, p0, p1):
    """out[i] = g[i] f_code'(x[i]; p0, p1); 1-D contiguous arrays."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = _activation_back_value(g[i], float(x[i]), code, p0, p1)


@cuda.jit
def _activation_back_strided(g, x, out, code, p0, p1):
    """out[i] = g[j] f_code'(x[j]; p0, p1), j the 4-D index of position i."""
    _, d1, d2, d3 = x.shape
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = _index(i, d1, d2, d3)
        out[i] = _activation_back_value(g[i0, i1, i2, i3], float(x[i0, i1, i2, i3]), code,
                                        p0, p1)


@cuda.jit
def _binary_flat(a, b, out, code):
    """out[i] = a[i] (op) b[i]; 1-D contiguous arrays."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = _binary_value(a[i], b[i], code)


@cuda.jit
def _binary_strided(a, b, out, code):
    """out[i] = a[j] (op) b[j], j the 4-D index of position i (a, b broadcast views)."""
    _, d1, d2, d3 = a.shape
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i0, i1, i2, i3 = _index(i, d1, d2, d3)
        out[i] = _binary_value(a[i0, i1, i2, i3], b[i0, i1, i2, i3], code)


def _signatures():
    """(kernel, signature) of every compilation the dispatchers launch: per dtype, flat
    arrays are C-contiguous 1-D, strided ones 4-D of layout "A"; codes int64, p0 and p1
    float64, scale's factor of the dtype."""
    sigs = []
    for t in ("float32", "float64"):
        flat, view = f"{t}[::1]", f"{t}[:, :, :, :]"
        sigs += [(_unary_flat, f"void({flat}, {flat}, int64, {t})"),
                 (_unary_strided, f"void({view}, {flat}, int64, {t})"),
                 (_activation_flat, f"void({flat}, {flat}, int64, float64, float64)"),
                 (_activation_strided, f"void({view}, {flat}, int64, float64, float64)"),
                 (_activation_back_flat,
                  f"void({flat}, {flat}, {flat}, int64, float64, float64)"),
                 (_activation_back_strided,
                  f"void({view}, {view}, {flat}, int64, float64, float64)"),
                 (_binary_flat, f"void({flat}, {flat}, {flat}, int64)"),
                 (_binary_strided, f"void({view}, {view}, {flat}, int64)")]
    return sigs


PTX_SIGNATURES = _signatures()


# --- launching --------------------------------------------------------------------------------
def _launch_shape(n: int) -> tuple[int, int]:
    """(blocks, threads per block) for n elements: up to 128 threads (fewer for small n, a
    whole number of warps), blocks capped (the grid-stride loop does the rest); fewer of
    both under the simulator."""
    return grid_stride_shape(n, min(THREADS_PER_BLOCK, 32 * -(-n // 32)), MAX_BLOCKS)


def _launch(flat_kernel, strided_kernel, out, ins, *args) -> None:
    """Run `kernel(*inputs, out, *args)` over out's elements, the inputs broadcast to out's
    shape: the flat kernel if every operand is contiguous, else the strided one."""
    n = out.size
    if n == 0:
        return
    views = [broadcast(x, out.shape) for x in ins]
    itemsizes = [v.dtype.itemsize for v in views] + [out.dtype.itemsize]
    dims = _coalesce(out.shape, *(v.strides for v in views), out.strides)
    if not dims or len(dims) == 1 and dims[0][1] == itemsizes:
        flat = [strided(v, (n,), (v.dtype.itemsize,)) for v in (*views, out)]
        flat_kernel[_launch_shape(n)](*flat, *args)
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
        strided_kernel[_launch_shape(m)](*inputs, out_part, *args)


def _params(op: str, params: dict, names) -> tuple[float, float]:
    """The op's float parameters `names` (at most two) as (p0, p1), 0.0 for missing ones."""
    missing = [k for k in names if k not in params]
    if missing:
        raise TypeError(f"cuda kernel of {op}: missing parameters {missing}, got "
                        f"{sorted(params)}")
    values = [float(params[k]) for k in names] + [0.0, 0.0]
    return values[0], values[1]


def unary(name: str, params=()):
    """The dispatcher of plain unary op `name` (or cont): kernel(out, [x], **params)."""
    code = UNARY_CODES[name]

    def kernel(out, ins, **kw):
        a = np.dtype(out.dtype).type(_params(name, kw, params)[0])
        _launch(_unary_flat, _unary_strided, out, ins, code, a)
    kernel.__name__ = f"cuda_{name}"
    return kernel


def activation(name: str, params=()):
    """The dispatcher of activation `name`: kernel(out, [x], **params)."""
    code = ACTIVATION_CODES[name]

    def kernel(out, ins, **kw):
        _launch(_activation_flat, _activation_strided, out, ins, code,
                *_params(name, kw, params))
    kernel.__name__ = f"cuda_{name}"
    return kernel


def activation_back(name: str, params=()):
    """The dispatcher of `<name>_back`: kernel(out, [g, x], **params) = g * f'(x)."""
    code = ACTIVATION_CODES[name]

    def kernel(out, ins, **kw):
        _launch(_activation_back_flat, _activation_back_strided, out, ins, code,
                *_params(f"{name}_back", kw, params))
    kernel.__name__ = f"cuda_{name}_back"
    return kernel


def binary(name: str):
    """The dispatcher of binary op `name`: kernel(out, [a, b]) with numpy broadcasting."""
    code = BINARY_CODES[name]

    def kernel(out, ins):
        _launch(_binary_flat, _binary_strided, out, ins, code)
    kernel.__name__ = f"cuda_{name}"
    return kernel


def cuda_broadcast_to(out, ins, shape):
    """out = ins[0] broadcast (numpy rules) to out's shape `shape`."""
    _launch(_unary_flat, _unary_strided, out, ins, _CONT, np.dtype(out.dtype).type(0))


# --- one dispatcher per op, cuda_<op> (the name in the op's kernels table) --------------------
cuda_neg = unary("neg")
cuda_scale = unary("scale", ("scale",))
cuda_sqr = unary("sqr")
cuda_sqrt = unary("sqrt")
cuda_log = unary("log")
cuda_exp = unary("exp")
cuda_abs = unary("abs")
cuda_sgn = unary("sgn")
cuda_step = unary("step")
cuda_relu = unary("relu")
cuda_cont = unary("cont")

cuda_sin = activation("sin")
cuda_cos = activation("cos")
cuda_tanh = activation("tanh")
cuda_sigmoid = activation("sigmoid")
cuda_gelu = activation("gelu")
cuda_gelu_erf = activation("gelu_erf")
cuda_silu = activation("silu")
cuda_elu = activation("elu", ("alpha",))
cuda_leaky_relu = activation("leaky_relu", ("negative_slope",))
cuda_softplus = activation("softplus")
cuda_hardswish = activation("hardswish")
cuda_clamp = activation("clamp", ("min", "max"))

cuda_sin_back = activation_back("sin")
cuda_cos_back = activation_back("cos")
cuda_tanh_back = activation_back("tanh")
cuda_sigmoid_back = activation_back("sigmoid")
cuda_gelu_back = activation_back("gelu")
cuda_gelu_erf_back = activation_back("gelu_erf")
cuda_silu_back = activation_back("silu")
cuda_elu_back = activation_back("elu", ("alpha",))
cuda_leaky_relu_back = activation_back("leaky_relu", ("negative_slope",))
cuda_softplus_back = activation_back("softplus")
cuda_hardswish_back = activation_back("hardswish")
cuda_clamp_back = activation_back("clamp", ("min", "max"))

cuda_add = binary("add")
cuda_sub = binary("sub")
cuda_mul = binary("mul")
cuda_div = binary("div")
cuda_relu_back = binary("relu_back")
