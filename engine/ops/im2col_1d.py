"""im2col_1d: the windows of an NCL signal as rows of a matrix (ggml's 1-D im2col), so a 1-D
convolution is a matmul; and its backward im2col_1d_back (col2im).

For x of shape (N, C, L), kernel size K, stride s, padding p and dilation d:

    OL = (L + 2 p - d (K - 1) - 1) // s + 1
    cols[n, ol, c K + k] = x[n, c, ol s - p + k d]        (0 where that falls in the padding)

so `cols @ w.reshape(O, C*K).T` is the 1-D convolution with an OIK kernel w. `dtype` is the
columns' dtype (default x's). The backward adds every column entry back onto the cell it
was read from:

    im2col_1d_back(g, x_shape, ...)[n, c, i] = sum of g[n, ol, c K + k] over ol s - p + k d = i

Both ops are linear and each is the other's backward. Both run the 2-D im2col kernels of
engine/backends/cpu/im2col.py on (N, C, 1, L) and (N, 1, OL, C*K) views with a 1 x K kernel:
one kernel for two ops; the views never copy, and the kernels read strided inputs in place.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.im2col import cpu_im2col, cpu_im2col_back
from engine.errors import DTypeError, ShapeError
from engine.ops.im2col import check_columns_input, torch_in
from engine.params import (
    Params,
    check_float_dtype,
    choice_param,
    int_tuple,
    integer,
    ints_param,
    size_param,
    window_output_size,
)
from engine.registry import OpDef, VJPOf, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case, scale_case
from engine.strategies import MAX_ELEMENTS, draw_input, sample_strategy, shapes, window_axis
from engine.tensor import DTYPES, as_dtype, dtype_name, is_float


def _params(op, k, stride, padding, dilation) -> dict:
    return dict(k=integer(op, "k", k), stride=integer(op, "stride", stride),
                padding=integer(op, "padding", padding),
                dilation=integer(op, "dilation", dilation))


# --- im2col_1d --------------------------------------------------------------------------------
def _infer(x, k, stride, padding, dilation, dtype):
    check_columns_input("im2col_1d", x, "NCL", dtype)
    (ol,) = window_output_size("im2col_1d", x.shape, (k,), (stride,), (padding,), (dilation,))
    return (x.shape[0], ol, x.shape[1] * k), as_dtype(dtype)


def im2col_1d(x, k, stride=1, padding=0, dilation=1, dtype=None):
    """Columns (N, OL, C*K) of the NCL signal x, last axis ordered (c, k); dtype: of the
    columns (default x's)."""
    return make_node("im2col_1d", (x,), **_params("im2col_1d", k, stride, padding, dilation),
                     dtype=dtype_name(x.dtype if dtype is None else dtype))


def _backward(g, out, x, k, stride, padding, dilation, dtype):
    return (im2col_1d_back(g, x.shape, k, stride, padding, dilation, x.dtype),)


def cpu_im2col_1d(out, ins, k, stride, padding, dilation, dtype):
    """im2col_1d as the 2-D kernel on (N, C, 1, L) -> (N, 1, OL, C*K) views, 1 x K kernel."""
    (x,) = ins
    cpu_im2col(out[:, None], [x[:, :, None]], 1, k, (1, stride), (0, padding), (1, dilation),
               dtype)


def _torch_im2col_1d(x, k, stride=1, padding=0, dilation=1, dtype=None):
    import torch.nn.functional as F
    cols = F.unfold(x.unsqueeze(2), (1, k), dilation=(1, dilation), padding=(0, padding),
                    stride=(1, stride)).transpose(1, 2)          # (N, OL, C*K)
    return cols if dtype is None else torch_in(cols, dtype)


# --- im2col_1d_back ---------------------------------------------------------------------------
def _back_infer(g, x_shape, k, stride, padding, dilation, dtype):
    check_float_dtype("im2col_1d_back", dtype)
    if not is_float(g.dtype):
        raise DTypeError(f"im2col_1d_back: needs a float gradient, got {g.dtype} of shape "
                         f"{list(g.shape)}")
    if len(x_shape) != 3:
        raise ShapeError(f"im2col_1d_back: x_shape must be NCL (3 axes), got {list(x_shape)}")
    (ol,) = window_output_size("im2col_1d_back", x_shape, (k,), (stride,), (padding,),
                               (dilation,))
    want = (x_shape[0], ol, x_shape[1] * k)
    if tuple(g.shape) != want:
        raise ShapeError(f"im2col_1d_back: gradient of shape {list(g.shape)} does not match "
                         f"the columns {list(want)} of a signal of shape {list(x_shape)}")
    return tuple(x_shape), as_dtype(dtype)


def im2col_1d_back(g, x_shape, k, stride=1, padding=0, dilation=1, dtype=None):
    """Gradient of im2col_1d w.r.t. its signal (col2im): dx[n, c, i] = sum of g over the
    column entries read from (n, c, i). dtype: the signal's (default g's)."""
    return make_node("im2col_1d_back", (g,),
                     x_shape=int_tuple("im2col_1d_back", "x_shape", x_shape, None),
                     **_params("im2col_1d_back", k, stride, padding, dilation),
                     dtype=dtype_name(g.dtype if dtype is None else dtype))


def _back_backward(grad, out, g, x_shape, k, stride, padding, dilation, dtype):
    return (im2col_1d(grad, k, stride, padding, dilation, g.dtype),)


def cpu_im2col_1d_back(out, ins, x_shape, k, stride, padding, dilation, dtype):
    """im2col_1d_back as the 2-D kernel on (N, 1, OL, C*K) -> (N, C, 1, L) views."""
    (g,) = ins
    cpu_im2col_back(out[:, :, None], [g[:, None]], out.shape[:2] + (1,) + out.shape[2:], 1, k,
                    (1, stride), (0, padding), (1, dilation), dtype)


def _torch_im2col_1d_back(g, x_shape, k, stride=1, padding=0, dilation=1, dtype=None):
    import torch.nn.functional as F
    dx = F.fold(g.transpose(1, 2), (1, x_shape[-1]), (1, k), dilation=(1, dilation),
                padding=(0, padding), stride=(1, stride))[:, :, 0]
    return dx if dtype is None else torch_in(dx, dtype)


def _back_primals(g, x_shape, k, stride, padding, dilation, dtype):
    """im2col_1d_back(g, x_shape, ...) is im2col_1d's VJP for a signal of x_shape
    (im2col_1d is linear: any signal, here zeros)."""
    return {"x": np.zeros(x_shape)}, g, dict(k=k, stride=stride, padding=padding,
                                             dilation=dilation, dtype=None)


# --- samples, strategies and registration ------------------------------------------------------
# (x shape, K, stride, padding, dilation, permute of x, columns' dtype differs)
CASES = [((1, 1, 7), 3, 1, 0, 1, None, False), ((2, 3, 8), 3, 2, 1, 1, None, False),
         ((2, 2, 9), 3, 1, 2, 2, None, False), ((1, 3, 6), 1, 1, 0, 1, None, False),
         ((3, 2, 10), 2, 3, 1, 2, None, False), ((2, 4, 5), 5, 1, 2, 1, None, False),
         ((2, 3, 7), 3, 2, 1, 1, (0, 2, 1), False), ((1, 2, 8), 4, 2, 0, 1, (2, 1, 0), False),
         ((2, 2, 6), 3, 1, 1, 1, None, True)]


def _other(dtype):
    return "f64" if dtype == "f32" else "f32"


@both_dtypes
def _samples(dtype):
    return [Sample.make("im2col_1d", [InputSpec("x", s, permute=perm)], dtype, k=k, stride=st,
                        padding=p, dilation=d, dtype=_other(dtype) if mixed else None)
            for s, k, st, p, d, perm, mixed in CASES]


def _cols_shape(x_shape, k, stride, padding, dilation):
    ol = (x_shape[-1] + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    return (x_shape[0], ol, x_shape[1] * k)


@both_dtypes
def _back_samples(dtype):
    out = []
    for s, k, st, p, d, _, mixed in CASES[::2]:
        g_shape = _cols_shape(s, k, st, p, d)
        out.append(Sample.make("im2col_1d_back", [InputSpec("g", g_shape)], dtype, x_shape=s,
                               k=k, stride=st, padding=p, dilation=d,
                               dtype=_other(dtype) if mixed else None))
    out.append(Sample.make("im2col_1d_back", [InputSpec("g", (2, 4, 9), permute=(0, 2, 1))],
                           dtype, x_shape=(2, 3, 8), k=3, stride=2, padding=1, dilation=1,
                           dtype=None))
    out.append(Sample.make("im2col_1d_back", [InputSpec("g", (2, 4, 9), expand=(1,))],
                           dtype, x_shape=(2, 3, 8), k=3, stride=2, padding=1, dilation=1,
                           dtype=None))            # g a stride-0 broadcast along the windows
    return out


def _draw_params(draw, back=False):
    """(x shape, K, stride, padding, dilation): K 1-5, stride 1-3, padding 0-2, dilation
    1-3, a length up to 16 that holds at least one window, batch and channels 1-3, and at
    most MAX_ELEMENTS checked elements: those of the signal, or for the backward op
    (back) those of its columns."""
    ax = draw(window_axis(kernel=(1, 5), stride=(1, 3), padding=(0, 2), dilation=(1, 3),
                          max_side=16))
    (ol,) = window_output_size("im2col_1d", (ax.side,), (ax.kernel,), (ax.stride,),
                               (ax.padding,), (ax.dilation,))
    per_channel = ol * ax.kernel if back else ax.side
    shape = draw(shapes(2, 2, max_side=3, max_size=MAX_ELEMENTS // per_channel)) + (ax.side,)
    return shape, ax.kernel, ax.stride, ax.padding, ax.dilation


@sample_strategy
def _strategy(draw, dtype):
    from hypothesis import strategies as st
    shape, k, s, p, d = _draw_params(draw)
    return Sample.make("im2col_1d", [draw_input(draw, "x", shape)],
                       dtype, k=k, stride=s, padding=p, dilation=d,
                       dtype=draw(st.sampled_from([None, "f32", "f64"])))


@sample_strategy
def _back_strategy(draw, dtype):
    from hypothesis import strategies as st
    shape, k, s, p, d = _draw_params(draw, back=True)
    g = draw_input(draw, "g", _cols_shape(shape, k, s, p, d))
    return Sample.make("im2col_1d_back", [g], dtype, x_shape=shape, k=k, stride=s, padding=p,
                       dilation=d, dtype=draw(st.sampled_from([None, "f32", "f64"])))


def _im2col_1d_scale():
    """Scale case: 1-D columns of 1.05M elements."""
    return [scale_case("im2col_1d", [InputSpec("x", (4, 8, 11003))], dilation=1, dtype=None,
                       k=3, padding=0, stride=1)]


# sizes as ggml's ints; the columns' dtype a float one: infer says so (a DTypeError)
_PARAMS = dict(k=size_param(), stride=size_param(), padding=size_param(0),
               dilation=size_param(), dtype=choice_param(*DTYPES))
def _im2col_1d_bench():
    """Bench case: a 1-D convolution's columns, 32 signals of 128 channels and 1024
    steps, windows of 3 with padding 1 (12.6M elements)."""
    return [bench_case("im2col_1d", [InputSpec("x", (32, 128, 1024))], dilation=1,
                       dtype=None, k=3, padding=1, stride=1)]


register(OpDef("im2col_1d", params=Params(_PARAMS),
               scale=_im2col_1d_scale, bench=_im2col_1d_bench, infer=_infer, backward=_backward,
               kernels={"cpu": cpu_im2col_1d,
                        "cuda": "engine.backends.cuda.im2col:cuda_im2col_1d"},
               build=im2col_1d, torch=_torch_im2col_1d,
               samples=_samples, strategy=_strategy,
               doc="NCL signal -> (N, OL, C*K) window columns, ordered (c, k) (ggml's 1-D "
                   "im2col)"))
register(OpDef("im2col_1d_back", params=Params(dict(x_shape=ints_param(0), **_PARAMS)),
               kind="backward", infer=_back_infer, backward=_back_backward,
               kernels={"cpu": cpu_im2col_1d_back,
                        "cuda": "engine.backends.cuda.im2col:cuda_im2col_1d_back"},
               build=im2col_1d_back,
               torch=_torch_im2col_1d_back, samples=_back_samples, strategy=_back_strategy,
               vjp_of=VJPOf("im2col_1d", _back_primals),
               doc="gradient of im2col_1d: columns added back onto the signal (col2im); its "
                   "own backward is im2col_1d"))


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("im2col_1d", "no mutant yet: its gradient is im2col_1d_back, which has none "
                             "either; covered only by --inject scale")
mutation.exempt("im2col_1d_back", "no mutant yet: a dedicated backward op (the 1-D twin of "
                                  "im2col_back, whose mutant im2col_back_ignores_dilation is not "
                                  "applied to it); checked against im2col_1d's VJP by "
                                  "gradcheck.backward_ops")
