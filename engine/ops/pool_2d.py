"""2-D max and average pooling over NCHW tensors, and its dedicated backward op.

For x of shape (N, C, H, W), kernel (kh, kw), stride (sh, sw) and padding (ph, pw), window
(oy, ox) covers rows oy*sh - ph ... oy*sh - ph + kh - 1 (columns likewise), and

    OH = (H + 2 ph - kh) // sh + 1        (OW likewise)
    max: out[n, c, oy, ox] = max of x over the window's cells inside the image
         (padded cells are -inf: they never win);
    avg: out[n, c, oy, ox] = (sum of x over the window's cells inside the image) / (kh kw)
         (padded cells count as zeros: the divisor is the FULL window size, as in ggml and
         torch's avg_pool2d(count_include_pad=True)).

Padding must be at most half the kernel (as torch requires), so every window holds at least
one image cell. The backward op `pool_2d_back(g, x, y)` is also given the forward output y.
For max it sends g[n, c, oy, ox] to the first cell of the window (row-major order, image
cells only) equal to y[n, c, oy, ox], or to its first NaN when y is NaN: the first maximum
wins on ties (a subgradient there, as in torch); windows that overlap (stride < kernel) add
their contributions. For avg it spreads g / (kh kw) over the window's image cells (y unused).
Its registry builder (the samples') takes y as optional and builds it as pool_2d(x) when
it is not given, so that a sample's y is always x's pooled output; engine.ops.pool_2d_back
is the positional builder below.
"""

from __future__ import annotations

from engine.backends.cpu.pool_2d import cpu_pool_2d, cpu_pool_2d_back
from engine.errors import DTypeError, ParamError, ShapeError
from engine.params import (
    Params,
    Rule,
    check_float_input,
    choice_param,
    pair,
    size_param,
    window_output_size,
)
from engine.registry import OpDef, VJPOf, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case, scale_case
from engine.strategies import (
    DISTINCT,
    MAX_ELEMENTS,
    SIGNED,
    draw_input,
    sample_strategy,
    shapes,
    window_axis,
)

# engine.ops.pool_2d_back is pool_2d_back(g, x, y, mode, kernel, ...), not the registry's
# builder (y optional)
__all__ = ["pool_2d_back"]

MODES = ("max", "avg")


def _check(op, x, mode, kernel, stride, padding) -> tuple[int, int]:
    """Validate an NCHW float input (the parameters: _PARAMS); return (OH, OW)."""
    check_float_input(op, x, "NCHW")
    return window_output_size(op, x.shape, kernel, stride, padding, (1, 1))


def _pool_infer(x, mode, kernel, stride, padding):
    oh, ow = _check("pool_2d", x, mode, kernel, stride, padding)
    return (x.shape[0], x.shape[1], oh, ow), x.dtype


def _params(op, mode, kernel, stride, padding) -> dict:
    kernel = pair(op, "kernel", kernel)
    return dict(mode=mode, kernel=kernel,
                stride=kernel if stride is None else pair(op, "stride", stride),
                padding=pair(op, "padding", padding))


def pool_2d(x, mode, kernel, stride=None, padding=0):
    """Max ("max") or average ("avg") pooling of the NCHW tensor x.

    kernel, stride, padding: an int or a pair (rows, cols); stride defaults to the kernel.
    avg divides by the full window size kh*kw, padded cells included (ggml's rule; torch's
    avg_pool2d with count_include_pad=True). Padded cells never win a max.
    """
    return make_node("pool_2d", (x,), **_params("pool_2d", mode, kernel, stride, padding))


def _pool_backward(g, out, x, mode, kernel, stride, padding):
    # out (the forward output) tells the max backward each window's maximum
    return (pool_2d_back(g, x, out, mode, kernel, stride, padding),)


def _torch_pool_2d(x, mode, kernel, stride=None, padding=0):
    import torch.nn.functional as F
    if mode == "max":
        return F.max_pool2d(x, kernel, stride, padding)
    return F.avg_pool2d(x, kernel, stride, padding, count_include_pad=True)


