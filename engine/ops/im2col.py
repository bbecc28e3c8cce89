"""im2col: the patches of an NCHW image as rows of a matrix, so a convolution is a matmul.

For x of shape (N, C, H, W), kernel size (KH, KW), stride s, padding p and dilation d:

    OH = (H + 2 p_h - d_h (KH - 1) - 1) // s_h + 1        (OW likewise)
    cols[n, oy, ox, (c KH + ky) KW + kx] = x[n, c, oy s_h - p_h + ky d_h, ox s_w - p_w + kx d_w]

with zeros where the image index falls in the padding. The last axis is ordered (c, ky, kx),
as in ggml's im2col, so `cols @ w.reshape(O, C*KH*KW).T` is the convolution with an OIHW
kernel w. `dtype` is the columns' dtype (default x's; conv_2d passes the kernel's).

`layout` "NKHW" gives the same columns with the window axis second, (N, C*KH*KW, OH, OW)
(torch's unfold order): each image's columns a (K, OH*OW) matrix whose rows are shifted
copies of the image's planes, so that `w.reshape(O, K) @ cols[n]` is the convolution
already in NCHW order, and im2col and col2im copy and add whole rows (conv_2d's layout).
The default "NHWK" is ggml's.

im2col is linear; its backward is the dedicated op `im2col_back`, which adds every column
entry back onto the image cell it was read from (col2im).
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.im2col import cpu_im2col, cpu_im2col_back
from engine.errors import DTypeError, ShapeError
from engine.params import (
    Params,
    check_float_dtype,
    check_float_input,
    choice_param,
    int_tuple,
    integer,
    ints_param,
    pair,
    size_param,
    window_output_size,
)
from engine.registry import OpDef, VJPOf, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case, scale_case
from engine.strategies import MAX_ELEMENTS, draw_input, sample_strategy, shapes, window_axis
from engine.tensor import DTYPES, TORCH_DTYPE_NAMES, as_dtype, dtype_name, is_float


def check_columns_input(op: str, x, layout: str, dtype) -> None:
    """The input of a columns op (im2col, im2col_1d): a float input laid out as `layout`
    ("NCHW", "NCL"), and a float dtype for the columns."""
    check_float_input(op, x, layout)
    check_float_dtype(op, dtype)


def torch_in(t, dtype):
    """The torch tensor t converted to our dtype `dtype` (a name or a numpy dtype): the torch
    references' columns and images."""
    import torch
    return t.to(getattr(torch, TORCH_DTYPE_NAMES[dtype_name(dtype)]))


# --- im2col ------------------------------------------------------------------------------------
LAYOUTS = ("NHWK", "NKHW")


def columns_shape(n: int, oh: int, ow: int, k: int, layout: str) -> tuple:
    """The shape of the columns of n images in `layout`."""
    return (n, oh, ow, k) if layout == "NHWK" else (n, k, oh, ow)


def _im2col_infer(x, kh, kw, stride, padding, dilation, dtype, layout="NHWK"):
    check_columns_input("im2col", x, "NCHW", dtype)
    oh, ow = window_output_size("im2col", x.shape, (kh, kw), stride, padding, dilation)
    return columns_shape(x.shape[0], oh, ow, x.shape[1] * kh * kw, layout), as_dtype(dtype)


def im2col(x, kh, kw, stride=(1, 1), padding=(0, 0), dilation=(1, 1), dtype=None,
           layout="NHWK"):
    """Columns (N, OH, OW, C*KH*KW) of the NCHW image x, last axis ordered (c, ky, kx); with
    layout "NKHW", (N, C*KH*KW, OH, OW).

    stride, padding, dilation: an int or a pair (rows, cols). dtype: of the columns
    (default x's).
    """
    return make_node("im2col", (x,), kh=integer("im2col", "kh", kh),
                     kw=integer("im2col", "kw", kw),
                     stride=pair("im2col", "stride", stride),
                     padding=pair("im2col", "padding", padding),
                     dilation=pair("im2col", "dilation", dilation),
                     dtype=dtype_name(x.dtype if dtype is None else dtype),
                     layout=layout)


def _im2col_backward(g, out, x, kh, kw, stride, padding, dilation, dtype, layout="NHWK"):
    return (im2col_back(g, x.shape, kh, kw, stride, padding, dilation, x.dtype, layout),)


