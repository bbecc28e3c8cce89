"""Focused tests of im2col, conv_2d and pool_2d: ggml's im2col layout, pooling at the padding
(avg divides by the full window, padded cells never win a max), ties and NaN in max pooling
and its backward (first maximum, first NaN, tiled and general kernels against a reference),
strided inputs, mixed dtypes, float64 finite differences, clear errors, and a property test
against torch over random shapes and parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import engine
from engine import ops
from engine.errors import DTypeError, ParamError, ShapeError
from engine.samples import InputSpec, Sample
from tests.engine.ops.op_harness import TOL, evaluate, run_engine, run_torch, weighted_grads


# --- im2col -----------------------------------------------------------------------------------
def test_im2col_layout_is_ggml_order():
    """cols[n, oy, ox, (c*KH + ky)*KW + kx] = x[n, c, oy*s - p + ky*d, ox*s - p + kx*d]."""
    x = np.arange(2 * 3 * 5 * 6, dtype=np.float64).reshape(2, 3, 5, 6) + 1
    kh, kw, (sh, sw), (ph, pw), (dh, dw) = 3, 2, (2, 1), (1, 0), (1, 2)
    cols = evaluate(lambda t: ops.im2col(t, kh, kw, (sh, sw), (ph, pw), (dh, dw)), x)
    n, oh, ow, k = cols.shape
    assert (oh, ow, k) == ((5 + 2 - 2 - 1) // 2 + 1, (6 - 2 - 1) // 1 + 1, 3 * 3 * 2)
    for i in range(n):
        for oy in range(oh):
            for ox in range(ow):
                for c in range(3):
                    for ky in range(kh):
                        for kx in range(kw):
                            y, xx = oy * sh - ph + ky * dh, ox * sw - pw + kx * dw
                            want = x[i, c, y, xx] if 0 <= y < 5 and 0 <= xx < 6 else 0.0
                            assert cols[i, oy, ox, (c * kh + ky) * kw + kx] == want


def test_im2col_dtype_is_the_columns_dtype():
    x = np.random.default_rng(0).uniform(-1, 1, (1, 2, 4, 4)).astype(np.float32)
    cols = evaluate(lambda t: ops.im2col(t, 3, 3, dtype="f64"), x)
    assert cols.dtype == np.float64
    want = F.unfold(torch.from_numpy(x), 3).transpose(1, 2).reshape(1, 2, 2, 18)
    np.testing.assert_array_equal(cols, want.double().numpy())


# --- pool_2d at the padding, ties, NaN -----------------------------------------------------------
def test_avg_pool_divides_by_the_full_window_with_padding():
    x = np.ones((1, 1, 4, 4))
    out = evaluate(lambda t: ops.pool_2d(t, "avg", 3, stride=1, padding=1), x)[0, 0]
    # corners see 4 image cells of 9, edges 6, the inside 9 (count_include_pad)
    np.testing.assert_allclose(out[0, 0], 4 / 9)
    np.testing.assert_allclose(out[0, 1], 6 / 9)
    np.testing.assert_allclose(out[1, 1], 1.0)
    want = F.avg_pool2d(torch.from_numpy(x), 3, 1, 1, count_include_pad=True).numpy()[0, 0]
    np.testing.assert_allclose(out, want, rtol=1e-12)


def test_max_pool_padding_never_wins():
    x = -1.0 - np.random.default_rng(1).uniform(0, 1, (2, 3, 5, 5))
    out = evaluate(lambda t: ops.pool_2d(t, "max", 3, stride=2, padding=1), x)
    assert (out < -1.0).all()                     # a zero from the padding would win
    np.testing.assert_allclose(out[:, :, 0, 0], x[:, :, :2, :2].max(axis=(2, 3)))
    np.testing.assert_allclose(out, F.max_pool2d(torch.from_numpy(x), 3, 2, 1).numpy())


def test_max_pool_backward_routes_ties_to_the_first_maximum():
    x = np.zeros((1, 2, 4, 6))                    # every window is one tie
    g = np.random.default_rng(2).uniform(1, 2, (1, 2, 2, 3))
    (dx,) = weighted_grads(lambda t: ops.pool_2d(t, "max", 2), [x], g)
    want = np.zeros_like(x)
    want[:, :, ::2, ::2] = g                       # the top-left cell of each window
    np.testing.assert_array_equal(dx, want)


def test_max_pool_overlapping_windows_add_up():
    x = np.zeros((1, 1, 3, 3))
    x[0, 0, 1, 1] = 5.0                           # the maximum of all four 2x2 windows
    (dx,) = weighted_grads(lambda t: ops.pool_2d(t, "max", 2, stride=1), [x], np.ones((1, 1, 2, 2)))
    assert dx[0, 0, 1, 1] == 4.0 and dx.sum() == 4.0


def test_max_pool_propagates_nan():
    x = np.random.default_rng(3).uniform(-1, 1, (1, 1, 4, 4))
    x[0, 0, 1, 2] = np.nan
    out = evaluate(lambda t: ops.pool_2d(t, "max", 2), x)
    np.testing.assert_array_equal(np.isnan(out[0, 0]), [[False, True], [False, False]])
    np.testing.assert_array_equal(out, F.max_pool2d(torch.from_numpy(x), 2).numpy())


@pytest.mark.parametrize("stride, padding", [(2, 0), (1, 0), (2, 1)],
                         ids=["tiled", "overlapping", "padded"])
def test_max_pool_backward_sends_a_nan_window_to_its_first_nan(stride, padding):
    """A window holding NaNs sends its gradient to its first NaN in row-major order (torch's
    CPU kernel picks the last one), even when a larger number comes before it."""
    x = np.zeros((1, 1, 4, 4))
    x[0, 0, 0, 0] = 5.0
    x[0, 0, 0, 1] = x[0, 0, 1, 0] = np.nan
    g = np.arange(1.0, 10.0)
    build = lambda t: ops.pool_2d(t, "max", 2, stride=stride, padding=padding)  # noqa: E731
    oh = evaluate(build, x).shape[2]
    (dx,) = weighted_grads(build, [x], g[:oh * oh].reshape(1, 1, oh, oh))
    want = _reference_max_pool_back(g[:oh * oh].reshape(1, 1, oh, oh), x, (2, 2),
                                    (stride, stride), (padding, padding))
    np.testing.assert_array_equal(dx, want)
    if stride == 2 and padding == 0:               # the top-left window: its first NaN only
        assert (dx[0, 0, 0, 1], dx[0, 0, 0, 0], dx[0, 0, 1, 0], dx[0, 0, 1, 1]) == (1, 0, 0, 0)


@pytest.mark.parametrize("mode, kernel, stride, padding", [
    ("max", (2, 3), 2, (1, 1)), ("avg", (2, 3), 2, (1, 1)), ("max", 2, 2, 0), ("max", 3, 1, 1)])
def test_pool_of_a_strided_view(mode, kernel, stride, padding):
    """pool_2d of a permuted (strided) input, forward and backward, against torch."""
    a = np.random.default_rng(4).permutation(2 * 6 * 3 * 7).reshape(2, 6, 3, 7) / 100.0
    kw = dict(mode=mode, kernel=kernel, stride=stride, padding=padding)
    at = torch.from_numpy(a).requires_grad_(True)
    from engine.ops.pool_2d import _torch_pool_2d
    out = _torch_pool_2d(at.permute(0, 2, 1, 3), **kw)
    g = np.random.default_rng(5).uniform(-1, 1, tuple(out.shape))
    got = weighted_grads(lambda t: ops.pool_2d(ops.permute(t, (0, 2, 1, 3)), **kw), [a], g)[0]
    (out * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(got, at.grad.numpy(), rtol=1e-12, atol=1e-14)


# --- the max backward kernels against a reference ------------------------------------------------
def _reference_max_pool_back(g, x, kernel, stride, padding):
    """dx of max pooling, window by window: g goes to the first image cell (row-major) equal to
    the window's maximum, or to its first NaN; overlapping windows add up."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    dx = np.zeros_like(x)
    n, c, oh, ow = g.shape
    for i, j, oy, ox in np.ndindex(n, c, oh, ow):
        cells = [(yy, xx) for yy in range(oy * sh - ph, oy * sh - ph + kh)
                 for xx in range(ox * sw - pw, ox * sw - pw + kw)
                 if 0 <= yy < x.shape[2] and 0 <= xx < x.shape[3]]
        vals = np.array([x[i, j, yy, xx] for yy, xx in cells])
        first = np.flatnonzero(np.isnan(vals) if np.isnan(vals).any() else vals == vals.max())[0]
        dx[(i, j, *cells[first])] += g[i, j, oy, ox]
    return dx


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("shape, kernel, stride, padding", [
    ((2, 3, 6, 8), (2, 2), (2, 2), (0, 0)),       # tiled
    ((2, 2, 7, 9), (2, 2), (2, 2), (0, 0)),       # tiled, rows and columns left over
    ((1, 2, 9, 8), (3, 2), (3, 2), (0, 0)),       # tiled, non-square
    ((1, 2, 5, 4), (1, 1), (1, 1), (0, 0)),       # tiled, 1x1
    ((1, 2, 10, 11), (5, 5), (5, 5), (0, 0)),     # tiles too large for a compiled size
    ((2, 2, 7, 7), (3, 3), (2, 2), (1, 1)),       # padded, overlapping
    ((1, 3, 6, 5), (2, 2), (1, 1), (0, 0)),       # overlapping
    ((2, 1, 6, 7), (3, 2), (1, 2), (1, 0)),       # mixed
    ((1, 2, 8, 8), (2, 2), (3, 3), (1, 0)),       # gaps between windows
], ids=["tiled", "leftover", "tiled-3x2", "1x1", "tiled-5x5", "padded", "overlap", "mixed",
        "gaps"])
