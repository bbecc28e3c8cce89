"""The tinygrad adapter: registry cases through tinygrad's autodiff on its CPU device, the
upstream gradient it is handed, the rows it cannot run, and a wrong rule caught.

Skipped, saying why, where tinygrad or clang (its CPU device's compiler) is missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from engine.registry import get_op
from engine.samples import InputSpec, Sample
from gradcheck.check import check_sample

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("tinygrad") is None,
                       reason="tinygrad is not installed (pip install '.[tinygrad]')"),
    pytest.mark.skipif(shutil.which("clang") is None,
                       reason="clang is missing: tinygrad's CPU device compiles with it"),
]


@pytest.fixture(scope="module")
def adapter():
    from gradcheck.adapters import get_adapter
    return get_adapter("tinygrad")


def first_case(adapter, op: str, dtype: str = "f32"):
    """The first registry case of `op` in `dtype` that the adapter runs."""
    return next(c for c in get_op(op).samples()
                if c.dtype == dtype and adapter.unsupported(c) is None)


def test_it_is_registered_and_describes_itself(adapter):
    assert adapter.name == "tinygrad" and adapter.isolated is False
    text = adapter.describe()
    assert text.startswith("tinygrad 0.14.0 (autodiff, CPU device") and "cache.db" in text


def test_the_compile_workers_are_pointed_at_the_same_kernel_cache(tmp_path):
    # tinygrad lowers and compiles in spawned processes, which read CACHEDB from the
    # environment: without it there, their compiled kernels went to ~/.cache/tinygrad
    env = {k: v for k, v in os.environ.items() if k != "CACHEDB"}
    env["GRADVERIFY_CACHE"] = str(tmp_path)
    code = ("import os; from gradcheck.adapters.tinygrad_adapter.device import "
            "import_tinygrad; import_tinygrad(); import tinygrad.helpers as h; "
            "print(os.environ['CACHEDB'] == h.CACHEDB, h.CACHEDB)")
    said = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True).stdout.split()
    assert said == ["True", str(tmp_path / "tinygrad" / "cache.db")]


@pytest.mark.parametrize("op", ["exp", "tanh", "matmul", "softmax", "conv_2d", "pool_2d",
                                "norm", "rms_norm"])
def test_registry_cases_pass_in_float32(adapter, op):
    case = first_case(adapter, op)
    result = check_sample(case, adapter=adapter, use_torch=False)
    assert result.status == "pass", result.message


def test_a_dedicated_backward_op_is_tinygrads_vjp_of_its_forward(adapter):
    case = first_case(adapter, "softmax_sink_back")
    assert check_sample(case, adapter=adapter, use_torch=False).status == "pass"


def test_the_upstream_gradient_is_the_weights(adapter):
    """mul's gradients are w * b and w * a: with all-ones weights they would be b and a."""
    case = Sample.make("mul", [InputSpec("a", (3, 4)), InputSpec("b", (3, 4))], "f32")
    a, b = case.generate_inputs()
    w = np.arange(12, dtype=np.float64).reshape(3, 4) - 5.5
    vjp = adapter.vjp(case, [a, b], w)
    np.testing.assert_allclose(vjp.output, a * b, rtol=1e-6)
    np.testing.assert_allclose(vjp.grads[0], w * b, rtol=1e-6)
    np.testing.assert_allclose(vjp.grads[1], w * a, rtol=1e-6)
    assert not np.allclose(vjp.grads[0], b)


def test_unsupported_rows_carry_their_reasons(adapter):
    view = Sample.make("exp", [InputSpec("x", (3, 4, 5), permute=(2, 0, 1))], "f32")
    assert "not applicable" in adapter.unsupported(view)
    assert "no user-visible strides" in adapter.unsupported(view)
    plain = Sample.make("exp", [InputSpec("x", (2, 3))], "f32")
    import dataclasses
    permuted = dataclasses.replace(plain, cotangent="permuted")
    assert "not applicable" in adapter.unsupported(permuted)
    assert "argmax" in adapter.unsupported(Sample.make("argmax", [InputSpec("x", (4,))]))
    result = check_sample(view, adapter=adapter, use_torch=False)
    assert result.status == "unsupported" and "not applicable" in result.message


def test_bfloat16_runs_or_says_why(adapter):
    from gradcheck.adapters.tinygrad_adapter.device import dtype_problem
    case = Sample.make("exp", [InputSpec("x", (2, 3))], "bf16")
    why = adapter.unsupported(case)
    assert (why is None) == (dtype_problem(adapter.device, "bf16") is None)
    if why:
        assert "bf16" in why and "does not compile" in why


class WrongExp:
    """A deliberately wrong rule: exp's forward, but the gradient of x (1, not e^x)."""

    def __call__(self, x):
        return x.exp().detach() + x - x.detach()


def test_a_wrong_rule_fails(adapter):
    from gradcheck.adapters.tinygrad_adapter import TinygradAdapter

    class Wrong(TinygradAdapter):
        def function(self, case):
            return WrongExp() if case.op == "exp" else super().function(case)

    case = first_case(adapter, "exp")
    result = check_sample(case, adapter=Wrong(), use_torch=False)
    assert result.status == "fail"
    assert check_sample(case, adapter=adapter, use_torch=False).status == "pass"


def test_a_missing_tinygrad_is_one_line(monkeypatch):
    import builtins

    from checkkit.loading import AdapterError
    from gradcheck.adapters.tinygrad_adapter import device

    real = builtins.__import__

    def no_tinygrad(name, *args, **kwargs):
        if name == "tinygrad" or name.startswith("tinygrad."):
            raise ImportError("No module named 'tinygrad'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tinygrad)
    with pytest.raises(AdapterError) as err:
        device.import_tinygrad()
    assert "pip install" in str(err.value) and "\n" not in str(err.value)


def test_a_missing_clang_is_one_line(monkeypatch):
    from checkkit.loading import AdapterError
    from gradcheck.adapters.tinygrad_adapter import device

    monkeypatch.setattr(device.shutil, "which", lambda name: None)
    with pytest.raises(AdapterError) as err:
        device.choose_device("CPU")
    assert "clang" in str(err.value) and "\n" not in str(err.value)
    assert device.choose_device(None) == "PYTHON"


def test_a_zero_dimensional_input_keeps_its_shape(adapter):
    """A 0-d input's gradient is 0-d (np.ascontiguousarray would have made it 1-d)."""
    case = Sample.make("add", [InputSpec("a", ()), InputSpec("b", (3, 2))], "f32")
    a, b = case.generate_inputs()
    w = np.linspace(-1.0, 1.0, 6).reshape(3, 2)
    vjp = adapter.vjp(case, [a, b], w)
    assert vjp.grads[0].shape == () and np.isclose(vjp.grads[0], w.sum(), rtol=1e-6)
