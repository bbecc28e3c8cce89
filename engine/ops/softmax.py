"""softmax along the last axis, with an optional additive mask, ggml's ALiBi slopes and
attention sinks, and its dedicated backward op softmax_back (the sinks' gradient is the op
softmax_sink_back, engine.ops.softmax_sink_back; log_softmax is engine.ops.log_softmax).

    softmax(x, s, mask, sinks; max_bias)[..., h, i, j]
        = exp(z_j - m) / (sum_k exp(z_k - m) + exp(sink_h - m)),
          z = s x + slope_h mask,   m = max(max_k z_k, sink_h)

Subtracting the row max keeps every exponent <= 0, so large inputs stay finite. The mask
(ggml's soft_max_ext mask: 0 where attention is allowed, large negatives or -inf where it is
not) broadcasts to x by numpy's rules without changing x's shape: a mask of x's shape, one
of shape x.shape[-2:] shared by every batch and head, or a single row. h is the head of a
row, x's axis -3 (ggml's ne[2]; an x of at most two axes has one head, H = 1).

ALiBi (ggml_soft_max_ext's max_bias >= 0): slope_h = alibi_slope(h, H, max_bias)
(engine.backends.alibi_math), 1 when max_bias = 0; it scales the mask only, so ALiBi
without a mask changes nothing. Attention sinks (ggml_soft_max_add_sinks, gpt-oss): an
optional input sinks of shape (H,), x's dtype, one logit per head that joins every row's
normaliser and the row max but is no output: its share p_sink = exp(sink_h - m) /
normaliser = 1 - sum_j y_j is what the row gives to "no key". A node with sinks has the
sources (x, mask, sinks); `softmax` gives a softmax with sinks and no mask a zero mask of
one element (a constant, without gradient). Backward, with y = softmax(...) and the
softmax Jacobian's product gz = y (g - sum_k g_k y_k), which sinks leave as it is
(dy_j / dz_i = y_j (delta_ij - y_i) with or without them):

    grad_x    = s gz                   (the op softmax_back with scale s)
    grad_mask = slope_h gz summed over the axes the mask was broadcast along
                                       (such a sum, below float64, from gz made in
                                       float64 and rounded once: _mask_gradient)
    grad_sink_h = -sum over the rows of head h of p_sink sum_j g_j y_j
                                       (the op softmax_sink_back)

softmax_sink_back recomputes y and p_sink from x, mask and sinks in float64, as flash
attention recomputes its probabilities: 1 - sum_j y_j from the stored y would cancel (a
row's sum of rounded y errs by an ulp of 1, p_sink may be far smaller). The mask is
differentiable; a mask built as an input or a constant simply gets no gradient node. The
kernels read rows of x as contiguous memory, so the builders put `cont` in front of a
strided (permuted) x; the infer rules refuse strided inputs given any other way. The mask
is read in place through its strides.
"""

from __future__ import annotations

import math

import numpy as np

from engine.backends.alibi_math import alibi_slopes
from engine.backends.cpu.softmax import cpu_softmax, cpu_softmax_back
from engine.errors import DTypeError, ParamError, ShapeError
from engine.ops.broadcast import broadcast_shapes, sum_to
from engine.ops.cast import cast
from engine.ops.shape import contiguous_inputs
from engine.params import Params, alibi_param, check_rows, factor_param, number
from engine.reference_math import reference_alibi_slopes
from engine.registry import OpDef, VJPOf, make_node, register, registered, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import (
    BENCH_DTYPE,
    BENCH_HALF_DTYPES,
    HALF_SCALE_DTYPES,
    SIDE,
    SQUARE,
    TRANSPOSED,
    bench_case,
    bench_cases,
    scale_case,
)
from engine.strategies import (
    MAX_ELEMENTS,
    SIGNED,
    broadcast_source,
    draw_input,
    draw_row_input,
    sample_strategy,
)
from engine.tensor import constant

# engine.ops.softmax is softmax(x, scale, mask, ...), not the registry's builder (tensors first)
__all__ = ["softmax"]


# --- softmax ----------------------------------------------------------------------------------
def check_scale(op, scale) -> float:
    return number(op, "scale", scale)