def test_max_pool_back_kernel_matches_a_reference(shape, kernel, stride, padding, dtype):
    """The max backward kernels on ties (small integers), NaNs and a dx buffer full of
    garbage, for contiguous and permuted x, against a window-by-window reference."""
    from engine.backends.cpu.pool_2d import cpu_pool_2d, cpu_pool_2d_back
    rng = np.random.default_rng(8)
    ftype = np.float32 if dtype == "f32" else np.float64
    x = rng.integers(-2, 3, shape).astype(ftype)           # many ties
    x.reshape(-1)[rng.choice(x.size, x.size // 15, replace=False)] = np.nan
    params = dict(mode="max", kernel=kernel, stride=stride, padding=padding)
    oh = (shape[2] + 2 * padding[0] - kernel[0]) // stride[0] + 1
    ow = (shape[3] + 2 * padding[1] - kernel[1]) // stride[1] + 1
    y = np.empty((shape[0], shape[1], oh, ow), ftype)
    cpu_pool_2d(y, [x], **params)
    g = rng.uniform(1, 2, y.shape).astype(ftype)
    want = _reference_max_pool_back(g, x, kernel, stride, padding)
    permuted = np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    for xs in (x, permuted):
        dx = np.full(shape, np.nan, ftype)
        cpu_pool_2d_back(dx, [g, xs, y], **params)
        np.testing.assert_array_equal(dx, want)


# --- conv_2d --------------------------------------------------------------------------------------
def test_conv_2d_mixed_dtypes():
    """Columns take the kernel's dtype; the input's gradient keeps the input's dtype."""
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, (2, 3, 5, 5)).astype(np.float32)
    w = rng.uniform(-1, 1, (4, 3, 3, 3))
    out = evaluate(lambda a, b: ops.conv_2d(a, b, padding=1), x, w)
    assert out.dtype == np.float64
    want = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    gx, gw = weighted_grads(lambda a, b: ops.conv_2d(a, b, padding=1), [x, w], np.ones(out.shape))
    assert gx.dtype == np.float32 and gw.dtype == np.float64


# --- float64 finite differences -------------------------------------------------------------------
@pytest.mark.parametrize("build, shapes", [
    (lambda x: ops.pool_2d(x, "max", 3, stride=2, padding=1), [(1, 2, 5, 5)]),
    (lambda x: ops.pool_2d(x, "avg", (3, 2), stride=(1, 2), padding=(1, 0)), [(2, 1, 4, 5)]),
    (lambda x: ops.im2col(x, 2, 3, 2, 1, (2, 1)), [(1, 2, 5, 6)]),
    (lambda x, w: ops.conv_2d(x, w, 2, 1, 1), [(2, 2, 5, 4), (3, 2, 3, 3)]),
], ids=["max_pool", "avg_pool", "im2col", "conv_2d"])
def test_backward_matches_finite_differences(build, shapes):
    rng = np.random.default_rng(7)
    arrays = [rng.permutation(int(np.prod(s))).reshape(s) / np.prod(s) for s in shapes]
    out = evaluate(build, *arrays)
    w = rng.uniform(-1, 1, out.shape)
    grads = weighted_grads(build, arrays, w)
    eps = 1e-6
    for a, g in zip(arrays, grads, strict=True):
        for idx in np.ndindex(a.shape):
            hi, lo = a.copy(), a.copy()
            hi[idx] += eps
            lo[idx] -= eps
            fd = ((evaluate(build, *[hi if b is a else b for b in arrays]) * w).sum() -
                  (evaluate(build, *[lo if b is a else b for b in arrays]) * w).sum()) / (2 * eps)
            assert abs(fd - g[idx]) < 1e-6, idx


# --- errors ---------------------------------------------------------------------------------------
def _t(shape, dtype="f32"):
    return engine.input_tensor(shape, dtype)


@pytest.mark.parametrize("build, error, match", [
    (lambda: ops.pool_2d(_t((3, 8, 8)), "max", 2), ShapeError,
     r"pool_2d: needs an NCHW.*\[3, 8, 8\]"),
    (lambda: ops.pool_2d(_t((1, 1, 8, 8)), "min", 2), ParamError, "mode must be one of"),
    (lambda: ops.pool_2d(_t((1, 1, 8, 8)), "max", 0), ParamError, "kernel must be positive"),
    (lambda: ops.pool_2d(_t((1, 1, 8, 8)), "max", 2, 0), ParamError, "stride must be positive"),
    (lambda: ops.pool_2d(_t((1, 1, 8, 8)), "max", 3, 1, -1), ParamError, "non-negative"),
    (lambda: ops.pool_2d(_t((1, 1, 8, 8)), "max", 3, 1, 2), ParamError, "at most half"),
    (lambda: ops.pool_2d(_t((1, 1, 2, 8)), "max", 3), ShapeError, r"does not fit.*\[1, 1, 2, 8\]"),
    (lambda: ops.pool_2d(_t((1, 1, 8, 8)), "max", (2, 2, 2)), ParamError, "pair of ints"),
    (lambda: ops.pool_2d(_t((1, 1, 8, 8)), "max", 2.5), ParamError, "pair of ints"),
    (lambda: ops.pool_2d(_t((1, 1, 8, 8), "i32"), "max", 2), DTypeError, "float input"),
    (lambda: ops.pool_2d_back(_t((1, 1, 3, 4)), _t((1, 1, 8, 8)), _t((1, 1, 4, 4)), "max", 2),
     ShapeError, r"pool_2d_back: gradient of shape \[1, 1, 3, 4\].*\[1, 1, 4, 4\]"),
    (lambda: ops.pool_2d_back(_t((1, 1, 4, 4)), _t((1, 1, 8, 8)), _t((1, 1, 4, 3)), "max", 2),
     ShapeError, r"pool_2d_back: pooled output of shape \[1, 1, 4, 3\].*\[1, 1, 4, 4\]"),
    (lambda: ops.pool_2d_back(_t((1, 1, 4, 4)), _t((1, 1, 8, 8)), _t((1, 1, 4, 4), "f64"),
                              "max", 2), DTypeError, "pool_2d_back: pooled output dtype"),
    (lambda: ops.im2col(_t((1, 1, 8, 8)), 3, 3, stride=(1, 0)), ParamError,
     "stride must be positive"),
    (lambda: ops.im2col(_t((1, 1, 8, 8)), 3, 3, dilation=0), ParamError,
     "dilation must be positive"),
    (lambda: ops.im2col(_t((1, 1, 4, 4)), 3, 3, dilation=2), ShapeError, "does not fit"),
    (lambda: ops.im2col(_t((1, 8, 8)), 3, 3), ShapeError, r"im2col: needs an NCHW"),
    (lambda: ops.im2col(_t((1, 1, 8, 8)), 3, 3, dtype="i32"), DTypeError, "a float dtype"),
    (lambda: ops.im2col_back(_t((1, 6, 6, 8)), (1, 1, 8, 8), 3, 3, 1, 0, 1, "f32"),
     ShapeError, r"im2col_back: gradient of shape \[1, 6, 6, 8\]"),
    (lambda: ops.conv_2d(_t((1, 3, 8, 8)), _t((4, 2, 3, 3))), ShapeError,
     r"conv_2d: input has 3 channels but the kernel expects 2"),
    (lambda: ops.conv_2d(_t((3, 8, 8)), _t((4, 3, 3, 3))), ShapeError, "conv_2d: needs an NCHW"),
    (lambda: ops.conv_2d(_t((1, 3, 2, 8)), _t((4, 3, 3, 3))), ShapeError,
     "conv_2d: .*does not fit"),
    (lambda: ops.conv_2d(_t((1, 3, 8, 8)), _t((4, 3, 3, 3)), padding=-1), ParamError,
     "conv_2d: padding must be non-negative"),
])
def test_errors_name_the_op_and_the_problem(build, error, match):
    with pytest.raises(error, match=match):
        build()


# --- property test against torch ------------------------------------------------------------------
@st.composite
def _pool_cases(draw):
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    ph, pw = draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2))
    h = draw(st.integers(max(kh - 2 * ph, 1), 9))
    w = draw(st.integers(max(kw - 2 * pw, 1), 9))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), h, w)
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    mode = draw(st.sampled_from(["max", "avg"]))
    dtype = draw(st.sampled_from(["f32", "f64"]))
    spec = InputSpec("x", shape, "distinct" if mode == "max" else "uniform")
    return Sample.make("pool_2d", [spec], dtype, mode=mode, kernel=(kh, kw), stride=stride,
                       padding=(ph, pw))


