"""The checks of op parameters and inputs shared by several op modules, written once
(engine.params, which declares each op's parameters, re-exports them: ops import them from
there).

Each takes the op's name (for the message) and either returns the parameter in its
canonical form or raises: ParamError for a parameter malformed on its own (see
engine.errors.ParamError), ShapeError or DTypeError for inputs, or parameters, that do not
fit the inputs' shapes.

- `integer`, `boolean`, `number`, `pair`, `int_tuple`, `ints`, `int_rows`, `choice`,
  `is_real`: the form of a parameter, strict on types: an int is an int (numpy's
  included) within int64, never a bool or a float (not even 500.0); a bool is True or
  False, never 0, 1 or "True"; a number is a real, never a bool or a string; `ints` and
  `int_rows` take tuples only (the form a node stores), `int_tuple` any sequence;
- `show_value`: a value for a message, cut short (also an int too long for repr);
- `shapes_str`: the shapes of tensors for a message;
- `window_output_size`: a sliding window (kernel, stride, padding, dilation per axis) over
  the last axes of an input, validated, and the number of windows per axis;
- `check_rows`: the inputs of a row-wise op (the rows are the last axis);
- `check_float_input`: a float input laid out as NCHW, NCL, ... (one axis per letter);
- `check_float_dtype`: a dtype parameter that must name a float dtype.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.errors import DTypeError, ParamError, ShapeError
from engine.tensor import as_dtype, is_float

INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1


def shapes_str(*tensors) -> str:
    """'[2, 3] and [4]' for error messages."""
    return " and ".join(str(list(t.shape)) for t in tensors)


def show_value(v) -> str:
    """repr(v) cut to 100 characters, also for an int too long for repr."""
    try:
        text = repr(v)
    except ValueError:   # Python's int max-str-digits
        return f"an int of {v.bit_length()} bits" if isinstance(v, int) else \
            f"a {type(v).__name__} holding an int too long to print"
    return text if len(text) <= 100 else text[:97] + "..."


def is_int(v) -> bool:
    return not isinstance(v, (bool, np.bool_)) and hasattr(v, "__index__")


def _in_int64(v) -> bool:
    return INT64_MIN <= v <= INT64_MAX


def is_real(v) -> bool:
    """A real number (numpy's included), not a bool."""
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, numbers.Real)


def integer(op: str, name: str, v, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """v as an int in [low, high] (int64 by default; no silent truncation of floats)."""
    if not is_int(v):
        raise ParamError(f"{op}: {name} must be an int, got {show_value(v)}")
    out = operator.index(v)
    if not low <= out <= high:
        raise ParamError(f"{op}: {name} must be an int in [{low}, {high}], got {show_value(out)}")
    return out


def boolean(op: str, name: str, v) -> bool:
    """v as a bool: True or False (numpy's too), never 0, 1 or a string."""
    if not isinstance(v, (bool, np.bool_)):
        raise ParamError(f"{op}: {name} must be True or False, got {show_value(v)}")
    return bool(v)


def number(op: str, name: str, v, finite: bool = True) -> float:
    """v as a float: a real number, not a bool or a string, not NaN, and finite unless
    `finite` is False (then +-inf pass, e.g. a one-sided clamp)."""
    if not is_real(v):
        raise ParamError(f"{op}: {name} must be a number, got {show_value(v)}")
    try:
        out = float(v)
    except OverflowError:
        raise ParamError(f"{op}: {name} is too large for a float") from None
    if math.isnan(out) or (finite and math.isinf(out)):
        raise ParamError(f"{op}: {name} must be a {'finite ' if finite else ''}number, got "
                         f"{out!r}")
    return out


def pair(op: str, name: str, v) -> tuple[int, int]:
    """An int or a pair of ints as a pair (rows, cols)."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ParamError(f"{op}: {name} must be an int or a pair of ints, got {show_value(v)}")
        a, b = v
    else:
        a = b = v
    if not (is_int(a) and is_int(b) and _in_int64(a) and _in_int64(b)):
        raise ParamError(f"{op}: {name} must be an int or a pair of ints, got {show_value(v)}")
    return operator.index(a), operator.index(b)


def int_tuple(op: str, name: str, value, ndim: int | None = None,
              low: int | None = 0) -> tuple[int, ...]:
    """`value` as a tuple of `ndim` ints (any number if ndim is None), each >= low (any
    int64 if low is None)."""
    count = "" if ndim is None else f"{ndim} "
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise ParamError(f"{op}: {name} must be a sequence of {count}ints, got {show_value(value)}")
    items = tuple(value)
    if (ndim is not None and len(items) != ndim) or \
            not all(is_int(v) and _in_int64(v) for v in items):
        raise ParamError(f"{op}: {name} must be a sequence of {count}ints (one per axis), "
                         f"got {show_value(value)}")
    out = tuple(operator.index(v) for v in items)
    if low is not None and any(v < low for v in out):
        raise ParamError(f"{op}: {name} must be >= {low} on every axis, got {list(out)}")
    return out


def ints(op: str, name: str, value) -> tuple[int, ...]:
    """A tuple of int64s of any length and sign (a shape, axes, an offset), as a node
    stores it (a builder turns a user's list into one with int_tuple): the form only; the
    op's infer checks the values against its inputs."""
    if not isinstance(value, tuple):
        raise ParamError(f"{op}: {name} must be a tuple of ints, got {show_value(value)}")
    return int_tuple(op, name, value, None, None)


def int_rows(width: int) -> Callable[[str, str, Any], tuple[tuple[int, ...], ...]]:
    """The check of a tuple of `width`-tuples of int64s (pad's (before, after) pairs,
    strided_slice's (start, stop, step) triples), any number of them, as a node stores
    them."""
    def check(op: str, name: str, value) -> tuple[tuple[int, ...], ...]:
        if not (isinstance(value, tuple) and all(isinstance(row, tuple) for row in value)):
            raise ParamError(f"{op}: {name} must be a tuple of {width}-tuples of ints, got "
                             f"{show_value(value)}")
        return tuple(int_tuple(op, f"{name}[{i}]", row, width, None)
                     for i, row in enumerate(value))
    return check


def choice(*options: str) -> Callable[[str, str, Any], str]:
    """The check of a string parameter that is one of `options` (a mode, a dtype name)."""
    def check(op: str, name: str, value) -> str:
        if not isinstance(value, str) or value not in options:
            raise ParamError(f"{op}: {name} must be one of {list(options)}, got "
                             f"{show_value(value)}")
        return value
    return check


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
        if not is_float(t.dtype) or t.dtype != first.dtype:
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


def check_float_input(op: str, x, layout: str) -> None:
    """An input of a float dtype with one axis per letter of `layout` ("NCHW", "NCL")."""
    if x.ndim != len(layout):
        raise ShapeError(f"{op}: needs an {layout} input ({len(layout)} axes), got shape "
                         f"{list(x.shape)}")
    if not is_float(x.dtype):
        raise DTypeError(f"{op}: needs a float input, got {x.dtype} of shape {list(x.shape)}")


def check_float_dtype(op: str, dtype) -> None:
    """A dtype parameter (a name or a numpy dtype) that names a float dtype."""
    if not is_float(as_dtype(dtype)):
        raise DTypeError(f"{op}: dtype must be a float dtype (f16, bf16, f32, f64), got "
                         f"{dtype!r}")
