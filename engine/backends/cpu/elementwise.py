"""CPU kernels of elementwise ops: unary maps, activations and their one-pass gradients,
and broadcasting binary ops.

One compiled kernel per family, switching on an op code *outside* the element loop, so
each loop stays a simple, vectorisable `prange` and numba caches one function per dtype.
Dispatchers take the op's output buffer and its inputs (possibly strided or broadcast
views) and never allocate.

Activations compute in float64 whatever the dtype, from scalar functions f(v) and f'(v)
written once below (LLVM may still evaluate a libm call on a widened float32 value in
float32, sin as sinf: within an ulp). p0 and p1 are the op's float parameters (elu's alpha,
leaky_relu's negative_slope, clamp's min and max). The CUDA kernels
(engine.backends.cuda.elementwise) call the same scalar functions.
"""

from __future__ import annotations

import math

import numpy as np

from engine.backends.cpu import layout, threads
from engine.backends.cpu.jit import bindable, call, parallel_kernel, prange, scalar_math, sequence

UNARY_CODES = {"neg": 0, "scale": 1, "sqr": 2, "sqrt": 3, "log": 4, "exp": 5, "abs": 6,
               "sgn": 7, "step": 8, "relu": 9, "cont": 10}
BINARY_CODES = {"add": 0, "sub": 1, "mul": 2, "div": 3, "relu_back": 4}


@parallel_kernel
def _unary(x, out, code, alpha):
    """out[i] = f_code(x[i]) over 1-D contiguous arrays (out may alias x)."""
    n = x.size
    zero = x.dtype.type(0)
    one = x.dtype.type(1)
    a = x.dtype.type(alpha)
    if code == 0:
        for i in prange(n):
            out[i] = -x[i]
    elif code == 1:
        for i in prange(n):
            out[i] = a * x[i]
    elif code == 2:
        for i in prange(n):
            out[i] = x[i] * x[i]
    elif code == 3:
        for i in prange(n):
            out[i] = np.sqrt(x[i])
    elif code == 4:
        for i in prange(n):
            out[i] = np.log(x[i])
    elif code == 5:
        for i in prange(n):
            out[i] = np.exp(x[i])
    elif code == 6:
        for i in prange(n):
            out[i] = abs(x[i])
    elif code == 7:
        for i in prange(n):
            v = x[i]
            out[i] = one if v > zero else (-one if v < zero else zero)
    elif code == 8:
        for i in prange(n):
            out[i] = one if x[i] > zero else zero
    elif code == 9:
        for i in prange(n):
            v = x[i]
            out[i] = v if v > zero else zero
    else:
        for i in prange(n):
            out[i] = x[i]


# --- activations: f and f' of one float64 value --------------------------------------------
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
SOFTPLUS_THRESHOLD = 20.0       # torch's default: softplus(x) = x for x > 20


@scalar_math
def sigmoid(v):
    """1 / (1 + e^-v), without overflow for either sign."""
    if v >= 0.0:
        return 1.0 / (1.0 + math.exp(-v))
    e = math.exp(v)
    return e / (1.0 + e)


@scalar_math
def gelu(v):
    """0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))."""
    return 0.5 * v * (1.0 + math.tanh(SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v)))


@scalar_math
def gelu_grad(v):
    """0.5 (1 + t) + 0.5 v (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 v^2), t the tanh above."""
    t = math.tanh(SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v))
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * SQRT_2_OVER_PI * \
        (1.0 + 3.0 * GELU_CUBIC * v * v)


@scalar_math
def gelu_erf(v):
    """v Phi(v) = 0.5 v erfc(-v / sqrt 2) (erfc keeps the tail accurate for v << 0)."""
    return 0.5 * v * math.erfc(-v * INV_SQRT_2)


@scalar_math
def gelu_erf_grad(v):
    """Phi(v) + v phi(v), phi the standard normal density."""
    return 0.5 * math.erfc(-v * INV_SQRT_2) + v * math.exp(-0.5 * v * v) * INV_SQRT_2PI


@scalar_math
def silu_grad(v):
    """d/dv v s(v) = s (1 + v (1 - s)), s = sigmoid(v)."""
    s = sigmoid(v)
    return s * (1.0 + v * (1.0 - s))


@scalar_math
def softplus(v):
    """log(1 + e^v), or v above the threshold."""
    return v if v > SOFTPLUS_THRESHOLD else math.log1p(math.exp(v))


@scalar_math
def hardswish(v):
    """v relu6(v + 3) / 6."""
    if v <= -3.0:
        return 0.0
    return v if v >= 3.0 else v * (v + 3.0) / 6.0


@scalar_math
def hardswish_grad(v):
    """0 below -3, 1 above 3, (2 v + 3) / 6 between."""
    if v < -3.0:
        return 0.0
    return 1.0 if v > 3.0 else v / 3.0 + 0.5


