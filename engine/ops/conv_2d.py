"""conv_2d: 2-D convolution (cross-correlation, no bias), an op with kernels of its own, and
its two backward ops, conv_2d_back_x (the image's gradient) and conv_2d_back_w (the
kernel's).

For x of shape (N, C, H, W) and an OIHW kernel w of shape (O, C, KH, KW), as torch's
conv2d:

    out[n, o, oy, ox] = sum over c, ky, kx of
                        w[o, c, ky, kx] x[n, c, oy s_h - p_h + ky d_h, ox s_w - p_w + kx d_w]

(x read as 0 in the padding), OH = (H + 2 p_h - d_h (KH - 1) - 1) // s_h + 1 (OW likewise).
The result has w's dtype. With K = C*KH*KW, P = OH*OW, w_rows = reshape(w, (O, K)) and
cols_i the (K, P) columns of image i (im2col's NKHW layout), it is

    out[i] = w_rows @ cols_i,  dx[i] = col2im(w_rows^T @ g[i]),  dw = sum_i g[i] @ cols_i^T

It was composed of those parts (im2col, batched matmuls, im2col_back, a sum over the
batch), which wrote each image's columns, and their gradient, to an (N, K, P) buffer and
read them back: 75 MB for bench_ops' case. Its CPU kernels (engine.backends.cpu.conv_2d)
make each image's columns in a scratch that stays in L2 and multiply them at once; their
plain twin is that composition. `python bench/bench_ops.py --op conv_2d --repeat 9
--threads 1` (forward+backward against torch, one thread each): see docs/performance.md.

Both backward ops are bilinear, so their own gradients are conv_2d and the other backward
op (a second order through conv_2d, as the composition gave):

    <back_x(g, w), r> = <g, conv_2d(r, w)> = <w, back_w(g, r)>
    <back_w(g, x), r> = <g, conv_2d(x, r)> = <x, back_x(g, r)>
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.conv_2d import cpu_conv_2d, cpu_conv_2d_back_w, cpu_conv_2d_back_x
from engine.errors import DTypeError, ShapeError
from engine.ops.im2col import torch_in
from engine.params import (
    Params,
    choice_param,
    int_tuple,
    ints_param,
    pair,
    size_param,
    window_output_size,
)
from engine.registry import OpDef, VJPOf, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case, scale_case
from engine.strategies import MAX_ELEMENTS, draw_input, sample_strategy, shapes, window_axis
from engine.tensor import DTYPES, as_dtype, dtype_name, is_float


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


def _geometry(op: str, stride, padding, dilation) -> dict:
    return dict(stride=pair(op, "stride", stride), padding=pair(op, "padding", padding),
                dilation=pair(op, "dilation", dilation))


def _conv_infer(x, w, stride, padding, dilation):
    oh, ow = _check(x, w, **_geometry("conv_2d", stride, padding, dilation))
    return (x.shape[0], w.shape[0], oh, ow), w.dtype


def conv_2d(x, w, stride=1, padding=0, dilation=1, **unknown):
    """2-D convolution of NCHW x with OIHW kernel w (torch's conv2d without bias).

    stride, padding, dilation: an int or a pair (rows, cols). The result has w's dtype.
    (Any other keyword: the registry's ParamError naming it.)
    """
    return make_node("conv_2d", (x, w), stride=stride, padding=padding, dilation=dilation,
                     **unknown)


def _conv_backward(g, out, x, w, stride, padding, dilation):
    geo = dict(stride=stride, padding=padding, dilation=dilation)
    return (conv_2d_back_x(g, w, x.shape, x.dtype, **geo),
            conv_2d_back_w(g, x, w.shape, **geo))


def _check_gradient(op: str, g, w_dtype, x_shape, w_shape, stride, padding, dilation):
    """g: conv_2d's output gradient for an image of x_shape and a kernel of w_shape, in the
    kernel's dtype w_dtype."""
    if not is_float(g.dtype) or g.dtype != w_dtype:
        raise DTypeError(f"{op}: needs a float gradient in the kernel's dtype, got {g.dtype} "
                         f"and {w_dtype}")
    if len(x_shape) != 4 or len(w_shape) != 4 or x_shape[1] != w_shape[1]:
        raise ShapeError(f"{op}: needs an NCHW image and an OIHW kernel of as many channels, "
                         f"got shapes {list(x_shape)} and {list(w_shape)}")
    oh, ow = window_output_size(op, x_shape, w_shape[2:], stride, padding, dilation)
    want = (x_shape[0], w_shape[0], oh, ow)
    if tuple(g.shape) != want:
        raise ShapeError(f"{op}: gradient of shape {list(g.shape)} does not match the output "
                         f"{list(want)} of an image {list(x_shape)} and a kernel "
                         f"{list(w_shape)}")


# --- conv_2d_back_x --------------------------------------------------------------------------
def _back_x_infer(g, w, x_shape, dtype, stride, padding, dilation):
    if w.ndim != 4:
        raise ShapeError(f"conv_2d_back_x: needs an OIHW kernel, got shape {list(w.shape)}")
    _check_gradient("conv_2d_back_x", g, w.dtype, x_shape, w.shape,
                    **_geometry("conv_2d_back_x", stride, padding, dilation))
    return tuple(x_shape), as_dtype(dtype)


def conv_2d_back_x(g, w, x_shape, dtype, stride, padding, dilation):
    """Gradient of conv_2d w.r.t. its image, of shape x_shape and dtype `dtype`:
    dx[n, c, y, x] = sum of g[n, o, oy, ox] w[o, c, ky, kx] over the windows reading
    (y, x)."""
    return make_node("conv_2d_back_x", (g, w),
                     x_shape=int_tuple("conv_2d_back_x", "x_shape", x_shape, None),
                     dtype=dtype_name(dtype),
                     **_geometry("conv_2d_back_x", stride, padding, dilation))


def _back_x_backward(grad, out, g, w, x_shape, dtype, stride, padding, dilation):
    geo = dict(stride=stride, padding=padding, dilation=dilation)
    return conv_2d(grad, w, **geo), conv_2d_back_w(g, grad, w.shape, **geo)


def _torch_back_x(g, w, x_shape, dtype, stride, padding, dilation):
    import torch
    dx = torch.nn.grad.conv2d_input(tuple(x_shape), w, g, stride=stride, padding=padding,
                                    dilation=dilation)
    return torch_in(dx, dtype)


def _back_x_primals(g, w, x_shape, dtype, stride, padding, dilation):
    """conv_2d_back_x(g, w) is conv_2d's VJP w.r.t. x (linear in x: any image, zeros)."""
    return ({"x": np.zeros(x_shape), "w": w}, g,
            dict(stride=stride, padding=padding, dilation=dilation))


# --- conv_2d_back_w --------------------------------------------------------------------------
def _back_w_infer(g, x, w_shape, stride, padding, dilation):
    if x.ndim != 4 or not is_float(x.dtype):
        raise ShapeError(f"conv_2d_back_w: needs a float NCHW image, got shape "
                         f"{list(x.shape)} of {x.dtype}")
    _check_gradient("conv_2d_back_w", g, g.dtype, x.shape, w_shape,
                    **_geometry("conv_2d_back_w", stride, padding, dilation))
    return tuple(w_shape), g.dtype


def conv_2d_back_w(g, x, w_shape, stride, padding, dilation):
    """Gradient of conv_2d w.r.t. its kernel, of shape w_shape and g's dtype:
    dw[o, c, ky, kx] = sum over n, oy, ox of g[n, o, oy, ox] x[n, c, y, x]."""
    return make_node("conv_2d_back_w", (g, x),
                     w_shape=int_tuple("conv_2d_back_w", "w_shape", w_shape, None),
                     **_geometry("conv_2d_back_w", stride, padding, dilation))


def _back_w_backward(grad, out, g, x, w_shape, stride, padding, dilation):
    geo = dict(stride=stride, padding=padding, dilation=dilation)
    return conv_2d(x, grad, **geo), conv_2d_back_x(g, grad, x.shape, x.dtype, **geo)


def _torch_back_w(g, x, w_shape, stride, padding, dilation):
    import torch
    return torch.nn.grad.conv2d_weight(x.to(g.dtype), tuple(w_shape), g, stride=stride,
                                       padding=padding, dilation=dilation)


def _back_w_primals(g, x, w_shape, stride, padding, dilation):
    """conv_2d_back_w(g, x) is conv_2d's VJP w.r.t. w (linear in w: any kernel, zeros)."""
    return ({"x": x, "w": np.zeros(w_shape)}, g,
            dict(stride=stride, padding=padding, dilation=dilation))


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


def _back_samples(dtype):
    """Each backward op on conv_2d's geometries (padded, strided, dilated, a 1 x 1 kernel,
    an image of the other float dtype), its gradient contiguous, permuted (an NHWC-stored
    gradient) or broadcast with stride 0 (a sum's gradient), the other operand a view."""
    other = "f64" if dtype == "f32" else "f32"
    # (x shape, w shape, stride, padding, dilation, g's view, x's dtype)
    cases = [((2, 3, 6, 5), (4, 3, 3, 3), 1, 1, 1, {}, dtype),
             ((3, 2, 8, 7), (3, 2, 3, 3), 2, 1, 1, {}, dtype),
             ((2, 4, 5, 6), (3, 4, 1, 1), 1, 0, 1, {"permute": (0, 2, 3, 1)}, dtype),
             ((2, 2, 9, 8), (2, 2, 3, 3), 1, 1, 2, {"expand": (1,)}, dtype),
             ((1, 2, 7, 9), (3, 2, 3, 2), (2, 1), (1, 0), (1, 2), {}, other)]
    out = []
    for xs, ws, s, p, d, view, x_dtype in cases:
        geo = _geometry("conv_2d", s, p, d)
        oh, ow = window_output_size("conv_2d", xs, ws[2:], **geo)
        g = InputSpec("g", (xs[0], ws[0], oh, ow), **view)
        out.append(Sample.make("conv_2d_back_x",
                               [g, InputSpec("w", ws, permute=(1, 0, 2, 3))
                                if ws[0] == ws[1] else InputSpec("w", ws)],
                               dtype, x_shape=xs, dtype=x_dtype, **geo))
        out.append(Sample.make("conv_2d_back_w", [g, InputSpec("x", xs, dtype=x_dtype)],
                               dtype, w_shape=ws, **geo))
    return out


@both_dtypes
def _back_x_samples(dtype):
    return [c for c in _back_samples(dtype) if c.op == "conv_2d_back_x"]


@both_dtypes
def _back_w_samples(dtype):
    return [c for c in _back_samples(dtype) if c.op == "conv_2d_back_w"]


# defaults stored as pairs, as make_node stores a given int (the kernels index them)
_GEOMETRY = dict(stride=size_param(pair=True, default=(1, 1)),
                 padding=size_param(0, pair=True, default=(0, 0)),
                 dilation=size_param(pair=True, default=(1, 1)))
# the backward ops' geometry is required: it must be the one their gradient was made with
_BACK_GEOMETRY = dict(stride=size_param(pair=True), padding=size_param(0, pair=True),
                      dilation=size_param(pair=True))
register(OpDef("conv_2d", params=Params(dict(_GEOMETRY)), infer=_conv_infer,
               backward=_conv_backward,
               kernels={"cpu": cpu_conv_2d, "cuda": "engine.backends.cuda.conv_2d:cuda_conv_2d"},
               build=conv_2d, torch=_torch_conv_2d,
               scale=_conv_2d_scale, bench=_conv_2d_bench,
               samples=_conv_samples, strategy=_conv_strategy,
               doc="2-D convolution of NCHW input with OIHW kernel (per-image columns and "
                   "a product)"))
register(OpDef("conv_2d_back_x", kind="backward",
               params=Params(dict(x_shape=ints_param(0), dtype=choice_param(*DTYPES),
                                  **_BACK_GEOMETRY)),
               infer=_back_x_infer, backward=_back_x_backward,
               kernels={"cpu": cpu_conv_2d_back_x,
                        "cuda": "engine.backends.cuda.conv_2d:cuda_conv_2d_back_x"},
               build=conv_2d_back_x, torch=_torch_back_x, samples=_back_x_samples,
               vjp_of=VJPOf("conv_2d", _back_x_primals, wrt="x"),
               doc="gradient of conv_2d w.r.t. its image: col2im of w_rows^T @ g per image"))
register(OpDef("conv_2d_back_w", kind="backward",
               params=Params(dict(w_shape=ints_param(0), **_BACK_GEOMETRY)),
               infer=_back_w_infer, backward=_back_w_backward,
               kernels={"cpu": cpu_conv_2d_back_w,
                        "cuda": "engine.backends.cuda.conv_2d:cuda_conv_2d_back_w"},
               build=conv_2d_back_w, torch=_torch_back_w, samples=_back_w_samples,
               vjp_of=VJPOf("conv_2d", _back_w_primals, wrt="w"),
               doc="gradient of conv_2d w.r.t. its kernel: sum over the images of g[i] @ "
                   "cols_i^T"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.backends.cpu import conv_2d as cpu_conv  # noqa: E402
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import function_replaced, kernel_replaced  # noqa: E402


def _weight_of_the_last_image(real):
    """The weight's gradient on the fast path (conv_2d:columns) with BLAS's beta 0 for
    every image instead of 1 after the first: each image's product overwrites its
    partial sum, so each partial is its last image's alone."""
    def weight_t(x, g, dw_t, i0, i1, *rest):
        real(x, g, dw_t, i1 - 1, i1, *rest)
    return weight_t


def _back_x_window_shifted(real):
    """The image's gradient with windows starting one column left (the column padding
    read as pw + 1)."""
    def kernel(out, ins, **params):
        ph, pw = params["padding"]
        real(out, ins, **{**params, "padding": (ph, pw + 1)})
    return kernel


def _batched(case) -> bool:
    return case.inputs[0].shape[0] > 1


mutation.register(
    Mutant("conv_2d_weight_last_image", ("conv_2d", "conv_2d_back_w"),
           "conv_2d_back_w's per-image products overwrite the weight's gradient instead of "
           "adding to it (BLAS's beta 0 for every image): only the last image counts",
           lambda: function_replaced(cpu_conv, "weight_t", _weight_of_the_last_image),
           where=_batched, max_cases=1, kind="dropped term"),
    Mutant("conv_2d_back_x_window_shifted", ("conv_2d",),
           "conv_2d_back_x adds each window's gradient into cells one column left of the "
           "window (its column padding read one too large)",
           lambda: kernel_replaced("conv_2d_back_x", _back_x_window_shifted),
           max_cases=1, kind="off-by-one window"),
)