def check_max_bias(op, name, v) -> float:
    v = number(op, name, v)
    if v < 0.0:
        raise ParamError(f"{op}: max_bias must be >= 0 (0: no ALiBi), got {v!r}")
    return v


PARAMS = Params(dict(scale=factor_param(), max_bias=alibi_param()))


def n_heads(shape) -> int:
    """The heads of a softmax input of `shape`: its axis -3, or 1 for fewer axes."""
    return shape[-3] if len(shape) >= 3 else 1


def check_mask_sinks(op, x, rest):
    """The rules of the mask and the sinks (rest = (), (mask,) or (mask, sinks)) of an x."""
    srcs = (x, *rest)
    for name, t in zip(("mask", "sinks"), rest, strict=False):
        if t.dtype != x.dtype:
            raise DTypeError(f"{op}: {name} dtype {t.dtype} differs from input dtype "
                             f"{x.dtype} (shapes {shapes_str(*srcs)})")
    if not rest:
        return
    m = rest[0]
    if x.ndim > 4:
        raise ShapeError(f"{op}: a mask needs an input of at most 4 axes, got shapes "
                         f"{shapes_str(*srcs)}")
    try:
        fits = broadcast_shapes(op, x.shape, m.shape) == x.shape
    except ShapeError:
        fits = False
    if not fits:
        raise ShapeError(f"{op}: mask of shape {list(m.shape)} does not broadcast to "
                         f"the input's shape {list(x.shape)}")
    if len(rest) > 1 and rest[1].shape != (n_heads(x.shape),):
        raise ShapeError(f"{op}: sinks must have shape (H,) = ({n_heads(x.shape)},), one "
                         f"logit per head (x's axis -3), got shapes {shapes_str(*srcs)}")


def _softmax_infer(x, *rest, scale, max_bias):
    check_rows("softmax", x)
    if len(rest) > 2:
        raise ShapeError(f"softmax: takes x, mask and sinks, got {len(rest) + 1} inputs of "
                         f"shapes {shapes_str(x, *rest)}")
    check_mask_sinks("softmax", x, rest)
    return x.shape, x.dtype


def softmax(x, scale=1.0, mask=None, *, max_bias=0.0, sinks=None):
    """softmax(scale * x + slope_h * mask) along the last axis, with one sink logit per head
    in every row's normaliser (module doc); mask (optional) broadcasts to x, sinks
    (optional) has shape (H,), max_bias (ALiBi's, >= 0) sets the slopes."""
    (x,) = contiguous_inputs(x)
    srcs = (x,) if mask is None else (x, mask)
    if sinks is not None:
        if mask is None:
            srcs += (constant(np.zeros(1, x.dtype), x.dtype, name="softmax.no_mask"),)
        srcs += (sinks,)
    return make_node("softmax", srcs, scale=check_scale("softmax", scale),
                     max_bias=check_max_bias("softmax", "max_bias", max_bias))


def _softmax_build(x, mask=None, sinks=None, scale=1.0, max_bias=0.0):
    """The registry's builder: tensor inputs first (x, mask, sinks), then the parameters."""
    return softmax(x, scale, mask, max_bias=max_bias, sinks=sinks)


def times_slopes(gz, max_bias):
    """gz (..., H, T, N) with each head's elements times its ALiBi slope (none for
    max_bias = 0): a constant of the slopes in gz's dtype, broadcast over its rows."""
    if max_bias == 0.0:
        return gz
    h = n_heads(gz.shape)
    slopes = alibi_slopes(h, max_bias).reshape((h, 1, 1)[-min(3, gz.ndim):])
    return registered.mul(gz, constant(slopes.astype(gz.dtype), gz.dtype,
                                       name="softmax.alibi_slopes"))


def _softmax_backward(g, y, x, *rest, scale, max_bias=0.0):
    gx = softmax_back(g, y, scale)
    if not rest:
        return (gx,)
    grads = (gx, _mask_gradient(g, y, x, rest, gx, scale, max_bias))
    if len(rest) == 1:
        return grads
    return grads + (registered.softmax_sink_back(g, x, *rest, scale=scale,
                                                 max_bias=max_bias),)


