"""conv_2d: 2-D convolution (cross-correlation, no bias) as im2col followed by a matmul.

For x of shape (N, C, H, W) and an OIHW kernel w of shape (O, C, KH, KW), as torch's
conv2d:

    out[n, o, oy, ox] = sum over c, ky, kx of
                        w[o, c, ky, kx] x[n, c, oy s_h - p_h + ky d_h, ox s_w - p_w + kx d_w]

(x read as 0 in the padding), OH = (H + 2 p_h - d_h (KH - 1) - 1) // s_h + 1 (OW likewise).
With K = C*KH*KW, P = OH*OW and w_rows = reshape(w, (O, K)), it is composed in one of two
arrangements, batched over n, each on im2col's columns (dtype w's) in its own layout:

    kernel rows first:  cols = reshape(im2col(x, layout NKHW), (N, K, P))
                        out[n] = w_rows @ cols[n]                    (O, P): already NCHW
    columns first:      cols = reshape(im2col(x), (N, P, K))
                        out[n] = (cols[n] @ w_rows^T)^T              (P, O), then copied NCHW

so its gradients come from those parts: im2col_back for x, matmul's rule for w. Neither
copies the columns' gradient: in kernel rows first it is w_rows^T @ g[n], (K, P), already
in the columns' layout; in columns first, g[n]^T @ w_rows, (P, K), which the reshape
before im2col_back computes as such (engine.ops.shape.contiguous_product) rather than as
the transpose of w_rows^T @ g[n]. The NKHW columns are shifted rows of the image's planes:
im2col and col2im copy and add whole rows (the fast paths im2col:rows and
im2col_back:rows). On the bench case, (64, 32, 32, 32) by (64, 32, 3, 3) with padding 1,
forward and backward went from (N, P, K) columns multiplied transposed to NKHW columns:
im2col 11.7 -> 9.5-9.7 ms, col2im 25.0 -> 8.7-9.9, the three products 81 -> 83-85, 121 ->
106 ms in all (`python bench/profile_op.py --op conv_2d`: one thread's CPU time per
node, BLAS on one thread). OpenBLAS packs an operand whose rows lie 4 KiB apart slowly:
w_rows @ cols[n] with P = 1024 took 30-33 ms where rows padded to 1040 took 23-26 (a
one-off script). Columns first copies its output, N*P*O elements, in the forward pass;
but OpenBLAS makes an (O, K) @ (K, P) product with few rows O slowly: for P = 196, K = 72
and O = 16, 32, 64 the kernel rows first product (then on transposed (P, K) columns)
took 1.39, 1.10 and 0.91 times the columns first product and its copy (one thread's CPU
time, numpy 2.x's OpenBLAS, a one-off script on this 2-core machine). So:

- x with no gradient (it depends on no param, as a model's input images), or K <= O, or
  O >= ROWS_FIRST_MIN_OUT: kernel rows first, no copy at all;
- else (an inner layer with few output channels, as the MNIST CNN's second, O = 16):
  columns first. On that CNN, kernel rows first for its second layer measured 2-5% more
  CPU time per training epoch than columns first (7.17-7.66 s against 7.00-7.28, three
  epochs each, `--threads 1`, alternating).

The batched products are N products of (O, K) by (K, P) (or their transposes), rather than
one (N*P, K) by (K, O) product whose K and O are small, a shape that measured far below
BLAS's speed. The kernel's gradient is summed per image by matmul and then over the batch
by sum_to: float32 results differ from one (K, N*P) by (N*P, O) product only in the order of
summation.
"""

from __future__ import annotations

from engine.errors import DTypeError, ShapeError
from engine.ops.im2col import im2col
from engine.ops.matmul import matmul
from engine.ops.shape import cont, cont_if_strided, reshape, transpose
from engine.params import Params, pair, size_param, window_output_size
from engine.registry import OpDef, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case, scale_case
from engine.strategies import MAX_ELEMENTS, draw_input, sample_strategy, shapes, window_axis
from engine.tensor import is_float


