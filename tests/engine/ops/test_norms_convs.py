"""Focused tests of rms_norm, norm (and their dedicated backward ops), softmax with an additive
mask, im2col_1d (and im2col_1d_back), pool_1d, conv_transpose_2d (and the backward of
im2col_back it relies on) and mse_loss: edge cases, numerics, clear errors, and property
tests against torch driven by the ops' own hypothesis strategies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import engine
from engine import ops
from engine.errors import DTypeError, ParamError, ShapeError
from engine.registry import get_op
from tests.engine.ops.op_harness import TOL, evaluate, weighted_grads

RNG = np.random.default_rng(2024)


def _torch_grads(fn, arrays, w):
    tens = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*tens)
    (out * torch.tensor(w, dtype=out.dtype)).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() for t in tens]


# --- rms_norm and norm ---------------------------------------------------------------------------
def test_norms_accumulate_in_float64():
    """A float32 row of large, nearly equal values: a float32 running sum loses the spread,
    the float64 one does not."""
    x = (1e4 + RNG.uniform(-1, 1, (3, 64))).astype(np.float32)
    want = x.astype(np.float64)
    for build, ref in [(lambda t: ops.rms_norm(t, 1e-6),
                        want / np.sqrt((want ** 2).mean(-1, keepdims=True) + 1e-6)),
                       (lambda t: ops.norm(t, 1e-5),
                        (want - want.mean(-1, keepdims=True))
                        / np.sqrt(want.var(-1, keepdims=True) + 1e-5))]:
        got = evaluate(build, x)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6)


def test_norm_of_a_constant_row_is_zero_with_a_finite_gradient():
    x = np.full((2, 5), 3.0)
    assert not evaluate(lambda t: ops.norm(t, 1e-5), x).any()
    (dx,) = weighted_grads(lambda t: ops.norm(t, 1e-5), [x], RNG.uniform(-1, 1, (2, 5)))
    assert np.isfinite(dx).all()


def test_eps_zero_matches_torch():
    x = RNG.uniform(-2, 2, (3, 6))
    w = RNG.uniform(-1, 1, x.shape)
    for build, ref in [(lambda t: ops.rms_norm(t, 0.0), lambda t: t * torch.rsqrt(
                           t.pow(2).mean(-1, keepdim=True))),
                       (lambda t: ops.norm(t, 0.0), lambda t: F.layer_norm(t, (6,), eps=0.0))]:
        (got,) = weighted_grads(build, [x], w)
        out, (want,) = _torch_grads(ref, [x], w)
        np.testing.assert_allclose(evaluate(build, x), out, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", ["rms_norm", "norm"])
def test_dedicated_backward_reads_strided_gradients(op):
    """The backward op gets a permuted gradient (the output is permuted before the loss);
    its builder makes it contiguous for the row kernel."""
    x = RNG.uniform(-1, 1, (4, 3, 5))
    w = RNG.uniform(-1, 1, (5, 3, 4))
    build = lambda t: ops.permute(getattr(ops, op)(t, 1e-3), (2, 1, 0))  # noqa: E731
    ref = get_op(op).torch
    (got,) = weighted_grads(build, [x], w)
    _, (want,) = _torch_grads(lambda t: ref(t, 1e-3).permute(2, 1, 0), [x], w)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", ["rms_norm_back", "norm_back"])
def test_backward_ops_match_autograd(op):
    g, x = RNG.uniform(-1, 1, (2, 3, 7)), RNG.uniform(-1, 1, (2, 3, 7))
    got = evaluate(lambda a, b: getattr(ops, op)(a, b, 1e-4), g, x)
    ref = get_op(op[:-len("_back")]).torch
    xt = torch.tensor(x, requires_grad=True)
    (want,) = torch.autograd.grad(ref(xt, 1e-4), xt, torch.tensor(g))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)


# --- softmax with a mask -------------------------------------------------------------------------
def _causal_mask(rows, cols, value=-1e4):
    return np.triu(np.full((rows, cols), value), k=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask_shape", ["matrix", "full", "per_batch"])
def test_causal_mask_with_large_negatives(mask_shape, dtype):
    """ggml's attention pattern: -1e4 above the diagonal, shared by batches and heads or not;
    forward and the gradients of x and of the mask against torch."""
    x = RNG.uniform(-3, 3, (2, 3, 4, 4)).astype(dtype)
    mask = {"matrix": _causal_mask(4, 4),
            "full": np.broadcast_to(_causal_mask(4, 4), x.shape).copy(),
            "per_batch": np.stack([_causal_mask(4, 4), _causal_mask(4, 4).T])[:, None]}[
        mask_shape].astype(dtype)
    w = RNG.uniform(-1, 1, x.shape)
    build = lambda a, m: ops.softmax(a, 0.5, m)  # noqa: E731
    got = evaluate(build, x, mask)
    want, want_grads = _torch_grads(lambda a, m: (a.double() * 0.5 + m.double()).softmax(-1)
                                    .to(a.dtype), [x, mask], w)
    np.testing.assert_allclose(got, want, **TOL["f32" if dtype == np.float32 else "f64"])
    assert (got[np.broadcast_to(mask, x.shape) < -1] < 1e-30).all()     # masked: exp(-1e4)
    for g, wg in zip(weighted_grads(build, [x, mask], w), want_grads, strict=True):
        np.testing.assert_allclose(g, wg, **TOL["f32" if dtype == np.float32 else "f64"])


def test_infinite_mask_matches_torch():
    x = RNG.uniform(-3, 3, (2, 5, 5))
    mask = _causal_mask(5, 5, -np.inf)
    got = evaluate(lambda a, m: ops.softmax(a, mask=m), x, mask)
    np.testing.assert_allclose(got, torch.softmax(torch.tensor(x + mask), -1).numpy(),
                               rtol=1e-12, atol=1e-300)
    assert (got[:, 0, 0] == 1.0).all()


def test_a_constant_mask_gets_no_gradient():
    """A mask given as an input (not a param) is a constant: only x gets a gradient."""
    x, mask = RNG.uniform(-1, 1, (3, 4)), RNG.uniform(-5, 0, (3, 4))
    w = RNG.uniform(-1, 1, (3, 4))
    gx, gm = weighted_grads(lambda a, m: ops.softmax(a, 2.0, m), [x, mask], w, params=[True, False])
    assert gm is None
    xt = torch.tensor(x, requires_grad=True)
    ((2.0 * xt + torch.tensor(mask)).softmax(-1) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_masked_softmax_of_permuted_x_and_mask():
    x = RNG.uniform(-2, 2, (4, 2, 3))
    mask = RNG.uniform(-5, 0, (4, 3))
    w = RNG.uniform(-1, 1, (2, 4, 3))
    build = lambda a, m: ops.softmax(ops.permute(a, (1, 0, 2)), 1.5,  # noqa: E731
                                     ops.permute(m, (1, 0)))
    got = weighted_grads(build, [x, mask.T.copy()], w)
    _, want = _torch_grads(lambda a, m: (1.5 * a.permute(1, 0, 2) + m.T).softmax(-1),
                           [x, mask.T.copy()], w)
    for g, wg in zip(got, want, strict=True):
        np.testing.assert_allclose(g, wg, rtol=1e-10, atol=1e-12)


def test_softmax_without_a_mask_is_unchanged():
    x = RNG.uniform(-3, 3, (3, 5))
    np.testing.assert_allclose(evaluate(lambda a: ops.softmax(a, -0.7), x),
                               torch.softmax(torch.tensor(-0.7 * x), -1).numpy(), rtol=1e-12)


# --- im2col_1d and pool_1d -----------------------------------------------------------------------
def test_im2col_1d_layout_is_ggml_order():
    """cols[n, ol, c*K + k] = x[n, c, ol*s - p + k*d] (0 in the padding)."""
    x = np.arange(2 * 3 * 11, dtype=np.float64).reshape(2, 3, 11) + 1
    k, s, p, d = 3, 2, 2, 2
    cols = evaluate(lambda t: ops.im2col_1d(t, k, s, p, d), x)
    ol = (11 + 2 * p - d * (k - 1) - 1) // s + 1
    assert cols.shape == (2, ol, 3 * k)
    for n, o, c, j in np.ndindex(2, ol, 3, k):
        i = o * s - p + j * d
        assert cols[n, o, c * k + j] == (x[n, c, i] if 0 <= i < 11 else 0.0)


def test_im2col_1d_is_the_2d_op_on_a_row():
    x = RNG.uniform(-1, 1, (2, 3, 9)).astype(np.float32)
    one = evaluate(lambda t: ops.im2col_1d(t, 3, 2, 1, 1, dtype="f64"), x)
    two = evaluate(lambda t: ops.im2col(ops.reshape(t, (2, 3, 1, 9)), 1, 3, (1, 2), (0, 1),
                                        dtype="f64"), x)
    assert one.dtype == np.float64
    np.testing.assert_array_equal(one, two[:, 0])


def test_im2col_1d_back_is_the_adjoint():
    """<im2col_1d(x), c> == <x, im2col_1d_back(c)>, and the backward of the backward is
    im2col_1d again (checked through a loss on im2col_1d_back)."""
    x, k, s, p, d = RNG.uniform(-1, 1, (2, 3, 10)), 3, 2, 1, 2
    cols = evaluate(lambda t: ops.im2col_1d(t, k, s, p, d), x)
    c = RNG.uniform(-1, 1, cols.shape)
    back = evaluate(lambda t: ops.im2col_1d_back(t, x.shape, k, s, p, d), c)
    np.testing.assert_allclose((cols * c).sum(), (x * back).sum(), rtol=1e-12)
    (gc,) = weighted_grads(lambda t: ops.im2col_1d_back(t, x.shape, k, s, p, d), [c], x)
    np.testing.assert_allclose(gc, cols, rtol=1e-12)


def test_avg_pool_1d_divides_by_the_full_window():
    x = np.ones((1, 1, 5))
    out = evaluate(lambda t: ops.pool_1d(t, "avg", 3, stride=1, padding=1), x)[0, 0]
    np.testing.assert_allclose(out, [2 / 3, 1, 1, 1, 2 / 3])


def test_max_pool_1d_padding_never_wins_and_ties_go_first():
    x = -1.0 - RNG.uniform(0, 1, (2, 3, 7))
    out = evaluate(lambda t: ops.pool_1d(t, "max", 3, 2, 1), x)
    np.testing.assert_allclose(out, F.max_pool1d(torch.tensor(x), 3, 2, 1).numpy())
    (dx,) = weighted_grads(lambda t: ops.pool_1d(t, "max", 2), [np.zeros((1, 1, 6))],
                           np.ones((1, 1, 3)))
    np.testing.assert_array_equal(dx[0, 0], [1, 0, 1, 0, 1, 0])


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_pool_1d_of_a_permuted_input(mode):
    a = RNG.permutation(2 * 9 * 3).reshape(2, 9, 3) / 50.0      # stored NLC
    w = RNG.uniform(-1, 1, (2, 3, 5))
    build = lambda t: ops.pool_1d(ops.permute(t, (0, 2, 1)), mode, 3, 2, 1)  # noqa: E731
    ref = lambda t: get_op("pool_1d").torch(t.permute(0, 2, 1), mode, 3, 2, 1)  # noqa: E731
    out, (want,) = _torch_grads(ref, [a], w)
    np.testing.assert_allclose(evaluate(build, a), out, rtol=1e-12)
    np.testing.assert_allclose(weighted_grads(build, [a], w)[0], want, rtol=1e-12, atol=1e-14)


# --- conv_transpose_2d and the backward of im2col_back -------------------------------------------
def test_conv_transpose_2d_scatters_each_pixel():
    """out[n, o, y*s + ky, x*s + kx] += x[n, c, y, x] w[c, o, ky, kx], by a direct loop."""
    x, w, s = RNG.uniform(-1, 1, (2, 3, 3, 2)), RNG.uniform(-1, 1, (3, 2, 2, 3)), (2, 3)
    got = evaluate(lambda a, b: ops.conv_transpose_2d(a, b, s), x, w)
    want = np.zeros((2, 2, (3 - 1) * 2 + 2, (2 - 1) * 3 + 3))
    for n, c, y, xx, o, ky, kx in np.ndindex(2, 3, 3, 2, 2, 2, 3):
        want[n, o, y * s[0] + ky, xx * s[1] + kx] += x[n, c, y, xx] * w[c, o, ky, kx]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got, F.conv_transpose2d(torch.tensor(x), torch.tensor(w),
                                                       stride=s).numpy(), rtol=1e-12)


def test_im2col_back_has_im2col_as_its_backward():
    """col2im's gradient is im2col with the same parameters: the gradient of
    sum(im2col_back(c) * x) w.r.t. c is im2col(x)."""
    x = RNG.uniform(-1, 1, (2, 2, 5, 6))
    params = (3, 2, (2, 1), (1, 0), (1, 2))
    cols = evaluate(lambda t: ops.im2col(t, *params), x)
    (gc,) = weighted_grads(lambda t: ops.im2col_back(t, x.shape, *params, "f64"),
                   [RNG.uniform(-1, 1, cols.shape)], x)
    np.testing.assert_allclose(gc, cols, rtol=1e-12)


# --- mse_loss ------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4)])
def test_mse_loss_is_a_scalar_mean(shape):
    a, b = RNG.uniform(-2, 2, shape), RNG.uniform(-1, 1, shape)
    got = evaluate(ops.mse_loss, a, b)
    assert got.shape == ()
    np.testing.assert_allclose(got, ((a - b) ** 2).mean(), rtol=1e-12)
    ga, gb = weighted_grads(ops.mse_loss, [a, b], np.array(1.0))
    np.testing.assert_allclose(ga, 2 * (a - b) / max(a.size, 1), rtol=1e-12)
    np.testing.assert_allclose(gb, -ga, rtol=1e-12)


# --- errors --------------------------------------------------------------------------------------
def _t(shape, dtype="f32"):
    return engine.input_tensor(shape, dtype)


@pytest.mark.parametrize("build, error, match", [
    (lambda: ops.rms_norm(_t(())), ShapeError, r"rms_norm: needs at least one axis"),
    (lambda: ops.norm(_t((3,), "i32")), DTypeError, "norm: needs float inputs"),
    (lambda: ops.rms_norm(_t((3,)), -1e-6), ParamError, r"rms_norm: eps must be finite and >= 0"),
    (lambda: ops.norm(_t((3,)), float("nan")), ParamError, "norm: eps must be finite"),
    (lambda: ops.norm(_t((3,)), "1e-5"), ParamError, "norm: eps must be a number"),
    (lambda: ops.rms_norm_back(_t((3, 4)), _t((4, 3))), ShapeError,
     r"rms_norm_back: inputs must have the same shape, got \[3, 4\] and \[4, 3\]"),
    (lambda: ops.norm_back(_t((3, 4)), _t((3, 4), "f64")), DTypeError, "norm_back"),
    (lambda: ops.softmax(_t((3, 4)), mask=_t((4, 4))), ShapeError,
     r"softmax: mask of shape \[4, 4\] does not broadcast to the input's shape \[3, 4\]"),
    (lambda: ops.softmax(_t((3, 4)), mask=_t((2, 3, 4))), ShapeError,
     r"mask of shape \[2, 3, 4\] does not broadcast"),
    (lambda: ops.softmax(_t((3, 4)), mask=_t((3, 4), "f64")), DTypeError,
     "softmax: mask dtype float64 differs from input dtype float32"),
    (lambda: ops.softmax(_t((1, 2, 1, 3, 4)), mask=_t((3, 4))), ShapeError,
     "softmax: a mask needs an input of at most 4 axes"),
    (lambda: ops.im2col_1d(_t((2, 3, 4, 5)), 3), ShapeError, r"im2col_1d: needs an NCL"),
    (lambda: ops.im2col_1d(_t((2, 3, 4)), 3, dilation=2), ShapeError,
     r"im2col_1d: a kernel of 3 .*does not fit input of shape \[2, 3, 4\]"),
    (lambda: ops.im2col_1d(_t((2, 3, 4)), 3, stride=0), ParamError, "stride must be positive"),
    (lambda: ops.im2col_1d(_t((2, 3, 4)), 3, padding=-1), ParamError, "non-negative"),
    (lambda: ops.im2col_1d(_t((2, 3, 4)), 2.0), ParamError, "k must be an int"),
    (lambda: ops.im2col_1d(_t((2, 3, 4)), 2, dtype="i32"), DTypeError, "a float dtype"),
    (lambda: ops.im2col_1d_back(_t((2, 3, 9)), (2, 3, 4), 3), ShapeError,
     r"im2col_1d_back: gradient of shape \[2, 3, 9\] does not match the columns \[2, 2, 9\]"),
    (lambda: ops.pool_1d(_t((2, 3, 8, 8)), "max", 2), ShapeError, r"pool_1d: needs an NCL"),
    (lambda: ops.pool_1d(_t((2, 3, 8)), "sum", 2), ParamError, "pool_1d: mode must be"),
    (lambda: ops.pool_1d(_t((2, 3, 8)), "max", 3, 1, 2), ParamError, "at most half"),
    (lambda: ops.pool_1d(_t((2, 3, 2)), "max", 3), ShapeError, "pool_1d: .*does not fit"),
    (lambda: ops.pool_1d(_t((2, 3, 8)), "max", (2, 2)), ParamError, "kernel must be an int"),
    (lambda: ops.conv_transpose_2d(_t((1, 3, 4, 4)), _t((2, 3, 3, 3))), ShapeError,
     "conv_transpose_2d: input has 3 channels but the kernel expects 2"),
    (lambda: ops.conv_transpose_2d(_t((3, 4, 4)), _t((3, 2, 3, 3))), ShapeError,
     r"conv_transpose_2d: needs an NCHW"),
    (lambda: ops.conv_transpose_2d(_t((1, 3, 4, 4)), _t((3, 2, 3, 3), "f64")), DTypeError,
     "conv_transpose_2d: needs float input and kernel of one dtype"),
    (lambda: ops.conv_transpose_2d(_t((1, 3, 4, 4)), _t((3, 2, 3, 3)), 0), ParamError,
     "stride must be positive"),
    (lambda: ops.mse_loss(_t((3, 4)), _t((4,))), ShapeError,
     r"mse_loss: inputs must have the same shape, got \[3, 4\] and \[4\]"),
    (lambda: ops.mse_loss(_t((3,)), _t((3,), "f64")), DTypeError, "mse_loss"),
])
def test_errors_name_the_op_and_the_problem(build, error, match):
    with pytest.raises(error, match=match):
        build()