def _mask_gradient(g, y, x, rest, gx, scale, max_bias):
    """slope_h gz summed to the mask's shape. Where that sums over broadcast axes below
    float64, gz is made in float64 from y recomputed there (the forward kernel's z is
    float64 too) and the sum rounded once: the terms cancel (a mask broadcast along a row
    shifts it, which softmax ignores: a zero gradient), and gz rounded to x's dtype, or
    made from the stored y, whose rounding leaves sum_j y_j off 1, errs by those roundings
    (float16: 1e-4 where torch's float64-computed reference errs 1e-16; float32: 1.5e-8,
    8.3 times the bar; `gradcheck --op softmax --random 200 --seed 2`)."""
    mask = rest[0]
    if mask.size == x.size or x.dtype == np.float64:
        gz = gx if scale == 1.0 else softmax_back(g, y, 1.0)
        return sum_to(times_slopes(gz, max_bias), mask.shape)
    wide = [cast(t, "f64") for t in (g, x, *rest)]
    y = registered.softmax(*wide[1:], scale=scale, max_bias=max_bias)
    gz = softmax_back(wide[0], y, 1.0)
    return cast(sum_to(times_slopes(gz, max_bias), mask.shape), x.dtype)


def _softmax_back_infer(g, y, scale):
    check_rows("softmax_back", g, y)
    return y.shape, y.dtype


def softmax_back(g, y, scale=1.0):
    """Gradient of softmax(x, scale) from its output y and output gradient g:
    scale * y * (g - sum(g * y, last axis))."""
    g, y = contiguous_inputs(g, y)
    return make_node("softmax_back", (g, y), scale=check_scale("softmax_back", scale))


# --- samples, strategies, torch references, registration ---------------------------------------
ROW_SHAPES = [(5,), (3, 4), (2, 3, 7)]
SCALES = (1.0, 0.1, 2.5, -0.5)
# (x shape, mask shape, mask permute, scale, mask values: (kind, low, high)). LARGE masks are
# mostly 0 (the key is attended) with a tenth of large negatives in [-1e4, -5e3] (it is
# not), as ggml's causal masks: a mask of large negatives everywhere would leave one key
# per row, a one-hot output whose every gradient is 0 (a vacuous check)
MODERATE, LARGE = ("uniform", -5.0, 0.0), ("sparse", -10000.0, -5000.0)
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
    return out + _alibi_sink_samples(dtype, x)


# ALiBi and sinks: (x shape, x permute, mask shape (None: the mask-less form, a constant zero
# mask of one element), sinks range (None: no sinks), max_bias, scale). 3 and 5 heads take
# both of ALiBi's slope sequences (5 is no power of two), a sink range of [3, 6] makes the
# sink take most of each row's weight, [-2, 2] and [2, 5] (against logits of up to 7.5) a
# share. (A sink of almost no weight, such as [-8, -4] against logits of 7, has a gradient
# below any tolerance's floor: no check of it could fail.)
ALIBI_SINKS = [((3, 2, 5), None, (2, 5), None, 8.0, 1.0),         # one mask for every head
               ((5, 2, 4), None, (5, 2, 4), None, 2.0, 0.5),
               ((2, 3, 2, 4), None, (2, 1, 2, 4), None, 1.0, -0.5),
               ((3, 2, 5), None, (2, 5), (-2.0, 2.0), 0.0, 1.0),
               ((2, 5, 2, 3), None, (5, 2, 3), (-2.0, 2.0), 8.0, 0.5),
               ((2, 3, 4), None, None, (3.0, 6.0), 0.0, 1.0),
               ((4, 6), None, (4, 6), (2.0, 5.0), 0.0, 2.5),        # one head
               ((6,), None, (6,), (-1.0, 1.0), 1.0, 1.0),
               ((2, 3, 4), (1, 0, 2), (3, 4), (-2.0, 2.0), 4.0, 1.0)]


def sink_mask(shape, values=MODERATE, grad=True):
    """The mask of a case with sinks: of `shape`, or None: the zero mask of one element
    that `softmax` gives sinks without a mask (not differentiated)."""
    if shape is None:
        return InputSpec("mask", (1,), "uniform", 0.0, 0.0, grad=False)
    return InputSpec("mask", shape, *values, grad=grad)


