"""Engines as adapters: ours keeps its verdicts, torch passes on the registry, hand-written
numpy VJPs and custom torch Functions are judged, and a bad engine name is a clear error."""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest

from engine.registry import get_op
from gradcheck.adapters import AdapterError, AdapterSpec, get_adapter, spec_of
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.adapters.numpy_adapter import NumpyAdapter
from gradcheck.adapters.torch_adapter import TorchAdapter
from gradcheck.api import assert_numpy, assert_torch, check_numpy, check_torch
from gradcheck.check import check_sample
from gradcheck.repro import repro_command
from tests.gradcheck.abort_adapter import CRASH_CASE, WrongAdapter
from tests.refusals import refusal_test

OPS = ("relu", "softmax", "pool_2d", "conv_2d", "cross_entropy_loss", "matmul")


def smallest(op: str, dtype: str, n: int = 1):
    cases = [s for s in get_op(op).samples() if s.dtype == dtype]
    return sorted(cases, key=lambda s: sum(np.prod(i.shape) for i in s.inputs))[:n]


@pytest.mark.parametrize("op", OPS)
def test_engine_adapter_gives_the_default_verdicts(op):
    for case in smallest(op, "f32"):
        default, explicit = check_sample(case), check_sample(case, adapter=EngineAdapter())
        assert default.status == explicit.status == "pass", default.message
        assert default.labels == explicit.labels and "engine" not in default.labels
        for key in ("checked", "kinks", "max_abs_err", "worst", "forward", "torch"):
            assert default.metrics[key] == explicit.metrics[key]


def test_injected_bug_belongs_to_the_engine_adapter():
    (case,) = smallest("relu", "f64")
    r = check_sample(case, adapter=EngineAdapter("cpu", "scale:1.01"))
    assert r.status == "fail" and "backprop of x is off" in r.message
    with pytest.raises(ValueError, match="our engine only"):
        check_sample(case, inject="scale:1.01", adapter=TorchAdapter())
    with pytest.raises(ValueError, match="unknown mutation"):
        EngineAdapter("cpu", "flip")


@pytest.mark.parametrize("op", OPS)
def test_torch_adapter_passes_on_the_registry_cases(op):
    for case in smallest(op, "f32", 2) + smallest(op, "f64"):
        r = check_sample(case, adapter=TorchAdapter())
        assert r.status == "pass", f"{case}: {r.message}"
        assert r.labels["engine"] == "torch" and r.metrics["forward"] == "agree"


def test_torch_adapter_views_permuted_inputs():
    (case,) = [s for s in get_op("relu").samples() if s.inputs[0].permute and s.dtype == "f32"]
    assert check_sample(case, adapter=TorchAdapter()).status == "pass"


def test_a_wrong_engine_fails_and_an_op_it_lacks_is_unsupported():
    (case,) = [s for s in get_op("relu").samples() if str(s) == CRASH_CASE]
    r = check_sample(case, adapter=WrongAdapter())
    assert r.status == "fail" and "backprop of x is off" in r.message
    assert r.labels["engine"] == "wrong" and r.metrics["forward"] == "agree"
    (soft,) = smallest("softmax", "f64")
    u = check_sample(soft, adapter=WrongAdapter())
    assert u.status == "unsupported" and "only relu, not softmax" in u.message


class _TransposedGradient(WrongAdapter):
    def vjp(self, case, arrays, weights):
        v = super().vjp(case, arrays, weights)
        v.grads = [g.T for g in v.grads]
        return v


def test_an_answer_of_the_wrong_shape_is_an_error_naming_it():
    (case,) = [s for s in get_op("relu").samples() if str(s) == CRASH_CASE]
    r = check_sample(case, adapter=_TransposedGradient())
    assert r.status == "error"
    assert "gradient of x has shape [4, 3], the input [3, 4]" in r.message


# --- numpy forward/VJP pairs -------------------------------------------------------------

def _x(dtype=np.float64):
    rng = np.random.default_rng(1)
    return rng.uniform(-2, 2, (3, 5)).astype(dtype)


