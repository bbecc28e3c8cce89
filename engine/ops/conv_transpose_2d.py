"""conv_transpose_2d: the transposed 2-D convolution without padding (ggml's
conv_transpose_2d_p0), composed as a matmul followed by col2im.

For x of shape (N, C_in, H, W), a kernel w of shape (C_in, C_out, KH, KW) (torch's
conv_transpose2d layout) and stride s:

    OH = (H - 1) s + KH,   OW = (W - 1) s + KW
    out[n, o, y s + ky, x s + kx] += sum_c x[n, c, y, x] w[c, o, ky, kx]

Every input pixel scatters a C_out x KH x KW patch into the output. The patches of all
pixels are exactly the im2col columns of an (N, C_out, OH, OW) image with a KH x KW kernel,
stride s, no padding: (OH - KH) / s + 1 = H windows down, W across, column (o KH + ky) KW + kx.
So

    cols = reshape(cont(permute(x, NHWC)), (N H W, C_in)) @ reshape(w, (C_in, C_out KH KW))
    out  = im2col_back(reshape(cols, (N, H, W, C_out KH KW)), (N, C_out, OH, OW), KH, KW, s)

and the gradients come from the parts: im2col_back's backward is im2col (col2im and im2col
are each other's transpose) and matmul's rule gives x's and w's.
"""

from __future__ import annotations

from engine.errors import DTypeError, ShapeError
from engine.ops.im2col import im2col_back
from engine.ops.matmul import matmul
from engine.ops.shape import cont, cont_if_strided, permute, reshape
from engine.params import Params, pair, size_param
from engine.registry import OpDef, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case, scale_case
from engine.strategies import draw_input, sample_strategy, shapes
from engine.tensor import is_float


def _check(x, w, stride) -> tuple[int, int]:
    """Validate an NCHW input and a (C_in, C_out, KH, KW) kernel; return (OH, OW)."""
    if x.ndim != 4 or w.ndim != 4:
        raise ShapeError(f"conv_transpose_2d: needs an NCHW input and a (C_in, C_out, KH, KW) "
                         f"kernel (4 axes each), got shapes {list(x.shape)} and "
                         f"{list(w.shape)}")
    if not is_float(x.dtype) or x.dtype != w.dtype:
        raise DTypeError(f"conv_transpose_2d: needs float input and kernel of one dtype, got "
                         f"{x.dtype} and {w.dtype} for shapes {list(x.shape)} and "
                         f"{list(w.shape)}")
    if x.shape[1] != w.shape[0]:
        raise ShapeError(f"conv_transpose_2d: input has {x.shape[1]} channels but the kernel "
                         f"expects {w.shape[0]} (shapes {list(x.shape)} and {list(w.shape)})")
    if 0 in x.shape or 0 in w.shape:
        raise ShapeError(f"conv_transpose_2d: empty input or kernel, shapes {list(x.shape)} "
                         f"and {list(w.shape)}")
    return ((x.shape[2] - 1) * stride[0] + w.shape[2],
            (x.shape[3] - 1) * stride[1] + w.shape[3])


def conv_transpose_2d(x, w, stride=1):
    """Transposed 2-D convolution of NCHW x with a (C_in, C_out, KH, KW) kernel w, no
    padding (torch's conv_transpose2d without bias; ggml's conv_transpose_2d_p0).

    stride: an int or a pair (rows, cols).
    """
    stride = pair("conv_transpose_2d", "stride", stride)
    oh, ow = _check(x, w, stride)
    n, c, h, wd = x.shape
    o, kh, kw = w.shape[1:]
    pixels = reshape(cont(permute(x, (0, 2, 3, 1))), (n * h * wd, c))
    cols = matmul(pixels, reshape(cont_if_strided(w), (c, o * kh * kw)))
    return im2col_back(reshape(cols, (n, h, wd, o * kh * kw)), (n, o, oh, ow), kh, kw, stride,
                       (0, 0), (1, 1), x.dtype)


def _torch_conv_transpose_2d(x, w, stride=1):
    import torch.nn.functional as F
    return F.conv_transpose2d(x, w, stride=stride)


# --- samples and strategy -------------------------------------------------------------------------
# (x shape, w shape, stride, permute of x, permute of w); ggml checks x [1, 3, 2, 3] with a
# 3 -> 1 channel 2x2 kernel at stride 1, and 9 -> 1 channels 3x3 at stride 2
CASES = [((1, 3, 2, 3), (3, 1, 2, 2), 1, None, None),
         ((1, 4, 3, 3), (4, 1, 3, 3), 2, None, None),
         ((2, 2, 3, 4), (2, 3, 2, 3), 1, None, None),
         ((2, 3, 3, 2), (3, 2, 3, 3), 2, None, None),
         ((1, 2, 4, 3), (2, 2, 1, 1), 1, None, None),
         ((1, 2, 3, 3), (2, 2, 2, 2), 3, None, None),               # gaps between patches
         ((2, 2, 2, 3), (2, 2, 3, 2), (2, 1), None, None),
         ((2, 3, 3, 3), (3, 2, 2, 2), 2, (0, 2, 3, 1), None),       # x stored NHWC
         ((1, 2, 3, 4), (2, 3, 2, 2), 1, None, (1, 0, 2, 3))]       # w stored (C_out, C_in, ..)


@both_dtypes
def _samples(dtype):
    return [Sample.make("conv_transpose_2d", [InputSpec("x", xs, permute=px),
                                              InputSpec("w", ws, permute=pw)], dtype, stride=s)
            for xs, ws, s, px, pw in CASES]


@sample_strategy
def _strategy(draw, dtype):
    """batch, channels in and out 1-3, an image up to 4x4, a kernel up to 3x3, strides 1-3
    per axis; input and kernel each in a range of SIGNED, possibly a view."""
    from hypothesis import strategies as st
    n, c, o = draw(shapes(3, 3, max_side=3))
    h, w = draw(shapes(2, 2, max_side=4))
    kh, kw = draw(shapes(2, 2, max_side=3))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    return Sample.make("conv_transpose_2d",
                       [draw_input(draw, "x", (n, c, h, w)),
                        draw_input(draw, "w", (c, o, kh, kw))],
                       dtype, stride=stride)


def _conv_transpose_2d_scale():
    """Scale case: a stride-2 transposed convolution of 4 x 16 x 64 x 64."""
    return [scale_case("conv_transpose_2d", [InputSpec("x", (4, 16, 64, 64)),
                                             InputSpec("w", (16, 8, 3, 3))], stride=2)]


def _conv_transpose_2d_bench():
    """Bench case: a decoder's stride-2 upsampling, 64 images of 16 x 16 with 64 channels
    to 32 channels of 33 x 33."""
    return [bench_case("conv_transpose_2d", [InputSpec("x", (64, 64, 16, 16)),
                                             InputSpec("w", (64, 32, 3, 3))], stride=2)]


register(OpDef("conv_transpose_2d", kind="composite", compose=conv_transpose_2d,
               params=Params(dict(stride=size_param(pair=True, default=1))),
               scale=_conv_transpose_2d_scale, bench=_conv_transpose_2d_bench,
               torch=_torch_conv_transpose_2d, samples=_samples, strategy=_strategy,
               doc="transposed 2-D convolution, no padding (ggml's conv_transpose_2d_p0): "
                   "matmul of pixels with the kernel, then col2im (im2col_back)"))


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("conv_transpose_2d", "composite: permute, cont, reshape, matmul and im2col_back, "
                                     "whose mutants cover its gradient")