def _torch_im2col(x, kh, kw, stride=(1, 1), padding=(0, 0), dilation=(1, 1), dtype=None,
                  layout="NHWK"):
    import torch
    stride, padding, dilation = (pair("im2col", n, v) for n, v in
                                 (("stride", stride), ("padding", padding), ("dilation", dilation)))
    oh, ow = window_output_size("im2col", x.shape, (kh, kw), stride, padding, dilation)
    cols = torch.nn.functional.unfold(x, (kh, kw), dilation=dilation, padding=padding,
                                      stride=stride)               # (N, C*KH*KW, OH*OW)
    if layout == "NKHW":
        cols = cols.reshape(x.shape[0], -1, oh, ow)
    else:
        cols = cols.transpose(1, 2).reshape(x.shape[0], oh, ow, -1)
    return cols if dtype is None else torch_in(cols, dtype)


# --- im2col_back ----------------------------------------------------------------------------------
def _im2col_back_infer(g, x_shape, kh, kw, stride, padding, dilation, dtype, layout="NHWK"):
    check_float_dtype("im2col_back", dtype)
    if not is_float(g.dtype):
        raise DTypeError(f"im2col_back: needs a float gradient, got {g.dtype}")
    if len(x_shape) != 4:
        raise ShapeError(f"im2col_back: x_shape must be NCHW (4 axes), got {list(x_shape)}")
    oh, ow = window_output_size("im2col_back", x_shape, (kh, kw), stride, padding,
                                 dilation)
    want = columns_shape(x_shape[0], oh, ow, x_shape[1] * kh * kw, layout)
    if tuple(g.shape) != want:
        raise ShapeError(f"im2col_back: gradient of shape {list(g.shape)} does not match the "
                         f"columns {list(want)} of an image of shape {list(x_shape)}")
    return tuple(x_shape), as_dtype(dtype)


def im2col_back(g, x_shape, kh, kw, stride, padding, dilation, dtype, layout="NHWK"):
    """Gradient of im2col w.r.t. its image: dx[n, c, y, x] = sum of g over the column
    entries read from (n, c, y, x). dtype: the image's; layout: g's (see im2col)."""
    return make_node("im2col_back", (g,),
                     x_shape=int_tuple("im2col_back", "x_shape", x_shape, None),
                     kh=integer("im2col_back", "kh", kh), kw=integer("im2col_back", "kw", kw),
                     stride=pair("im2col_back", "stride", stride),
                     padding=pair("im2col_back", "padding", padding),
                     dilation=pair("im2col_back", "dilation", dilation),
                     dtype=dtype_name(dtype), layout=layout)


def _im2col_back_backward(grad, out, g, x_shape, kh, kw, stride, padding, dilation, dtype,
                          layout="NHWK"):
    # col2im is linear and its transpose is im2col with the same parameters
    return (im2col(grad, kh, kw, stride, padding, dilation, dtype=g.dtype, layout=layout),)


def _torch_im2col_back(g, x_shape, kh, kw, stride, padding, dilation, dtype, layout="NHWK"):
    import torch
    if layout == "NKHW":
        g = g.reshape(g.shape[0], g.shape[1], -1)                 # (N, C*KH*KW, OH*OW)
    else:
        g = g.reshape(g.shape[0], g.shape[1] * g.shape[2], -1).transpose(1, 2)
    dx = torch.nn.functional.fold(g, tuple(x_shape[2:]), (kh, kw), dilation=dilation,
                                  padding=padding, stride=stride)
    return torch_in(dx, dtype)


def _im2col_back_primals(g, x_shape, kh, kw, stride, padding, dilation, dtype,
                         layout="NHWK"):
    """im2col_back(g, x_shape, ...) is im2col's VJP for an image of x_shape (im2col is
    linear: any image, here zeros)."""
    return {"x": np.zeros(x_shape)}, g, dict(kh=kh, kw=kw, stride=stride, padding=padding,
                                             dilation=dilation, dtype=None, layout=layout)