@st.composite
def _conv_cases(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    p = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    h = draw(st.integers(max(d[0] * (kh - 1) + 1 - 2 * p[0], 1), 8))
    w = draw(st.integers(max(d[1] * (kw - 1) + 1 - 2 * p[1], 1), 8))
    n, c, o = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dtype = draw(st.sampled_from(["f32", "f64"]))
    if draw(st.booleans()):
        inputs = [InputSpec("x", (n, c, h, w)), InputSpec("w", (o, c, kh, kw))]
        return Sample.make("conv_2d", inputs, dtype, stride=s, padding=p, dilation=d)
    params = dict(kh=kh, kw=kw, stride=s, padding=p, dilation=d, dtype=None)
    return Sample("im2col", (InputSpec("x", (n, c, h, w)),), tuple(sorted(params.items())), dtype)


def _check_against_torch(sample):
    arrays = sample.generate_inputs()
    got, got_grads = run_engine(sample, arrays)
    want, want_grads = run_torch(sample, arrays)
    np.testing.assert_allclose(got, want, **TOL[sample.dtype], err_msg=str(sample))
    for g, w in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w, **TOL[sample.dtype], err_msg=str(sample))


@given(_pool_cases())
def test_pool_2d_matches_torch_on_random_cases(sample):
    _check_against_torch(sample)


@given(_conv_cases())
def test_conv_2d_and_im2col_match_torch_on_random_cases(sample):
    _check_against_torch(sample)