@parallel_kernel
def _activation(x, out, code, p0, p1):
    """out[i] = f_code(x[i]; p0, p1) over 1-D contiguous arrays (out may alias x)."""
    n = x.size
    if code == 0:
        for i in prange(n):
            out[i] = math.sin(float(x[i]))
    elif code == 1:
        for i in prange(n):
            out[i] = math.cos(float(x[i]))
    elif code == 2:
        for i in prange(n):
            out[i] = math.tanh(float(x[i]))
    elif code == 3:
        for i in prange(n):
            out[i] = sigmoid(float(x[i]))
    elif code == 4:
        for i in prange(n):
            out[i] = gelu(float(x[i]))
    elif code == 5:
        for i in prange(n):
            out[i] = gelu_erf(float(x[i]))
    elif code == 6:
        for i in prange(n):
            v = float(x[i])
            out[i] = v * sigmoid(v)
    elif code == 7:                                   # elu, alpha = p0
        for i in prange(n):
            v = float(x[i])
            out[i] = v if v > 0.0 else p0 * math.expm1(v)
    elif code == 8:                                   # leaky_relu, negative_slope = p0
        for i in prange(n):
            v = float(x[i])
            out[i] = v if v > 0.0 else p0 * v
    elif code == 9:
        for i in prange(n):
            out[i] = softplus(float(x[i]))
    elif code == 10:
        for i in prange(n):
            out[i] = hardswish(float(x[i]))
    else:                                             # clamp to [p0, p1]; NaN stays NaN
        for i in prange(n):
            v = float(x[i])
            out[i] = p0 if v < p0 else (p1 if v > p1 else v)


@parallel_kernel
def _activation_back(g, x, out, code, p0, p1):
    """out[i] = g[i] f_code'(x[i]; p0, p1) over 1-D contiguous arrays (out may alias x)."""
    n = x.size
    if code == 0:
        for i in prange(n):
            out[i] = g[i] * math.cos(float(x[i]))
    elif code == 1:
        for i in prange(n):
            out[i] = -g[i] * math.sin(float(x[i]))
    elif code == 2:
        for i in prange(n):
            t = math.tanh(float(x[i]))
            out[i] = g[i] * (1.0 - t * t)
    elif code == 3:
        for i in prange(n):
            s = sigmoid(float(x[i]))
            out[i] = g[i] * (s * (1.0 - s))
    elif code == 4:
        for i in prange(n):
            out[i] = g[i] * gelu_grad(float(x[i]))
    elif code == 5:
        for i in prange(n):
            out[i] = g[i] * gelu_erf_grad(float(x[i]))
    elif code == 6:
        for i in prange(n):
            out[i] = g[i] * silu_grad(float(x[i]))
    elif code == 7:
        for i in prange(n):
            v = float(x[i])
            out[i] = g[i] if v > 0.0 else g[i] * (p0 * math.exp(v))
    elif code == 8:
        for i in prange(n):
            out[i] = g[i] if x[i] > 0.0 else g[i] * p0
    elif code == 9:
        for i in prange(n):
            v = float(x[i])
            out[i] = g[i] if v > SOFTPLUS_THRESHOLD else g[i] * sigmoid(v)
    elif code == 10:
        for i in prange(n):
            out[i] = g[i] * hardswish_grad(float(x[i]))
    else:
        for i in prange(n):
            v = x[i]
            out[i] = g[i] if p0 <= v <= p1 else 0.0


@scalar_math
def binary_value(code, x, y, zero):
    """x (op) y for the binary op `code`; relu_back is x if y > 0 else 0."""
    if code == 0:
        return x + y
    if code == 1:
        return x - y
    if code == 2:
        return x * y
    if code == 3:
        return x / y
    return x if y > zero else zero


@parallel_kernel
def _binary_flat(a, b, out, code):
    """out[i] = a[i] (op) b[i] over 1-D contiguous arrays of one size."""
    zero = out.dtype.type(0)
    for i in prange(out.size):
        out[i] = binary_value(code, a[i], b[i], zero)


@parallel_kernel
def _binary_rows(a, a_rows, a_step, b, b_rows, b_step, out, run, code):
    """Row r of a broadcast binary op (see engine.backends.cpu.layout):
    out[r run + j] = a[a_rows[r] + a_step j] (op) b[b_rows[r] + b_step j], steps 0 or 1.
    Each case is a loop over contiguous slices, which LLVM vectorises."""
    zero = out.dtype.type(0)
    for r in prange(a_rows.size):
        o = out[r * run:(r + 1) * run]
        ao = a_rows[r]
        bo = b_rows[r]
        if a_step == 1 and b_step == 1:
            x = a[ao:ao + run]
            y = b[bo:bo + run]
            for j in range(run):
                o[j] = binary_value(code, x[j], y[j], zero)
        elif a_step == 1:
            x = a[ao:ao + run]
            w = b[bo]
            for j in range(run):
                o[j] = binary_value(code, x[j], w, zero)
        elif b_step == 1:
            v = a[ao]
            y = b[bo:bo + run]
            for j in range(run):
                o[j] = binary_value(code, v, y[j], zero)
        else:
            value = binary_value(code, a[ao], b[bo], zero)
            for j in range(run):
                o[j] = value