# --- samples and registration ------------------------------------------------------------------
@both_dtypes
def _im2col_samples(dtype):
    other = "f64" if dtype == "f32" else "f32"
    cases = [((1, 1, 5, 5), 3, 3, 1, 0, 1, None),
             ((2, 3, 6, 5), 3, 2, 2, 1, 1, None),
             ((2, 2, 7, 6), 3, 3, (1, 2), (1, 2), 2, None),
             ((1, 3, 4, 4), 1, 1, 1, 0, 1, None),
             ((3, 2, 5, 7), 2, 3, (2, 1), (0, 1), (2, 1), None),
             ((2, 2, 5, 4), 3, 3, 1, 1, 1, other)]
    # sliced (an offset and steps) and expanded (stride 0) images
    views = [((2, 2, 5, 6), 3, 3, 1, 1, 1, {"slice": ((0, 2, 1), (1, 3, 1), (1, 6, 1),
                                                      (0, 12, 2))}),
             ((1, 3, 6, 5), 3, 2, 2, 0, 1, {"expand": (1,)})]
    # Sample.make's own `dtype` argument would swallow the op's `dtype` param: build directly
    # the window axis second (NKHW): padded, strided and dilated, and a view
    nkhw = [((2, 3, 6, 5), 3, 2, 2, 1, 1, {}), ((2, 2, 7, 6), 3, 3, (1, 2), (1, 2), 2, {}),
            ((2, 2, 5, 6), 3, 3, 1, 1, 1, {"slice": ((0, 2, 1), (1, 3, 1), (1, 6, 1),
                                                     (0, 12, 2))})]
    return [Sample("im2col", (InputSpec("x", s),),
                   tuple(sorted(dict(kh=kh, kw=kw, stride=st, padding=p, dilation=d,
                                     dtype=dt).items())), dtype)
            for s, kh, kw, st, p, d, dt in cases] + [
        Sample("im2col", (InputSpec("x", s, **view),),
               tuple(sorted(dict(kh=kh, kw=kw, stride=st, padding=p, dilation=d,
                                 dtype=None).items())), dtype)
        for s, kh, kw, st, p, d, view in views] + [
        Sample("im2col", (InputSpec("x", s, **view),),
               tuple(sorted(dict(kh=kh, kw=kw, stride=st, padding=p, dilation=d,
                                 dtype=None, layout="NKHW").items())), dtype)
        for s, kh, kw, st, p, d, view in nkhw]


@both_dtypes
def _im2col_back_samples(dtype):
    """Columns of images as im2col makes them: contiguous, a permuted view (as the
    backward of conv_2d's matmul hands them) or a stride-0 broadcast; dilated, padded, and
    of the other dtype."""
    other = "f64" if dtype == "f32" else "f32"
    cases = [((1, 1, 5, 5), 3, 3, 1, 0, 1, {}, dtype),
             ((2, 3, 6, 5), 3, 2, 2, 1, 1, {}, dtype),
             ((2, 2, 7, 6), 3, 3, (1, 2), (1, 2), 2, {}, dtype),
             ((1, 2, 6, 6), 3, 3, 1, 1, 1, {"permute": (0, 3, 1, 2)}, dtype),
             ((2, 2, 5, 7), 2, 3, (2, 1), (0, 1), (2, 1), {"permute": (2, 1, 0, 3)}, dtype),
             ((1, 2, 6, 5), 3, 3, 1, 1, 1, {"expand": (3,)}, dtype),
             ((2, 1, 6, 6), 3, 2, 2, 1, (1, 2), {"expand": (0, 2)}, dtype),
             ((1, 2, 5, 4), 3, 3, 1, 1, 1, {}, other)]
    # NKHW columns (conv_2d's): contiguous, strided and dilated, and a permuted view
    nkhw = [((2, 3, 6, 5), 3, 2, 2, 1, 1, {}, dtype),
            ((2, 2, 7, 6), 3, 3, (1, 2), (1, 2), 2, {}, dtype),
            ((1, 2, 6, 6), 3, 3, 1, 1, 1, {"permute": (0, 3, 1, 2)}, dtype)]
    out = []
    for layout, rows in (("NHWK", cases), ("NKHW", nkhw)):
        for x_shape, kh, kw, st, p, d, view, dt in rows:
            st_, p_, d_ = (v if isinstance(v, tuple) else (v, v) for v in (st, p, d))
            oh, ow = window_output_size("im2col_back", x_shape, (kh, kw), st_, p_, d_)
            g = InputSpec("g", columns_shape(x_shape[0], oh, ow, x_shape[1] * kh * kw,
                                             layout), **view)
            extra = {} if layout == "NHWK" else {"layout": layout}
            out.append(Sample.make("im2col_back", [g], dtype, x_shape=x_shape, kh=kh, kw=kw,
                                   stride=st_, padding=p_, dilation=d_, dtype=dt, **extra))
    return out


