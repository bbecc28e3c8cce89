"""Every registry op, forward and backward, against torch in float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest

from engine.registry import all_ops
from tests.engine.ops.op_harness import TOL, run_engine, run_torch

OPS = all_ops()
SAMPLES = [s for op in OPS.values() if op.samples for s in op.samples()]


def test_every_op_has_backward_or_reason_and_samples():
    for name, op in OPS.items():
        assert op.differentiable or op.no_grad, name
        if op.kind not in ("backward", "update"):   # update ops: optcheck checks them
            assert op.samples and op.samples(), f"op {name} has no sample cases"
            assert op.torch is not None, f"op {name} has no torch reference"


def test_every_op_with_a_kernel_has_one_on_every_backend():
    """An op added with a CPU kernel must come with its CUDA kernel (named, resolved lazily)."""
    missing = [name for name, op in OPS.items()
               if op.kind not in ("view", "composite") and set(op.kernels) != {"cpu", "cuda"}]
    assert not missing, f"ops without a cpu and a cuda kernel: {missing}"


@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_forward_matches_torch(sample):
    arrays = sample.generate_inputs()
    got, _ = run_engine(sample, arrays, with_grad=False)
    want, _ = run_torch(sample, arrays, with_grad=False)
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, **TOL[sample.precision])


@pytest.mark.parametrize("sample", [s for s in SAMPLES if OPS[s.op].differentiable], ids=str)
def test_backward_matches_torch(sample):
    arrays = sample.generate_inputs()
    _, got = run_engine(sample, arrays)
    _, want = run_torch(sample, arrays)
    for spec, g, w in zip(sample.inputs, got, want, strict=True):
        if w is None:
            continue
        assert g is not None, f"no gradient for input {spec.name}"
        np.testing.assert_allclose(g, w, **TOL[sample.precision], err_msg=f"input {spec.name}")
