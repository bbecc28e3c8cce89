"""Numpy broadcasting for binary ops, and the one helper that reduces a broadcast gradient."""

from __future__ import annotations

from engine.errors import ShapeError


def broadcast_shapes(op: str, a_shape, b_shape) -> tuple[int, ...]:
    """The numpy broadcast of two shapes, or a ShapeError naming the op and both shapes."""
    n = max(len(a_shape), len(b_shape))
    a = (1,) * (n - len(a_shape)) + tuple(a_shape)
    b = (1,) * (n - len(b_shape)) + tuple(b_shape)
    out = []
    for da, db in zip(a, b, strict=True):
        if da != db and 1 not in (da, db):
            raise ShapeError(f"{op}: shapes {list(a_shape)} and {list(b_shape)} do not "
                             "broadcast")
        out.append(da if db == 1 else db)
    return tuple(out)


def sum_to(g, shape):
    """Sum gradient `g` (of a broadcast result) back to an input of `shape`."""
    from engine import ops
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                      if d == 1 and g.shape[lead + i] != 1)
    return ops.reshape(ops.sum(g, axes), shape)