def _check(x, w, stride, padding, dilation) -> tuple[int, int]:
    """Validate NCHW input and OIHW kernel; return (OH, OW)."""
    if x.ndim != 4 or w.ndim != 4:
        raise ShapeError(f"conv_2d: needs an NCHW input and an OIHW kernel (4 axes each), "
                         f"got shapes {list(x.shape)} and {list(w.shape)}")
    if not is_float(x.dtype) or not is_float(w.dtype):
        raise DTypeError(f"conv_2d: needs float input and kernel, got {x.dtype} and "
                         f"{w.dtype} for shapes {list(x.shape)} and {list(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ShapeError(f"conv_2d: input has {x.shape[1]} channels but the kernel expects "
                         f"{w.shape[1]} (shapes {list(x.shape)} and {list(w.shape)})")
    return window_output_size("conv_2d", x.shape, w.shape[2:], stride, padding, dilation)


# output channels from which kernel rows first pays even where the columns are the larger
# operand (see the module doc)
ROWS_FIRST_MIN_OUT = 64


def _depends_on_a_param(t) -> bool:
    """Whether t gets a gradient: it is a param or is computed from one."""
    seen, stack = set(), [t]
    while stack:
        u = stack.pop()
        if u.is_param:
            return True
        if u.id not in seen:
            seen.add(u.id)
            stack.extend(u.srcs)
    return False


def conv_2d(x, w, stride=1, padding=0, dilation=1):
    """2-D convolution of NCHW x with OIHW kernel w (torch's conv2d without bias).

    stride, padding, dilation: an int or a pair (rows, cols). The result has w's dtype.
    """
    stride, padding, dilation = (pair("conv_2d", name, v) for name, v in
                                 (("stride", stride), ("padding", padding),
                                  ("dilation", dilation)))
    oh, ow = _check(x, w, stride, padding, dilation)
    n = x.shape[0]
    o, c, kh, kw = w.shape
    k = c * kh * kw
    w_rows = reshape(cont_if_strided(w), (o, k))                 # a strided kernel is copied
    if o >= ROWS_FIRST_MIN_OUT or k <= o or not _depends_on_a_param(x):
        cols = reshape(im2col(x, kh, kw, stride, padding, dilation, dtype=w.dtype,
                              layout="NKHW"), (n, k, oh * ow))
        out = matmul(w_rows, cols)                                 # (N, O, OH*OW)
    else:
        cols = reshape(im2col(x, kh, kw, stride, padding, dilation, dtype=w.dtype),
                       (n, oh * ow, k))
        out = cont(transpose(matmul(cols, transpose(w_rows))))     # (N, OH*OW, O) -> NCHW
    return reshape(out, (n, o, oh, ow))


def _torch_conv_2d(x, w, stride=1, padding=0, dilation=1):
    import torch.nn.functional as F
    return F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation)