def _tanh_vjp(w, x):
    return [w * (1 - np.tanh(x) ** 2)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_right_vjp_passes(dtype):
    r = assert_numpy(np.tanh, _tanh_vjp, [_x(dtype)], torch_fn=lambda x: x.tanh())
    assert r.labels["engine"] == "numpy" and r.metrics["torch"] == "agree"
    assert r.labels["dtype"] == ("f32" if dtype == np.float32 else "f64")


def test_numpy_wrong_vjp_fails_as_backprop():
    r = check_numpy(np.tanh, lambda w, x: [w * (1 - np.tanh(x) ** 2) * 1.01], [_x()])
    assert r.status == "fail" and r.metrics["forward"] == "agree"
    assert "numerical: x 15/15 off" in r.message.replace("x0 ", "x ")  # numpy<2: no signature
    with pytest.raises(AssertionError, match="gradcheck fail"):
        assert_numpy(np.tanh, lambda w, x: [w * 0.5], [_x()])


def test_numpy_wrong_forward_is_caught_against_the_reference():
    r = check_numpy(lambda x: np.tanh(x) + 1e-3, _tanh_vjp, [_x()], reference=np.tanh)
    assert r.status == "fail" and r.metrics["forward"] == "off"
    assert r.message.startswith("forward: output differs from the float64 reference")


def test_numpy_vjp_with_unchecked_and_integer_inputs():
    def scale_rows(x, idx):
        return x[idx] * 2.0

    def vjp(w, x, idx):
        g = np.zeros_like(x)
        np.add.at(g, idx, 2.0 * w)
        return [g, None]
    r = check_numpy(scale_rows, vjp, [_x(), np.array([2, 0, 2])])
    assert r.status == "pass", r.message
    assert r.metrics["checked"] == 15


class _DecliningNumpy(NumpyAdapter):
    """mul(a, b) whose VJP gives a's gradient and, for b, a wrong one it declines."""

    def __init__(self, declines):
        super().__init__(np.multiply, lambda w, a, b: [w * b, w * a * 7.0])
        self.declines = declines

    def declined(self, case) -> dict[str, str]:
        return self.declines


def _mul_case():
    return next(s for s in get_op("mul").samples() if str(s) == "mul(type=f64,a=[3,4],b=[3,4])")


def test_a_declined_gradient_is_not_checked_and_the_row_says_so():
    r = check_sample(_mul_case(), adapter=_DecliningNumpy({"b": "no backward for b here"}),
                     use_torch=False)
    assert r.status == "pass" and r.metrics["checked"] == 12
    assert r.metrics["declined"] == "b: no backward for b here"
    assert r.message == "declined (not checked): b: no backward for b here"


def test_a_failure_on_the_checked_inputs_still_names_the_declined_one():
    adapter = _DecliningNumpy({"a": "declined a"})      # b's gradient (off by 7x) is checked
    r = check_sample(_mul_case(), adapter=adapter, use_torch=False)
    assert r.status == "fail" and r.message.startswith("numerical: b 12/12 off")
    assert r.message.endswith("; declined (not checked): a: declined a")


def test_declining_every_checked_input_is_unsupported_and_an_unknown_name_an_error():
    both = _DecliningNumpy({"a": "no a", "b": "no b"})
    r = check_sample(_mul_case(), adapter=both, use_torch=False)
    assert r.status == "unsupported" and r.metrics["declined"] == "a: no a; b: no b"
    assert "declines the gradient of every checked input" in r.message
    r = check_sample(_mul_case(), adapter=_DecliningNumpy({"c": "?"}), use_torch=False)
    assert r.status == "error"
    assert "declined the gradient of 'c', not an input of the case (inputs: a, b)" in r.message


# --- torch callables and custom Functions ------------------------------------------------

def _cube_function(factor: float):
    import torch

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * factor * x ** 2
    return Cube.apply


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_custom_torch_function_right_backward_passes(dtype):
    r = assert_torch(_cube_function(3.0), [_x(dtype)], name="cube")
    assert r.name == "cube(x=[3,5])" and r.labels["engine"] == "torch"


def test_custom_torch_function_wrong_backward_fails():
    r = check_torch(_cube_function(2.0), [_x()], name="cube")
    assert r.status == "fail" and r.metrics["forward"] == "agree"
    assert "numerical: x 15/15 off" in r.message             # Cube.forward(ctx, x)


def test_torch_callable_with_a_reference_checks_its_forward():
    import torch
    good = check_torch(lambda x, y: x * y.sigmoid(), [_x(), _x()[0]])
    assert good.status == "pass", good.message
    off = check_torch(lambda x: torch.tanh(x) * 1.001, [_x()], reference=torch.tanh)
    assert off.status == "fail" and off.metrics["forward"] == "off"


# --- the registry of engines -------------------------------------------------------------

test_bad_engine_names_are_clear_errors = refusal_test(get_adapter, AdapterError, [
    ("tensorflow", "unknown engine 'tensorflow'; known: engine, torch, numpy, ggml"),
    ("no_such_module:Adapter", "cannot import no_such_module"),
    ("tests.gradcheck.abort_adapter:Nope", "has no attribute 'Nope'"),
    ("tests.gradcheck.abort_adapter:relu_vjp", "cannot be set up"),
    ("numpy:ndarray", "cannot be set up|is not an adapter"),
    ("tests.gradcheck.abort_adapter:CRASH_CASE", "is not an adapter"),
    (":Adapter", "expected module:attribute"),
])


def test_get_adapter_records_the_spec_that_rebuilds_it():
    a = get_adapter("tests.gradcheck.abort_adapter:WrongAdapter")
    assert spec_of(a) == AdapterSpec("tests.gradcheck.abort_adapter:WrongAdapter")
    assert type(spec_of(a).build()) is type(a)
    assert spec_of(EngineAdapter("cuda")) == AdapterSpec("engine", (("backend", "cuda"),))
    assert spec_of(WrongAdapter()).name == "tests.gradcheck.abort_adapter:WrongAdapter"
    with pytest.raises(AdapterError, match="cannot be set up with options"):
        get_adapter("engine", device=3)


def test_ggml_is_imported_only_when_asked_for(monkeypatch):
    made = []

    class FakeGgml:
        name, isolated = "ggml", True

        def __init__(self, lib_dir=None):
            made.append(lib_dir)

        def describe(self):
            return "ggml 0.0 (fake)"

        def unsupported(self, case):
            return None

        def vjp(self, case, arrays, weights):
            raise NotImplementedError

    monkeypatch.setitem(sys.modules, "gradcheck.adapters.ggml",
                        types.SimpleNamespace(GgmlAdapter=FakeGgml))
    a = get_adapter("ggml", lib_dir="/opt/ggml/lib")
    assert made == ["/opt/ggml/lib"] and spec_of(a) == AdapterSpec(
        "ggml", (("lib_dir", "/opt/ggml/lib"),))
    (case,) = smallest("pool_2d", "f32")
    assert repro_command(case, a) == \
        f"gradcheck --engine ggml --ggml-lib /opt/ggml/lib --op pool_2d -k '{case}'"
    code = ("import sys, gradcheck.cli, gradcheck.api, checkkit.worker; "
            "assert 'gradcheck.adapters.ggml' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
