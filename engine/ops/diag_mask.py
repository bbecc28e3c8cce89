"""Causal masks: diag_mask_inf and diag_mask_zero (ggml's DIAG_MASK_INF and DIAG_MASK_ZERO).

For x of 2 to 4 axes (ggml's tensors have at most 4), rows i on axis -2 and columns j on
axis -1, and an int n_past >= 0 (the positions already seen, so row i may attend to
columns 0 .. n_past + i):

    diag_mask_inf(x, n_past)[..., i, j]  = -inf  where j > n_past + i,  x[..., i, j] elsewhere
    diag_mask_zero(x, n_past)[..., i, j] = 0     where j > n_past + i,  x[..., i, j] elsewhere

softmax(diag_mask_inf(x, n_past)) is the causal softmax of attention: a masked score gets
weight exp(-inf) = 0. Both are linear in x on the kept elements and constant on the masked
ones, so the gradient of either is the upstream gradient with the masked elements zeroed:

    grad_x = diag_mask_zero(g, n_past)                 (ggml's backward of both)

diag_mask_inf's -inf outputs are constants of the op: gradcheck gives them weight 0 and
reports them as `constant` (gradcheck.reference.constant_cells). torch:
x.masked_fill(triu(ones(R, C), n_past + 1), -inf or 0).
"""

from __future__ import annotations

import math

from engine.backends.cpu.diag_mask import cpu_diag_mask_inf, cpu_diag_mask_zero
from engine.errors import DTypeError, ShapeError
from engine.params import INT32_MAX, Params, int_param
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import SIDE, SQUARE, TRANSPOSED, bench_case, scale_case
from engine.strategies import MAX_ELEMENTS, draw_input, sample_strategy, shapes
from engine.tensor import is_float

OPS = ("diag_mask_inf", "diag_mask_zero")
FILL = {"diag_mask_inf": -math.inf, "diag_mask_zero": 0.0}
MAX_DIMS = 4


# ggml's int n_past; the kernel keeps columns up to n_past + i + 1, far inside int64
PARAMS = Params(dict(n_past=int_param(0, INT32_MAX, why="positions already seen (ggml's int)")))


def _n_past(op, name, v) -> int:
    return PARAMS[name].check(op, name, v)


def _infer(op):
    def infer(x, n_past):
        if not is_float(x.dtype):
            raise DTypeError(f"{op}: x must be float, got {x.dtype} (shape {list(x.shape)})")
        if not 2 <= x.ndim <= MAX_DIMS:
            raise ShapeError(f"{op}: x must have 2 to {MAX_DIMS} axes (rows, columns last), "
                             f"got shape {list(x.shape)}")
        return x.shape, x.dtype
    infer.__name__ = f"_{op}_infer"
    return infer


def diag_mask_inf(x, n_past=0):
    """x with -inf at [..., i, j] for j > n_past + i (the causal mask of attention scores)."""
    return make_node("diag_mask_inf", (x,), n_past=_n_past("diag_mask_inf", "n_past", n_past))


def diag_mask_zero(x, n_past=0):
    """x with 0 at [..., i, j] for j > n_past + i (the gradient of both causal masks)."""
    return make_node("diag_mask_zero", (x,),
                     n_past=_n_past("diag_mask_zero", "n_past", n_past))


def _backward(g, out, x, n_past):
    return (diag_mask_zero(g, n_past),)


def _torch(op):
    def reference(x, n_past):
        import torch
        rows, cols = x.shape[-2], x.shape[-1]
        masked = torch.ones(rows, cols, dtype=torch.bool).triu(n_past + 1)
        return x.masked_fill(masked, FILL[op])
    return reference


