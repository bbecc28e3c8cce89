"""The Python API for people's own functions, and the pytest helper."""

from __future__ import annotations

import numpy as np
import pytest

from engine import ops
from gradcheck.api import assert_gradients, check_function


def softsign_ish(x, w):
    return ops.div(ops.mul(x, w), ops.add(ops.abs(x), 1.0))


def arrays():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.2, 1.0, (4, 5)) * rng.choice([-1.0, 1.0], (4, 5))
    return [x, rng.uniform(0.5, 1.5, (5,))]


def test_correct_function_passes_three_ways():
    r = check_function(softsign_ish, arrays(),
                       torch_fn=lambda x, w: x * w / (x.abs() + 1))
    assert r.status == "pass", r.message
    assert r.metrics["torch"] == "agree" and r.name.startswith("softsign_ish(")


def test_wrong_torch_reference_is_named():
    r = check_function(softsign_ish, arrays(), torch_fn=lambda x, w: x * w / (x.abs() + 2))
    assert r.status == "fail" and "torch" in r.message


def test_float32_inputs_use_float32_tolerances():
    x, w = arrays()
    r = check_function(softsign_ish, [x.astype(np.float32), w.astype(np.float32)])
    assert r.status == "pass" and r.labels["dtype"] == "f32"


def test_grad_flags_exclude_inputs():
    r = check_function(softsign_ish, arrays(), grad=[True, False])
    assert r.status == "pass" and r.metrics["checked"] == 20


def test_assert_gradients_raises_on_a_wrong_backward():
    # a hand-written "op" whose forward and backward disagree: x * stop_gradient-like trick
    def wrong(x):
        return ops.add(ops.mul(x, x), ops.sub(ops.sgn(x), ops.sgn(x)))
    assert_gradients(wrong, [arrays()[0]])
    with pytest.raises(AssertionError, match="gradcheck fail"):
        from gradcheck.injection import injected
        with injected("scale:1.05", {"mul"}):
            assert_gradients(lambda x: ops.mul(x, x), [arrays()[0]])


def test_bad_arguments():
    with pytest.raises(ValueError, match="float input"):
        check_function(lambda i: i, [np.arange(3, dtype=np.int32)])
    with pytest.raises(ValueError, match="flags"):
        check_function(softsign_ish, arrays(), grad=[True])
