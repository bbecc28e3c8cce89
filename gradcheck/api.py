"""gradcheck for your own ops: check any function built from engine ops.

    import numpy as np
    from engine import ops
    from gradcheck.api import check_function, assert_gradients

    def swish(x, beta):
        return ops.mul(x, ops.sigmoid(ops.mul(x, beta)))

    x = np.random.default_rng(0).normal(size=(4, 5))
    beta = np.full((5,), 1.5)
    result = check_function(swish, [x, beta], torch_fn=lambda x, b: x * (x * b).sigmoid())
    print(result.status, result.metrics["max_abs_err"])

    def test_swish():                        # in your own pytest suite
        assert_gradients(swish, [x, beta])

The result is the same record `gradcheck --op` produces (numerical float64 reference,
kinks, tolerances by dtype, optional torch agreement, modes).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from engine.samples import InputSpec
from engine.tensor import dtype_name
from gradcheck.check import check_sample
from reports import Result


@dataclasses.dataclass(frozen=True)
class FunctionCase:
    """A case made of a user's build function and fixed input arrays (Sample's interface)."""

    name: str
    build_fn: Callable
    arrays: tuple
    inputs: tuple
    dtype: str
    torch_fn: Callable | None = None
    registered = False

    @property
    def op(self) -> str:
        return self.name.split("(", 1)[0]

    @property
    def precision(self) -> str:
        return "f32" if any(i.dtype == "f32" for i in self.inputs) or self.dtype == "f32" \
            else "f64"

    @property
    def torch_kwargs(self) -> dict:
        return {}

    def promoted(self, dtype="f64") -> FunctionCase:
        inputs = tuple(dataclasses.replace(i, dtype=dtype) if i.dtype in ("f32", "f64") else i
                       for i in self.inputs)
        return dataclasses.replace(self, inputs=inputs, dtype=dtype)

    def seed(self) -> int:
        return int.from_bytes(hashlib.sha256(self.name.encode()).digest()[:8], "little")

    def generate_inputs(self) -> list[np.ndarray]:
        return [np.array(a, copy=True) for a in self.arrays]

    def leaf_arrays(self, arrays):
        return list(arrays)

    def build(self, *leaves):
        return self.build_fn(*leaves)

    def __str__(self) -> str:
        return self.name


def check_function(build: Callable, arrays: Sequence, *, grad: Sequence[bool] | None = None,
                   torch_fn: Callable | None = None, name: str | None = None,
                   mode: str = "auto", backend: str = "cpu") -> Result:
    """Check the backward pass of `build(*tensors)`, an engine expression of its inputs,
    at the given input arrays (float32 or float64; integer arrays are constants).

    grad: which inputs to differentiate (default: every float input). torch_fn: the same
    function written in torch, taking float64 torch tensors, for three-way agreement."""
    arrays = tuple(np.asarray(a) for a in arrays)
    if not arrays:
        raise ValueError("check_function needs at least one input array")
    floats = [a for a in arrays if a.dtype.kind == "f"]
    if not floats:
        raise ValueError("check_function needs a float input to differentiate")
    grad = [a.dtype.kind == "f" for a in arrays] if grad is None else list(grad)
    if len(grad) != len(arrays):
        raise ValueError(f"grad has {len(grad)} flags for {len(arrays)} inputs")
    inputs = tuple(InputSpec(f"x{i}", a.shape, dtype=dtype_name(a.dtype), grad=bool(g))
                   for i, (a, g) in enumerate(zip(arrays, grad, strict=True)))
    fn_name = name or getattr(build, "__name__", "function")
    shapes = ",".join(f"{i.name}=[{','.join(map(str, i.shape))}]" for i in inputs)
    case = FunctionCase(f"{fn_name}({shapes})", build, arrays, inputs,
                        dtype_name(floats[0].dtype), torch_fn)
    return check_sample(case, mode=mode, backend=backend)


def assert_gradients(build: Callable, arrays: Sequence, **kwargs) -> Result:
    """check_function, raising AssertionError with gradcheck's verdict unless it passes
    (for use in your own pytest suites)."""
    result = check_function(build, arrays, **kwargs)
    if result.status != "pass":
        raise AssertionError(f"gradcheck {result.status}: {result.name}: {result.message}")
    return result
