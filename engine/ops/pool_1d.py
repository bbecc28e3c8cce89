"""1-D max and average pooling over NCL tensors, composed from 2-D pooling.

For x of shape (N, C, L), kernel k, stride s (default k) and padding p (at most k / 2),
window o covers cells o s - p ... o s - p + k - 1 and

    OL = (L + 2 p - k) // s + 1
    max: out[n, c, o] = max of x over the window's cells inside the signal
    avg: out[n, c, o] = (sum of x over the window's cells inside the signal) / k

(padded cells never win a max and count as zeros in an average: the divisor is always k, as
torch's avg_pool1d with count_include_pad=True). It is composed as

    out = reshape(pool_2d(reshape(x, (N, C, 1, L)), mode, (1, k), (1, s), (0, p)), (N, C, OL))

so its kernels and its gradient are pool_2d's (pool_2d_back): a max window sends its
gradient to its first cell equal to the maximum. A strided (permuted) x is made contiguous
first, as reshape needs.
"""

from __future__ import annotations

from engine.ops.pool_2d import HALF_THE_KERNEL, MODES, pool_2d
from engine.ops.shape import cont_if_strided, reshape
from engine.params import (
    Params,
    check_float_input,
    choice_param,
    integer,
    size_param,
    window_output_size,
)
from engine.registry import OpDef, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case, scale_case
from engine.strategies import DISTINCT, SIGNED, draw_input, sample_strategy, shapes, window_axis


def _check(x, mode, kernel, stride, padding) -> int:
    """Validate an NCL float input (the parameters are declared); return OL."""
    check_float_input("pool_1d", x, "NCL")
    (ol,) = window_output_size("pool_1d", x.shape, (kernel,), (stride,), (padding,), (1,))
    return ol


def pool_1d(x, mode, kernel, stride=None, padding=0):
    """Max ("max") or average ("avg") pooling of the NCL tensor x along its last axis.

    kernel, stride, padding: ints; stride defaults to the kernel. avg divides by the full
    window size, padded cells included; padded cells never win a max.
    """
    kernel = integer("pool_1d", "kernel", kernel)
    stride = kernel if stride is None else integer("pool_1d", "stride", stride)
    padding = integer("pool_1d", "padding", padding)
    ol = _check(x, mode, kernel, stride, padding)
    n, c, length = x.shape
    planes = reshape(cont_if_strided(x), (n, c, 1, length))
    return reshape(pool_2d(planes, mode, (1, kernel), (1, stride), (0, padding)), (n, c, ol))


def _torch_pool_1d(x, mode, kernel, stride=None, padding=0):
    import torch.nn.functional as F
    if mode == "max":
        return F.max_pool1d(x, kernel, stride, padding)
    return F.avg_pool1d(x, kernel, stride, padding, count_include_pad=True)


# --- samples and strategy -------------------------------------------------------------------------
SHAPES = [(1, 1, 9), (2, 3, 8), (1, 2, 11), (2, 1, 10)]


def _grid():
    """ggml-style cases: kernel 1, 2 or 3, stride 1 or 2 (or the default: the kernel),
    padding 0 or 1 (at most half the kernel), cycling through shapes; plus a few more."""
    cases = [(k, s, p) for k in (1, 2, 3) for s in (1, 2, None) for p in (0, 1) if 2 * p <= k]
    cases = [(SHAPES[i % len(SHAPES)], k, s, p, None) for i, (k, s, p) in enumerate(cases)]
    return cases + [((2, 2, 12), 4, 3, 2, None), ((1, 3, 9), 5, 2, 2, None),
                    ((2, 3, 8), 3, 2, 1, (0, 2, 1)), ((3, 2, 7), 2, 1, 1, (2, 0, 1))]


@both_dtypes
def _samples(dtype):
    out = []
    for mode in MODES:
        for shape, k, s, p, perm in _grid():
            spec = InputSpec("x", shape, "distinct" if mode == "max" else "uniform",
                             permute=perm)
            out.append(Sample.make("pool_1d", [spec], dtype, mode=mode, kernel=k, stride=s,
                                   padding=p))
    return out


@sample_strategy
def _strategy(draw, dtype):
    """kernel 1-5, stride 1-4 or the default, padding up to half the kernel, a length up to
    16 that holds a window, batch and channels 1-3, possibly a view; max pooling on
    distinct values (no ties, so every max is differentiable: a range of DISTINCT, never
    expanded), average pooling on a range of SIGNED."""
    from hypothesis import strategies as st
    ax = draw(window_axis(kernel=(1, 5), stride=(1, 4), max_side=16))
    shape = draw(shapes(2, 2, max_side=3)) + (ax.side,)
    mode = draw(st.sampled_from(MODES))
    spec = draw_input(draw, "x", shape, DISTINCT if mode == "max" else SIGNED,
                      layout={"expand": mode != "max"})
    stride = draw(st.sampled_from([None, ax.stride]))
    return Sample.make("pool_1d", [spec], dtype, mode=mode, kernel=ax.kernel, stride=stride,
                       padding=ax.padding)


def _pool_1d_scale():
    """Scale cases: kernel 3, stride 2, max and avg, over 1.05M elements."""
    return [scale_case("pool_1d", [InputSpec("x", (8, 16, 8209), "distinct", -1.0, 1.0)],
                       kernel=3, mode=mode, padding=1, stride=2) for mode in ("max", "avg")]


def _pool_1d_bench():
    """Bench case: max pooling by 2 of 64 signals of 256 channels and 512 steps."""
    return [bench_case("pool_1d", [InputSpec("x", (64, 256, 512))], kernel=2, mode="max",
                       padding=0, stride=2)]


register(OpDef("pool_1d", kind="composite", compose=pool_1d, torch=_torch_pool_1d,
               params=Params(dict(mode=choice_param(*MODES), kernel=size_param(),
                                  stride=size_param(default=None, nullable=True),
                                  padding=size_param(0, default=0)),
                             rules=(HALF_THE_KERNEL,)),
               scale=_pool_1d_scale, bench=_pool_1d_bench,
               samples=_samples, strategy=_strategy,
               doc="1-D max/avg pooling of NCL input (pool_2d on a (N, C, 1, L) view); avg "
                   "divides by the full window"))
