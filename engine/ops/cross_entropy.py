"""Cross-entropy loss of logits against probability labels, and its dedicated backward.

Rows are all leading axes of logits and labels (shape (..., C), N rows); labels are
probabilities (each row sums to 1). The loss is a 0-d scalar:

    loss = -(1/N) sum_r sum_c labels[r, c] log_softmax(logits[r])[c]

    grad_logits = g (softmax(logits) t - labels) / N       (the op cross_entropy_loss_back)
                  t_r = sum_c labels[r, c]

Labels get no gradient. For probabilities t = 1 and the gradient is ggml's softmax - labels;
but labels rounded to a 16-bit float sum to 1 only within a rounding each (float16: 0.8076
and 0.1926 sum to 1.0002), and softmax - labels is then off the loss's gradient by g
softmax (t - 1) / N: unseen beside a gradient of the labels' size, it was the whole error
of logits broadcast along the classes, whose true gradient is 0 (2.2e-4 where torch's
float16 errs 6e-17, 20 times the precision bar; `gradcheck --op cross_entropy_loss --random
200 --seed 3`). The row's sum t costs a pass over the row that the kernel reads anyway.
"""

from __future__ import annotations

import math

from engine.backends.cpu.cross_entropy import cpu_cross_entropy_loss, cpu_cross_entropy_loss_back
from engine.errors import DTypeError, ShapeError
from engine.ops.shape import contiguous_inputs
from engine.params import check_rows
from engine.registry import OpDef, VJPOf, make_node, register, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import SQUARE, bench_case, scale_case
from engine.strategies import MAGNITUDES, MAX_ELEMENTS, draw_input, sample_strategy, shapes


def _infer(logits, labels):
    check_rows("cross_entropy_loss", logits, labels)
    if math.prod(logits.shape[:-1]) == 0:
        raise ShapeError(f"cross_entropy_loss: the loss is a mean over rows and needs at "
                         f"least one, got shapes {shapes_str(logits, labels)}")
    return (), logits.dtype


def cross_entropy_loss(logits, labels):
    """Mean over rows of -sum_c labels * log_softmax(logits), a 0-d tensor."""
    logits, labels = contiguous_inputs(logits, labels)
    return make_node("cross_entropy_loss", (logits, labels))


def _backward(g, out, logits, labels):
    return cross_entropy_loss_back(g, logits, labels), None


def _back_infer(g, logits, labels):
    check_rows("cross_entropy_loss_back", logits, labels)
    if g.shape != ():
        raise ShapeError(f"cross_entropy_loss_back: the loss gradient must be 0-d, got shape "
                         f"{list(g.shape)} (logits {list(logits.shape)})")
    if g.dtype != logits.dtype:
        raise DTypeError(f"cross_entropy_loss_back: gradient dtype {g.dtype} differs from "
                         f"logits dtype {logits.dtype}")
    return logits.shape, logits.dtype


def cross_entropy_loss_back(g, logits, labels):
    """g * (softmax(logits) * sum(labels, last axis) - labels) / N, N the number of rows
    (softmax - labels for probability labels)."""
    logits, labels = contiguous_inputs(logits, labels)
    return make_node("cross_entropy_loss_back", (g, logits, labels))


CE_SHAPES = [(1, 5), (4, 3), (7, 10), (2, 3, 4), (6,)]


@both_dtypes
def _samples(dtype):
    return [Sample.make("cross_entropy_loss",
                        [InputSpec("logits", s, low=-3.0, high=3.0),
                         InputSpec("labels", s, "probs", low=-2.0, high=2.0, grad=False)],
                        dtype) for s in CE_SHAPES]


@both_dtypes
def _back_samples(dtype):
    """g is the 0-d loss gradient (no layout to vary); logits and labels contiguous or
    permuted views."""
    return [Sample.make("cross_entropy_loss_back",
                        [InputSpec("g", (), low=0.5, high=2.0),
                         InputSpec("logits", s, low=-3.0, high=3.0, permute=pl),
                         InputSpec("labels", s, "probs", grad=False, permute=pb)], dtype)
            for s, pl, pb in [((4, 3), None, None), ((2, 3, 4), None, None),
                              ((3, 5), (1, 0), None), ((2, 4, 3), (2, 0, 1), (1, 0, 2))]]


