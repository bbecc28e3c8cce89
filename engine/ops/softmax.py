"""Row-wise ops along the last axis: softmax (with an optional additive mask and its
dedicated backward) and log_softmax.

    softmax(x, s, mask)[..., j] = exp(z_j - m) / sum_k exp(z_k - m),
                                  z = s x + mask,  m = max_k z_k
    log_softmax(x)[..., j] = x_j - m - log(sum_k exp(x_k - m)),      m = max_k x_k

Subtracting the row max keeps every exponent <= 0, so large inputs stay finite. The mask
(ggml's soft_max_ext mask: 0 where attention is allowed, large negatives or -inf where it is
not) broadcasts to x by numpy's rules without changing x's shape: a mask of x's shape, one
of shape x.shape[-2:] shared by every batch and head, or a single row. Backward, with
y = softmax(x, s, mask):

    softmax:      grad_z = y (g - sum_k g_k y_k)   (the op softmax_back with scale 1)
                  grad_x = s grad_z                (softmax_back with scale s)
                  grad_mask = grad_z summed over the axes the mask was broadcast along
    log_softmax:  grad_x = g - exp(out) sum_k g_k             (composed: exp(out) = softmax)

The mask is differentiable; a mask built as an input or a constant simply gets no gradient
node. The kernels read rows of x as contiguous memory, so the builders put `cont` in front
of a strided (permuted) x; the infer rules refuse strided inputs given any other way. The
mask is read in place through its strides.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.softmax import cpu_log_softmax, cpu_softmax, cpu_softmax_back
from engine.errors import DTypeError, ShapeError
from engine.ops.broadcast import broadcast_shapes, sum_to
from engine.ops.reduce import sum as reduce_sum
from engine.ops.shape import contiguous_inputs
from engine.params import check_rows, number
from engine.registry import OpDef, VJPOf, make_node, register, registered, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import HALF_SCALE_DTYPES, SIDE, SQUARE, TRANSPOSED, scale_case
from engine.strategies import (
    SIGNED,
    broadcast_source,
    draw_input,
    draw_row_input,
    sample_strategy,
)

# engine.ops.softmax is softmax(x, scale, mask), not the registry's builder (tensors first)
__all__ = ["softmax"]


# --- softmax ----------------------------------------------------------------------------------
def _check_scale(op, scale) -> float:
    return number(op, "scale", scale)


def _softmax_infer(x, *mask, scale):
    _check_scale("softmax", scale)
    check_rows("softmax", x)
    if mask:
        (m,) = mask
        if m.dtype != x.dtype:
            raise DTypeError(f"softmax: mask dtype {m.dtype} differs from input dtype "
                             f"{x.dtype} (shapes {shapes_str(x, m)})")
        if x.ndim > 4:
            raise ShapeError(f"softmax: a mask needs an input of at most 4 axes, got shapes "
                             f"{shapes_str(x, m)}")
        try:
            fits = broadcast_shapes("softmax", x.shape, m.shape) == x.shape
        except ShapeError:
            fits = False
        if not fits:
            raise ShapeError(f"softmax: mask of shape {list(m.shape)} does not broadcast to "
                             f"the input's shape {list(x.shape)}")
    return x.shape, x.dtype


def softmax(x, scale=1.0, mask=None):
    """softmax(scale * x + mask) along the last axis; mask (optional) broadcasts to x."""
    (x,) = contiguous_inputs(x)
    srcs = (x,) if mask is None else (x, mask)
    return make_node("softmax", srcs, scale=_check_scale("softmax", scale))


def _softmax_build(x, mask=None, scale=1.0):
    """The registry's builder: tensor inputs first (x, mask), then the parameter."""
    return softmax(x, scale, mask)


def _softmax_backward(g, y, x, *mask, scale):
    gx = softmax_back(g, y, scale)
    if not mask:
        return (gx,)
    gz = gx if scale == 1.0 else softmax_back(g, y, 1.0)
    return gx, sum_to(gz, mask[0].shape)


def _softmax_back_infer(g, y, scale):
    _check_scale("softmax_back", scale)
    check_rows("softmax_back", g, y)
    return y.shape, y.dtype


def softmax_back(g, y, scale=1.0):
    """Gradient of softmax(x, scale) from its output y and output gradient g:
    scale * y * (g - sum(g * y, last axis))."""
    g, y = contiguous_inputs(g, y)
    return make_node("softmax_back", (g, y), scale=_check_scale("softmax_back", scale))


# --- log_softmax --------------------------------------------------------------------------------
def _log_softmax_infer(x):
    check_rows("log_softmax", x)
    return x.shape, x.dtype


def log_softmax(x):
    """log(softmax(x)) along the last axis, via a stable log-sum-exp."""
    (x,) = contiguous_inputs(x)
    return make_node("log_softmax", (x,))


def _log_softmax_backward(g, out, x):
    exp_out = registered.exp(out)          # = softmax(x)
    return (registered.sub(g, registered.mul(exp_out, reduce_sum(g, -1, keepdims=True))),)


