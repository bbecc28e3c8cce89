"""Matrix product with numpy's batching rules, for inputs of 2 or more axes.

    out[..., i, j] = sum_k a[..., i, k] b[..., k, j]

The batch axes (all but the last two) broadcast as in numpy. Backward, with the matrix
transpose T of the last two axes and `sum_to` undoing the batch broadcast:

    grad_a = sum_to(g @ b^T, a.shape)      grad_b = sum_to(a^T @ g, b.shape)

Both operands have one dtype, or one is float32 and the other float16 or bfloat16: a
language model's linear layer on 16-bit weights (ggml's mul_mat of F16 or BF16 weights and
F32 activations). That product is float32: the 16-bit operand widened (exact), accumulated
in float32; the 16-bit operand's gradient is rounded to its dtype (a cast).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from engine.backends.cpu.matmul import cpu_matmul
from engine.errors import DTypeError, ShapeError
from engine.ops.broadcast import broadcast_shapes, sum_to
from engine.ops.cast import cast
from engine.ops.shape import transpose
from engine.registry import OpDef, make_node, register, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import (
    BENCH_DTYPE,
    BENCH_HALF_DTYPES,
    HALF_SCALE_DTYPES,
    bench_cases,
    scale_case,
)
from engine.strategies import broadcast_source, draw_input, sample_strategy, shapes
from engine.tensor import HALF_DTYPES, dtype_name, is_float

HALF_NAMES = ("f16", "bf16")


def _mixed(a, b) -> bool:
    """Whether the operands are float32 and a 16-bit float (either way round)."""
    return {np.dtype(a.dtype), np.dtype(b.dtype)} in ({np.dtype(np.float32), h}
                                                      for h in HALF_DTYPES)


def _infer(a, b):
    if a.dtype != b.dtype and not _mixed(a, b):
        raise DTypeError(f"matmul: dtypes differ ({a.dtype} and {b.dtype}) for shapes "
                         f"{shapes_str(a, b)}; only float32 with float16 or bfloat16 mix; "
                         "convert one explicitly (cast)")
    if not is_float(a.dtype):
        raise DTypeError(f"matmul: needs float inputs, got {a.dtype} for shapes "
                         f"{shapes_str(a, b)}")
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError(f"matmul: needs inputs with at least 2 axes, got shapes "
                         f"{shapes_str(a, b)}; reshape a vector to [1, n] or [n, 1]")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: inner dimensions differ ({a.shape[-1]} != "
                         f"{b.shape[-2]}) for shapes {shapes_str(a, b)}")
    try:
        batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    except ShapeError:
        raise ShapeError(f"matmul: batch axes {list(a.shape[:-2])} and {list(b.shape[:-2])} "
                         f"do not broadcast, for shapes {shapes_str(a, b)}") from None
    return batch + (a.shape[-2], b.shape[-1]), np.float32 if _mixed(a, b) else a.dtype


def matmul(a, b):
    """a @ b over the last two axes; batch axes broadcast (numpy.matmul for ndim >= 2)."""
    return make_node("matmul", (a, b))


def _backward(g, out, a, b):
    def like(grad, x):            # a mixed product's 16-bit operand: its gradient rounded
        return grad if grad.dtype == x.dtype else cast(grad, dtype_name(x.dtype))
    return (like(sum_to(matmul(g, transpose(b)), a.shape), a),
            like(sum_to(matmul(transpose(a), g), b.shape), b))


VIEW_PAIRS = [(((3, 4), {"slice": ((1, 4, 1), (0, 8, 2))}),
               ((4, 5), {"slice": ((2, 10, 2), (1, 6, 1))})),
              (((2, 3, 4), {"expand": (0,)}), ((2, 4, 5), {"expand": (2,)})),
              (((3, 4), {"expand": (1,)}), ((2, 4, 5), {"slice": ((0, 2, 1), (1, 5, 1),
                                                                  (0, 10, 2))})),
              (((3, 4), {"slice": ((1, 4, 1), (1, 5, 1))}),
               ((4, 5), {"slice": ((0, 8, 2), (2, 7, 1))}))]
MATMUL_SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)),
                 ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5)), ((1, 1), (1, 3))]


@both_dtypes
def _samples(dtype):
    return [Sample.make("matmul", [InputSpec("a", sa), InputSpec("b", sb)], dtype)
            for sa, sb in MATMUL_SHAPES] + [
        # transposed operands: a^T @ b and a @ b^T as strided views
        Sample.make("matmul", [InputSpec("a", (3, 4), permute=(1, 0)), InputSpec("b", (4, 5))],
                    dtype),
        Sample.make("matmul", [InputSpec("a", (2, 3, 4)),
                               InputSpec("b", (2, 4, 5), permute=(0, 2, 1))], dtype)] + [
        # sliced (an offset and steps) and expanded (stride 0) operands
        Sample.make("matmul", [InputSpec("a", sa, **va), InputSpec("b", sb, **vb)], dtype)
        for (sa, va), (sb, vb) in VIEW_PAIRS] + (MIXED if dtype == "f32" else [])


# float32 activations a (m, k) times 16-bit weights b (k, n) stored as ggml stores weights
# (the leaf (n, k), b its transposed view), and the other way round once; (m, k, n): a
# single row, a small layer, and k long enough that the accumulation matters
MIXED = [Sample.make("matmul", [InputSpec("a", (m, k)),
                                InputSpec("b", (k, n), dtype=w, permute=(1, 0))], "f32")
         for w in HALF_NAMES for m, k, n in ((1, 16, 4), (3, 8, 6), (4, 48, 5))] + [
    Sample.make("matmul", [InputSpec("a", (3, 4), dtype=w), InputSpec("b", (4, 5))], "f32")
    for w in HALF_NAMES]


def _operand(draw, name, shape):
    """An operand in a range of SIGNED: contiguous, transposed (last two axes swapped) or
    another view (permuted, sliced, expanded)."""
    from hypothesis import strategies as st
    n = len(shape)
    transposed = tuple(range(n - 2)) + (n - 1, n - 2)
    spec = draw_input(draw, name, shape)
    if not spec.is_view and draw(st.booleans()):
        spec = dataclasses.replace(spec, permute=transposed)
    return spec


@sample_strategy
def _strategy(draw, dtype):
    """m, k, n in 1..5; batch axes (at most 2, at most 4 batches) that each operand may
    drop or hold as 1 (numpy broadcasting); either operand possibly a strided view."""
    from hypothesis import strategies as st
    batch = draw(shapes(min_dims=0, max_dims=2, max_side=4, max_size=4))
    m, k, n = (draw(st.integers(1, 5)) for _ in range(3))
    a = _operand(draw, "a", draw(broadcast_source(batch)) + (m, k))
    b = _operand(draw, "b", draw(broadcast_source(batch)) + (k, n))
    return Sample.make("matmul", [a, b], dtype)


def _matmul_scale():
    """Scale cases (engine.scale_cases): the zero-skipping product with a sparse left
    operand (MNIST's FC layer's shape, 1000 x 784 inputs, 10% non-zero, but 2000 outputs:
    at 10% the sparse path pays only on long product rows, which spread its counting over
    more multiply-adds, engine.backends.cpu.matmul; its weight gradient a^T @ g skips a's
    zeros too) and a sparse right one, both split by rows; an operand
    whose zeros fill whole columns, as images' borders (the column split); dense products
    big enough for BLAS on the engine's threads, in ragged row ranges, one with a
    transposed operand;
    a batched product split along its batch axis; the dense product in float16 and
    bfloat16 (float32 accumulation), its conversions inside BLAS's chunks (widen:fused:
    a's rows, g's, the outputs' rounding, g shared by b's gradient's chunks) and the
    operands every chunk reads whole (b, the transposed views in the backward) big enough
    to be widened before, on the engine's threads (split:half_widen:
    half.SPLIT_MIN_ELEMENTS)."""
    sparse = dict(kind="sparse", low=0.0, high=1.0)
    return [scale_case("matmul", [InputSpec("a", (1000, 784), **sparse),
                                  InputSpec("b", (784, 2000))]),
            scale_case("matmul", [InputSpec("a", (2000, 784)),
                                  InputSpec("b", (784, 1000), **sparse)]),
            scale_case("matmul", [InputSpec("a", (1000, 783), "sparse_cols", 0.0, 1.0),
                                  InputSpec("b", (783, 500))]),
            scale_case("matmul", [InputSpec("a", (257, 263)), InputSpec("b", (263, 251))]),
            scale_case("matmul", [InputSpec("a", (257, 263)),
                                  InputSpec("b", (263, 251), permute=(1, 0))]),
            scale_case("matmul", [InputSpec("a", (7, 129, 131)), InputSpec("b", (7, 131, 127))])
            ] + [scale_case("matmul", [InputSpec("a", (523, 1031)), InputSpec("b", (1031, 523))],
                            dtype) for dtype in HALF_SCALE_DTYPES]


def _torch_matmul(a, b):
    """torch's product; a mixed one (which torch refuses) in the wider dtype, as ours."""
    if a.dtype != b.dtype:
        import torch
        wide = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(wide), b.to(wide)
    return a @ b


