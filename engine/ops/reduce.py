"""Reductions: sum over all or some axes, and mean (a composite of sum and scale)."""

from __future__ import annotations

import math

from engine.backends.cpu.reduce import cpu_sum
from engine.errors import DTypeError, ShapeError
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes


def normalize_axes(op: str, shape, axis) -> tuple[int, ...]:
    """Axes as a sorted tuple of non-negative ints; None means all axes."""
    ndim = len(shape)
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise ShapeError(f"{op}: axis {a} out of range for shape {list(shape)}")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {axes}")
    return tuple(sorted(out))


def reduced_shape(shape, axes, keepdims) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _sum_infer(x, axes, keepdims):
    if x.dtype.kind != "f":
        raise DTypeError(f"sum: needs a float input, got {x.dtype}")
    return reduced_shape(x.shape, axes, keepdims), x.dtype


def _sum_backward(g, out, x, axes, keepdims):
    from engine.ops import broadcast_to, reshape
    return (broadcast_to(reshape(g, reduced_shape(x.shape, axes, True)), x.shape),)


def sum(x, axis=None, keepdims=False):  # noqa: A001  (the engine's op, like np.sum)
    """Sum of x over `axis` (an int, a tuple, or None for all axes)."""
    return make_node("sum", (x,), axes=normalize_axes("sum", x.shape, axis),
                     keepdims=bool(keepdims))


def mean(x, axis=None, keepdims=False):
    """Mean of x over `axis`: sum times 1/n, n the number of elements reduced."""
    from engine.ops.unary import scale
    axes = normalize_axes("mean", x.shape, axis)
    n = math.prod(x.shape[a] for a in axes)
    return scale(sum(x, axes, keepdims), 1.0 / n if n else float("nan"))


REDUCE_CASES = [((10,), None, False), ((3, 4), None, False), ((3, 4), 0, False),
                ((3, 4), 1, True), ((2, 3, 4), (0, 2), False), ((2, 3, 4, 5), (1, 3), True),
                ((2, 3, 4, 5), -1, False)]


def _samples(name):
    @both_dtypes
    def samples(dtype):
        return [Sample.make(name, [InputSpec("x", s)], dtype, axis=ax, keepdims=kd)
                for s, ax, kd in REDUCE_CASES] + [
            Sample.make(name, [InputSpec("x", (3, 4, 5), permute=(1, 2, 0))], dtype, axis=ax,
                        keepdims=False) for ax in (None, 1, (0, 2))]
    return samples


def _torch_reduce(fn):
    def ref(x, axis=None, keepdims=False):
        if axis is None:
            r = fn(x)
            return r.reshape([1] * x.ndim) if keepdims else r
        return fn(x, dim=axis, keepdim=keepdims)
    return ref


register(OpDef("sum", infer=_sum_infer, backward=_sum_backward,
               kernels={"cpu": cpu_sum}, build=sum, samples=_samples("sum"),
               torch=_torch_reduce(lambda x, **k: x.sum(**k)),
               doc="sum over axes (all by default), optionally keeping them as size 1"))
register(OpDef("mean", kind="composite", compose=mean, samples=_samples("mean"),
               torch=_torch_reduce(lambda x, **k: x.mean(**k)),
               doc="mean over axes: sum * (1/n)"))