# --- samples, strategies, torch references, registration ---------------------------------------
ROW_SHAPES = [(5,), (3, 4), (2, 3, 7)]
SCALES = (1.0, 0.1, 2.5, -0.5)
# (x shape, mask shape, mask permute, scale, mask values: (kind, low, high)). LARGE masks are
# integers in [-1e4, 0]; InputSpec has no generator of mostly-zero masks with a few -1e4
# entries, so that pattern (ggml's causal mask) is tested in tests/engine/ops/test_norms_convs.py
MODERATE, LARGE = ("uniform", -5.0, 0.0), ("int", -10000, 1)
MASKS = (MODERATE, ("uniform", -1e3, 0.0))      # the strategy's mask ranges
PROBS = (("probs", -3.0, 3.0), ("probs", -20.0, 20.0))   # softmax outputs, near one-hot too
MASKED = [((3, 5), (3, 5), None, 1.0, MODERATE),
          ((2, 3, 4), (3, 4), None, 0.1, MODERATE),           # ggml: one mask for the batch
          ((2, 2, 3, 4), (3, 4), None, 1.0, MODERATE),        # ... for every batch and head
          ((2, 2, 3, 4), (2, 1, 3, 4), None, 2.5, MODERATE),  # per batch, shared by heads
          ((3, 6), (6,), None, -0.5, MODERATE),               # one row for every row
          ((2, 3, 4), (3, 4), (1, 0), 1.0, MODERATE),         # a transposed (strided) mask
          ((2, 3, 5), (3, 5), None, 1.0, LARGE),              # large negatives
          ((2, 4, 3), (2, 4, 3), None, 0.1, LARGE)]


def draw_scale(draw):
    from hypothesis import strategies as st
    return draw(st.sampled_from(SCALES) | st.floats(-3.0, 3.0).map(lambda v: round(v, 2)))


@both_dtypes
def _softmax_samples(dtype):
    x = lambda s, p=None: InputSpec("x", s, low=-3.0, high=3.0, permute=p)  # noqa: E731
    out = [Sample.make("softmax", [x(s)], dtype, scale=1.0) for s in ROW_SHAPES]
    out += [Sample.make("softmax", [x((4, 6))], dtype, scale=s) for s in SCALES[1:]]
    out += [Sample.make("softmax", [x((3, 4, 5), (2, 0, 1))], dtype, scale=1.0)]
    for xs, ms, mp, sc, (kind, lo, hi) in MASKED:
        out.append(Sample.make("softmax", [x(xs), InputSpec("mask", ms, kind, lo, hi,
                                                            permute=mp)], dtype, scale=sc))
    out.append(Sample.make("softmax", [x((2, 5, 3), (0, 2, 1)),
                                       InputSpec("mask", (5, 3), "uniform", -5.0, 0.0)],
                           dtype, scale=2.5))
    # sliced (an offset and steps) and expanded (stride 0) inputs; the mask is read in
    # place through its strides, so an expanded mask reaches the kernel as it is
    view = lambda name, s, **v: InputSpec(name, s, low=-3.0, high=3.0, **v)  # noqa: E731
    out += [Sample.make("softmax", [view("x", (3, 5), slice=((1, 4, 1), (0, 10, 2)))], dtype,
                        scale=1.0),
            Sample.make("softmax", [view("x", (2, 3, 5), slice=((0, 2, 1), (1, 4, 1),
                                                                (1, 6, 1)))], dtype, scale=1.0),
            Sample.make("softmax", [view("x", (4, 6), expand=(0,))], dtype, scale=-0.5),
            Sample.make("softmax", [x((2, 3, 4)), InputSpec("mask", (2, 3, 4), "uniform", -5.0,
                                                            0.0, expand=(0, 1))],
                        dtype, scale=1.0),
            Sample.make("softmax", [view("x", (3, 4), expand=(0,)),
                                    InputSpec("mask", (3, 4), "uniform", -5.0, 0.0,
                                              slice=((1, 4, 1), (1, 5, 1)))], dtype, scale=2.5)]
    return out


@sample_strategy
def _softmax_strategy(draw, dtype):
    """x of 1-4 axes in a range of MAGNITUDES (tiny to huge), possibly a view, a scale,
    and half of the time a mask of a shape that broadcasts to x's (possibly a view too),
    its values in [-5, 0] or large negatives."""
    from hypothesis import strategies as st
    x = draw_row_input(draw, "x")
    inputs = [x]
    if draw(st.booleans()):
        shape = draw(broadcast_source(x.shape, min_dims=1))
        inputs.append(draw_input(draw, "mask", shape, MASKS))
    return Sample.make("softmax", inputs, dtype, scale=draw_scale(draw))


