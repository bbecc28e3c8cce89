"""log_softmax along the last axis, through a stable log-sum-exp:

    log_softmax(x)[..., j] = x_j - m - log(sum_k exp(x_k - m)),      m = max_k x_k
    grad_x = g - exp(out) sum_k g_k                  (exp(out) = softmax(x))

The gradient is the dedicated backward op log_softmax_back(g, y) = g - exp(y) sum_k g_k, one
pass per row after its float64 sum of g; composed of exp, a row sum, mul and sub it took
log_softmax's forward and backward over (256, 32000) to 2.0 times torch's (python
bench/bench_ops.py --op log_softmax --repeat 7 --threads 1). Its kernels, and
log_softmax's, are the row kernels of engine.backends.cpu.softmax and .cuda.softmax; the
builders put `cont` in front of strided inputs (the kernels read rows as contiguous
memory).
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.softmax import cpu_log_softmax, cpu_log_softmax_back
from engine.ops.shape import contiguous_inputs
from engine.ops.softmax import ROW_SHAPES
from engine.params import check_rows
from engine.registry import OpDef, VJPOf, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import SQUARE, bench_case, scale_case
from engine.strategies import SIGNED, draw_input, draw_row_input, sample_strategy


def _log_softmax_infer(x):
    check_rows("log_softmax", x)
    return x.shape, x.dtype


def log_softmax(x):
    """log(softmax(x)) along the last axis, via a stable log-sum-exp."""
    (x,) = contiguous_inputs(x)
    return make_node("log_softmax", (x,))


def _log_softmax_backward(g, out, x):
    return (log_softmax_back(g, out),)


def _log_softmax_back_infer(g, y):
    check_rows("log_softmax_back", g, y)
    return y.shape, y.dtype


def log_softmax_back(g, y):
    """Gradient of log_softmax from its output y and output gradient g:
    g - exp(y) * sum(g, last axis)."""
    g, y = contiguous_inputs(g, y)
    return make_node("log_softmax_back", (g, y))


# log_softmax's outputs: rows whose exponentials sum to 1, near one-hot too
LOG_PROBS = (("log_probs", -3.0, 3.0), ("log_probs", -20.0, 20.0))


@both_dtypes
def _log_softmax_back_samples(dtype):
    """g contiguous, a permuted view (y too) or a stride-0 broadcast along a leading axis,
    y rows of log-probabilities: checked against log_softmax's VJP (gradcheck.backward_ops)."""
    g = lambda s, p=None, e=None: InputSpec("g", s, permute=p, expand=e)  # noqa: E731
    return [Sample.make("log_softmax_back",
                        [g_spec, InputSpec("y", g_spec.shape, "log_probs", low=lo, high=hi,
                                           permute=py)], dtype)
            for g_spec, py, (lo, hi) in [(g((3, 4)), None, (-3.0, 3.0)),
                                         (g((2, 3, 5)), None, (-20.0, 20.0)),
                                         (g((3, 4, 2), (1, 2, 0)), None, (-3.0, 3.0)),
                                         (g((2, 3, 4), (2, 0, 1)), (1, 0, 2), (-3.0, 3.0)),
                                         (g((4, 6), e=(0,)), None, (-3.0, 3.0))]]


@sample_strategy
def _log_softmax_back_strategy(draw, dtype):
    g = draw_row_input(draw, "g", SIGNED)
    y = draw_input(draw, "y", g.shape, LOG_PROBS, narrow=False)
    return Sample.make("log_softmax_back", [g, y], dtype)


def _torch_log_softmax_back(g, y):
    return g - y.exp() * g.sum(-1, keepdim=True)


def _log_softmax_back_primals(g, y):
    """log_softmax_back(g, y) is log_softmax's VJP at x = y, for rows y of
    log-probabilities: log_softmax(y) = y."""
    return {"x": y}, g, {}


@both_dtypes
def _log_softmax_samples(dtype):
    return [Sample.make("log_softmax", [InputSpec("x", s, low=-3.0, high=3.0, permute=p)],
                        dtype)
            for s, p in [*((s, None) for s in ROW_SHAPES), ((3, 4, 5), (2, 0, 1))]]


@sample_strategy
def _log_softmax_strategy(draw, dtype):
    return Sample.make("log_softmax", [draw_row_input(draw, "x")], dtype)


def _log_softmax_scale():
    """Scale case: SQUARE rows on the engine's threads."""
    return [scale_case("log_softmax", [InputSpec("x", SQUARE, "uniform", -3.0, 3.0)])]


def _log_softmax_bench():
    """Bench case: 256 rows of logits over a 32,000-token vocabulary."""
    return [bench_case("log_softmax", [InputSpec("x", (256, 32000), "uniform", -3.0, 3.0)])]


register(OpDef("log_softmax", params={}, infer=_log_softmax_infer, backward=_log_softmax_backward,
               scale=_log_softmax_scale, bench=_log_softmax_bench,
               kernels={"cpu": cpu_log_softmax,
                        "cuda": "engine.backends.cuda.softmax:cuda_log_softmax"},
               build=log_softmax,
               torch=lambda x: x.log_softmax(-1), samples=_log_softmax_samples,
               strategy=_log_softmax_strategy,
               doc="log(softmax(x)) along the last axis (stable log-sum-exp)"))
register(OpDef("log_softmax_back", params={}, kind="backward",
               infer=_log_softmax_back_infer, no_grad="dedicated backward op",
               kernels={"cpu": cpu_log_softmax_back,
                        "cuda": "engine.backends.cuda.softmax:cuda_log_softmax_back"},
               build=log_softmax_back, torch=_torch_log_softmax_back,
               samples=_log_softmax_back_samples, strategy=_log_softmax_back_strategy,
               vjp_of=VJPOf("log_softmax", _log_softmax_back_primals),
               doc="g - exp(y) * sum(g, last axis): the gradient of log_softmax"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import backward_replaced, kernel_replaced  # noqa: E402


def _log_softmax_back_sum_short(real):
    """g - exp(y) (sum(g) - g_last): the real result with the last element's term added
    back, as a row sum that stops one element short."""
    def kernel(out, ins, **params):
        real(out, ins, **params)
        g, y = ins
        tail = np.exp(y.astype(np.float64)) * g[..., -1:].astype(np.float64)
        out += tail.astype(out.dtype)
    return kernel


mutation.register(
    Mutant("log_softmax_drops_normaliser", ("log_softmax",),
           "log_softmax's gradient g - softmax * sum(g) loses its second term: just g",
           lambda: backward_replaced("log_softmax", lambda real: lambda g, out, x: (g,)),
           kind="dropped term"),
    Mutant("log_softmax_back_sum_short", ("log_softmax",),
           "log_softmax_back's row sum of g stops one element short: g - exp(y) (sum(g) - "
           "g_last)",
           lambda: kernel_replaced("log_softmax_back", _log_softmax_back_sum_short),
           kind="dropped tail"),
)