@parallel_kernel
def _binary_4d(a, b, out, code):
    """out = a (op) b over 4-D arrays of out's shape (any strides; the general fallback)."""
    d0, d1, d2, d3 = out.shape
    zero = out.dtype.type(0)
    for r in prange(d0 * d1 * d2):
        i0 = r // (d1 * d2)
        i1 = (r // d2) % d1
        i2 = r % d2
        for i3 in range(d3):
            out[i0, i1, i2, i3] = binary_value(code, a[i0, i1, i2, i3], b[i0, i1, i2, i3],
                                               zero)


ACTIVATIONS = ("sin", "cos", "tanh", "sigmoid", "gelu", "gelu_erf", "silu", "elu",
               "leaky_relu", "softplus", "hardswish", "clamp")
ACTIVATION_CODES = {name: code for code, name in enumerate(ACTIVATIONS)}


def _param_values(params: dict, names) -> tuple[float, float]:
    """The op's float parameters `names` (at most two) as (p0, p1), 0.0 for missing ones."""
    values = [float(params[k]) for k in names] + [0.0, 0.0]
    return values[0], values[1]


def unary(name: str, params=()):
    """The dispatcher of unary op or activation `name`: kernel(out, [x], **params), the
    float parameters named in `params` (in order) passed to the kernel. A strided x is
    copied into out (layout.copy_call: a transposed view in tiles, any other by numpy,
    whose copy picks the best loop order for any strides) and mapped in place; `cont`
    only copies."""
    activation = name in ACTIVATION_CODES
    code = ACTIVATION_CODES[name] if activation else UNARY_CODES[name]

    def prepare(out, ins, **kw):
        p0, p1 = _param_values(kw, params)
        (x,) = ins
        flat_out = out.reshape(-1)
        src = x.reshape(-1) if x.flags.c_contiguous else flat_out
        if activation:
            run = call(_activation, src, flat_out, code, p0, p1)
        else:
            run = call(_unary, src, flat_out, code, p0)
        if x.flags.c_contiguous:
            return run
        gather = layout.copy_call(out, x)
        return gather if name == "cont" else sequence(gather, run)
    prepare.__name__ = f"cpu_{name}"
    return threads.split(bindable(prepare))


def activation_back(name: str, params=()):
    """The dispatcher of `<name>_back`: kernel(out, [g, x], **params) = g * f'(x) in one
    pass. g must be C-contiguous (the op's builder makes it so); a strided x is gathered
    into out and mapped in place."""
    code = ACTIVATION_CODES[name]

    def prepare(out, ins, **kw):
        p0, p1 = _param_values(kw, params)
        g, x = ins
        flat_out = out.reshape(-1)
        src = x.reshape(-1) if x.flags.c_contiguous else flat_out
        run = call(_activation_back, g.reshape(-1), src, flat_out, code, p0, p1)
        return run if x.flags.c_contiguous else \
            sequence(layout.copy_call(out, x), run)
    prepare.__name__ = f"cpu_{name}_back"
    return threads.split(bindable(prepare))


_coalesce = layout.coalesce   # also used by other kernel modules


def binary(name: str):
    """The dispatcher of binary op `name`: kernel(out, [a, b]) with numpy broadcasting.
    Same-shape contiguous operands run flat; broadcast ones as rows (layout.Rows: a bias
    over the rows of a matrix, a channel bias over images); other layouts as 4-D views."""
    code = BINARY_CODES[name]

    def prepare(out, ins):
        a, b = ins
        if a.shape == b.shape == out.shape and a.flags.c_contiguous and b.flags.c_contiguous:
            return call(_binary_flat, a.reshape(-1), b.reshape(-1), out.reshape(-1), code)
        rows = layout.Rows.of(out.shape, [a, b]) if out.flags.c_contiguous else None
        if rows is not None:
            (ab, bb), (ar, br), (sa, sb) = rows.bases, rows.offsets, rows.steps
            return call(_binary_rows, ab, ar, sa, bb, br, sb, out.reshape(-1), rows.run, code)
        return _binary_views(np.broadcast_to(a, out.shape), np.broadcast_to(b, out.shape),
                             out, code)
    prepare.__name__ = f"cpu_{name}"
    return threads.split(bindable(prepare))


def _binary_views(a, b, out, code):
    """The general case: coalesced axes as 4-D views, a loop in Python over any more."""
    dims = layout.coalesce(out.shape, a.strides, b.strides, out.strides) or [(1, [0, 0, 0])]
    pad = [(1, [0, 0, 0])] * max(4 - len(dims), 0)
    dims = pad + dims
    shape = [n for n, _ in dims]
    views = [layout.as_strided(arr, shape, [st[k] for _, st in dims])
             for k, arr in enumerate((a, b, out))]
    lead = len(dims) - 4
    return sequence(*(call(_binary_4d, *(v[idx] for v in views), code)
                      for idx in np.ndindex(*shape[:lead])))   # several for > 4 axes only
