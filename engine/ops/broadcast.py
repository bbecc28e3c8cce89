"""Numpy broadcasting for binary ops, and the one helper that reduces a broadcast gradient.

No op module is below this one: `sum_to` builds its ops (sum, reshape) through the registry,
so every op module may import it.
"""

from __future__ import annotations

from engine.errors import ShapeError
from engine.registry import registered


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
    """Sum gradient `g` (of a broadcast result) back to an input of `shape`: over the
    leading axes `shape` lacks and over the axes where it has 1 and g does not."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                      if d == 1 and g.shape[lead + i] != 1)
    return registered.reshape(registered.sum(g, axis=axes), shape=shape)
