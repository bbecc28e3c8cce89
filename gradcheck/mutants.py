"""Known bugs, each patched into the registry for one check, to prove gradcheck's power.

A mutant is a named, documented bug in one op's backward pass: its backward rule, or the cpu
kernel of its dedicated backward op. `mutant.patch()` is a context manager that puts the bug
in place and restores the registry afterwards (the very same objects), even on error (see
gradcheck.patches).
Kernel mutants wrap the real kernel: they call it with wrong parameters, or call it and then
corrupt its result the way the bug would. No mutant changes a forward computation, so the
float64 reference (and its numerical gradients) and the torch reference of a check stay
right while the mutant is active.

`ops` names the ops whose sample cases must catch the bug; `where` keeps the cases that
exercise it (an im2col case without dilation cannot show a dilation bug); `extra` adds cases
the registry lacks (said so in the description). The self-test is `gradcheck.selftest`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable

import numpy as np

from engine import ops
from engine.ops.broadcast import sum_to
from engine.samples import InputSpec, Sample
from gradcheck.patches import backward_replaced, kernel_replaced, scaled_backward


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    ops: tuple[str, ...]                    # whose sample cases must catch it
    description: str
    patch: Callable[[], contextlib.AbstractContextManager]
    where: Callable[[Sample], bool] = lambda case: True
    extra: Callable[[str], list[Sample]] = lambda dtype: []   # cases the registry lacks
    max_cases: int = 3                      # per op and dtype, smallest first
    cotangents: bool = False                # also the op's cotangent cases (gradcheck.cotangents)


def scaled(op_name: str, factor: float) -> Callable:
    """The patch of a mutant that scales every gradient of op `op_name` by `factor`."""
    return lambda: backward_replaced(op_name, lambda real: scaled_backward(real, factor))


# --- the bugs ---------------------------------------------------------------------------------
def _matmul_grad_a_untransposed(real):
    """grad_a = g @ b with b merely reshaped to b^T's shape: on square b exactly g @ b."""
    def backward(g, out, a, b):
        bt_shape = b.shape[:-2] + (b.shape[-1], b.shape[-2])
        grad_a = sum_to(ops.matmul(g, ops.reshape(ops.cont_if_strided(b), bt_shape)), a.shape)
        return grad_a, real(g, out, a, b)[1]
    return backward


def _permute_forward_axes(real):
    def backward(g, out, x, axes):
        return (ops.permute(g, axes),)
    return backward


def _sum_to_wrong_axis(g, shape):
    """sum_to that reduces each broadcast (size-1) axis's left neighbour instead of the axis
    itself, then reshapes: wrong numbers where the two lengths agree, a ShapeError elsewhere."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    right = [lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1]
    axes = sorted(set(range(lead)) | {(a - 1) % g.ndim for a in right})
    return ops.reshape(ops.sum(g, tuple(axes)), shape)


def _add_wrong_axis(real):
    return lambda g, out, a, b: (_sum_to_wrong_axis(g, a.shape), _sum_to_wrong_axis(g, b.shape))


def _pool_max_to_neighbour(real):
    """Max backward: each window's gradient lands one column right of its maximum (off the
    image at the right edge)."""
    def kernel(out, ins, **params):
        real(out, ins, **params)
        if params["mode"] == "max":
            out[..., 1:] = out[..., :-1].copy()
            out[..., 0] = 0
    return kernel


def _pool_avg_window_shifted(real):
    """Avg backward: windows start one column left (the column padding read as pw + 1)."""
    def kernel(out, ins, **params):
        if params["mode"] == "avg":
            ph, pw = params["padding"]
            params = {**params, "padding": (ph, pw + 1)}
        real(out, ins, **params)
    return kernel


def _softmax_back_no_subtraction(real):
    """s y g instead of s y (g - sum(g y)): the real result with the subtracted term added
    back."""
    def kernel(out, ins, **params):
        real(out, ins, **params)
        g, y = ins
        out += params.get("scale", 1.0) * y * np.sum(g * y, axis=-1, keepdims=True)
    return kernel


def _im2col_back_no_dilation(real):
    def kernel(out, ins, **params):
        real(out, ins, **{**params, "dilation": (1, 1)})
    return kernel


def _as_if_contiguous(a: np.ndarray) -> np.ndarray:
    """A dense strided view (a permutation of a whole buffer, positive strides) read in the
    buffer's order as if it were C-contiguous; anything else as it is."""
    def c_strides(shape):
        return tuple(int(np.prod(shape[i + 1:])) * a.itemsize for i in range(len(shape)))

    order = np.argsort([-s for s in a.strides], kind="stable")
    stored = tuple(a.shape[i] for i in order)           # the buffer's own axis order
    if a.flags.c_contiguous or min(a.strides, default=1) <= 0 or \
            tuple(a.strides[i] for i in order) != c_strides(stored):
        return a
    return np.lib.stride_tricks.as_strided(a, a.shape, c_strides(a.shape))


