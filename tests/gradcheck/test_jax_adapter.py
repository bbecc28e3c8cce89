"""gradcheck's jax adapter (gradcheck.adapters.jax): registry ops pass in float32 and
float64 under jax.vjp; views, non-contiguous upstream gradients and dedicated backward ops
are unsupported rows that say why; a wrong jax rule fails; without jax, one line that says
how to install it."""

from __future__ import annotations

import dataclasses
import re
import sys

import numpy as np
import pytest

import gradcheck.adapters
from engine.registry import get_op
from gradcheck.adapters import AdapterError, get_adapter
from gradcheck.check import check_case, check_sample
from gradcheck.cli import main

MISSING = "jax is not installed: pip install 'gradverify[jax]'"
# op -> text every chosen case's string holds (its first such contiguous case is run)
OPS = {"tanh": "", "exp": "", "matmul": "", "softmax": "mask=", "conv_2d": "stride=2",
       "pool_2d": "mode=max", "norm": "", "rms_norm": "", "attention": "causal=True",
       "rope": "mode=neox", "get_rows": "", "swiglu": "a="}


@pytest.fixture(scope="module")
def adapter():
    pytest.importorskip("jax", reason=MISSING)
    return get_adapter("jax")


def _case(op: str, dtype: str, needle: str = ""):
    """The op's first registry case in `dtype` whose string holds `needle`, with no input
    view and a contiguous upstream gradient."""
    for case in get_op(op).samples():
        plain = case.cotangent == "contiguous" and not any(s.is_view for s in case.inputs)
        if case.dtype == dtype and needle in str(case) and plain:
            return case
    raise LookupError(f"no plain {dtype} case of {op} with {needle!r}")


def test_describe_names_jax_on_the_cpu(adapter):
    assert re.fullmatch(r"jax \S+ \(jax\.vjp on CPU, jit\)", adapter.describe())


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("op", list(OPS))
def test_registry_ops_pass_in_jax(adapter, op, dtype):
    case = _case(op, dtype, OPS[op])
    row = check_sample(case, adapter=adapter)
    assert row.status == "pass", (str(case), row.message)
    assert row.labels["engine"] == "jax" and row.metrics["forward"] == "agree"
    assert row.metrics["torch"] == "agree"


def test_the_output_and_gradients_are_the_cases_dtypes(adapter):
    case = _case("softmax", "f32", "sinks=")
    arrays = case.generate_inputs()
    weights = np.ones(tuple(arrays[0].shape))
    result = adapter.vjp(case, arrays, weights)
    assert result.output.dtype == np.float32
    assert [g.dtype if g is not None else None for g in result.grads] == \
        [np.float32 if s.grad else None for s in case.inputs]


def test_forward_mode_compiles_the_vjp_with_the_jvp_and_answers_the_same(adapter):
    fresh, plain = type(adapter)(), type(adapter)(jit=False)
    case = _case("softmax", "f32", "sinks=")
    arrays = case.generate_inputs()
    rng = np.random.default_rng(0)
    weights = rng.standard_normal(arrays[0].shape)
    tangents = [rng.standard_normal(a.shape).astype(a.dtype) if s.grad else None
                for s, a in zip(case.inputs, arrays, strict=True)]
    alone = fresh.vjp(case, arrays, weights)
    assert not any(key[0] == "vjp+jvp" for key in fresh._compiled)
    jvp = fresh.jvp(case, arrays, tangents)
    fused = fresh.vjp(case, arrays, weights)
    assert [key[0] for key in fresh._compiled].count("vjp+jvp") == 1
    np.testing.assert_allclose(jvp.tangent, plain.jvp(case, arrays, tangents).tangent,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fused.output, alone.output, rtol=1e-6)
    for a, b in zip(fused.grads, alone.grads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _tanh_doubled_tangent():
    """tanh whose JVP rule doubles the tangent, so its VJP (jax's transpose of it) doubles
    too: a wrong jax rule that both modes must catch."""
    import jax
    import jax.numpy as jnp

    @jax.custom_jvp
    def tanh(x):
        return jnp.tanh(x)

    @tanh.defjvp
    def _(primals, tangents):
        y = jnp.tanh(primals[0])
        return y, 2.0 * tangents[0] * (1.0 - y * y)
    return tanh


def test_a_wrong_rule_fails_both_modes_through_the_fused_function(adapter):
    class Wrong(type(adapter)):
        def function(self, case):
            return (_tanh_doubled_tangent() if case.op == "tanh"
                    else super().function(case))
    wrong = Wrong()
    wrong._forward_mode = True          # as after a first case in --ad both
    rows = check_case(_case("tanh", "f32"), "both", adapter=wrong)
    assert any(key[0] == "vjp+jvp" for key in wrong._compiled)
    assert [row.status for row in rows] == ["fail", "fail"], [r.message for r in rows]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_16_bit_cases_run(adapter, dtype):
    row = check_sample(_case("matmul", dtype), adapter=adapter)
    assert row.status == "pass", row.message


def test_views_and_strided_cotangents_are_not_applicable(adapter):
    view = next(c for c in get_op("tanh").samples() if any(s.is_view for s in c.inputs))
    row = check_sample(view, adapter=adapter)
    assert row.status == "unsupported"
    assert "not applicable: jax arrays have no strides" in row.message
    assert "x is a" in row.message
    permuted = dataclasses.replace(_case("tanh", "f32"), cotangent="permuted")
    row = check_sample(permuted, adapter=adapter)
    assert row.status == "unsupported" and "permuted upstream gradient" in row.message


def test_a_dedicated_backward_op_is_unsupported_naming_its_forward_op(adapter):
    row = check_sample(_case("softmax_back", "f32"), adapter=adapter)
    assert row.status == "unsupported"
    assert "dedicated backward op" in row.message and "softmax" in row.message


def test_an_op_without_a_jax_equivalent_is_unsupported(adapter):
    class Fewer(type(adapter)):
        def function(self, case):
            return None if case.op == "tanh" else super().function(case)
    row = check_sample(_case("tanh", "f32"), adapter=Fewer())
    assert row.status == "unsupported" and "no jax equivalent" in row.message


def _doubled_tanh():
    """tanh with a custom VJP that doubles the gradient: a wrong jax rule."""
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def tanh(x):
        return jnp.tanh(x)

    def forward(x):
        y = jnp.tanh(x)
        return y, y

    def backward(y, g):
        return (2.0 * g * (1.0 - y * y),)
    tanh.defvjp(forward, backward)
    return tanh


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_a_wrong_jax_rule_fails(adapter, dtype):
    class Wrong(type(adapter)):
        def function(self, case):
            return _doubled_tanh() if case.op == "tanh" else super().function(case)
    row = check_sample(_case("tanh", dtype), adapter=Wrong(jit=False))
    assert row.status == "fail", row.message
    assert row.metrics["forward"] == "agree"     # only the backward is wrong


def test_cli_runs_jax(adapter, capsys):
    assert main(["--engine", "jax", "--op", "exp", "--dtype", "f64", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "engine under test: jax" in err and "3 passed, 8 unsupported" in out


def test_without_jax_the_engine_is_one_line_saying_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "jax", None)          # `import jax` raises ImportError
    for name in [m for m in sys.modules if m.startswith("gradcheck.adapters.jax")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(gradcheck.adapters, "jax", raising=False)
    with pytest.raises(AdapterError, match=re.escape("pip install 'gradverify[jax]'")):
        get_adapter("jax")
    assert main(["--engine", "jax", "--op", "exp", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'gradverify[jax]'" in err and len(err.strip().splitlines()) == 1