@both_dtypes
def _softmax_back_samples(dtype):
    """g contiguous, a permuted view (y too) or a stride-0 broadcast along a leading axis
    (one constant along a row gives the gradient 0), rows of y on the simplex: checked
    against softmax's VJP (gradcheck.backward_ops)."""
    g = lambda s, p=None, e=None: InputSpec("g", s, permute=p, expand=e)  # noqa: E731
    return [Sample.make("softmax_back", [g_spec, InputSpec("y", g_spec.shape, "probs",
                                                           permute=py)], dtype, scale=sc)
            for g_spec, sc, py in [(g((3, 4)), 1.0, None), (g((2, 3, 5)), -0.5, None),
                                   (g((3, 4, 2), (1, 2, 0)), 0.1, None),
                                   (g((4, 6), (1, 0)), 2.5, None),
                                   (g((2, 3, 4), (2, 0, 1)), 1.0, (1, 0, 2)),
                                   (g((4, 6), e=(0,)), 1.0, None),
                                   (g((2, 3, 5), e=(0, 1)), -0.5, (1, 0, 2))]]


@sample_strategy
def _softmax_back_strategy(draw, dtype):
    g = draw_row_input(draw, "g", SIGNED)
    y = draw_input(draw, "y", g.shape, PROBS, narrow=False)
    return Sample.make("softmax_back", [g, y], dtype, scale=draw_scale(draw))


@both_dtypes
def _log_softmax_samples(dtype):
    return [Sample.make("log_softmax", [InputSpec("x", s, low=-3.0, high=3.0, permute=p)],
                        dtype)
            for s, p in [*((s, None) for s in ROW_SHAPES), ((3, 4, 5), (2, 0, 1))]]


@sample_strategy
def _log_softmax_strategy(draw, dtype):
    return Sample.make("log_softmax", [draw_row_input(draw, "x")], dtype)


def _torch_softmax(x, mask=None, scale=1.0):
    if mask is None:
        return (x * scale).softmax(-1)
    # in float64, as the kernel: in float32, s x + mask rounds to the mask's precision,
    # which costs rows near a large negative mask value their accuracy
    return (x.double() * scale + mask.double()).softmax(-1).to(x.dtype)


def _torch_softmax_back(g, y, scale=1.0):
    return scale * y * (g - (g * y).sum(-1, keepdim=True))


def _softmax_back_primals(g, y, scale):
    """softmax_back(g, y, scale) is softmax's VJP at x = log(y) / scale, where
    softmax(scale x) = y for rows y on the simplex (scale 0: any x, the VJP is 0)."""
    x = np.log(y) / (scale if scale != 0.0 else 1.0)
    return {"x": x}, g, {"scale": scale}


def _softmax_scale():
    """Scale cases: SQUARE rows on the engine's threads, with a mask broadcast along the
    rows, and a transposed view; the plain rows in float16 and bfloat16."""
    x = dict(kind="uniform", low=-3.0, high=3.0)
    return [scale_case("softmax", [InputSpec("x", SQUARE, **x)], scale=1.0),
            scale_case("softmax", [InputSpec("x", SQUARE, **x),
                                   InputSpec("mask", (1, SIDE), "uniform", -5.0, 0.0)],
                       scale=0.5),
            scale_case("softmax", [InputSpec("x", SQUARE, permute=TRANSPOSED, **x)],
                       scale=1.0)] + [
        scale_case("softmax", [InputSpec("x", SQUARE, **x)], dtype, scale=1.0)
        for dtype in HALF_SCALE_DTYPES]


register(OpDef("softmax", params=dict(scale=number),
               scale=_softmax_scale, infer=_softmax_infer, backward=_softmax_backward,
               kernels={"cpu": cpu_softmax,
                        "cuda": "engine.backends.cuda.softmax:cuda_softmax"},
               build=_softmax_build, torch=_torch_softmax,
               samples=_softmax_samples, strategy=_softmax_strategy,
               doc="softmax(scale * x + mask) along the last axis; the mask broadcasts to x"))
register(OpDef("softmax_back", params=dict(scale=number),
               kind="backward", infer=_softmax_back_infer,
               no_grad="dedicated backward op",
               kernels={"cpu": cpu_softmax_back,
                        "cuda": "engine.backends.cuda.softmax:cuda_softmax_back"},
               build=softmax_back, torch=_torch_softmax_back, samples=_softmax_back_samples,
               strategy=_softmax_back_strategy, vjp_of=VJPOf("softmax", _softmax_back_primals),
               doc="scale * y * (g - sum(g * y, last axis)): the gradient of softmax"))
def _log_softmax_scale():
    """Scale case: SQUARE rows on the engine's threads."""
    return [scale_case("log_softmax", [InputSpec("x", SQUARE, "uniform", -3.0, 3.0)])]


register(OpDef("log_softmax", params={}, infer=_log_softmax_infer, backward=_log_softmax_backward,
               scale=_log_softmax_scale,
               kernels={"cpu": cpu_log_softmax,
                        "cuda": "engine.backends.cuda.softmax:cuda_log_softmax"},
               build=log_softmax,
               torch=lambda x: x.log_softmax(-1), samples=_log_softmax_samples,
               strategy=_log_softmax_strategy,
               doc="log(softmax(x)) along the last axis (stable log-sum-exp)"))
