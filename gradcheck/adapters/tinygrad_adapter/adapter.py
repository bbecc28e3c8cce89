"""TinygradAdapter: one gradcheck case as tinygrad Tensor code, differentiated by tinygrad.

For a case with inputs x_i and the op's tinygrad code y = f(x_1, ...) (ops.py, nn.py;
backward.py for the dedicated backward ops), the VJP is tinygrad's autodiff with the case's
weights as the upstream gradient:

    grads = y.gradient(x_1, ..., gradient=w)        w: the weights, in y's dtype

(tinygrad's Tensor.gradient, which returns zeros for an input no gradient reaches, as for
sgn and step), realized together with y in one schedule on tinygrad's CPU device
(device.py: clang-compiled kernels, cached on disk). Inputs are tinygrad tensors made from
the case's values in their own dtypes (float16, float32, float64; int32 indices), so a mixed
case (matmul of a float16 a and a float32 b) is computed as tinygrad promotes it.

What does not apply: tinygrad tensors have no strides a user can set. A permute, slice or
expand is a movement op that tinygrad folds into the index arithmetic of the kernels that
read it, and an upstream gradient is a tensor like any other, so the registry's input
views (perm[...], slice[...], expand[...]) and non-contiguous cotangent layouts have no
tinygrad counterpart: such cases are `unsupported`, saying so. bfloat16 cases run where
the CPU device can compile a bfloat16 kernel (one is tried); where it cannot, they are
unsupported with the compiler's message.

tinygrad raises Python exceptions for its failures (a compiler's error included), so the
adapter runs in gradcheck's own process (`isolated` False).
"""

from __future__ import annotations

import numpy as np

from engine.tensor import is_float
from gradcheck.adapters.base import VJP
from gradcheck.adapters.tinygrad_adapter import device as tg_device
from gradcheck.adapters.tinygrad_adapter.backward import BACKWARD, FORWARD

# ops of the registry that the adapter does not run, and why
NOT_MAPPED = {
    "argmax": "an integer output (argmax is not differentiated)",
}


def _view_of(spec) -> str | None:
    for kind in ("permute", "slice", "expand"):
        if getattr(spec, kind, None):
            return kind
    return None


class TinygradAdapter:
    """gradcheck's adapter for tinygrad's autodiff on its CPU device.

    device: "CPU" (clang-compiled kernels) or "PYTHON" (tinygrad's interpreter, no
    compiler); None: CPU when clang is on PATH, else PYTHON. A missing tinygrad or a CPU
    device without clang raises AdapterError in one line."""

    name = "tinygrad"
    isolated = False
    backend = "cpu"

    def __init__(self, device: str | None = None):
        self.tinygrad = tg_device.import_tinygrad()
        self.device = tg_device.choose_device(device)
        tg_device.keep_programs(self._version())

    def describe(self) -> str:
        from tinygrad import helpers
        where = (f"CPU device, kernels compiled by {tg_device.compiler()}"
                 if self.device == "CPU" else
                 "PYTHON device: no clang on PATH, tinygrad's interpreter (slow)")
        return (f"tinygrad {self._version()} (autodiff, {where}; kernel cache "
                f"{helpers.CACHEDB})")

    def _version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("tinygrad")
        except PackageNotFoundError:
            return "unknown"

    def function(self, case):
        """The tinygrad code of `case`'s op (None where there is none)."""
        return BACKWARD.get(case.op) or FORWARD.get(case.op)

    def unsupported(self, case) -> str | None:
        if case.op in NOT_MAPPED:
            return f"tinygrad adapter: {case.op} is not run: {NOT_MAPPED[case.op]}"
        if self.function(case) is None:
            return f"tinygrad adapter: no tinygrad code for op {case.op}"
        for name in sorted(case.float_dtypes):
            problem = tg_device.dtype_problem(self.device, name)
            if problem:
                return (f"tinygrad's {self.device} device cannot compute in {name} here: "
                        f"its kernel does not compile ({problem})")
        for spec in case.inputs:
            kind = _view_of(spec)
            if kind:
                return (f"not applicable: input {spec.name} is a {kind} view of its leaf, "
                        "and tinygrad tensors have no user-visible strides (a view is index "
                        "arithmetic fused into the kernels, as for a contiguous input)")
        cotangent = getattr(case, "cotangent", "contiguous")
        if cotangent != "contiguous":
            return (f"not applicable: a {cotangent} cotangent layout; tinygrad's upstream "
                    "gradient is a tensor without user-visible strides")
        return None

    def _tensors(self, case, arrays):
        from tinygrad import Tensor
        # np.array, not np.ascontiguousarray, which makes a 0-d array 1-d
        return [Tensor(np.array(a, order="C"), device=self.device) for a in arrays]

    def _output(self, case, tensors):
        return self.function(case)(*tensors, **dict(getattr(case, "kwargs", {})))

    def forward(self, case, arrays) -> np.ndarray:
        """The case's output alone (a dedicated backward op's, through backward.py)."""
        why = self.unsupported(case)
        if why:
            raise ValueError(f"tinygrad cannot run {case}: {why}")
        return self._output(case, self._tensors(case, arrays)).numpy().copy()

    def vjp(self, case, arrays, weights) -> VJP:
        """tinygrad's gradient of sum(f(*inputs) * weights), in the inputs' dtypes."""
        from tinygrad import Tensor
        why = self.unsupported(case)
        if why:
            raise ValueError(f"tinygrad cannot run {case}: {why}")
        tensors = self._tensors(case, arrays)
        out = self._output(case, tensors)
        checked = [i for i, (spec, a) in enumerate(zip(case.inputs, arrays, strict=True))
                   if spec.grad and is_float(np.asarray(a).dtype)]
        grads: list = [None] * len(tensors)
        if checked and out.is_floating_point():
            w = np.asarray(weights, np.float64).reshape(tuple(out.shape))
            upstream = Tensor(w, device=self.device).cast(out.dtype)
            found = out.gradient(*(tensors[i] for i in checked), gradient=upstream)
            Tensor.realize(out, *found)
            for i, g in zip(checked, found, strict=True):
                grads[i] = g.numpy().copy()
        return VJP(out.numpy().copy(), grads)
