"""CPU kernels of elementwise ops: unary maps and broadcasting binary ops.

One compiled kernel per family, switching on an op code *outside* the element loop, so
each loop stays a simple, vectorisable `prange` and numba caches one function per dtype.
Dispatchers take the op's output buffer and its inputs (possibly strided or broadcast
views) and never allocate.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.jit import parallel_kernel, prange

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


@parallel_kernel
def _binary_flat(a, b, out, code):
    """out[i] = a[i] (op) b[i] over 1-D contiguous arrays of one size; relu_back is
    a[i] if b[i] > 0 else 0."""
    n = out.size
    if code == 0:
        for i in prange(n):
            out[i] = a[i] + b[i]
    elif code == 1:
        for i in prange(n):
            out[i] = a[i] - b[i]
    elif code == 2:
        for i in prange(n):
            out[i] = a[i] * b[i]
    elif code == 3:
        for i in prange(n):
            out[i] = a[i] / b[i]
    else:
        zero = out.dtype.type(0)
        for i in prange(n):
            out[i] = a[i] if b[i] > zero else zero


@parallel_kernel
def _binary_4d(a, b, out, code):
    """out = a (op) b over 4-D arrays of out's shape (a, b strided or broadcast, stride 0)."""
    d0, d1, d2, d3 = out.shape
    for i in prange(d0 * d1):
        i0 = i // d1
        i1 = i % d1
        for i2 in range(d2):
            if code == 0:
                for i3 in range(d3):
                    out[i0, i1, i2, i3] = a[i0, i1, i2, i3] + b[i0, i1, i2, i3]
            elif code == 1:
                for i3 in range(d3):
                    out[i0, i1, i2, i3] = a[i0, i1, i2, i3] - b[i0, i1, i2, i3]
            elif code == 2:
                for i3 in range(d3):
                    out[i0, i1, i2, i3] = a[i0, i1, i2, i3] * b[i0, i1, i2, i3]
            elif code == 3:
                for i3 in range(d3):
                    out[i0, i1, i2, i3] = a[i0, i1, i2, i3] / b[i0, i1, i2, i3]
            else:
                zero = out.dtype.type(0)
                for i3 in range(d3):
                    v = b[i0, i1, i2, i3]
                    out[i0, i1, i2, i3] = a[i0, i1, i2, i3] if v > zero else zero


def unary(name: str):
    """The dispatcher of unary op `name`: kernel(out, [x], **params)."""
    code = UNARY_CODES[name]

    def kernel(out, ins, scale=1.0):
        (x,) = ins
        flat_out = out.reshape(-1)
        if x.flags.c_contiguous:
            _unary(x.reshape(-1), flat_out, code, scale)
        else:                      # strided view: gather into out, then map in place
            np.copyto(out, x)
            _unary(flat_out, flat_out, code, scale)
    kernel.__name__ = f"cpu_{name}"
    return kernel


def _coalesce(shape, *strides_list):
    """Merge adjacent axes that are contiguous in every operand; drop size-1 axes."""
    dims = [(n, [s[i] for s in strides_list]) for i, n in enumerate(shape) if n != 1]
    merged: list[tuple[int, list[int]]] = []
    for n, st in dims:
        if merged:
            pn, pst = merged[-1]
            if all(ps == s * n for ps, s in zip(pst, st, strict=True)):
                merged[-1] = (pn * n, st)
                continue
        merged.append((n, st))
    return merged


def binary(name: str):
    """The dispatcher of binary op `name`: kernel(out, [a, b]) with numpy broadcasting."""
    code = BINARY_CODES[name]

    def kernel(out, ins):
        a, b = ins
        if a.shape == b.shape == out.shape and a.flags.c_contiguous and b.flags.c_contiguous:
            _binary_flat(a.reshape(-1), b.reshape(-1), out.reshape(-1), code)
            return
        a = np.broadcast_to(a, out.shape)
        b = np.broadcast_to(b, out.shape)
        dims = _coalesce(out.shape, a.strides, b.strides, out.strides)
        shape = [n for n, _ in dims]
        lead = max(len(dims) - 4, 0)
        shape4 = [1] * max(4 - len(dims), 0) + shape[lead:]
        views = []
        for k, arr in enumerate((a, b, out)):
            st = [s[k] for _, s in dims]
            full_shape = shape[:lead] + shape4
            full_st = st[:lead] + [0] * max(4 - len(dims), 0) + st[lead:]
            views.append(np.lib.stride_tricks.as_strided(arr, full_shape, full_st))
        av, bv, ov = views
        for idx in np.ndindex(*shape[:lead]):   # only for > 4 irreducible axes
            _binary_4d(av[idx], bv[idx], ov[idx], code)
    kernel.__name__ = f"cpu_{name}"
    return kernel
