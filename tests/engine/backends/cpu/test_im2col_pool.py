"""The CPU kernels of im2col, im2col_back and 2-D pooling against plain numpy references, on
MNIST-like and odd shapes, strides, padding (also wider than the window), dilation, float32,
float64 and mixed dtypes, permuted inputs, window sizes compiled into the kernel and read at
run time, and arrays large enough for the parallel compilations. Output buffers start as
NaN, so an element a kernel forgets to write shows up. And conv_2d against torch, with and
without an image gradient, its training graph (its own kernels: no columns), and its
kernels' bits on 1, 2 and 3 threads and against their plain twin."""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import engine
from engine import ops
from engine.backends.cpu import conv_2d as cpu_conv
from engine.backends.cpu import paths, threads
from engine.backends.cpu.im2col import STATIC_WINDOW, cpu_im2col, cpu_im2col_back
from engine.backends.cpu.jit import PARALLEL_MIN_SIZE
from engine.backends.cpu.pool_2d import MAX_TILE, cpu_pool_2d, cpu_pool_2d_back
from gradcheck.adapters.engine_adapter import engine_thread_count
from tests.engine.ops.op_harness import TOL, evaluate, weighted_grads

FLOATS = {"f32": np.float32, "f64": np.float64}


def _output_size(size, k, stride, padding, dilation=1):
    return (size + 2 * padding - dilation * (k - 1) - 1) // stride + 1


def _windows(size, k, stride, padding, dilation=1):
    """For each window cell j, the slice of the padded axis its outputs read."""
    out = _output_size(size, k, stride, padding, dilation)
    return [slice(j * dilation, j * dilation + stride * (out - 1) + 1, stride) for j in range(k)]


# --- references -----------------------------------------------------------------------------------
def im2col_reference(x, kh, kw, stride, padding, dilation, dtype):
    """cols[n, oy, ox, (c*kh + ky)*kw + kx] from slices of the zero-padded image."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    rows, cols = _windows(h, kh, sh, ph, dh), _windows(w, kw, sw, pw, dw)
    oh, ow = _output_size(h, kh, sh, ph, dh), _output_size(w, kw, sw, pw, dw)
    out = np.empty((n, oh, ow, c, kh, kw), dtype)
    for ky, ys in enumerate(rows):
        for kx, xs in enumerate(cols):
            out[..., ky, kx] = xp[:, :, ys, xs].transpose(0, 2, 3, 1)
    return out.reshape(n, oh, ow, c * kh * kw)


def im2col_back_reference(g, x_shape, kh, kw, stride, padding, dilation, dtype):
    """dx: each column entry added, in float64 and in (ky, kx) order, onto the cell of the
    zero-padded image it was read from; then the padding cut off and the sum rounded once
    (the kernel's order, so the results agree bit for bit)."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    n, c, h, w = x_shape
    oh, ow = g.shape[1], g.shape[2]
    g6 = g.reshape(n, oh, ow, c, kh, kw).astype(np.float64)
    dxp = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    rows, cols = _windows(h, kh, sh, ph, dh), _windows(w, kw, sw, pw, dw)
    for ky, ys in enumerate(rows):
        for kx, xs in enumerate(cols):
            dxp[:, :, ys, xs] += g6[..., ky, kx].transpose(0, 3, 1, 2)
    return dxp[:, :, ph:ph + h, pw:pw + w].astype(dtype)


def max_pool_reference(x, kernel, stride, padding):
    """(y, dx_of): y = each window's maximum (its first NaN if it holds one), and dx_of(g)
    sends g to each window's first cell (row-major, image cells only) equal to its maximum,
    or to its first NaN; overlapping windows add up."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    n, c, h, w = x.shape
    oh, ow = _output_size(h, kh, sh, ph), _output_size(w, kw, sw, pw)
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)
    wins = np.stack([xp[:, :, ys, xs] for ys in _windows(h, kh, sh, ph)
                     for xs in _windows(w, kw, sw, pw)], axis=-1)       # (n, c, oh, ow, cells)
    nan = np.isnan(wins)
    top = np.max(np.where(nan, -np.inf, wins), axis=-1)
    y = np.where(nan.any(-1), np.nan, top)
    first = np.where(nan.any(-1), np.argmax(nan, -1), np.argmax(wins == top[..., None], -1))

    def dx_of(g):
        """Window by window in row-major order, as the kernels add overlapping windows."""
        dxp = np.zeros(xp.shape, g.dtype)
        ni, ci = np.ogrid[:n, :c]
        for oy, ox in np.ndindex(oh, ow):
            ky, kx = np.divmod(first[:, :, oy, ox], kw)
            dxp[ni, ci, oy * sh + ky, ox * sw + kx] += g[:, :, oy, ox]
        return dxp[:, :, ph:ph + h, pw:pw + w]
    return y.astype(x.dtype), dx_of


def avg_pool_reference(x, kernel, stride, padding):
    """Window sums over the zero-padded image divided by the full window size."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    total = sum(xp[:, :, ys, xs] for ys in _windows(x.shape[2], kh, sh, ph)
                for xs in _windows(x.shape[3], kw, sw, pw))
    return total / (kh * kw)


