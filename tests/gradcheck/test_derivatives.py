"""Forward mode and second order (gradcheck.derivatives): the nested numerics, the adjoint
identity, the rows of ours, torch, jax and numpy JVPs, the API, the command line, the
pytest plugin and the self-test's mutants of the new modes."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import ops
from engine.registry import get_op
from gradcheck.api import check_function, check_numpy, check_torch
from gradcheck.check import check_case, check_derivative
from gradcheck.cli import main
from gradcheck.derivatives import adjoint_check
from gradcheck.generated import generated_results
from gradcheck.mode_mutants import MODE_MUTANTS, run_mode_mutant
from gradcheck.numeric import hessian_vector
from gradcheck.request import GradcheckRequest

torch = pytest.importorskip("torch")


def _case(op: str, dtype: str = "f64", needle: str = ""):
    return next(s for s in get_op(op).samples() if s.dtype == dtype and needle in str(s)
                and s.cotangent == "contiguous" and not any(i.is_view for i in s.inputs))


# --- numerics -----------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_hessian_vector_matches_the_closed_form(seed):
    rng = np.random.default_rng(seed)
    x, w, v = (rng.normal(size=(2, 3)) for _ in range(3))

    def f():
        return float(np.sum(np.sin(x) * x ** 2 * w))
    exact = (2 * np.sin(x) + 4 * x * np.cos(x) - x ** 2 * np.sin(x)) * w * v
    hv = hessian_vector(f, [x], [v])[0]
    assert np.all(np.abs(hv.value - exact) <= 1e-7 + hv.error)
    assert np.max(hv.error) < 1e-3 * max(1.0, np.max(np.abs(exact)))   # a 2x error shows
    us = [[rng.normal(size=(2, 3))] for _ in range(3)]
    proj = hessian_vector(f, [x], [v], outer=us)
    assert np.allclose(proj.value, [np.sum(u[0] * exact) for u in us], atol=1e-6)


def test_hessian_vector_flags_a_kink_of_the_first_derivative():
    x = np.array([0.0, 1.0])
    v = [np.ones(2)]

    def f():
        return float(np.sum(np.abs(x) * x))     # |x| x: the second derivative jumps at 0
    hv = hessian_vector(f, [x], v)[0]
    assert hv.kink[0] and not hv.kink[1]
    assert hv.value[1] == pytest.approx(2.0, abs=1e-6)


def test_the_adjoint_identity_judges_catches_and_says_when_it_cannot():
    rng = np.random.default_rng(0)
    jt, w = rng.normal(size=(1, 5)), rng.normal(size=5)
    t, g = rng.normal(size=5), rng.normal(size=5)
    scale = float(np.sum(jt * w) / np.sum(t * g))
    problem, note, worst = adjoint_check(jt, w, [[t]], [g * scale], "f64")
    assert problem is None and note is None and worst < 1e-6
    problem, note, _ = adjoint_check(jt * 2, w, [[t]], [g * scale], "f64")
    assert problem.startswith("adjoint: the JVP and the VJP disagree")
    w_cancel = np.array([1.0, -1.0])
    problem, note, _ = adjoint_check(np.array([[1.0, 1.0]]), w_cancel,
                                     [[np.ones(2)]], [np.zeros(2)], "f32")
    assert problem is None and "not judged" in note


# --- rows -----------------------------------------------------------------------------------
def test_ours_takes_both_modes_by_differentiating_its_backward():
    rows = check_case(_case("mul"), "both", 2)
    assert [r.status for r in rows] == ["pass"] * 3, [r.message for r in rows]
    assert rows[1].name.endswith(" [fwd]") and rows[1].labels["ad"] == "fwd"
    assert rows[2].name.endswith(" [order 2]") and rows[2].labels["order"] == "2"
    assert rows[1].metrics["torch"] == "agree" and rows[2].metrics["hessian"] == "nonzero"


def test_ours_says_which_backward_it_cannot_differentiate():
    row = check_derivative(_case("softmax"), "order 2")
    assert row.status == "unsupported"
    assert "softmax_back has no backward" in row.message


def test_a_linear_op_says_its_hessian_is_zero():
    row = check_derivative(_case("rope"), "order 2", adapter=None)
    assert row.status == "pass" and row.metrics["hessian"] == "zero"
    assert "the Hessian is zero here" in row.message


def test_an_injected_backward_bug_fails_both_new_rows():
    rows = check_case(_case("exp"), "both", 2, inject="scale:2")
    assert [r.status for r in rows] == ["fail"] * 3
    assert "the JVP is off" in rows[1].message
    assert "the second derivative of x (rev-rev) is off" in rows[2].message


def test_mixed_dtype_inputs_take_second_order():
    row = check_derivative(_case("matmul", "f32", "a:bf16"), "order 2")
    assert row.status == "pass", row.message


def test_an_expanded_cotangent_keeps_the_adjoint_identity():
    from gradcheck.cotangents import registry_cases
    case = next(s for s in registry_cases(get_op("matmul")) if s.cotangent == "expanded")
    row = check_derivative(case, "fwd")
    assert row.status == "pass", row.message


def test_an_engine_without_forward_mode_says_so():
    from gradcheck.adapters.numpy_adapter import NumpyAdapter
    adapter = NumpyAdapter(np.tanh, lambda w, x: [w * (1 - np.tanh(x) ** 2)])
    row = check_derivative(_case("tanh"), "fwd", adapter=adapter)
    assert row.status == "unsupported" and "offers no forward mode" in row.message


def test_scale_cases_and_ops_without_a_gradient_are_skips():
    scale = next(iter(get_op("relu").scale()))
    assert check_derivative(scale, "fwd").status == "skip"
    assert check_derivative(_case("argmax", "f32"), "order 2").status == "skip"


@pytest.mark.parametrize("op", ["softmax", "norm", "conv_2d", "attention", "cross_entropy_loss"])
def test_torch_passes_both_modes_and_orders(op):
    from gradcheck.adapters.torch_adapter import TorchAdapter
    rows = check_case(_case(op), "both", 2, adapter=TorchAdapter())
    assert [r.status for r in rows] == ["pass"] * 3, [r.message for r in rows]
    assert rows[2].metrics["methods"] == "rev-rev,fwd-rev"


def test_jax_passes_both_modes_and_orders():
    pytest.importorskip("jax", reason="jax is not installed: pip install 'gradverify[jax]'")
    from gradcheck.adapters import get_adapter
    adapter = get_adapter("jax")
    for op in ("softmax", "tanh", "matmul"):
        rows = check_case(_case(op, "f32"), "both", 2, adapter=adapter)
        assert [r.status for r in rows] == ["pass"] * 3, [r.message for r in rows]


# --- the API --------------------------------------------------------------------------------
X = np.random.default_rng(3).normal(size=(3, 4))


def test_check_torch_takes_ad_and_order():
    result = check_torch(torch.tanh, [X], ad="both", order=2)
    assert result.status == "pass", result.message
    assert result.metrics["parts"] == "rev pass, fwd pass, order 2 pass"
    assert result.labels["ad"] == "both" and result.labels["order"] == "2"


def test_check_function_and_check_numpy_take_the_new_modes():
    result = check_function(lambda a: ops.mul(ops.exp(a), a), [X], ad="both", order=2,
                            torch_fn=lambda a: a.exp() * a)
    assert result.status == "pass", result.message
    good = check_numpy(np.tanh, lambda w, x: [w * (1 - np.tanh(x) ** 2)], [X], ad="fwd",
                       jvp=lambda t, x: t[0] * (1 - np.tanh(x) ** 2))
    assert good.status == "pass", good.message
    bad = check_numpy(np.tanh, lambda w, x: [w * (1 - np.tanh(x) ** 2)], [X], ad="both",
                      jvp=lambda t, x: 1.01 * t[0] * (1 - np.tanh(x) ** 2))
    assert bad.status == "fail" and "fwd: " in bad.message and "adjoint" in bad.message
    with pytest.raises(ValueError, match="jvp="):
        check_numpy(np.tanh, lambda w, x: [w], [X], ad="fwd")
    with pytest.raises(ValueError, match="ad must be one of"):
        check_torch(torch.tanh, [X], ad="forward")


# --- the self-test's mutants of the new modes -----------------------------------------------
@pytest.mark.parametrize("mutant", MODE_MUTANTS, ids=lambda m: m.name)
def test_each_mode_mutant_is_caught_by_its_check_and_not_by_reverse_mode(mutant):
    row = run_mode_mutant(mutant)
    if row.status == "skip":
        pytest.skip(row.message)
    assert row.status == "pass", row.message
    assert row.metrics["reverse_mode"] == "pass"


def test_the_adjoint_identity_alone_catches_a_jvp_rule_bug():
    """Without the numerics' verdict: the JVP row's adjoint problem is there on its own."""
    from gradcheck.mode_mutants import _torch_tanh
    result = check_torch(_torch_tanh(jvp_sign=-1.0), [X], ad="fwd",
                         cotangents=("contiguous",))
    assert "adjoint: the JVP and the VJP disagree" in result.message


# --- generated cases, the request, the command line, the plugin ------------------------------
def test_generated_cases_run_in_every_mode_asked():
    rows = generated_results("mul", 3, 0, "f64", ad="both", order=2)
    names = [r.name for r in rows]
    assert any(n.endswith(" [fwd]") for n in names)
    assert any(n.endswith(" [order 2]") for n in names)
    assert all(r.status == "pass" for r in rows), [r.message for r in rows]


def test_the_request_refuses_bad_modes():
    assert "--ad must be one of rev, fwd, both" in GradcheckRequest(ad="x").problem()
    assert "--order must be one of 1, 2" in GradcheckRequest(order=3).problem()
    assert "--ad" in GradcheckRequest(self_test=True, ad="both").problem()


def test_the_cli_runs_torch_both_modes_and_order_2_on_softmax(capsys):
    assert main(["--engine", "torch", "--ad", "both", "--order", "2", "--op", "softmax",
                 "--dtype", "f64", "--no-progress", "--show", "all"]) == 0
    out = capsys.readouterr().out
    assert "[fwd]" in out and "[order 2]" in out


def test_a_failing_new_row_reproduces_in_its_mode(capsys):
    assert main(["--op", "exp", "--dtype", "f64", "--ad", "fwd", "--inject", "scale:2",
                 "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "--ad fwd" in out and "reproduce: gradcheck --inject scale:2 --op exp" in out


def test_the_cli_refuses_order_3(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--op", "exp", "--order", "3"])
    assert exc.value.code == 2
    assert "--order" in capsys.readouterr().err


def test_the_plugin_takes_the_new_options(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--gradcheck",
         "--gradcheck-op", "exp", "--gradcheck-dtype", "f64", "--gradcheck-ad", "both",
         "--gradcheck-order", "2", "--gradcheck-no-torch", "-v"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " passed" in proc.stdout


def test_row_names_of_the_new_modes_are_distinct():
    rows = check_case(dataclasses.replace(_case("sqr")), "both", 2)
    assert len({r.name for r in rows}) == 3


# --- an isolated adapter's jvp and hvp run in its worker ------------------------------------
ISOLATED_TANH = '''
import os
import numpy as np
from gradcheck.adapters.base import JVP, VJP, Unsupported


class A:
    name = "tanh-in-a-worker"
    isolated = True
    hvp_methods = ("rev-rev",)

    def describe(self):
        return "numpy tanh"

    def unsupported(self, case):
        return None if case.op == "tanh" else "tanh only"

    def vjp(self, case, arrays, weights):
        (x,) = arrays
        y = np.tanh(x)
        return VJP(y, [np.asarray(weights, x.dtype).reshape(y.shape) * (1 - y * y)])

    def jvp(self, case, arrays, tangents):
        (x,), (t,) = arrays, tangents
        y = np.tanh(x)
        return JVP(y, t * (1 - y * y) * (1.0 if os.getpid() != {parent} else 5.0))

    def hvp(self, case, arrays, weights, direction, method):
        raise Unsupported("no second order in pid " + str(os.getpid()))
'''


def test_an_isolated_adapter_runs_jvp_and_hvp_in_its_worker(tmp_path, monkeypatch):
    from gradcheck.adapters import get_adapter
    from tests.gradcheck.user_adapter import write_module
    source = ISOLATED_TANH.replace("{parent}", str(os.getpid()))
    engine = write_module(tmp_path, monkeypatch, "iso_tanh", source)
    rows = check_case(_case("tanh"), "both", 2, adapter=get_adapter(engine))
    assert [r.status for r in rows] == ["pass", "pass", "unsupported"], \
        [r.message for r in rows]            # a jvp run here would be 5x off
    assert rows[2].message.startswith("no second order in pid ")
    assert rows[2].message != f"no second order in pid {os.getpid()}"


def test_the_docs_example_of_the_new_modes_runs():
    """docs/guides/gradcheck.md, Forward mode and second order: its example, as written."""
    result = check_torch(torch.nn.functional.gelu, [np.linspace(-3, 3, 12)], ad="both",
                         order=2)
    assert (result.status, result.metrics["parts"]) == \
        ("pass", "rev pass, fwd pass, order 2 pass")


def test_the_list_says_which_ops_our_engine_takes_to_order_2():
    from gradcheck.runner import list_ops
    lines = {line.split()[0]: line for line in list_ops().splitlines()[2:]}
    assert " yes " in lines["mul"] and "no: softmax_back" in lines["softmax"]
    assert "no: relu_back" in lines["relu"]
