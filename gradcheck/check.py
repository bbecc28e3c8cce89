"""Check one sample case: backprop against float64 numerical gradients on the engine.

The op's output is reduced to a scalar by a fixed random weighting (never a plain sum:
sum(softmax(x)) is constant and would test nothing). Backprop runs in the case's dtype;
the numerical reference runs the same graph in float64 on the same (rounded) inputs.
"""

from __future__ import annotations

import numpy as np

import engine
from engine import ops
from engine.errors import EngineError
from engine.registry import get_op
from engine.tensor import as_dtype
from gradcheck.mutations import injected
from gradcheck.numeric import compare, numerical_gradient
from reports import Result


def loss_weights(shape, seed: int) -> np.ndarray:
    """Weights in +-[0.5, 1.5] with random signs: no element's gradient is ever zero."""
    rng = np.random.default_rng(seed)
    return rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


def _weighted_case(sample, arrays, as_params: bool):
    """Leaves (params where checked, else inputs), the op's output and the scalar loss."""
    leaves = []
    for spec, a in zip(sample.inputs, sample.leaf_arrays(arrays), strict=True):
        if a.dtype.kind == "f":
            a = a.astype(as_dtype(spec.dtype or sample.dtype))
        checked = spec.grad and a.dtype.kind == "f"
        t = (engine.param if as_params and checked else engine.input_tensor)(
            a.shape, a.dtype, name=spec.name)
        t.set(a)
        leaves.append(t)
    out = sample.build(*leaves)
    if out.dtype.kind != "f":
        return leaves, out, None
    w = engine.input_tensor(out.shape, out.dtype, name="loss_weights")
    w.set(loss_weights(out.shape, sample.seed()).astype(out.dtype))
    loss = ops.sum(ops.mul(out, w)).set_loss()
    return leaves, out, loss


def analytic_gradients(sample, arrays, inject=None) -> list[np.ndarray | None]:
    """Backprop gradients in the case's dtype (None for unchecked inputs)."""
    leaves, out, loss = _weighted_case(sample, arrays, as_params=True)
    case_ops = {t.op for t in engine.Graph([out]).nodes if not t.is_leaf}
    graph = engine.Graph([loss], name=str(sample))
    with injected(inject, case_ops):
        grads = graph.build_backward(loss)
    graph.compute()
    return [grads[t].numpy() if t in grads else (np.zeros(t.shape, t.dtype) if t.is_param
                                                 else None) for t in leaves]


def numeric_gradients(sample, arrays):
    """(gradient, error estimate) per checked input, by finite differences of the case with
    every float dtype promoted to float64, on the same (rounded) input values."""
    leaves, _, loss = _weighted_case(sample.promoted("f64"), arrays, as_params=False)
    graph = engine.Graph([loss], name=f"{sample}.numeric")

    def f() -> float:
        graph.compute()
        return float(loss.buffer().reshape(-1)[0])

    out = []
    for spec, t in zip(sample.inputs, leaves, strict=True):
        if spec.grad and t.dtype.kind == "f":
            out.append(numerical_gradient(f, t.buffer()))
        else:
            out.append(None)
    return out


def check_sample(sample, inject: str | None = None) -> Result:
    """Compare backprop with numerical gradients for every checked input of `sample`."""
    name = str(sample)
    op = get_op(sample.op)
    if not op.differentiable:
        return Result("gradcheck", name, "skip", message=f"no gradient: {op.no_grad}")
    try:
        arrays = sample.generate_inputs()
        analytic = analytic_gradients(sample, arrays, inject)
        numeric = numeric_gradients(sample, arrays)
    except EngineError as exc:
        return Result("gradcheck", name, "error", message=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a crashing kernel is this case's verdict, not the sweep's end
        return Result("gradcheck", name, "error",
                      message=f"unexpected {type(exc).__name__}: {exc}")
    checked = 0
    max_abs = max_rel = 0.0
    problems = []
    for spec, a, num in zip(sample.inputs, analytic, numeric, strict=True):
        if num is None:
            continue
        c = compare(spec.from_leaf(a), spec.from_leaf(num[0]), sample.precision)
        checked += c.checked
        max_abs, max_rel = max(max_abs, c.max_abs), max(max_rel, c.max_rel)
        if c.nonfinite:
            problems.append(f"{spec.name}: {c.nonfinite} NaN/Inf")
        if c.failures:
            problems.append(f"{spec.name}: {c.failures}/{c.checked} off, worst at "
                            f"{list(c.worst_index)}: backprop {c.worst_analytic:.6g}, "
                            f"numerical {c.worst_numeric:.6g}")
    metrics = {"checked": checked, "max_abs_err": max_abs, "max_rel_err": max_rel}
    return Result("gradcheck", name, "fail" if problems else "pass", metrics,
                  "; ".join(problems))