def _alibi_sink_samples(dtype, x):
    out = []
    for xs, xp, ms, sinks, max_bias, sc in ALIBI_SINKS:
        inputs = [x(xs, xp), sink_mask(ms)]
        if sinks is not None:
            inputs.append(InputSpec("sinks", (n_heads(xs),), "uniform", *sinks))
        params = dict(max_bias=max_bias) if max_bias else {}
        out.append(Sample.make("softmax", inputs, dtype, scale=sc, **params))
    return out


SINKS = (("uniform", -3.0, 3.0), ("uniform", 2.0, 8.0))     # the strategy's sink ranges
MAX_BIASES = (0.0, 0.5, 8.0)


def draw_softmax(draw, extras=None):
    """softmax's inputs and parameters (the strategy's): x of 1-4 axes in a range of
    MAGNITUDES (tiny to huge), possibly a view, a scale; half of the time (extras None; or
    always, extras True) a mask of a shape that broadcasts to x's (possibly a view too),
    its values in [-5, 0] or large negatives, then ALiBi's max_bias (0 a third of the time,
    else drawn from 0.25 to 16)
    and half of the time (or always) sinks, where x, mask and sinks together stay within
    MAX_ELEMENTS checked elements."""
    from hypothesis import strategies as st
    x = draw_row_input(draw, "x")
    inputs = [x]
    params = {"scale": draw_scale(draw)}
    if extras or (extras is None and draw(st.booleans())):
        shape = draw(broadcast_source(x.shape, min_dims=1))
        inputs.append(draw_input(draw, "mask", shape, MASKS))
        max_bias = draw(st.sampled_from(MAX_BIASES)) and draw(st.integers(1, 64)) / 4.0
        if max_bias:
            params["max_bias"] = max_bias
        heads = n_heads(x.shape)
        fits = math.prod(x.shape) + math.prod(shape) + heads <= MAX_ELEMENTS
        if extras or (fits and draw(st.booleans())):
            inputs.append(draw_input(draw, "sinks", (heads,), SINKS, layout=False))
    return inputs, params


@sample_strategy
def _softmax_strategy(draw, dtype):
    """The cases of draw_softmax."""
    inputs, params = draw_softmax(draw)
    return Sample.make("softmax", inputs, dtype, **params)


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


def torch_softmax(x, mask=None, sinks=None, scale=1.0, max_bias=0.0):
    """softmax's torch reference: with a mask, in float64, the slopes a (H, 1, 1) tensor and
    the sinks a last column of z, cut off after the softmax."""
    if mask is None:
        return (x * scale).softmax(-1)
    # in float64, as the kernel: in float32, s x + mask rounds to the mask's precision,
    # which costs rows near a large negative mask value their accuracy
    import torch
    h = n_heads(x.shape)
    lead = (h, 1, 1)[-min(3, x.ndim):]
    slopes = torch.tensor(reference_alibi_slopes(h, max_bias), dtype=torch.float64).reshape(lead)
    z = x.double() * scale + slopes * mask.double()
    if sinks is None:
        return z.softmax(-1).to(x.dtype)
    column = sinks.double().reshape(lead).expand(*z.shape[:-1], 1)
    return torch.cat([z, column], -1).softmax(-1)[..., :-1].to(x.dtype)


def _bench_torch_softmax(x, mask=None, sinks=None, scale=1.0, max_bias=0.0):
    """torch_softmax in x's dtype, as a torch user writes it (the mask times the ALiBi
    slopes where max_bias > 0; the sinks a last column of the scores, cut off after the
    softmax), for the bench: the reference computes a masked softmax in float64."""
    if mask is None:
        return (x * scale).softmax(-1)
    import torch
    h = n_heads(x.shape)
    lead = (h, 1, 1)[-min(3, x.ndim):]
    if max_bias > 0.0:
        slopes = torch.tensor(reference_alibi_slopes(h, max_bias), dtype=x.dtype)
        mask = slopes.reshape(lead) * mask
    z = x * scale + mask
    if sinks is None:
        return z.softmax(-1)
    column = sinks.reshape(lead).expand(*z.shape[:-1], 1)
    return torch.cat([z, column], -1).softmax(-1)[..., :-1]