def _matmul_bench():
    """Bench cases: a language model's projection, 512 tokens of 1024 features times a
    (1024, 2048) weight (2.1 GFLOP forward), in float32, float16 and bfloat16."""
    return bench_cases("matmul", [InputSpec("a", (512, 1024)), InputSpec("b", (1024, 2048))],
                       (BENCH_DTYPE, *BENCH_HALF_DTYPES))


register(OpDef("matmul", params={}, scale=_matmul_scale, bench=_matmul_bench, infer=_infer,
               backward=_backward,
               kernels={"cpu": cpu_matmul, "cuda": "engine.backends.cuda.matmul:cuda_matmul"},
               build=matmul, torch=_torch_matmul, samples=_samples, strategy=_strategy,
               doc="matrix product over the last two axes, batch axes broadcast (numpy)"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.backends.cpu import matmul_sparse as sp  # noqa: E402
from engine.backends.cpu import paths  # noqa: E402
from engine.backends.cpu.matmul import dense_lines  # noqa: E402
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import (  # noqa: E402
    backward_replaced,
    function_replaced,
    prepare_replaced,
    scaled,
)
from engine.ops.shape import cont_if_strided, reshape  # noqa: E402


def _matmul_grad_a_untransposed(real):
    """grad_a = g @ b with b merely reshaped to b^T's shape: on square b exactly g @ b."""
    def backward(g, out, a, b):
        bt_shape = b.shape[:-2] + (b.shape[-1], b.shape[-2])
        grad_a = sum_to(matmul(g, reshape(cont_if_strided(b), bt_shape)), a.shape)
        return grad_a, real(g, out, a, b)[1]
    return backward


def sparse_product_drops_last_nonzero(prepare):
    """matmul:sparse: each row of the sparse operand's CSR loses its last entry (its row
    end taken one short): that non-zero's term is missing from the product. Rows dense
    enough for BLAS (matmul.dense_lines, which a row split gives to BLAS) are left right."""
    def mutated(out, ins, **params):
        run = prepare(out, ins, **params)
        a, b = ins

        def call():
            with paths.recording() as took:
                run()
            side = next((p for p in took if p.startswith("matmul:sparse")), None)
            if side is None:
                return
            left = side.startswith("matmul:sparse_left")
            s, d, dest = (a, b, out) if left else (b.T, a.T, out.T)
            nonzero = s != 0
            counts = nonzero.sum(axis=1)
            dense = dense_lines(counts, s.shape[1], d.shape[1], "rows")
            rows = np.flatnonzero((counts > 0) & ~dense)
            last = s.shape[1] - 1 - np.argmax(nonzero[rows, ::-1], axis=1)
            dest[rows] -= s[rows, last][:, None] * d[last]
        return call
    return mutated


def threaded_rows_store(real):
    """matmul_sparse.compress_multiply_rows (a thread's row range of a sparse product)
    storing its rows where a column split must add them to the dense columns' share, which
    BLAS wrote first: that share is lost. Only the engine's thread split calls it; one
    thread runs compress_multiply, which stays right."""
    def rows(*args):
        dest, accumulate, r0, r1 = args[9], args[12], args[-2], args[-1]
        if accumulate:
            dest[r0:r1] = 0
        return real(*args)
    return rows


mutation.register(
    Mutant("sparse_threaded_rows_store", ("matmul",),
           "the zero-skipping product split by columns (dense columns by BLAS, the sparse "
           "rest added) stores, on the engine's threads, its sparse rows over the dense "
           "columns' share instead of adding to it",
           lambda: function_replaced(sp, "compress_multiply_rows", threaded_rows_store),
           where=lambda case: case.inputs[0].kind == "sparse_cols", tier="scale",
           max_cases=1, kind="unwritten edge"),
    Mutant("matmul_grad_scaled", ("matmul",),
           "both of matmul's gradients multiplied by 1.01", scaled("matmul", 1.01),
           kind="scaled gradient"),
    Mutant("matmul_grad_a_untransposed", ("matmul",),
           "grad_a = g @ b instead of g @ b^T, b 'transposed' by a reshape to b^T's shape "
           "(shapes stay valid; on square b it is exactly g @ b)",
           lambda: backward_replaced("matmul", _matmul_grad_a_untransposed),
           kind="transposed gradient"),
    Mutant("sparse_product_drops_last_nonzero", ("matmul",),
           "the zero-skipping product (matmul:sparse) loses the last non-zero of each "
           "sparse row of its CSR",
           lambda: prepare_replaced("matmul", sparse_product_drops_last_nonzero),
           where=lambda case: case.inputs[0].kind == "sparse", tier="scale", max_cases=1,
           kind="dropped tail"),
)
