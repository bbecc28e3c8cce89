"""mse_loss: the mean squared error of two tensors of one shape, a 0-d scalar.

    mse_loss(a, b) = (1/n) sum_i (a_i - b_i)^2,        n = number of elements

composed as mean(sqr(sub(a, b))), so both inputs are differentiable through those ops:

    grad_a = (2/n) g (a - b),      grad_b = -(2/n) g (a - b)

The inputs must have the same shape and dtype: a silent broadcast would average over the
wrong count (torch warns about it for the same reason).
"""

from __future__ import annotations

from engine.errors import DTypeError, ShapeError
from engine.ops.reduce import mean
from engine.registry import OpDef, register, registered, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import BENCH_ELEMENTS, SQUARE, bench_case, scale_case
from engine.strategies import draw_input, sample_strategy, shapes
from engine.tensor import is_float


def mse_loss(a, b):
    """mean((a - b)^2) over every element, a 0-d tensor; a and b of one shape and dtype."""
    if not is_float(a.dtype) or a.dtype != b.dtype:
        raise DTypeError(f"mse_loss: needs float inputs of one dtype, got {a.dtype} and "
                         f"{b.dtype} for shapes {shapes_str(a, b)}")
    if a.shape != b.shape:
        raise ShapeError(f"mse_loss: inputs must have the same shape, got {shapes_str(a, b)}")
    if a.size == 0:
        raise ShapeError(f"mse_loss: the mean of no elements is undefined (shapes "
                         f"{shapes_str(a, b)})")
    return mean(registered.sqr(registered.sub(a, b)))


def _torch_mse_loss(a, b):
    import torch.nn.functional as F
    return F.mse_loss(a, b)


# (a shape, b shape's permute or None, a's permute or None); ggml's loss ops are checked on
# shapes like [10, 5, 4, 3]: here smaller, as the finite differences cost 4 evaluations per
# element of each input
CASES = [((), None, None), ((7,), None, None), ((3, 4), None, None), ((2, 3, 4), None, None),
         ((2, 2, 3, 4), None, None), ((3, 4, 5), (2, 0, 1), None),
         ((4, 6), None, (1, 0)), ((2, 3, 4), (1, 2, 0), (2, 1, 0))]


@both_dtypes
def _samples(dtype):
    return [Sample.make("mse_loss", [InputSpec("a", s, low=-2.0, high=2.0, permute=pa),
                                     InputSpec("b", s, permute=pb)], dtype)
            for s, pa, pb in CASES]


@sample_strategy
def _strategy(draw, dtype):
    shape = draw(shapes(0, 4, max_side=5, max_size=120))
    return Sample.make("mse_loss", [
        draw_input(draw, "a", shape), draw_input(draw, "b", shape)], dtype)


def _mse_loss_scale():
    """Scale case: two SQUARE operands."""
    return [scale_case("mse_loss", [InputSpec("a", SQUARE), InputSpec("b", SQUARE)])]


def _mse_loss_bench():
    """Bench case: two BENCH_ELEMENTS operands."""
    return [bench_case("mse_loss", [InputSpec("a", BENCH_ELEMENTS),
                                    InputSpec("b", BENCH_ELEMENTS)])]


register(OpDef("mse_loss", kind="composite", compose=mse_loss, torch=_torch_mse_loss,
               scale=_mse_loss_scale, bench=_mse_loss_bench,
               samples=_samples, strategy=_strategy,
               doc="mean((a - b)^2) over every element, a 0-d loss; both inputs "
                   "differentiable"))


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("mse_loss", "composite: mean(sqr(sub(a, b))), differentiated through those "
                            "ops (sum's and sub's mutants; sqr's stated reason)")