def _torch_softmax_back(g, y, scale=1.0):
    return scale * y * (g - (g * y).sum(-1, keepdim=True))


def _softmax_back_primals(g, y, scale):
    """softmax_back(g, y, scale) is softmax's VJP at x = log(y) / scale, where
    softmax(scale x) = y for rows y on the simplex (scale 0: any x, the VJP is 0)."""
    x = np.log(y) / (scale if scale != 0.0 else 1.0)
    return {"x": x}, g, {"scale": scale}


# 5 heads of 206 rows of SIDE (1,061,930 elements): the row ranges of 2, 3, 4 and 7 threads
# end inside a head
HEADS = (5, 206, SIDE)


def _softmax_scale():
    """Scale cases: SQUARE rows on the engine's threads, with a mask broadcast along the
    rows, and a transposed view; HEADS rows with ALiBi, a mask shared by the heads and
    sinks, and with sinks alone (split:cpu_softmax_masked, split:cpu_softmax_sink_back);
    the plain rows in float16 and bfloat16."""
    x = dict(kind="uniform", low=-3.0, high=3.0)
    heads = [InputSpec("x", HEADS, **x), InputSpec("mask", HEADS[1:], "uniform", -5.0, 0.0),
             InputSpec("sinks", HEADS[:1], "uniform", -1.0, 3.0)]
    return [scale_case("softmax", [InputSpec("x", SQUARE, **x)], scale=1.0),
            scale_case("softmax", [InputSpec("x", SQUARE, **x),
                                   InputSpec("mask", (1, SIDE), "uniform", -5.0, 0.0)],
                       scale=0.5),
            scale_case("softmax", [InputSpec("x", SQUARE, permute=TRANSPOSED, **x)],
                       scale=1.0),
            scale_case("softmax", heads, scale=0.5, max_bias=8.0),
            scale_case("softmax", [heads[0], sink_mask(None), heads[2]], scale=1.0)] + [
        scale_case("softmax", [InputSpec("x", SQUARE, **x)], dtype, scale=1.0)
        for dtype in HALF_SCALE_DTYPES]


BENCH_SCORES = (8, 512, 512)     # attention scores: 8 heads of 512 queries and keys


def _softmax_bench():
    """Bench cases: attention scores BENCH_SCORES, plain (in float32, float16 and
    bfloat16), with a (512, 512) mask, and with the mask, ALiBi and a sink per head (as
    gpt-oss; in the three dtypes). The masks are constants (no gradient); the sinks are
    learned."""
    x = InputSpec("x", BENCH_SCORES, "uniform", -3.0, 3.0)
    mask = InputSpec("mask", BENCH_SCORES[1:], "uniform", -5.0, 0.0, grad=False)
    sinks = InputSpec("sinks", BENCH_SCORES[:1], "uniform", -1.0, 3.0)
    dtypes = (BENCH_DTYPE, *BENCH_HALF_DTYPES)
    return (bench_cases("softmax", [x], dtypes, scale=1.0) +
            [bench_case("softmax", [x, mask], scale=0.125)] +
            bench_cases("softmax", [x, mask, sinks], dtypes, scale=0.125, max_bias=8.0))


register(OpDef("softmax", params=PARAMS,
               scale=_softmax_scale, bench=_softmax_bench, infer=_softmax_infer,
               backward=_softmax_backward,
               kernels={"cpu": cpu_softmax,
                        "cuda": "engine.backends.cuda.softmax:cuda_softmax"},
               build=_softmax_build, torch=torch_softmax, bench_torch=_bench_torch_softmax,
               samples=_softmax_samples, strategy=_softmax_strategy,
               # each row sums to 1: a cotangent constant along it has a zero VJP
               null_cotangents=("expanded",),
               doc="softmax(scale * x + slope_h * mask) along the last axis, with one sink "
                   "logit per head in the normaliser; the mask broadcasts to x"))