def _pool_back_reads_gradient_as_contiguous(real):
    """pool_2d_back reads its incoming gradient in memory order, ignoring its strides (ggml
    0.20.2's pool_2d backward does): right whenever that gradient is contiguous."""
    def kernel(out, ins, **params):
        g, *rest = ins
        real(out, [_as_if_contiguous(g), *rest], **params)
    return kernel


def _cross_entropy_back_not_divided(real):
    def kernel(out, ins, **params):
        real(out, ins, **params)
        out *= out.size // out.shape[-1]            # the row count N the kernel divided by
    return kernel


# --- which cases exercise a bug -----------------------------------------------------------------
def _pair(v) -> tuple[int, int]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _dilated(case) -> bool:
    return _pair(case.kwargs.get("dilation", 1)) != (1, 1)


def _not_an_involution(case) -> bool:
    axes = case.kwargs["axes"]
    return any(axes[axes[i]] != i for i in range(len(axes)))


def _several_rows(case) -> bool:
    return math.prod(case.inputs[0].shape[:-1]) > 1


def _mode(mode):
    return lambda case: case.kwargs.get("mode") == mode


def _add_square_case(dtype):
    return [Sample.make("add", [InputSpec("a", (3, 3)), InputSpec("b", (3, 1))], dtype)]


def _permute_cube_case(dtype):
    return [Sample.make("permute", [InputSpec("x", (3, 3, 3))], dtype, axes=(2, 0, 1))]


MUTANTS: dict[str, Mutant] = {m.name: m for m in [
    Mutant("relu_grad_scaled", ("relu",),
           "relu's gradient multiplied by 1.01", scaled("relu", 1.01)),
    Mutant("matmul_grad_scaled", ("matmul",),
           "both of matmul's gradients multiplied by 1.01", scaled("matmul", 1.01)),
    Mutant("matmul_grad_a_untransposed", ("matmul",),
           "grad_a = g @ b instead of g @ b^T, b 'transposed' by a reshape to b^T's shape "
           "(shapes stay valid; on square b it is exactly g @ b)",
           lambda: backward_replaced("matmul", _matmul_grad_a_untransposed)),
    Mutant("permute_grad_forward_axes", ("permute",),
           "permute's backward applies the forward axes instead of their inverse; invisible "
           "on swaps, a shape error on non-cubic 3-cycles (caught by shape check), wrong "
           "numbers on the extra cubic case (3,3,3)",
           lambda: backward_replaced("permute", _permute_forward_axes),
           where=_not_an_involution, extra=_permute_cube_case),
    Mutant("div_drops_denominator_grad", ("div",),
           "div's backward returns no gradient for the denominator b (zero)",
           lambda: backward_replaced("div", lambda real: lambda g, out, a, b:
                                     (real(g, out, a, b)[0], None))),
    Mutant("log_softmax_drops_normaliser", ("log_softmax",),
           "log_softmax's gradient g - softmax * sum(g) loses its second term: just g",
           lambda: backward_replaced("log_softmax", lambda real: lambda g, out, x: (g,))),
    Mutant("add_broadcast_wrong_axis", ("add",),
           "add's broadcast gradient reduced over the axis left of each broadcast axis, then "
           "reshaped: a shape error on the registry's cases (caught by shape check), wrong "
           "numbers on the extra case a (3,3) + b (3,1), which the registry lacks",
           lambda: backward_replaced("add", _add_wrong_axis), extra=_add_square_case),
    Mutant("pool_max_grad_to_neighbour", ("pool_2d",),
           "pool_2d_back (max) routes each window's gradient to the cell right of its "
           "maximum", lambda: kernel_replaced("pool_2d_back", _pool_max_to_neighbour),
           where=_mode("max")),
    Mutant("pool_avg_window_shifted", ("pool_2d",),
           "pool_2d_back (avg) spreads each window's gradient over a window shifted one "
           "column left", lambda: kernel_replaced("pool_2d_back", _pool_avg_window_shifted),
           where=_mode("avg")),
    Mutant("pool_back_reads_gradient_as_contiguous", ("pool_2d",),
           "pool_2d_back reads its incoming gradient in memory order, ignoring its strides "
           "(ggml 0.20.2's bug, which broke its MNIST CNN): only a cotangent=permuted case "
           "hands it a strided gradient",
           lambda: kernel_replaced("pool_2d_back", _pool_back_reads_gradient_as_contiguous),
           where=lambda case: case.cotangent == "permuted", cotangents=True),
    Mutant("softmax_back_no_subtraction", ("softmax",),
           "softmax_back computes s * y * g instead of s * y * (g - sum(g * y))",
           lambda: kernel_replaced("softmax_back", _softmax_back_no_subtraction)),
    Mutant("im2col_back_ignores_dilation", ("im2col", "conv_2d"),
           "im2col_back scatters the columns as if the dilation were 1",
           lambda: kernel_replaced("im2col_back", _im2col_back_no_dilation), where=_dilated,
           max_cases=1),
    Mutant("cross_entropy_back_not_divided", ("cross_entropy_loss",),
           "cross_entropy_loss_back forgets to divide by the row count N",
           lambda: kernel_replaced("cross_entropy_loss_back", _cross_entropy_back_not_divided),
           where=_several_rows),
]}