def _nan_buffer(shape, dtype):
    return np.full(shape, np.nan, dtype)


def _permuted(a):
    """a as a strided view (its data stored with the channel axis last)."""
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


# --- cases ----------------------------------------------------------------------------------------
# (x shape, (kh, kw), stride, padding, dilation)
IM2COL_CASES = {
    "mnist-conv1": ((2, 1, 28, 28), (3, 3), (1, 1), (1, 1), (1, 1)),
    "mnist-conv2": ((2, 8, 14, 14), (3, 3), (1, 1), (1, 1), (1, 1)),
    "odd": ((3, 2, 7, 5), (2, 3), (2, 1), (1, 0), (1, 2)),
    "1x1-strided": ((2, 3, 6, 7), (1, 1), (2, 3), (0, 0), (1, 1)),
    "stride-3-dilated": ((1, 2, 11, 10), (3, 2), (3, 2), (2, 1), (2, 3)),
    "padding-wider-than-window": ((1, 2, 4, 5), (2, 2), (1, 2), (3, 2), (1, 1)),
    "one-output": ((2, 2, 3, 3), (3, 3), (1, 1), (0, 0), (1, 1)),
    "window-read-at-run-time": ((2, 2, 9, 10), (STATIC_WINDOW + 1, STATIC_WINDOW + 2),
                                (1, 2), (2, 3), (1, 1)),
    "parallel": ((12, 8, 14, 14), (3, 3), (1, 1), (1, 1), (1, 1)),
}


def _cols_size(case):
    (n, c, h, w), (kh, kw), stride, padding, dilation = case
    return (n * _output_size(h, kh, stride[0], padding[0], dilation[0])
            * _output_size(w, kw, stride[1], padding[1], dilation[1]) * c * kh * kw)


def test_the_cases_reach_both_window_kinds_and_both_compilations():
    assert _cols_size(IM2COL_CASES["parallel"]) >= PARALLEL_MIN_SIZE
    assert min(IM2COL_CASES["window-read-at-run-time"][1]) > STATIC_WINDOW


def _im2col_params(case, dtype):
    _, (kh, kw), stride, padding, dilation = case
    return dict(kh=kh, kw=kw, stride=stride, padding=padding, dilation=dilation, dtype=dtype)


@pytest.mark.parametrize("dtype, cols_dtype", [("f32", "f32"), ("f64", "f64"), ("f32", "f64")])
@pytest.mark.parametrize("case", IM2COL_CASES.values(), ids=IM2COL_CASES.keys())
def test_im2col_matches_the_reference(case, dtype, cols_dtype):
    x = np.random.default_rng(0).standard_normal(case[0]).astype(FLOATS[dtype])
    params = _im2col_params(case, cols_dtype)
    want = im2col_reference(x, *case[1], *case[2:], FLOATS[cols_dtype])
    for xs in (x, _permuted(x)):
        cols = _nan_buffer(want.shape, FLOATS[cols_dtype])
        cpu_im2col(cols, [xs], **params)
        np.testing.assert_array_equal(cols, want)