register(OpDef("softmax_back", params=Params(dict(scale=factor_param())),
               kind="backward", infer=_softmax_back_infer,
               no_grad="dedicated backward op",
               kernels={"cpu": cpu_softmax_back,
                        "cuda": "engine.backends.cuda.softmax:cuda_softmax_back"},
               build=softmax_back, torch=_torch_softmax_back, samples=_softmax_back_samples,
               strategy=_softmax_back_strategy, vjp_of=VJPOf("softmax", _softmax_back_primals),
               doc="scale * y * (g - sum(g * y, last axis)): the gradient of softmax"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.backends.alibi_math import alibi_slope  # noqa: E402
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import (  # noqa: E402
    backward_replaced,
    kernel_replaced,
    prepare_replaced,
)


def _softmax_back_no_subtraction(real):
    """s y g instead of s y (g - sum(g y)): the real result with the subtracted term added
    back."""
    def kernel(out, ins, **params):
        real(out, ins, **params)
        g, y = ins
        out += params.get("scale", 1.0) * y * np.sum(g * y, axis=-1, keepdims=True)
    return kernel


def _sink_gradient_dropped(real):
    """softmax's backward without the sinks' gradient (None: no gradient, zeros)."""
    def backward(g, out, x, *rest, **params):
        grads = real(g, out, x, *rest, **params)
        return grads[:2] + (None,) if len(rest) == 2 else grads
    return backward


def _alibi_mask_grad_next_heads_slope(real):
    """softmax's backward scaling head h's mask gradient by head h + 1's ALiBi slope."""
    def backward(g, out, x, *rest, scale, max_bias=0.0):
        grads = real(g, out, x, *rest, scale=scale, max_bias=max_bias)
        if not rest or max_bias == 0.0:
            return grads
        heads = n_heads(x.shape)
        shifted = np.array([alibi_slope(h + 1.0, float(heads), max_bias)
                            for h in range(heads)])
        gz = registered.softmax_back(g, out, 1.0)
        shifted = shifted.reshape((heads, 1, 1)[-min(3, gz.ndim):]).astype(gz.dtype)
        gm = sum_to(registered.mul(gz, constant(shifted, gz.dtype)), rest[0].shape)
        return (grads[0], gm) + tuple(grads[2:])
    return backward


def softmax_ragged_row_sum(prepare):
    """softmax over rows whose length is not a multiple of 8: the row sum stops one element
    short, so every element is divided by the sum without the last exponential:
    y'_j = e_j / (S - e_last) = y_j / (1 - y_last)."""
    def mutated(out, ins, **params):
        run = prepare(out, ins, **params)
        if out.shape[-1] % 8 == 0:
            return run

        def call():
            run()
            with np.errstate(divide="ignore", invalid="ignore"):
                out[...] = out / (1.0 - out[..., -1:].astype(np.float64))
        return call
    return mutated


mutation.register(
    Mutant("softmax_back_no_subtraction", ("softmax",),
           "softmax_back computes s * y * g instead of s * y * (g - sum(g * y))",
           lambda: kernel_replaced("softmax_back", _softmax_back_no_subtraction),
           kind="dropped term"),
    Mutant("softmax_sink_without_gradient", ("softmax",),
           "softmax's backward drops the attention sinks' gradient (as ggml 0.20.2's "
           "SOFT_MAX backward, which never writes one)",
           lambda: backward_replaced("softmax", _sink_gradient_dropped),
           where=lambda case: len(case.inputs) == 3 and case.inputs[2].grad,
           kind="dropped term"),
    Mutant("softmax_alibi_slopes_off_by_one_head", ("softmax",),
           "softmax's backward scales head h's mask gradient by ALiBi's slope of head h + 1",
           lambda: backward_replaced("softmax", _alibi_mask_grad_next_heads_slope),
           where=lambda case: case.kwargs.get("max_bias", 0.0) > 0 and case.inputs[1].grad,
           kind="scaled gradient"),
    Mutant("softmax_ragged_row_sum", ("softmax",),
           "softmax's row sum stops one element short on rows whose length is not a "
           "multiple of 8: each y_j becomes y_j / (1 - y_last)",
           lambda: prepare_replaced("softmax", softmax_ragged_row_sum),
           where=lambda case: case.inputs[0].shape[-1] % 8 != 0, kind="dropped tail"),
)
