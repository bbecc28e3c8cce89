"""argmax along the last axis: int32 indices of shape x.shape[:-1].

On ties the first (lowest) index wins; a NaN counts as larger than any number, so the first
NaN of a row wins (numpy and torch agree). Piecewise constant: no gradient.
"""

from __future__ import annotations

from engine.backends.cpu.argmax import cpu_argmax
from engine.errors import ShapeError
from engine.ops.shape import contiguous_inputs
from engine.params import check_rows
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case
from engine.strategies import DISTINCT, draw_input, sample_strategy, shapes


def _infer(x):
    check_rows("argmax", x)
    if x.shape[-1] == 0:
        raise ShapeError(f"argmax: the last axis of shape {list(x.shape)} is empty")
    return x.shape[:-1], "i32"


def argmax(x):
    """Index of the largest element along the last axis (first one on ties), as int32."""
    (x,) = contiguous_inputs(x)
    return make_node("argmax", (x,))


@both_dtypes
def _samples(dtype):
    return [Sample.make("argmax", [InputSpec("x", s, "distinct", -2.0, 2.0)], dtype)
            for s in [(7,), (3, 4), (2, 3, 5)]]


@sample_strategy
def _strategy(draw, dtype):
    """1 to 3 axes of distinct values (no ties; a range of DISTINCT), possibly a permuted
    or sliced view (never expanded: repeated values would tie)."""
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=8))
    return Sample.make("argmax", [draw_input(draw, "x", shape, DISTINCT,
                                            layout={"expand": False})], dtype)


def _torch_argmax(x):
    import torch
    return x.argmax(-1).to(torch.int32)


def _bench():
    """Bench case: the next token of 256 rows of logits over a 32,000-token vocabulary."""
    return [bench_case("argmax", [InputSpec("x", (256, 32000), "uniform", -3.0, 3.0)])]


register(OpDef("argmax", params={}, infer=_infer,
               no_grad="integer output: piecewise constant",
               kernels={"cpu": cpu_argmax, "cuda": "engine.backends.cuda.argmax:cuda_argmax"},
               build=argmax, torch=_torch_argmax,
               samples=_samples, bench=_bench, strategy=_strategy,
               doc="index of the max along the last axis, int32, first on ties"))
