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
"""

from __future__ import annotations

from engine.backends.cpu.pool_2d import cpu_pool_2d, cpu_pool_2d_back
from engine.errors import DTypeError, ParamError, ShapeError
from engine.params import pair, window_output_size
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.strategies import MAX_ELEMENTS, permutations, sample_strategy, shapes, window_axis

MODES = ("max", "avg")


def _check(op, x, mode, kernel, stride, padding) -> tuple[int, int]:
    """Validate an NCHW float input and pooling params; return (OH, OW)."""
    if x.ndim != 4:
        raise ShapeError(f"{op}: needs an NCHW input (4 axes), got shape {list(x.shape)}")
    if x.dtype.kind != "f":
        raise DTypeError(f"{op}: needs a float input, got {x.dtype} of shape {list(x.shape)}")
    if mode not in MODES:
        raise ParamError(f"{op}: mode must be one of {MODES}, got {mode!r}")
    oh, ow = window_output_size(op, x.shape, kernel, stride, padding, (1, 1))
    if 2 * padding[0] > kernel[0] or 2 * padding[1] > kernel[1]:
        raise ParamError(f"{op}: padding {list(padding)} must be at most half the kernel "
                         f"{list(kernel)} (input of shape {list(x.shape)})")
    return oh, ow


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


@both_dtypes
def _pool_samples(dtype):
    out = []
    for mode in MODES:
        for shape, k, s, p in _grid():
            spec = InputSpec("x", shape, "distinct" if mode == "max" else "uniform")
            out.append(Sample.make("pool_2d", [spec], dtype, mode=mode, kernel=k, stride=s,
                                   padding=p))
    return out


@sample_strategy
def _pool_strategy(draw, dtype):
    """Mode; per axis kernel 1-3, stride 1-3, padding <= kernel // 2 and a side up to 9 that
    fits a window; batch and channels 1-3 (at most MAX_ELEMENTS inputs); max pools distinct
    values (no ties); the input possibly a permuted view."""
    from hypothesis import strategies as st
    mode = draw(st.sampled_from(MODES))
    rows, cols = draw(window_axis()), draw(window_axis())
    batch = draw(shapes(2, 2, max_side=3, max_size=MAX_ELEMENTS // (rows.side * cols.side)))
    spec = InputSpec("x", batch + (rows.side, cols.side),
                     "distinct" if mode == "max" else "uniform", permute=draw(permutations(4)))
    return Sample.make("pool_2d", [spec], dtype, mode=mode, kernel=(rows.kernel, cols.kernel),
                       stride=(rows.stride, cols.stride), padding=(rows.padding, cols.padding))


register(OpDef("pool_2d", infer=_pool_infer, backward=_pool_backward,
               kernels={"cpu": cpu_pool_2d, "cuda": "engine.backends.cuda.pool:cuda_pool_2d"},
               build=pool_2d, torch=_torch_pool_2d,
               samples=_pool_samples, strategy=_pool_strategy,
               doc="2-D max/avg pooling of NCHW input; avg divides by the full window"))
register(OpDef("pool_2d_back", kind="backward", infer=_pool_back_infer,
               no_grad="a backward op; the engine takes no second derivatives",
               kernels={"cpu": cpu_pool_2d_back,
                        "cuda": "engine.backends.cuda.pool:cuda_pool_2d_back"},
               build=pool_2d_back,
               doc="gradient of pool_2d given its output y: g routed to each window's first "
                   "cell equal to y (max) or spread as g/(kh*kw) (avg)"))