def _im2col_strategy(dtype):
    """Per axis kernel 1-3, stride 1-3, padding 0-2, dilation 1-2 and a side up to 8 that
    fits the kernel; batch and channels 1-3 (at most MAX_ELEMENTS inputs); columns in x's
    dtype, the other float dtype or the default, in either layout; the image in a range of
    SIGNED, possibly a view."""
    from hypothesis import strategies as st

    @sample_strategy
    def draw_case(draw, dtype):
        rows, cols = (draw(window_axis(padding=(0, 2), dilation=(1, 2), max_side=8))
                      for _ in range(2))
        batch = draw(shapes(2, 2, max_side=3, max_size=MAX_ELEMENTS // (rows.side * cols.side)))
        x = draw_input(draw, "x", batch + (rows.side, cols.side))
        return Sample.make("im2col", [x], dtype, kh=rows.kernel, kw=cols.kernel,
                           stride=(rows.stride, cols.stride),
                           padding=(rows.padding, cols.padding),
                           dilation=(rows.dilation, cols.dilation),
                           dtype=draw(st.sampled_from([None, "f32", "f64"])),
                           layout=draw(st.sampled_from(LAYOUTS)))
    return draw_case(dtype)


def _im2col_scale():
    """Scale cases: columns of 2.3M elements (on the engine's threads), with and without
    padding and stride, in both layouts (NKHW: the fast paths im2col:rows and
    im2col_back:rows)."""
    return [scale_case("im2col", [InputSpec("x", (2, 4, 182, 182))], dilation=1, dtype=None,
                       kh=3, kw=3, padding=0, stride=1),
            scale_case("im2col", [InputSpec("x", (2, 4, 363, 363))], dilation=1, dtype=None,
                       kh=3, kw=3, padding=1, stride=2),
            scale_case("im2col", [InputSpec("x", (2, 4, 363, 363))], dilation=1, dtype=None,
                       kh=3, kw=3, padding=1, stride=2, layout="NKHW")]


# sizes as ggml's ints; the columns' dtype a float one: infer says so (a DTypeError)
_PARAMS = dict(kh=size_param(), kw=size_param(), stride=size_param(pair=True),
               padding=size_param(0, pair=True), dilation=size_param(pair=True),
               dtype=choice_param(*DTYPES), layout=choice_param(*LAYOUTS, default="NHWK"))
def _im2col_bench():
    """Bench case: the columns of conv_2d's bench case, a CIFAR-like batch of 64 images of
    32 x 32 with 32 channels, 3 x 3 windows with padding 1 (18.9M elements)."""
    return [bench_case("im2col", [InputSpec("x", (64, 32, 32, 32))], dilation=1, dtype=None,
                       kh=3, kw=3, padding=1, stride=1)]


register(OpDef("im2col", params=Params(_PARAMS),
               scale=_im2col_scale, bench=_im2col_bench, infer=_im2col_infer,
               backward=_im2col_backward,
               kernels={"cpu": cpu_im2col, "cuda": "engine.backends.cuda.im2col:cuda_im2col"},
               build=im2col, torch=_torch_im2col,
               samples=_im2col_samples, strategy=_im2col_strategy,
               doc="NCHW image -> (N, OH, OW, C*KH*KW) patch columns, ordered (c, ky, kx) "
                   "(layout NKHW: (N, C*KH*KW, OH, OW))"))
register(OpDef("im2col_back", params=Params(dict(x_shape=ints_param(0), **_PARAMS)),
               kind="backward", infer=_im2col_back_infer,
               backward=_im2col_back_backward,
               kernels={"cpu": cpu_im2col_back,
                        "cuda": "engine.backends.cuda.im2col:cuda_im2col_back"},
               build=im2col_back, torch=_torch_im2col_back, samples=_im2col_back_samples,
               vjp_of=VJPOf("im2col", _im2col_back_primals),
               doc="gradient of im2col: columns added back onto the image (col2im)"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import kernel_replaced  # noqa: E402


def _im2col_back_no_dilation(real):
    def kernel(out, ins, **params):
        real(out, ins, **{**params, "dilation": (1, 1)})
    return kernel


def _dilated(case) -> bool:
    return pair("im2col", "dilation", case.kwargs.get("dilation", 1)) != (1, 1)


mutation.register(
    Mutant("im2col_back_ignores_dilation", ("im2col",),
           "im2col_back scatters the columns as if the dilation were 1",
           lambda: kernel_replaced("im2col_back", _im2col_back_no_dilation), where=_dilated,
           max_cases=1, kind="off-by-one window"),
)