@pytest.mark.parametrize("cols_dtype, dtype", [("f32", "f32"), ("f64", "f64"), ("f64", "f32")])
@pytest.mark.parametrize("case", IM2COL_CASES.values(), ids=IM2COL_CASES.keys())
def test_im2col_back_matches_the_reference(case, cols_dtype, dtype):
    """Bit for bit: both sum in float64 in (ky, kx) order and round once."""
    x_shape = case[0]
    cols_shape = im2col_reference(np.zeros(x_shape), *case[1], *case[2:], np.float64).shape
    g = np.random.default_rng(1).standard_normal(cols_shape).astype(FLOATS[cols_dtype])
    want = im2col_back_reference(g, x_shape, *case[1], *case[2:], FLOATS[dtype])
    dx = _nan_buffer(x_shape, FLOATS[dtype])
    cpu_im2col_back(dx, [g], x_shape=x_shape, **_im2col_params(case, dtype))
    np.testing.assert_array_equal(dx, want)


@pytest.mark.parametrize("case", IM2COL_CASES.values(), ids=IM2COL_CASES.keys())
def test_im2col_back_is_the_adjoint_of_im2col(case):
    """<im2col(x), g> = <x, im2col_back(g)> in float64."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(case[0])
    params = _im2col_params(case, "f64")
    cols = im2col_reference(x, *case[1], *case[2:], np.float64)
    cpu_im2col(cols, [x], **params)
    g = rng.standard_normal(cols.shape)
    dx = np.empty_like(x)
    cpu_im2col_back(dx, [g], x_shape=x.shape, **params)
    np.testing.assert_allclose(np.vdot(cols, g), np.vdot(x, dx), rtol=1e-12)


# --- pooling --------------------------------------------------------------------------------------
# (x shape, kernel, stride, padding)
POOL_CASES = {
    "mnist-pool1": ((2, 8, 28, 28), (2, 2), (2, 2), (0, 0)),
    "mnist-pool2": ((2, 16, 14, 14), (2, 2), (2, 2), (0, 0)),
    "tiled-leftover": ((2, 3, 7, 9), (2, 2), (2, 2), (0, 0)),
    "tiled-3x2-leftover": ((1, 2, 11, 7), (3, 2), (3, 2), (0, 0)),
    "tiled-1x1": ((1, 2, 5, 4), (1, 1), (1, 1), (0, 0)),
    "tiled-largest-compiled": ((1, 2, 9, 8), (MAX_TILE, MAX_TILE), (MAX_TILE, MAX_TILE), (0, 0)),
    "tiles-too-large": ((1, 2, 11, 12), (MAX_TILE + 1,) * 2, (MAX_TILE + 1,) * 2, (0, 0)),
    "overlapping-padded": ((2, 2, 7, 8), (3, 3), (2, 2), (1, 1)),
    "gaps": ((1, 2, 8, 9), (2, 2), (3, 3), (1, 0)),
    "parallel": ((24, 16, 14, 14), (2, 2), (2, 2), (0, 0)),
    "parallel-general": ((24, 16, 14, 14), (3, 3), (2, 2), (1, 1)),
}


def _pool_input(shape, dtype, seed):
    """Small integers (many ties) with a few NaNs."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(FLOATS[dtype])
    x.reshape(-1)[rng.choice(x.size, max(1, x.size // 50), replace=False)] = np.nan
    return x


def test_the_pool_cases_reach_the_parallel_compilations():
    assert np.prod(POOL_CASES["parallel"][0]) >= PARALLEL_MIN_SIZE


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("case", POOL_CASES.values(), ids=POOL_CASES.keys())
def test_max_pool_and_its_backward_match_the_reference(case, dtype):
    shape, kernel, stride, padding = case
    x = _pool_input(shape, dtype, 3)
    params = dict(mode="max", kernel=kernel, stride=stride, padding=padding)
    want_y, dx_of = max_pool_reference(x, kernel, stride, padding)
    g = np.random.default_rng(4).uniform(1, 2, want_y.shape).astype(x.dtype)
    want_dx = dx_of(g)
    for xs in (x, _permuted(x)):
        y = _nan_buffer(want_y.shape, x.dtype)
        cpu_pool_2d(y, [xs], **params)
        np.testing.assert_array_equal(y, want_y)
        for gs in (g, _permuted(g)):
            dx = _nan_buffer(shape, x.dtype)
            cpu_pool_2d_back(dx, [gs, xs, y], **params)
            np.testing.assert_array_equal(dx, want_dx)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("case", POOL_CASES.values(), ids=POOL_CASES.keys())
def test_avg_pool_matches_the_reference(case, dtype):
    shape, kernel, stride, padding = case
    x = np.random.default_rng(5).standard_normal(shape).astype(FLOATS[dtype])
    want = avg_pool_reference(x, kernel, stride, padding)
    y = _nan_buffer(want.shape, x.dtype)
    cpu_pool_2d(y, [x], mode="avg", kernel=kernel, stride=stride, padding=padding)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == "f32" else dict(rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(y, want, **tol)


# --- im2col_back's scatter against its gather ------------------------------------------------
SCATTER_CASES = [((3, 8, 14, 14), 3, 3, (1, 1), (1, 1), (1, 1)),
                 ((2, 9, 9, 8), 3, 2, (2, 1), (1, 0), (1, 2)),
                 ((2, 8, 7, 6), 2, 3, (3, 2), (0, 3), (2, 1)),        # padding wider than
                 ((1, 8, 5, 5), 7, 6, (1, 1), (2, 2), (1, 1)),        # a window; run-time
                 ((2, 8, 40, 40), 3, 3, (1, 1), (1, 1), (1, 1))]      # sizes; parallel


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("case", SCATTER_CASES, ids=str)
def test_im2col_back_scatter_gives_the_gathers_bits(case, dtype, threads):
    """The fast path im2col_back:scatter adds each cell's terms in the gather's order: the
    same bits as its plain twin, on contiguous and permuted columns, at 1 and 2 threads."""
    x_shape, kh, kw, stride, padding, dilation = case
    oh = _output_size(x_shape[2], kh, stride[0], padding[0], dilation[0])
    ow = _output_size(x_shape[3], kw, stride[1], padding[1], dilation[1])
    rng = np.random.default_rng(3)
    g = rng.standard_normal((x_shape[0], oh, ow, x_shape[1] * kh * kw)).astype(FLOATS[dtype])
    permuted = np.ascontiguousarray(g.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
    args = (x_shape, kh, kw, stride, padding, dilation, dtype)
    with engine_thread_count(threads):
        results = []
        for cols in (g, permuted):
            with paths.recording() as taken:
                fast = np.full(x_shape, np.nan, FLOATS[dtype])
                cpu_im2col_back(fast, [cols], *args)
            assert taken["im2col_back:scatter"] > 0
            with paths.plain():
                plain = np.full(x_shape, np.nan, FLOATS[dtype])
                cpu_im2col_back(plain, [cols], *args)
            np.testing.assert_array_equal(fast.view(np.uint8), plain.view(np.uint8))
            results.append(fast)
    want = im2col_back_reference(g, x_shape, kh, kw, stride, padding, dilation, FLOATS[dtype])
    for got in results:
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


# --- NKHW columns: the rows paths against their gathers -------------------------------------------
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype, cols_dtype", [("f32", "f32"), ("f64", "f64"), ("f32", "f64")])
@pytest.mark.parametrize("case", IM2COL_CASES.values(), ids=IM2COL_CASES.keys())
def test_nkhw_rows_give_the_gathers_bits(case, dtype, cols_dtype, threads):
    """im2col:rows writes the NHWK reference's columns with the window axis second, and
    im2col_back:rows adds each cell's terms in the gather's order: the same bits as their
    plain twins (the gathers on the NHWK view), on contiguous and strided inputs, at 1 and
    2 threads."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal(case[0]).astype(FLOATS[dtype])
    params = dict(_im2col_params(case, cols_dtype), layout="NKHW")
    want = im2col_reference(x, *case[1], *case[2:], FLOATS[cols_dtype]).transpose(0, 3, 1, 2)
    g = rng.standard_normal(want.shape).astype(FLOATS[cols_dtype])
    want_dx = im2col_back_reference(np.ascontiguousarray(g.transpose(0, 2, 3, 1)), x.shape,
                                    *case[1], *case[2:], FLOATS[dtype])
    back_params = dict(params, dtype=dtype)
    with engine_thread_count(threads):
        for xs in (x, _permuted(x)):
            for mode, path in ((paths.recording, "im2col:rows"), (paths.plain, None)):
                cols = _nan_buffer(want.shape, FLOATS[cols_dtype])
                with mode() as taken:
                    cpu_im2col(cols, [xs], **params)
                assert path is None or taken[path] > 0
                np.testing.assert_array_equal(cols, want)
        for gs in (g, _permuted(g)):
            for mode, path in ((paths.recording, "im2col_back:rows"), (paths.plain, None)):
                dx = _nan_buffer(x.shape, FLOATS[dtype])
                with mode() as taken:
                    cpu_im2col_back(dx, [gs], x_shape=x.shape, **back_params)
                assert path is None or taken[path] > 0
                np.testing.assert_array_equal(dx.view(np.uint8), want_dx.view(np.uint8))


# --- conv_2d -------------------------------------------------------------------------------------
# (x shape, w shape, stride, padding, dilation); K = C*KH*KW above and below O (the two
# arrangements conv_2d once chose between)
CONV_CASES = {
    "mnist-conv1": ((3, 1, 28, 28), (8, 1, 3, 3), 1, 1, 1),
    "mnist-conv2": ((3, 8, 14, 14), (16, 8, 3, 3), 1, 1, 1),
    "k-at-most-o": ((2, 1, 6, 5), (10, 1, 3, 3), 1, 1, 1),
    "strided-dilated": ((2, 3, 9, 8), (4, 3, 3, 2), (2, 1), (1, 0), (1, 2)),
    "parallel": ((8, 8, 14, 14), (16, 8, 3, 3), 1, 1, 1),
}


def _ops_reaching(t) -> set[str]:
    seen, stack, names = set(), [t], set()
    while stack:
        u = stack.pop()
        if u.id not in seen:
            seen.add(u.id)
            names.add(u.op)
            stack.extend(u.srcs)
    return names


@pytest.mark.parametrize("x_grad", [False, True], ids=["x-input", "x-param"])
def test_conv_2d_trains_on_its_own_kernels(x_grad):
    """The training graph is conv_2d, conv_2d_back_w and, for an input with a gradient
    only, conv_2d_back_x: no columns (im2col), no products, no copies."""
    leaf = engine.param if x_grad else engine.input_tensor
    w = engine.param((4, 8, 3, 3))
    out = ops.conv_2d(leaf((2, 8, 6, 6)), w, padding=1)
    loss = ops.sum(ops.mul(out, engine.input_tensor(out.shape)))
    graph = engine.Graph([loss])
    graph.build_backward(loss)
    names = {t.op for t in graph.nodes}
    assert not names & {"im2col", "im2col_back", "matmul", "cont"}, names
    assert "conv_2d_back_w" in names
    assert ("conv_2d_back_x" in names) == x_grad


def _conv_kernels(case, dtype):
    """conv_2d's forward, dx and dw by the CPU kernels on the case's random arrays."""
    x_shape, w_shape, stride, padding, dilation = case
    stride, padding, dilation = ((v, v) if isinstance(v, int) else v
                                 for v in (stride, padding, dilation))
    geo = dict(stride=stride, padding=padding, dilation=dilation)
    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, x_shape).astype(dtype)
    w = rng.uniform(-1, 1, w_shape).astype(dtype)
    oh, ow = (1 + (x_shape[2 + a] + 2 * padding[a] - dilation[a] * (w_shape[2 + a] - 1) - 1)
              // stride[a] for a in (0, 1))
    g = rng.uniform(-1, 1, (x_shape[0], w_shape[0], oh, ow)).astype(dtype)
    out, dx, dw = (np.full(s, np.nan, dtype) for s in (g.shape, x_shape, w_shape))
    cpu_conv.cpu_conv_2d(out, [x, w], **geo)
    cpu_conv.cpu_conv_2d_back_x(dx, [g, w], x_shape=x_shape, dtype=None, **geo)
    cpu_conv.cpu_conv_2d_back_w(dw, [g, x], w_shape=w_shape, **geo)
    return out, dx, dw


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CONV_CASES.values(), ids=CONV_CASES.keys())
def test_conv_2d_kernels_keep_their_bits_on_any_threads_and_match_the_plain_twin(case,
                                                                                  dtype):
    """The fast path (conv_2d:columns) split on 2 and 3 threads, however small the work,
    gives the bits of 1 thread (the weight's partial sums are fixed by the batch alone);
    the plain twin (im2col's columns, numpy's products) agrees within rounding."""
    got = {}
    for n in (1, 2, 3):
        with engine_thread_count(n), patch.object(threads, "MIN_MACS", 0), \
                paths.recording() as taken:
            got[n] = _conv_kernels(case, dtype)
        assert taken["conv_2d:columns"] == 3
    for n in (2, 3):
        for a, b in zip(got[1], got[n], strict=True):
            assert a.tobytes() == b.tobytes()
    with paths.plain(), paths.recording() as taken:
        plain = _conv_kernels(case, dtype)
    assert not taken
    for a, b in zip(got[1], plain, strict=True):
        _assert_close(a, b, "f32" if dtype == np.float32 else "f64")


def _assert_close(got, want, dtype):
    """Within the harness's tolerance, the absolute part scaled by the largest value: a
    kernel gradient sums N*OH*OW products, rounded in another order than torch's."""
    tol = TOL[dtype]
    np.testing.assert_allclose(got, want, rtol=tol["rtol"],
                               atol=tol["atol"] * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("x_grad", [False, True], ids=["x-input", "x-param"])
@pytest.mark.parametrize("case", CONV_CASES.values(), ids=CONV_CASES.keys())
def test_conv_2d_matches_torch(case, x_grad, dtype):
    x_shape, w_shape, stride, padding, dilation = case
    rng = np.random.default_rng(6)
    x = rng.uniform(0, 1, x_shape).astype(FLOATS[dtype])
    w = rng.uniform(-1, 1, w_shape).astype(FLOATS[dtype])

    def build(a, b):
        return ops.conv_2d(a, b, stride, padding, dilation)

    xt, wt = torch.tensor(x, requires_grad=x_grad), torch.tensor(w, requires_grad=True)
    want = F.conv2d(xt, wt, stride=stride, padding=padding, dilation=dilation)
    _assert_close(evaluate(build, x, w), want.detach().numpy(), dtype)
    g = rng.uniform(-1, 1, want.shape).astype(FLOATS[dtype])
    (want * torch.from_numpy(g)).sum().backward()
    gx, gw = weighted_grads(build, [x, w], g, params=[x_grad, True])
    _assert_close(gw, wt.grad.numpy(), dtype)
    if x_grad:
        _assert_close(gx, xt.grad.numpy(), dtype)
    else:
        assert gx is None