# --- samples, strategies, registration --------------------------------------------------------
# (shape, n_past, view): square, n_past 0 and > 0, wide rows (more columns than rows: the
# kv cache), more rows than columns, n_past past the last column (nothing masked), batches
# and heads, and views: permuted, sliced (an offset and steps), expanded (stride 0)
CASES = [((4, 4), 0, {}), ((4, 4), 2, {}), ((3, 9), 0, {}), ((3, 9), 5, {}),
         ((7, 3), 0, {}), ((7, 3), 1, {}), ((2, 3), 6, {}), ((1, 5), 0, {}),
         ((2, 4, 5), 1, {}), ((2, 2, 3, 4), 0, {}), ((2, 3, 2, 5), 2, {}),
         ((4, 5), 1, {"permute": (1, 0)}), ((2, 3, 4), 0, {"permute": (2, 0, 1)}),
         ((3, 5), 1, {"slice": ((1, 4, 1), (0, 10, 2))}),
         ((2, 3, 4), 0, {"slice": ((0, 2, 1), (1, 4, 1), (1, 5, 1))}),
         ((3, 4, 5), 2, {"expand": (0,)}), ((4, 6), 0, {"expand": (0,)})]


def _samples(op):
    @both_dtypes
    def samples(dtype):
        return [Sample.make(op, [InputSpec("x", shape, low=-3.0, high=3.0, **view)], dtype,
                            n_past=n_past) for shape, n_past, view in CASES]
    samples.__name__ = f"_{op}_samples"
    return samples


def _strategy(op):
    @sample_strategy
    def strategy(draw, dtype):
        """x of 2-4 axes (up to MAX_ELEMENTS), possibly a view, its range drawn; n_past
        from 0 to past the last column."""
        from hypothesis import strategies as st
        shape = draw(shapes(2, MAX_DIMS, max_side=8, max_size=MAX_ELEMENTS))
        n_past = draw(st.integers(0, shape[-1] + 1))
        return Sample.make(op, [draw_input(draw, "x", shape)], dtype, n_past=n_past)
    strategy.__name__ = f"_{op}_strategy"
    return strategy


def _scale(op):
    def scale():
        """Scale cases: SQUARE rows (and a transposed view of them) split into row ranges
        on the engine's threads (split:cpu_diag_mask), a band of width 17 past the
        diagonal."""
        x = dict(kind="uniform", low=-3.0, high=3.0)
        return [scale_case(op, [InputSpec("x", SQUARE, **x)], n_past=17),
                scale_case(op, [InputSpec("x", (2, SIDE // 2, SIDE), **x)], n_past=0),
                scale_case(op, [InputSpec("x", SQUARE, permute=TRANSPOSED, **x)], n_past=0)]
    scale.__name__ = f"_{op}_scale"
    return scale


def _bench(op):
    def bench():
        """Bench case: the causal mask of 8 heads' (512, 512) attention scores."""
        return [bench_case(op, [InputSpec("x", (8, 512, 512), "uniform", -3.0, 3.0)],
                           n_past=0)]
    bench.__name__ = f"_{op}_bench"
    return bench


for _op, _build, _kernel in (("diag_mask_inf", diag_mask_inf, cpu_diag_mask_inf),
                             ("diag_mask_zero", diag_mask_zero, cpu_diag_mask_zero)):
    register(OpDef(_op, params=PARAMS, infer=_infer(_op), backward=_backward,
                   kernels={"cpu": _kernel, "cuda": f"engine.backends.cuda.diag_mask:cuda_{_op}"},
                   build=_build, torch=_torch(_op), samples=_samples(_op),
                   scale=_scale(_op), bench=_bench(_op), strategy=_strategy(_op),
                   doc=f"x with {FILL[_op]} at [..., i, j] for j > n_past + i (causal mask); "
                       "gradient: diag_mask_zero(g, n_past)"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import backwards_replaced  # noqa: E402


def _mask_from_the_diagonal(real):
    return lambda g, out, x, n_past: real(g, out, x, n_past=0)


mutation.register(
    Mutant("diag_mask_grad_ignores_n_past", ("diag_mask_inf", "diag_mask_zero"),
           "the causal mask's backward masks as if n_past were 0: the gradient of the cells "
           "between the diagonal and n_past is dropped",
           backwards_replaced(("diag_mask_inf", "diag_mask_zero"), _mask_from_the_diagonal),
           where=lambda case: case.kwargs["n_past"] > 0, kind="off-by-one window"),
)
