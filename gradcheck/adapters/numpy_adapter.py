"""A forward and a vector-Jacobian product written by hand on numpy arrays, as an engine.

    forward(*arrays) -> output
    vjp(cotangent, *arrays) -> one gradient per input (None for an input not checked)

where vjp returns J^T cotangent: the gradient of sum(forward(*arrays) * cotangent) with
respect to each input. See gradcheck.api.check_numpy. A case's input views reach forward and
vjp as numpy views (sliced: an offset and strides; expanded: stride 0, read-only); the
gradient of each element is gathered into its leaf's by gradcheck (the adapter does not set
`leaf_gradients`, see gradcheck.adapters.base).

With `jvp`, a hand-written Jacobian-vector product too, for forward mode:
    jvp(tangents, *arrays) -> J t, the derivative of the output along `tangents` (one per
    input, None for an input held constant), shaped like the output.
Without it the adapter has no `jvp` and gradcheck says so (gradcheck.derivatives).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.tensor import is_float
from gradcheck.adapters.base import JVP, VJP, cotangent_view


class NumpyAdapter:
    name = "numpy"
    isolated = False
    backend = "cpu"

    def __init__(self, forward: Callable, vjp: Callable, jvp: Callable | None = None):
        if not callable(forward) or not callable(vjp):
            raise TypeError("NumpyAdapter needs a forward and a vjp callable, got "
                            f"{type(forward).__name__} and {type(vjp).__name__}")
        if jvp is not None and not callable(jvp):
            raise TypeError(f"NumpyAdapter's jvp must be callable, got {type(jvp).__name__}")
        self.forward, self.backward, self._jvp = forward, vjp, jvp
        if jvp is not None:
            self.jvp = self._forward_mode

    def describe(self) -> str:
        def name(f):
            return getattr(f, "__name__", repr(f))
        return f"numpy {np.__version__} (forward {name(self.forward)}, vjp {name(self.backward)})"

    def unsupported(self, case) -> str | None:
        return None

    def vjp(self, case, arrays, weights) -> VJP:
        arrays = [_view(spec, np.asarray(a)) for spec, a in zip(case.inputs, arrays,
                                                                  strict=True)]
        out = np.asarray(self.forward(*arrays))
        cotangent = np.asarray(weights).reshape(out.shape)
        if is_float(out.dtype):
            cotangent = cotangent.astype(out.dtype)
        # the case's layout: a transposed or a read-only stride-0 view (engine.samples)
        cotangent = cotangent_view(cotangent, getattr(case, "cotangent", "contiguous"))
        grads = self.backward(cotangent, *arrays)
        if isinstance(grads, np.ndarray) and len(case.inputs) == 1:
            grads = [grads]
        grads = list(grads)
        if len(grads) != len(case.inputs):
            raise ValueError(f"vjp returned {len(grads)} gradients for {len(case.inputs)} "
                             "inputs")
        return VJP(out, [None if g is None or not spec.grad else np.asarray(g)
                         for spec, g in zip(case.inputs, grads, strict=True)])


    def _forward_mode(self, case, arrays, tangents) -> JVP:
        """The output and the hand-written J t (see the module doc)."""
        arrays = [_view(spec, np.asarray(a)) for spec, a in zip(case.inputs, arrays,
                                                                  strict=True)]
        tangents = [None if t is None else _view(spec, np.asarray(t))
                    for spec, t in zip(case.inputs, tangents, strict=True)]
        return JVP(np.asarray(self.forward(*arrays)),
                   np.asarray(self._jvp(tangents, *arrays)))


def _view(spec, value: np.ndarray) -> np.ndarray:
    """The input as the numpy view the op sees (engine.samples.InputSpec): of its leaf
    stored in another axis order, sliced out of a larger leaf (an offset and strides) or
    expanded from a smaller one (stride 0, read-only)."""
    if not getattr(spec, "is_view", False):
        return value
    return spec.from_leaf(spec.to_leaf(value))