@both_dtypes
def _conv_samples(dtype):
    # (x shape, w shape, stride, padding, dilation)
    cases = [((1, 1, 5, 5), (1, 1, 3, 3), 1, 0, 1),
             ((2, 3, 6, 5), (4, 3, 3, 3), 1, 1, 1),
             ((2, 3, 7, 6), (2, 3, 3, 3), 2, 0, 1),
             ((3, 2, 8, 7), (3, 2, 3, 3), 2, 1, 1),
             ((2, 4, 5, 6), (3, 4, 1, 1), 1, 0, 1),
             ((1, 3, 6, 6), (2, 3, 1, 1), 2, 0, 1),
             ((2, 2, 9, 8), (2, 2, 3, 3), 1, 1, 2),
             ((1, 2, 7, 9), (3, 2, 3, 2), (2, 1), (1, 0), (1, 2)),
             ((2, 1, 6, 5), (10, 1, 3, 3), 1, 1, 1)]        # C*KH*KW <= O: kernel rows first
    return [Sample.make("conv_2d", [InputSpec("x", xs), InputSpec("w", ws)], dtype,
                        stride=s, padding=p, dilation=d)
            for xs, ws, s, p, d in cases] + [
        # strided views: an NHWC-stored image and an IOHW-stored kernel
        Sample.make("conv_2d", [InputSpec("x", (2, 3, 6, 5), permute=(0, 2, 3, 1)),
                                InputSpec("w", (2, 3, 3, 3), permute=(1, 0, 2, 3))], dtype,
                    stride=1, padding=1, dilation=1),
        # a sliced image (an offset and steps) and an expanded kernel (stride 0 along its
        # input channels), and the other way round
        Sample.make("conv_2d", [InputSpec("x", (2, 2, 6, 5), slice=((0, 2, 1), (1, 3, 1),
                                                                    (1, 7, 1), (0, 10, 2))),
                                InputSpec("w", (3, 2, 3, 3), expand=(1,))], dtype,
                    stride=1, padding=1, dilation=1),
        Sample.make("conv_2d", [InputSpec("x", (2, 2, 6, 5), slice=((0, 2, 1), (1, 3, 1),
                                                                    (1, 7, 1), (1, 6, 1))),
                                InputSpec("w", (3, 2, 3, 3))], dtype,
                    stride=1, padding=1, dilation=1),
        Sample.make("conv_2d", [InputSpec("x", (1, 3, 6, 6), expand=(0, 1)),
                                InputSpec("w", (2, 3, 3, 3), slice=((1, 3, 1), (0, 3, 1),
                                                                    (0, 6, 2), (1, 4, 1)))],
                    dtype, stride=2, padding=0, dilation=1)]


@sample_strategy
def _conv_strategy(draw, dtype):
    """Per axis kernel 1-3, stride 1-2, padding 0-1, dilation 1-2 and a side up to 8 that
    fits the kernel; 1-3 input and output channels, batch 1-3, at most MAX_ELEMENTS inputs in
    all; image and kernel each in a range of SIGNED, possibly a view."""
    from hypothesis import strategies as st
    rows, cols = (draw(window_axis(stride=(1, 2), padding=(0, 1), dilation=(1, 2), max_side=8))
                  for _ in range(2))
    c, o = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    w_shape = (o, c, rows.kernel, cols.kernel)
    budget = (MAX_ELEMENTS - o * c * rows.kernel * cols.kernel) // (c * rows.side * cols.side)
    (n,) = draw(shapes(1, 1, max_side=3, max_size=max(budget, 1)))
    return Sample.make("conv_2d", [draw_input(draw, "x", (n, c, rows.side, cols.side)),
                                   draw_input(draw, "w", w_shape)],
                       dtype,
                       stride=(rows.stride, cols.stride), padding=(rows.padding, cols.padding),
                       dilation=(rows.dilation, cols.dilation))


def _conv_2d_scale():
    """Scale case: MNIST-CNN-like 3 x 3 convolution at batch 8, its im2col of 2.4M elements
    and products on the engine's threads."""
    return [scale_case("conv_2d", [InputSpec("x", (8, 8, 64, 64)), InputSpec("w", (16, 8, 3, 3))],
                       dilation=1, padding=1, stride=1)]


def _conv_2d_bench():
    """Bench case: a 3 x 3 convolution of a CIFAR-like batch, 64 images of 32 x 32 with 32
    channels in and 64 out (2.4 GFLOP forward)."""
    return [bench_case("conv_2d", [InputSpec("x", (64, 32, 32, 32)),
                                   InputSpec("w", (64, 32, 3, 3))],
                       dilation=1, padding=1, stride=1)]


register(OpDef("conv_2d", kind="composite", compose=conv_2d, torch=_torch_conv_2d,
               params=Params(dict(stride=size_param(pair=True, default=1),
                                  padding=size_param(0, pair=True, default=0),
                                  dilation=size_param(pair=True, default=1))),
               scale=_conv_2d_scale, bench=_conv_2d_bench,
               samples=_conv_samples, strategy=_conv_strategy,
               doc="2-D convolution of NCHW input with OIHW kernel, via im2col and matmul"))
