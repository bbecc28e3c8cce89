"""What the ggml adapter's tests share (test_ggml_adapter, test_ggml_16bit): the skip without
the libggml-python wheel, a registry sample by its printed form, and the check that ggml's
output and gradients of a case agree with our engine's."""

from __future__ import annotations

import importlib.util

import pytest

from engine.registry import get_op
from engine.samples import Sample
from gradcheck.adapters.engine_adapter import EngineAdapter, weighted_graph
from gradcheck.check import loss_weights
from gradcheck.numeric import compare

NEEDS_LIBGGML = pytest.mark.skipif(importlib.util.find_spec("libggml") is None,
                                   reason="the libggml-python wheel is not installed")


def sample(op: str, text: str) -> Sample:
    """The registry sample of `op` that prints as `text`."""
    for case in get_op(op).samples():
        if str(case) == text:
            return case
    raise LookupError(f"no sample {text} of {op}")


def assert_agrees(adapter, case, precision: str = "f32"):
    """ggml's output and gradients of `case` against our engine's, within `precision`'s
    tolerance (the case's 16-bit leaves are F16 tensors in ggml)."""
    assert adapter.unsupported(case) is None
    arrays = case.generate_inputs()
    _, out, _, _ = weighted_graph(case, arrays, as_params=True)
    weights = loss_weights(out.shape, case.seed())
    ours = EngineAdapter("cpu").vjp(case, arrays, weights)
    theirs = adapter.vjp(case, arrays, weights)
    assert theirs.output.shape == ours.output.shape
    assert compare(theirs.output, ours.output, precision).ok
    for spec, mine, got in zip(case.inputs, ours.grads, theirs.grads, strict=True):
        if mine is None:
            assert got is None, spec.name
            continue
        assert got.shape == spec.shape
        cmp = compare(got, mine, precision)
        assert cmp.ok and not cmp.nonfinite, (spec.name, cmp)
    assert not theirs.differs