def _back_primals(g, logits, labels):
    """cross_entropy_loss_back(g, logits, labels) is the loss's VJP at (logits, labels)
    with respect to the logits."""
    return {"logits": logits, "labels": labels}, g, {}


LABELS = (("probs", -2.0, 2.0), ("probs", -20.0, 20.0))


@sample_strategy
def _strategy(draw, dtype):
    """Rows of 2..8 classes (1 to 3 axes in all), logits in a range of MAGNITUDES,
    probability labels (no gradient, from logits in [-2, 2] or [-20, 20]: near one-hot);
    either input possibly a view."""
    from hypothesis import strategies as st
    classes = draw(st.integers(2, 8))
    rows = draw(shapes(min_dims=0, max_dims=2, max_side=6, max_size=MAX_ELEMENTS // classes))
    shape = rows + (classes,)
    return Sample.make("cross_entropy_loss",
                       [draw_input(draw, "logits", shape, MAGNITUDES),
                        draw_input(draw, "labels", shape, LABELS, narrow=False, grad=False)],
                       dtype)


def _torch_cross_entropy(logits, labels):
    import torch.nn.functional as F
    c = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, c), labels.reshape(-1, c))


def _torch_cross_entropy_back(g, logits, labels):
    rows = math.prod(logits.shape[:-1])
    return g * (logits.softmax(-1) * labels.sum(-1, keepdim=True) - labels) / rows


def _scale():
    """Scale case: SQUARE logits and label rows (the rows on the engine's threads)."""
    return [scale_case("cross_entropy_loss",
                       [InputSpec("logits", SQUARE, "uniform", -3.0, 3.0),
                        InputSpec("labels", SQUARE, "probs", -2.0, 2.0, grad=False)])]


def _bench():
    """Bench case: a language model's loss, 256 rows of logits over 32,000 tokens."""
    return [bench_case("cross_entropy_loss",
                       [InputSpec("logits", (256, 32000), "uniform", -3.0, 3.0),
                        InputSpec("labels", (256, 32000), "probs", -2.0, 2.0, grad=False)])]


register(OpDef("cross_entropy_loss", params={}, scale=_scale, bench=_bench, infer=_infer,
               backward=_backward,
               kernels={"cpu": cpu_cross_entropy_loss,
                        "cuda": "engine.backends.cuda.cross_entropy:cuda_cross_entropy_loss"},
               build=cross_entropy_loss,
               torch=_torch_cross_entropy, samples=_samples, strategy=_strategy,
               doc="mean over rows of -sum(labels * log_softmax(logits)); a 0-d loss"))
register(OpDef("cross_entropy_loss_back", params={}, kind="backward", infer=_back_infer,
               no_grad="dedicated backward op",
               kernels={"cpu": cpu_cross_entropy_loss_back,
                        "cuda": "engine.backends.cuda.cross_entropy:cuda_cross_entropy_loss_back"},
               build=cross_entropy_loss_back, torch=_torch_cross_entropy_back,
               samples=_back_samples, vjp_of=VJPOf("cross_entropy_loss", _back_primals, "logits"),
               doc="g * (softmax(logits) * sum(labels) - labels) / N: the gradient of "
                   "cross_entropy_loss"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import kernel_replaced  # noqa: E402


def _cross_entropy_back_not_divided(real):
    def kernel(out, ins, **params):
        real(out, ins, **params)
        out *= out.size // out.shape[-1]            # the row count N the kernel divided by
    return kernel


def _several_rows(case) -> bool:
    return math.prod(case.inputs[0].shape[:-1]) > 1


mutation.register(
    Mutant("cross_entropy_back_not_divided", ("cross_entropy_loss",),
           "cross_entropy_loss_back forgets to divide by the row count N",
           lambda: kernel_replaced("cross_entropy_loss_back", _cross_entropy_back_not_divided),
           where=_several_rows, kind="scaled gradient"),
)
