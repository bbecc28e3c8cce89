"""log_softmax along the last axis, through a stable log-sum-exp:

    log_softmax(x)[..., j] = x_j - m - log(sum_k exp(x_k - m)),      m = max_k x_k
    grad_x = g - exp(out) sum_k g_k                  (composed: exp(out) = softmax(x))

Its kernels are the row kernels of engine.backends.cpu.softmax and .cuda.softmax; the
builder puts `cont` in front of a strided x (the kernels read rows as contiguous memory).
"""

from __future__ import annotations

from engine.backends.cpu.softmax import cpu_log_softmax
from engine.ops.reduce import sum as reduce_sum
from engine.ops.shape import contiguous_inputs
from engine.ops.softmax import ROW_SHAPES
from engine.params import check_rows
from engine.registry import OpDef, make_node, register, registered
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import SQUARE, bench_case, scale_case
from engine.strategies import draw_row_input, sample_strategy


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


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import backward_replaced  # noqa: E402

mutation.register(
    Mutant("log_softmax_drops_normaliser", ("log_softmax",),
           "log_softmax's gradient g - softmax * sum(g) loses its second term: just g",
           lambda: backward_replaced("log_softmax", lambda real: lambda g, out, x: (g,)),
           kind="dropped term"),
)