# --- pool_2d_back --------------------------------------------------------------------------------
def _pool_back_infer(g, x, y, mode, kernel, stride, padding):
    oh, ow = _check("pool_2d_back", x, mode, kernel, stride, padding)
    params = dict(mode=mode, kernel=kernel, stride=stride, padding=padding)
    if y.op == "pool_2d" and y.params != params:
        raise ParamError(f"pool_2d_back: its parameters {params} differ from those of y, "
                         f"pool_2d with {y.params}")
    want = (x.shape[0], x.shape[1], oh, ow)
    for name, t in (("gradient", g), ("pooled output", y)):
        if tuple(t.shape) != want:
            raise ShapeError(f"pool_2d_back: {name} of shape {list(t.shape)} does not match "
                             f"the pooled shape {list(want)} of input {list(x.shape)}")
        if t.dtype != x.dtype:
            raise DTypeError(f"pool_2d_back: {name} dtype {t.dtype} differs from input dtype "
                             f"{x.dtype} (shapes {list(t.shape)} and {list(x.shape)})")
    return x.shape, x.dtype


def pool_2d_back(g, x, y, mode, kernel, stride=None, padding=0):
    """Gradient of pool_2d w.r.t. x, given the output gradient g and y = pool_2d(x, ...) with
    the same parameters (see the module doc): max sends g to each window's first cell equal to
    y (its first NaN if y is NaN); avg spreads g / (kh kw) over the window."""
    return make_node("pool_2d_back", (g, x, y),
                     **_params("pool_2d_back", mode, kernel, stride, padding))


def _pool_back_build(g, x, *y, mode, kernel, stride=None, padding=0):
    """The registry's builder: pool_2d_back(g, x, y), y = pool_2d(x) (built) if not given."""
    (y,) = y or (pool_2d(x, mode, kernel, stride, padding),)
    return pool_2d_back(g, x, y, mode, kernel, stride, padding)


def _torch_pool_2d_back(g, x, *y, mode, kernel, stride=None, padding=0):
    """torch autograd's gradient of pool_2d at x for the output gradient g (y unused: torch
    finds each window's maximum itself)."""
    import torch
    with torch.enable_grad():
        xx = x.detach().requires_grad_(True)
        (dx,) = torch.autograd.grad(_torch_pool_2d(xx, mode, kernel, stride, padding), xx, g)
    return dx


# --- samples and registration ---------------------------------------------------------------------
SHAPES = [(1, 1, 5, 6), (2, 3, 6, 5), (1, 2, 7, 7), (2, 1, 8, 6)]


def _grid():
    """ggml-style cases: kernel 1 or 3, stride 1 or 2 and padding 0 or 1 per axis (padding
    at most half the kernel), cycling through batch/channel/size shapes; plus a few more."""
    per_axis = [(k, s, p) for k in (1, 3) for s in (1, 2) for p in (0, 1) if 2 * p <= k]
    cases = []
    for i, (k0, s0, p0) in enumerate(per_axis):
        for j, (k1, s1, p1) in enumerate(per_axis):
            shape = SHAPES[(i * len(per_axis) + j) % len(SHAPES)]
            cases.append((shape, (k0, k1), (s0, s1), (p0, p1)))
    cases += [((2, 3, 8, 8), 2, None, 0), ((1, 2, 7, 6), 2, 2, 1), ((2, 3, 8, 8), 3, 2, 1),
              ((3, 2, 5, 5), (2, 3), (1, 2), (1, 0))]
    return cases


VIEW_CASES = [(mode, (2, 2, 6, 6), {"slice": ((0, 2, 1), (1, 3, 1), (1, 7, 1), (0, 12, 2))},
               3, 2, 1) for mode in MODES] + [
    ("max", (1, 3, 5, 6), {"slice": ((0, 1, 1), (0, 6, 2), (2, 7, 1), (1, 7, 1))}, 2, 1, 0),
    ("avg", (2, 3, 6, 6), {"expand": (1, 3)}, 3, 2, 1),
    ("avg", (1, 2, 5, 6), {"slice": ((0, 1, 1), (1, 3, 1), (1, 2, 1), (0, 12, 2)),
                           "expand": (2,)}, 2, 2, 0)]


