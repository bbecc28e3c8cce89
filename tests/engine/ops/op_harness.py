"""Run a registry sample on the engine and on torch, forward and backward, the way gradcheck
does: through gradcheck's own adapters (EngineAdapter on the CPU, TorchAdapter in the
sample's dtypes) and gradcheck's weighting of the output (loss_weights, seeded by the case),
so that these tests and gradcheck differentiate the same loss, sum(output * weights)."""

from __future__ import annotations

import dataclasses

import numpy as np

import engine
from engine.samples import InputSpec
from engine.tensor import dtype_name
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.adapters.torch_adapter import TorchAdapter
from gradcheck.api import FunctionCase
from gradcheck.backprop import loss_weights as gradcheck_loss_weights

# forward/backward agreement with torch, per dtype (the engine and torch round differently)
# ours against torch in the same dtype; the 16-bit ones: both round every stored result,
# not always at the same places (a composite op of ours rounds between its nodes), so a few
# of their units in the last place apart
TOL = {"f64": dict(rtol=1e-10, atol=1e-12), "f32": dict(rtol=2e-5, atol=2e-6),
       "f16": dict(rtol=8e-3, atol=8e-3), "bf16": dict(rtol=6e-2, atol=6e-2)}

ENGINE = EngineAdapter("cpu")


def loss_weights(shape, seed=1234) -> np.ndarray:
    """gradcheck's fixed random weighting of an op's output, in +-[0.5, 1.5] (a plain sum
    would hide softmax's errors)."""
    return gradcheck_loss_weights(shape, seed)


def evaluate(build, *arrays) -> np.ndarray:
    """Forward value of build(*inputs) on the engine, the inputs set from `arrays`."""
    leaves = [engine.input_tensor(a.shape, a.dtype) for a in arrays]
    out = build(*leaves)
    for t, a in zip(leaves, arrays, strict=True):
        t.set(a)
    return engine.compute(out)[0]


def weighted_grads(build, arrays, w, params=None):
    """Gradients of sum(build(*leaves) * w) w.r.t. the leaves flagged in `params` (default:
    the float ones), by gradcheck's engine adapter on the CPU: None for the leaves not
    flagged, zeros for a flagged leaf the loss does not reach."""
    arrays = [np.asarray(a) for a in arrays]
    if params is None:
        params = [a.dtype.kind == "f" for a in arrays]
    inputs = tuple(InputSpec(f"x{i}", a.shape, dtype=dtype_name(a.dtype) if a.dtype.kind == "f"
                             else None, grad=bool(p))
                   for i, (a, p) in enumerate(zip(arrays, params, strict=True)))
    dtype = next((spec.dtype for spec in inputs if spec.dtype), "f64")
    case = FunctionCase("weighted_grads", build, tuple(arrays), inputs, dtype)
    return ENGINE.vjp(case, arrays, w).grads


def _output(sample, arrays):
    """The sample's output tensor on fresh inputs (its shape and dtype; nothing computed)."""
    return sample.build(*[engine.input_tensor(a.shape, a.dtype)
                          for a in sample.leaf_arrays(arrays)])


def _differentiated(sample, arrays, with_grad) -> bool:
    """Whether the sample's gradients are computed: asked for, a float output and a float
    input that is checked."""
    return (with_grad and _output(sample, arrays).dtype.kind == "f"
            and any(spec.grad and a.dtype.kind == "f"
                    for spec, a in zip(sample.inputs, arrays, strict=True)))


def _weights(sample, arrays) -> np.ndarray:
    return loss_weights(_output(sample, arrays).shape, sample.seed())


def run_engine(sample, arrays, with_grad=True):
    """Forward output and gradients of `sample` on the engine: gradcheck's vector-Jacobian
    product for its weighting, per input in the layout the op sees (None where not
    checked; None for every input when no gradient is computed)."""
    if not _differentiated(sample, arrays, with_grad):
        return evaluate(sample.build, *sample.leaf_arrays(arrays)), [None] * len(arrays)
    vjp = ENGINE.vjp(sample, arrays, _weights(sample, arrays))
    return vjp.output, vjp.grads


def _contiguous(sample, grad=True):
    """`sample` with every input contiguous in the layout the op sees (and, with grad=False,
    none differentiated): torch as a reference runs its plain paths, not its strided ones
    (torch's conv_transpose2d backward refuses a permuted weight)."""
    return dataclasses.replace(sample, inputs=tuple(
        dataclasses.replace(s, permute=None, slice=None, expand=None, grad=s.grad and grad)
        for s in sample.inputs))


def run_torch(sample, arrays, with_grad=True, float64=False):
    """The same from the op's torch equivalent under torch autograd, in the sample's dtypes
    (gradcheck's torch adapter, on contiguous inputs), with the same weighting; with
    float64, on the float inputs widened to float64 (the same values: the exact result of
    the sample's inputs to float64's precision, where torch computes in the inputs' dtype)."""
    given = arrays
    if float64:
        arrays = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]
    if not _differentiated(sample, given, with_grad):
        forward_only = _contiguous(sample, grad=False)
        return TorchAdapter().vjp(forward_only, arrays, None).output, [None] * len(arrays)
    vjp = TorchAdapter().vjp(_contiguous(sample), arrays, _weights(sample, given))
    # an expanded input's gradient is its leaf's, as the engine's is (InputSpec.view_gradient)
    return vjp.output, [None if g is None else spec.view_gradient(g)
                        for spec, g in zip(sample.inputs, vjp.grads, strict=True)]
