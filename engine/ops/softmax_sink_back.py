"""softmax_sink_back: the gradient of softmax's attention sinks (engine.ops.softmax), a
dedicated backward op.

For softmax(x, s, mask, sinks; max_bias) with output y and output gradient g, each head h's
sink gets

    grad_sink_h = -sum over the rows of head h of p_sink sum_j g_j y_j,
    p_sink = exp(sink_h - m) / (sum_k exp(z_k - m) + exp(sink_h - m)),
    z = s x + slope_h mask,  m = max(max_k z_k, sink_h)

(y_j = exp(z_j - m) / normaliser, so dy_j / dsink_h = -y_j p_sink). The kernels recompute
y and p_sink from x, mask and sinks in float64, as flash attention recomputes its
probabilities, rather than read the stored y: p_sink = 1 - sum_j y_j would cancel. Its
inputs are softmax's with g first, (g, x, mask, sinks), and its output has the sinks' shape
(H,); it is softmax's VJP with respect to its sinks (gradcheck checks the one against the
other). It has no gradient of its own (softmax_back has none either).
"""

from __future__ import annotations

import dataclasses

from engine.backends.cpu.softmax import cpu_softmax_sink_back
from engine.errors import ShapeError
from engine.ops.shape import contiguous_inputs
from engine.ops.softmax import (
    PARAMS,
    check_mask_sinks,
    check_max_bias,
    check_scale,
    draw_softmax,
    n_heads,
    sink_mask,
    torch_softmax,
)
from engine.params import check_rows
from engine.registry import OpDef, VJPOf, make_node, register, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.strategies import SIGNED, draw_input, sample_strategy


def _infer(g, x, *rest, scale, max_bias):
    check_rows("softmax_sink_back", g, x)
    if len(rest) != 2:
        raise ShapeError(f"softmax_sink_back: takes g, x, mask and sinks, got "
                         f"{len(rest) + 2} inputs of shapes {shapes_str(g, x, *rest)}")
    check_mask_sinks("softmax_sink_back", x, rest)
    return rest[1].shape, x.dtype


def softmax_sink_back(g, x, mask, sinks, *, scale=1.0, max_bias=0.0):
    """The gradient of softmax(x, scale, mask, sinks, max_bias)'s sinks for the output
    gradient g: per head h, -sum over its rows of p_sink sum_j g_j y_j (module doc)."""
    g, x = contiguous_inputs(g, x)
    return make_node("softmax_sink_back", (g, x, mask, sinks),
                     scale=check_scale("softmax_sink_back", scale),
                     max_bias=check_max_bias("softmax_sink_back", "max_bias", max_bias))


def _torch(g, x, mask, sinks, scale=1.0, max_bias=0.0):
    """autograd's VJP of softmax's torch reference with respect to the sinks."""
    import torch
    with torch.enable_grad():
        s = sinks.detach().requires_grad_(True)
        y = torch_softmax(x, mask, s, scale=scale, max_bias=max_bias)
        (gs,) = torch.autograd.grad(y, s, g.to(y.dtype))
    return gs.to(g.dtype)


def _primals(g, x, mask, sinks, scale, max_bias=0.0):
    """softmax_sink_back(g, x, mask, sinks) is softmax's VJP for g at (x, mask, sinks)."""
    return {"x": x, "mask": mask, "sinks": sinks}, g, {"scale": scale, "max_bias": max_bias}


# (x shape, g's view, mask shape (None: softmax's zero mask for sinks alone), sinks range,
# max_bias, scale)
CASES = [((3, 2, 5), {}, (2, 5), (-2.0, 2.0), 0.0, 1.0),
         ((2, 5, 2, 3), {"permute": (1, 0, 3, 2)}, (5, 2, 3), (-2.0, 2.0), 8.0, 0.5),
         ((4, 6), {"expand": (0,)}, None, (-1.0, 3.0), 0.0, 2.5),
         ((3, 4, 5), {"slice": ((0, 3, 1), (1, 5, 1), (0, 10, 2))}, (4, 5), (2.0, 6.0), 1.0,
          -0.5),
         ((5,), {}, (5,), (-1.0, 1.0), 0.0, 1.0)]


@both_dtypes
def _samples(dtype):
    """g contiguous, permuted, expanded (stride 0 along the rows' batch) or sliced; the x,
    mask and sinks of softmax's cases (gradcheck.backward_ops checks each against
    softmax's VJP with respect to the sinks, the one input checked)."""
    out = []
    for xs, view, ms, sinks, max_bias, sc in CASES:
        g = InputSpec("g", xs, grad=False, **view)
        inputs = [g, InputSpec("x", xs, low=-3.0, high=3.0, grad=False),
                  sink_mask(ms, grad=False), InputSpec("sinks", (n_heads(xs),), "uniform", *sinks)]
        params = dict(max_bias=max_bias) if max_bias else {}
        out.append(Sample.make("softmax_sink_back", inputs, dtype, scale=sc, **params))
    return out


@sample_strategy
def _strategy(draw, dtype):
    """A case of softmax's strategy with a mask and sinks, g of x's shape (signed ranges);
    only the sinks are checked (softmax's VJP with respect to them: gradcheck.backward_ops),
    so g, x and the mask are marked unchecked (their elements cost no finite differences)."""
    (x, mask, sinks), params = draw_softmax(draw, extras=True)
    g = draw_input(draw, "g", x.shape, SIGNED, grad=False)
    inputs = [g, *(dataclasses.replace(spec, grad=False) for spec in (x, mask)), sinks]
    return Sample.make("softmax_sink_back", inputs, dtype, **params)


register(OpDef("softmax_sink_back", params=PARAMS, kind="backward", infer=_infer,
               no_grad="dedicated backward op",
               kernels={"cpu": cpu_softmax_sink_back,
                        "cuda": "engine.backends.cuda.softmax:cuda_softmax_sink_back"},
               build=softmax_sink_back, torch=_torch, samples=_samples, strategy=_strategy,
               vjp_of=VJPOf("softmax", _primals, "sinks"),
               doc="-sum over each head's rows of p_sink * sum(g * y, last axis): the "
                   "gradient of softmax's sinks"))


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("softmax_sink_back", "no mutant of its own: the sinks' gradient op of softmax's "
                                     "backward, which softmax_sink_without_gradient drops; "
                                     "checked against softmax's VJP by gradcheck.backward_ops")