@both_dtypes
def _pool_samples(dtype):
    out = []
    for mode in MODES:
        for shape, k, s, p in _grid():
            spec = InputSpec("x", shape, "distinct" if mode == "max" else "uniform")
            out.append(Sample.make("pool_2d", [spec], dtype, mode=mode, kernel=k, stride=s,
                                   padding=p))
    # views of the input: sliced (an offset and steps) for both modes, expanded (stride 0,
    # so repeated values: avg only, max would tie)
    for mode, shape, view, k, s, p in VIEW_CASES:
        spec = InputSpec("x", shape, "distinct" if mode == "max" else "uniform", **view)
        out.append(Sample.make("pool_2d", [spec], dtype, mode=mode, kernel=k, stride=s,
                               padding=p))
    return out


@sample_strategy
def _pool_strategy(draw, dtype):
    """Mode; per axis kernel 1-3, stride 1-3, padding <= kernel // 2 and a side up to 9 that
    fits a window; batch and channels 1-3 (at most MAX_ELEMENTS inputs); max pools distinct
    values (no ties: a range of DISTINCT, never expanded), avg a range of SIGNED; the input
    possibly a view."""
    from hypothesis import strategies as st
    mode = draw(st.sampled_from(MODES))
    rows, cols = draw(window_axis()), draw(window_axis())
    batch = draw(shapes(2, 2, max_side=3, max_size=MAX_ELEMENTS // (rows.side * cols.side)))
    spec = draw_input(draw, "x", batch + (rows.side, cols.side),
                      DISTINCT if mode == "max" else SIGNED, layout={"expand": mode != "max"})
    return Sample.make("pool_2d", [spec], dtype, mode=mode, kernel=(rows.kernel, cols.kernel),
                       stride=(rows.stride, cols.stride), padding=(rows.padding, cols.padding))


# pool_2d_back's cases: (shape, kernel, stride, padding, the view of g); max pools distinct
# values (no ties). Windows that tile the image (the kernel's tiled path), overlap (stride <
# kernel: contributions add up), pad; g contiguous, permuted (as the backward of ggml's CNN
# flattening, cont(permute(pool_2d(x))), hands it), broadcast with stride 0 (as the backward
# of a sum over the last axes hands it) or sliced out of a larger buffer
BACK_CASES = [((2, 3, 6, 5), 3, 2, 1, {}), ((1, 2, 8, 6), 2, 2, 0, {}),
              ((1, 2, 5, 6), 3, 1, 1, {}), ((2, 1, 7, 6), (3, 1), (2, 1), (1, 0), {}),
              ((2, 3, 8, 8), 2, 2, 0, {"permute": (0, 2, 3, 1)}),
              ((2, 2, 6, 7), 3, 2, 1, {"permute": (3, 2, 1, 0)}),
              ((2, 3, 8, 6), 2, 2, 0, {"expand": (2, 3)}),
              ((1, 3, 6, 7), 3, 2, 1, {"expand": (1,)}),
              ((1, 2, 6, 6), 2, 2, 0, {"slice": ((0, 1, 1), (1, 3, 1), (1, 4, 1), (0, 6, 2))})]


@both_dtypes
def _pool_back_samples(dtype):
    out = []
    for mode in MODES:
        for shape, k, s, p, view in BACK_CASES:
            x = InputSpec("x", shape, "distinct" if mode == "max" else "uniform", grad=False)
            params = _params("pool_2d_back", mode, k, s, p)
            oh, ow = window_output_size("pool_2d_back", shape, params["kernel"],
                                        params["stride"], params["padding"], (1, 1))
            g = InputSpec("g", shape[:2] + (oh, ow), grad=False, **view)
            out.append(Sample.make("pool_2d_back", [g, x], dtype, **params))
    return out


def _pool_back_primals(g, x, *y, **params):
    """pool_2d_back(g, x, y) is pool_2d's VJP at x (y = pool_2d(x))."""
    return {"x": x}, g, params


def _pool_scale():
    """Scale cases (1.06M elements, on the engine's threads): max pooling whose 2 x 2
    windows tile the image (the tiled kernels), overlapping 3 x 3 windows with padding (the
    general kernels), average pooling, and a permuted input."""
    x = dict(kind="distinct", low=-1.0, high=1.0)
    shape = (4, 8, 182, 182)
    return [scale_case("pool_2d", [InputSpec("x", shape, **x)], kernel=(2, 2), mode="max",
                       padding=(0, 0), stride=(2, 2)),
            scale_case("pool_2d", [InputSpec("x", shape, **x)], kernel=(3, 3), mode="max",
                       padding=(1, 1), stride=(2, 2)),
            scale_case("pool_2d", [InputSpec("x", shape, **x)], kernel=(2, 3), mode="avg",
                       padding=(1, 0), stride=(2, 2)),
            scale_case("pool_2d", [InputSpec("x", (4, 182, 182, 8), permute=(0, 3, 1, 2),
                                             **x)],
                       kernel=(2, 2), mode="max", padding=(0, 0), stride=(2, 2))]


def half_the_kernel(kernel, padding) -> bool:
    """pool_1d's and pool_2d's rule: padding at most half the kernel on every axis, so that
    every window holds at least one image cell (as torch requires)."""
    pads = padding if isinstance(padding, tuple) else (padding,)
    sides = kernel if isinstance(kernel, tuple) else (kernel,)
    return all(2 * p <= k for p, k in zip(pads, sides, strict=True))


HALF_THE_KERNEL = Rule(("kernel", "padding"), half_the_kernel,
                       "padding must be at most half the kernel (every window holds an image "
                       "cell; avg divides by the full window)")
_PARAMS = Params(dict(mode=choice_param(*MODES), kernel=size_param(pair=True),
                      stride=size_param(pair=True), padding=size_param(0, pair=True)),
                 rules=(HALF_THE_KERNEL,))
def _pool_bench():
    """Bench cases: a CIFAR-like batch, 128 images of 32 x 32 with 64 channels (8.4M
    elements): max pooling by 2 x 2 (windows that tile the image), 3 x 3 windows of
    stride 2 with padding 1 (ResNet's: the general backward) and average pooling by 2 x 2."""
    x = InputSpec("x", (128, 64, 32, 32))
    return [bench_case("pool_2d", [x], kernel=(2, 2), mode="max", padding=(0, 0),
                       stride=(2, 2)),
            bench_case("pool_2d", [x], kernel=(3, 3), mode="max", padding=(1, 1),
                       stride=(2, 2)),
            bench_case("pool_2d", [x], kernel=(2, 2), mode="avg", padding=(0, 0),
                       stride=(2, 2))]


register(OpDef("pool_2d", params=_PARAMS,
               scale=_pool_scale, bench=_pool_bench, infer=_pool_infer, backward=_pool_backward,
               kernels={"cpu": cpu_pool_2d, "cuda": "engine.backends.cuda.pool:cuda_pool_2d"},
               build=pool_2d, torch=_torch_pool_2d,
               samples=_pool_samples, strategy=_pool_strategy,
               doc="2-D max/avg pooling of NCHW input; avg divides by the full window"))
register(OpDef("pool_2d_back", params=_PARAMS, kind="backward", infer=_pool_back_infer,
               no_grad="a dedicated backward op without a backward rule of its own",
               kernels={"cpu": cpu_pool_2d_back,
                        "cuda": "engine.backends.cuda.pool:cuda_pool_2d_back"},
               build=_pool_back_build, torch=_torch_pool_2d_back, samples=_pool_back_samples,
               vjp_of=VJPOf("pool_2d", _pool_back_primals),
               doc="gradient of pool_2d given its output y: g routed to each window's first "
                   "cell equal to y (max) or spread as g/(kh*kw) (avg)"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.backends.cpu import paths  # noqa: E402
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.kernels import as_if_contiguous  # noqa: E402
from engine.mutation.patches import kernel_replaced  # noqa: E402


def _pool_max_to_neighbour(real):
    """Max backward: each window's gradient lands one column right of its maximum (off the
    image at the right edge)."""
    def kernel(out, ins, **params):
        real(out, ins, **params)
        if params["mode"] == "max":
            out[..., 1:] = out[..., :-1].copy()
            out[..., 0] = 0
    return kernel


def _pool_avg_window_shifted(real):
    """Avg backward: windows start one column left (the column padding read as pw + 1)."""
    def kernel(out, ins, **params):
        if params["mode"] == "avg":
            ph, pw = params["padding"]
            params = {**params, "padding": (ph, pw + 1)}
        real(out, ins, **params)
    return kernel


def _pool_back_reads_gradient_as_contiguous(real):
    """pool_2d_back reads its incoming gradient in memory order, ignoring its strides (ggml
    0.20.2's pool_2d backward does): right whenever that gradient is contiguous."""
    def kernel(out, ins, **params):
        g, *rest = ins
        real(out, [as_if_contiguous(g), *rest], **params)
    return kernel


def pool_back_tiled_edge_unzeroed(kernel):
    """pool_2d_back (max, windows tiling the image, pool_2d_back:tiled): the rows and
    columns past the last window (H > OH*kh or W > OW*kw) are not zeroed; right only on a
    buffer that was zero before."""
    def mutated(out, ins, **params):
        kh, kw = params["kernel"]
        oh, ow = ins[0].shape[2], ins[0].shape[3]
        before = out.copy()
        with paths.recording() as took:
            kernel(out, ins, **params)
        if took["pool_2d_back:tiled"]:
            out[:, :, oh * kh:, :] = before[:, :, oh * kh:, :]
            out[:, :, :, ow * kw:] = before[:, :, :, ow * kw:]
    return mutated


def _mode(mode):
    return lambda case: case.kwargs.get("mode") == mode


def _pools_tile_with_a_remainder(case) -> bool:
    """Max pooling whose windows tile the image (stride = kernel, no padding, windows of at
    most 4 a side: the tiled kernels) with rows or columns past the last window (pool_1d's
    cases, made of pool_2d, too)."""
    kw = case.kwargs
    if case.op == "pool_1d":
        k, s, p, h, w = (1, kw["kernel"]), (1, kw["stride"] or kw["kernel"]), \
            (0, kw["padding"]), 1, case.inputs[0].shape[-1]
    else:
        k = pair("pool_2d", "kernel", kw["kernel"])
        s = pair("pool_2d", "stride", kw["stride"] or kw["kernel"])
        p = pair("pool_2d", "padding", kw["padding"])
        h, w = case.inputs[0].shape[-2:]
    return (kw["mode"] == "max" and s == k and p == (0, 0) and max(k) <= 4
            and bool(h % k[0] or w % k[1]))


mutation.register(
    Mutant("pool_max_grad_to_neighbour", ("pool_2d",),
           "pool_2d_back (max) routes each window's gradient to the cell right of its "
           "maximum", lambda: kernel_replaced("pool_2d_back", _pool_max_to_neighbour),
           where=_mode("max"), kind="off-by-one window"),
    Mutant("pool_avg_window_shifted", ("pool_2d",),
           "pool_2d_back (avg) spreads each window's gradient over a window shifted one "
           "column left", lambda: kernel_replaced("pool_2d_back", _pool_avg_window_shifted),
           where=_mode("avg"), kind="off-by-one window"),
    Mutant("pool_back_reads_gradient_as_contiguous", ("pool_2d",),
           "pool_2d_back reads its incoming gradient in memory order, ignoring its strides "
           "(ggml 0.20.2's bug, which broke its MNIST CNN): only a cotangent=permuted case "
           "hands it a strided gradient",
           lambda: kernel_replaced("pool_2d_back", _pool_back_reads_gradient_as_contiguous),
           where=lambda case: case.cotangent == "permuted", cotangents=True,
           kind="permuted stride"),
    Mutant("pool_back_tiled_edge_unzeroed", ("pool_2d", "pool_1d"),
           "pool_2d_back's tiled max kernel (windows tiling the image) does not zero the "
           "rows and columns past the last window: right on a zeroed buffer, NaN on reused "
           "memory; only windows that leave a remainder (pool_1d, kernel 3 over 8) show it",
           lambda: kernel_replaced("pool_2d_back", pool_back_tiled_edge_unzeroed),
           where=_pools_tile_with_a_remainder, max_cases=1, kind="unwritten edge"),
)
