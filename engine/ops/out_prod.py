"""out_prod: a sum of outer products (ggml's OUT_PROD), the product ggml's MUL_MAT backward
is made of.

In numpy axis order (the last axis is ggml's ne0): a has shape (..., K, M), b has shape
(..., K, N), and

    out_prod(a, b)[..., n, m] = sum over k of a[..., k, m] * b[..., k, n]    shape (..., N, M)

that is, out = b^T a over the last two axes: the sum over k of the outer products of row k
of b with row k of a. The batch axes are b's: a's batch axes must broadcast to them (each
side 1 or equal to b's; fewer axes are padded with 1s in front), as ggml repeats a's
matrices across b's batch (ggml asserts ne2 % ne02 == 0; here a side of a is 1 or b's).

A composite op, matmul(transpose(b), a), so its gradients are matmul's:

    d/da = b g            (summed over the batch axes a broadcasts along)
    d/db = a g^T

torch: b.transpose(-1, -2) @ a.
"""

from __future__ import annotations

from engine.errors import DTypeError, ShapeError
from engine.ops.matmul import matmul
from engine.ops.shape import transpose
from engine.registry import OpDef, register, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case, scale_case
from engine.strategies import broadcast_source, draw_input, sample_strategy, shapes
from engine.tensor import is_float


def _check(a, b):
    if not is_float(a.dtype) or a.dtype != b.dtype:
        raise DTypeError(f"out_prod: needs two float inputs of one dtype, got {a.dtype} and "
                         f"{b.dtype} for shapes {shapes_str(a, b)}")
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError(f"out_prod: needs a (..., K, M) and b (..., K, N), got shapes "
                         f"{shapes_str(a, b)}; reshape a vector to [1, n]")
    if a.shape[-2] != b.shape[-2]:
        raise ShapeError(f"out_prod: a (..., K, M) and b (..., K, N) must share K, got "
                         f"{a.shape[-2]} and {b.shape[-2]} for shapes {shapes_str(a, b)}")
    a_batch, b_batch = a.shape[:-2], b.shape[:-2]
    padded = (1,) * (len(b_batch) - len(a_batch)) + tuple(a_batch)
    if len(a_batch) > len(b_batch) or any(
            n not in (1, m) for n, m in zip(padded, b_batch, strict=True)):
        raise ShapeError(f"out_prod: a's batch axes {list(a_batch)} must broadcast to b's "
                         f"{list(b_batch)} (each side 1 or b's), for shapes "
                         f"{shapes_str(a, b)}")


def out_prod(a, b):
    """out[..., n, m] = sum_k a[..., k, m] * b[..., k, n] for a (..., K, M) and b
    (..., K, N): shape b.shape[:-2] + (N, M), a's batch broadcast to b's."""
    _check(a, b)
    return matmul(transpose(b), a)


def _torch_out_prod(a, b):
    return b.transpose(-1, -2) @ a


# --- samples and registration ---------------------------------------------------------------
# (a shape, b shape): ggml's test-backend-ops OUT_PROD cases (m = 256 shrunk, k = 1 and 16,
# broadcast batches) and a rank-2 product with a single k
CASES = [((4, 5), (4, 3)), ((1, 6), (1, 4)), ((16, 3), (16, 2)), ((2, 3, 4), (2, 3, 5)),
         ((3, 4), (2, 3, 5)), ((1, 3, 4), (2, 3, 5)), ((2, 1, 3, 2), (2, 3, 3, 4)),
         ((1, 1, 5, 3), (3, 2, 5, 2))]


@both_dtypes
def _out_prod_samples(dtype):
    out = [Sample.make("out_prod", [InputSpec("a", sa), InputSpec("b", sb)], dtype)
           for sa, sb in CASES]
    # views: a transposed (ggml's usual operand: the stored (M, K) matrix seen as (K, M)),
    # b permuted, a sliced, a expanded along a batch axis, b sliced
    out += [Sample.make("out_prod", [InputSpec("a", (4, 5), permute=(1, 0)),
                                     InputSpec("b", (4, 3))], dtype),
            Sample.make("out_prod", [InputSpec("a", (2, 3, 4)),
                                     InputSpec("b", (2, 3, 5), permute=(1, 0, 2))], dtype),
            Sample.make("out_prod", [InputSpec("a", (3, 4), slice=((1, 4, 1), (0, 8, 2))),
                                     InputSpec("b", (3, 2), slice=((0, 6, 2), (1, 3, 1)))],
                        dtype),
            Sample.make("out_prod", [InputSpec("a", (2, 3, 4), expand=(0,)),
                                     InputSpec("b", (2, 3, 5))], dtype)]
    return out


@sample_strategy
def _out_prod_strategy(draw, dtype):
    """k, m, n in 1..5; b's batch axes (at most 2, at most 4 batches), a's drawn to
    broadcast to them; either operand possibly a view."""
    from hypothesis import strategies as st
    batch = draw(shapes(min_dims=0, max_dims=2, max_side=4, max_size=4))
    k, m, n = (draw(st.integers(1, 5)) for _ in range(3))
    a = draw_input(draw, "a", draw(broadcast_source(batch)) + (k, m))
    b = draw_input(draw, "b", batch + (k, n))
    return Sample.make("out_prod", [a, b], dtype)


def _out_prod_scale():
    """Scale cases: products of ~2^24 multiply-adds (matmul's threaded split in ragged row
    ranges), a contiguous and a transposed (ggml's layout) a, and a batched one with a
    broadcast a."""
    return [scale_case("out_prod", [InputSpec("a", (263, 257)), InputSpec("b", (263, 251))]),
            scale_case("out_prod", [InputSpec("a", (263, 257), permute=(1, 0)),
                                    InputSpec("b", (263, 251))]),
            scale_case("out_prod", [InputSpec("a", (1, 131, 129)),
                                    InputSpec("b", (7, 131, 127))])]


def _out_prod_bench():
    """Bench case: a projection's weight gradient (ggml's use of OUT_PROD), 512 tokens'
    inputs (512, 1024) against their gradients (512, 2048)."""
    return [bench_case("out_prod", [InputSpec("a", (512, 1024)), InputSpec("b", (512, 2048))])]


register(OpDef("out_prod", kind="composite", compose=out_prod, torch=_torch_out_prod,
               samples=_out_prod_samples, scale=_out_prod_scale, bench=_out_prod_bench,
               strategy=_out_prod_strategy,
               doc="sum over k of outer products: out[..., n, m] = sum_k a[..., k, m] "
                   "b[..., k, n] (ggml OUT_PROD); a's batch broadcasts to b's"))


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("out_prod", "composite: matmul of transpose(b) and a, whose mutants cover its "
                            "gradient")
