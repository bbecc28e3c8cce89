"""The engine under test's side of a check: its backprop for the case's loss weighting.

The case's output is reduced to a scalar with fixed random weights, loss = sum(output *
weights) (never a plain sum: sum(softmax(x)) is constant and would test nothing), and the
adapter's vector-Jacobian product gives the gradient of that loss per input. The adapter
runs twice; the two answers must agree bit for bit (determinism). What it returns is
checked against the case's shapes before anything is compared, and the inputs it declines
(its optional `declined(case)`) are named.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from engine.registry import get_op
from engine.tensor import is_float


class EngineResultError(Exception):
    """An engine returned something that is not an answer for the case (wrong shape, a
    missing gradient): an error row."""


# the loss weights of a 16-bit case: 8 significant bits (bfloat16's), so that each weight is
# exactly a float16, a bfloat16 and a float32 value
NARROW_WEIGHTS = ("f16", "bf16")


def loss_weights(shape, seed: int, cotangent: str = "contiguous",
                 precision: str = "f64") -> np.ndarray:
    """Weights in +-[0.5, 1.5] with random signs: no element's gradient is ever zero. For an
    "expanded" cotangent (engine.samples) they are drawn per row and constant along the
    last axis, so that the engine can receive them as a stride-0 view; "expanded_first"
    the same along the first axis.

    For a case of `precision` f16 or bf16 (its least precise dtype) each weight is rounded
    to 8 significant bits, a value the engine's 16-bit (or float32) cotangent holds
    exactly: the float64 reference and the engine then differentiate the same loss. With
    float64 weights the engine got them rounded to 11 or 8 bits, and where the backward
    amplifies its cotangent that rounding was blamed on the engine: `gradcheck --all
    --random 200 --seed 3` failed norm(type=f16, x of 6 values in [-0.0625, -0.021]),
    whose gradient is 1/sigma ~ 96 times its cotangent's deviation from a constant: the
    engine's answer was the float64 gradient of its float16 weights to 5e-5, 0.024 from the
    float64 weights' (docs/performance.md)."""
    shape = tuple(shape)
    drawn = shape
    if cotangent == "expanded" and shape:
        drawn = shape[:-1] + (1,)
    elif cotangent == "expanded_first" and shape:
        drawn = (1,) + shape[1:]
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 1.5, drawn) * rng.choice([-1.0, 1.0], drawn)
    if precision in NARROW_WEIGHTS:
        w = w.astype(ml_dtypes.bfloat16).astype(np.float64)
    return np.array(np.broadcast_to(w, shape))      # a copy, 0-d stays 0-d


def same_bits(a, b) -> bool:
    """Whether two answers are bit for bit the same (NaNs equal), None only with None."""
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    return np.array_equal(a, b, equal_nan=is_float(a.dtype) and is_float(b.dtype))


def validated(vjp, case, output_shape):
    """(output, gradients) of an engine's VJP, checked against the case's shapes."""
    out = np.asarray(vjp.output)
    if out.shape != tuple(output_shape):
        raise EngineResultError(f"the engine's output has shape {list(out.shape)}, the "
                                f"case's output {list(output_shape)}")
    grads = list(vjp.grads)
    if len(grads) != len(case.inputs):
        raise EngineResultError(f"the engine returned {len(grads)} gradients for "
                                f"{len(case.inputs)} inputs")
    for i, (spec, g) in enumerate(zip(case.inputs, grads, strict=True)):
        if g is None:
            continue
        grads[i] = g = np.asarray(g)
        if g.shape != tuple(spec.shape):
            raise EngineResultError(f"the engine's gradient of {spec.name} has shape "
                                    f"{list(g.shape)}, the input {list(spec.shape)}")
    return out, grads


def leaf_answer(adapter, case, out, grads):
    """(out, grads) with each gradient its leaf's, in the layout the op sees: as given by
    an adapter whose `leaf_gradients` is set (it builds the case's input views, as ours,
    torch's and ggml's do); else taken per element of the values given, as independent
    inputs, and summed along an expanded input's stride-0 axes (InputSpec.view_gradient)."""
    if getattr(adapter, "leaf_gradients", False):
        return out, grads
    return out, [g if g is None or not hasattr(spec, "view_gradient") else
                 spec.view_gradient(g) for spec, g in zip(case.inputs, grads, strict=True)]


def engine_vjp(adapter, case, arrays, weights, output_shape):
    """(output, gradients, differs): the adapter's VJP, run twice; `differs` when the two
    runs (or the adapter's own repeat) gave different bits. An adapter with `vjp_runs`
    (ours) runs one graph twice instead of building it twice."""
    # the class's: an isolated adapter forwards unknown attributes to its local engine
    runs = getattr(type(adapter), "vjp_runs", None)
    if runs is not None:
        first, second = runs(adapter, case, [a.copy() for a in arrays], weights, 2)
    else:
        first = adapter.vjp(case, [a.copy() for a in arrays], weights)
        second = adapter.vjp(case, [a.copy() for a in arrays], weights)
    out, grads = leaf_answer(adapter, case, *validated(first, case, output_shape))
    out2, grads2 = leaf_answer(adapter, case, *validated(second, case, output_shape))
    differs = bool(first.differs or second.differs) or not same_bits(out, out2) or \
        not all(same_bits(a, b) for a, b in zip(grads, grads2, strict=True))
    return out, grads, differs


def declined_inputs(adapter, case, checked) -> dict[int, str]:
    """Of the checked inputs (indices), those whose gradient `adapter` declines (its
    optional `declined(case)`, see gradcheck.adapters.base), with the reason. Raises
    EngineResultError when it names something that is not an input of the case."""
    declined = getattr(adapter, "declined", None)
    reasons = (declined(case) if declined is not None else None) or {}
    names = [spec.name for spec in case.inputs]
    unknown = [repr(n) for n in reasons if n not in names]
    if unknown:
        raise EngineResultError(f"the engine declined the gradient of {', '.join(unknown)}, "
                                f"not an input of the case (inputs: {', '.join(names)})")
    return {i: str(reasons[names[i]]) for i in checked if names[i] in reasons}


def zero_gradient(case) -> str:
    """Why the case's op has a zero derivative by definition (OpDef.zero_gradient), "" for
    any other op and for a case of no registered op."""
    if not getattr(case, "registered", True):
        return ""
    return get_op(case.op).zero_gradient


def nonzero_problems(zero: str, case, checked, backprop) -> tuple[str, ...]:
    """With `zero` (the op's derivative is 0 by definition), a problem for each checked
    gradient that is not exactly 0: a zero derivative needs no tolerance."""
    if not zero:
        return ()
    problems = []
    for i in checked:
        g = np.asarray(backprop[i])
        bad = int(np.count_nonzero(g != 0) + np.count_nonzero(np.isnan(g)))
        if bad:
            problems.append(f"zero by definition: backprop of {case.inputs[i].name} has "
                            f"{bad}/{g.size} elements that are not exactly 0 ({zero})")
    return tuple(problems)
