"""Checks of op parameters and inputs shared by several op modules, written once.

Each takes the op's name (for the message) and either returns the parameter in its
canonical form or raises: ParamError for a parameter malformed on its own (see
engine.errors.ParamError), ShapeError or DTypeError for inputs, or parameters, that do not
fit the inputs' shapes.

- `integer`, `pair`, `int_tuple`, `is_real`: the form of a parameter;
- `window_output_size`: a sliding window (kernel, stride, padding, dilation per axis) over
  the last axes of an input, validated, and the number of windows per axis;
- `check_rows`: the inputs of a row-wise op (the rows are the last axis).
"""

from __future__ import annotations

import numbers
import operator

from engine.errors import DTypeError, ParamError, ShapeError
from engine.registry import shapes_str


def _is_int(v) -> bool:
    return not isinstance(v, bool) and hasattr(v, "__index__")


def is_real(v) -> bool:
    """A real number (numpy's included), not a bool."""
    return not isinstance(v, bool) and isinstance(v, numbers.Real)


def integer(op: str, name: str, v) -> int:
    """v as an int (no silent truncation of floats)."""
    if not _is_int(v):
        raise ParamError(f"{op}: {name} must be an int, got {v!r}")
    return operator.index(v)


def pair(op: str, name: str, v) -> tuple[int, int]:
    """An int or a pair of ints as a pair (rows, cols)."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ParamError(f"{op}: {name} must be an int or a pair of ints, got {v!r}")
        a, b = v
    else:
        a = b = v
    if not (_is_int(a) and _is_int(b)):
        raise ParamError(f"{op}: {name} must be an int or a pair of ints, got {v!r}")
    return operator.index(a), operator.index(b)


def int_tuple(op: str, name: str, value, ndim: int | None, low: int = 0) -> tuple[int, ...]:
    """`value` as a tuple of `ndim` ints (any number if ndim is None), each >= low."""
    count = "" if ndim is None else f"{ndim} "
    try:
        items = tuple(value)
    except TypeError:
        raise ParamError(f"{op}: {name} must be a sequence of {count}ints, got {value!r}") \
            from None
    if (ndim is not None and len(items) != ndim) or not all(_is_int(v) for v in items):
        raise ParamError(f"{op}: {name} must be a sequence of {count}ints (one per axis), "
                         f"got {value!r}")
    out = tuple(operator.index(v) for v in items)
    if any(v < low for v in out):
        raise ParamError(f"{op}: {name} must be >= {low} on every axis, got {list(out)}")
    return out


def window_output_size(op: str, x_shape, kernel, stride, padding, dilation) -> tuple[int, ...]:
    """The number of positions, per axis, of a window sliding over the last len(kernel) axes
    of `x_shape` (kernel, stride, padding, dilation: one int per axis):

        out = (side + 2 padding - dilation (kernel - 1) - 1) // stride + 1

    kernel, stride and dilation must be positive and padding non-negative (ParamError), and
    at least one window must fit on every axis (ShapeError)."""
    one_axis = len(kernel) == 1

    def show(values):
        return values[0] if one_axis else list(values)
    for name, values, low in (("kernel", kernel, 1), ("stride", stride, 1),
                              ("dilation", dilation, 1), ("padding", padding, 0)):
        if min(values) < low:
            kind = "positive" if low else "non-negative"
            raise ParamError(f"{op}: {name} must be {kind}, got {show(values)} for input of "
                             f"shape {list(x_shape)}")
    sides = x_shape[len(x_shape) - len(kernel):]
    out = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1
                for n, k, s, p, d in zip(sides, kernel, stride, padding, dilation, strict=True))
    if min(out) < 1:
        window, size = (f"kernel of {kernel[0]}", f"output length would be {out[0]}") \
            if one_axis else ("x".join(map(str, kernel)) + " kernel",
                              "output would be " + "x".join(map(str, out)))
        raise ShapeError(f"{op}: a {window} (dilation {show(dilation)}, padding "
                         f"{show(padding)}) does not fit input of shape {list(x_shape)}; "
                         f"{size}")
    return out


def check_rows(op: str, *tensors) -> None:
    """The inputs of a row-wise op: float, of one dtype and one shape, at least one axis,
    contiguous (the kernels read each row as contiguous memory)."""
    first = tensors[0]
    for t in tensors:
        if t.dtype.kind != "f" or t.dtype != first.dtype:
            raise DTypeError(f"{op}: needs float inputs of one dtype, got "
                             f"{', '.join(str(u.dtype) for u in tensors)} for shapes "
                             f"{shapes_str(*tensors)}")
        if t.shape != first.shape:
            raise ShapeError(f"{op}: inputs must have the same shape, got "
                             f"{shapes_str(*tensors)}")
    if first.ndim < 1:
        raise ShapeError(f"{op}: needs at least one axis (rows are the last axis), got "
                         f"shape {list(first.shape)}")
    for t in tensors:
        if not t.contiguous:
            raise ShapeError(f"{op}: input of shape {list(t.shape)} is a non-contiguous "
                             f"view; use engine.ops.{op}, which inserts cont()")
