"""optcheck's precision family: 16-bit (and float32) trajectories against float64, bounded by
torch with float32 state; its ratio rule, its skips, its mutants and its CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from checkkit.precision import FLOOR_ULPS, PRECISION_RATIO, ulp
from optcheck import precision
from optcheck.cli import main
from optcheck.mutants import MUTANTS, mutated
from optcheck.runner import FAMILIES, run_family
from optcheck.torch_trajectories import scenarios

torch = pytest.importorskip("torch")


# --- the rule's arithmetic ---------------------------------------------------------------------
@given(ref=st.floats(0, 10), size=st.floats(1e-3, 1e3), dtype=st.sampled_from(["f16", "bf16",
                                                                              "f32"]))
def test_the_bar_is_k_times_ref_err_plus_the_floor(ref, size, dtype):
    bar = PRECISION_RATIO * ref + FLOOR_ULPS * ulp(dtype) * size
    at = precision.TensorErrors(dtype, err=bar, ref_err=ref, size=size)
    assert at.ratio == pytest.approx(PRECISION_RATIO)
    over = precision.TensorErrors(dtype, err=bar * 1.01, ref_err=ref, size=size)
    assert over.ratio > PRECISION_RATIO
    assert precision.TensorErrors(dtype, err=0.0, ref_err=ref, size=size).ratio == 0.0


def test_the_floor_is_in_ulps_of_the_tensors_dtype_and_nan_fails():
    # the same absolute error: within 4 bfloat16 ulps of 1, far beyond 4 float32 ulps
    err = 2 * ulp("bf16")
    assert precision.TensorErrors("bf16", err=err, size=1.0).ratio == pytest.approx(4.0)
    assert precision.TensorErrors("f32", err=err, size=1.0).ratio > 1e3
    errors = precision.TensorErrors.of("bf16", [np.array([np.nan])], [np.zeros(1)], None,
                                       [np.zeros(1)])
    assert errors.ratio == float("inf")


def test_the_worst_tensor_decides_and_the_row_carries_the_columns():
    errors = {"w0": precision.TensorErrors("bf16", 0.01, 0.01, 0.02, 1.0),
              "w0.exp_avg": precision.TensorErrors("f32", 1e-3, 1e-7, 0.0, 1.0)}
    ok, metrics, message = precision.verdict(errors, "bf16")
    assert not ok and metrics["worst"] == "w0.exp_avg"
    assert {"err_vs_f64", "ref_err", "ratio", "native_err", "native_ratio"} <= set(metrics)
    assert metrics["err_vs_f64"] == 1e-3 and metrics["ref_err"] == 1e-7
    assert "w0.exp_avg (f32)" in message and "bar 8" in message
    ok, metrics, _ = precision.verdict({"w0": errors["w0"]}, "f32")
    assert ok and "native_err" not in metrics


# --- the family on the engine -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_the_engine_passes_with_a_margin(optimizer, dtype):
    rows = precision.run(optimizer, dtype, steps=40)
    assert len(rows) == len(scenarios(optimizer, 40))
    for r in rows:
        assert r.status == "pass", (r.name, r.message)
        assert r.labels["family"] == "precision" and r.labels["dtype"] == dtype
        # measured at 100 steps: at most 1.32 (docs/guides/optcheck.md); 8 is the bar
        assert r.metrics["ratio"] < 2.0, (r.name, r.metrics)
        assert r.metrics["err_vs_f64"] > 0 and r.metrics["ref_err"] > 0


def test_each_judged_tensor_is_judged_in_its_own_dtype():
    scenario = scenarios("adam", 10)[0]
    errors = precision.measure("adam", scenario, "bf16", steps=10)
    assert errors["w1"].dtype == "bf16" and errors["w1.exp_avg_sq"].dtype == "f32"
    assert "w1.step" not in errors


@pytest.mark.parametrize("mutant, dtype", [("state_in_bf16", "bf16"),
                                           ("param_truncated_f16", "f16")])
def test_the_16_bit_mutants_fail_the_ratio_rule(mutant, dtype):
    assert MUTANTS[mutant].dtype == dtype
    with mutated(MUTANTS[mutant]):
        rows = precision.run("adam", dtype, steps=100)
    failed = [r for r in rows if r.status == "fail"]
    assert failed, [r.metrics["ratio"] for r in rows]
    assert all(r.metrics["ratio"] > PRECISION_RATIO and "precision:" in r.message
               for r in failed)


def test_the_reference_keeps_16_bit_values_and_float32_state_where_torch_optim_does_not():
    from optcheck.torch_stepper import TorchStepper
    init = {"w0": np.linspace(-1, 1, 5)}
    hp = {"lr": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    flags = {"amsgrad": False, "maximize": False}
    ref = TorchStepper("adam", init, hp, flags, dtype="f32", round_to="bf16")
    as_is = TorchStepper("adam", init, hp, flags, dtype="bf16")
    for side in (ref, as_is):
        side.step({"w0": np.full(5, 0.3)})
    p = ref.params["w0"]
    assert p.dtype == torch.float32
    assert torch.equal(p, p.to(torch.bfloat16).to(torch.float32))
    assert ref.opt.state[p]["exp_avg"].dtype == torch.float32
    # torch.optim's own choice for a bfloat16 parameter (torch 2.13): state in bfloat16
    assert as_is.opt.state[as_is.params["w0"]]["exp_avg"].dtype == torch.bfloat16


# --- skips, runner, CLI ---------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["closed-form", "torch", "invariant"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_families_that_do_not_judge_16_bits_skip_with_a_reason(family, dtype):
    rows = run_family(family, "adam", dtype, steps=5)
    assert [r.status for r in rows] == ["skip"]
    assert "precision family" in rows[0].message and rows[0].labels["dtype"] == dtype


def test_the_precision_family_skips_float64_and_refuses_it_directly():
    rows = run_family("precision", "sgd", "f64", steps=5)
    assert [r.status for r in rows] == ["skip"] and "truth" in rows[0].message
    with pytest.raises(ValueError, match="dtype"):
        precision.run("sgd", "f64")
    assert "precision" in FAMILIES


def test_cli_dtype_bf16_prints_ratios_and_exits_0(capsys):
    assert main(["--opt", "sgd", "--dtype", "bf16", "--steps", "20", "--no-progress",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["results"]
    judged = [r for r in rows if r["family"] == "precision"]
    assert judged and all(r["status"] == "pass" and r["dtype"] == "bf16" for r in judged)
    assert all(r["ratio"] < PRECISION_RATIO and "err_vs_f64" in r and "ref_err" in r
               for r in judged)
    assert {r["family"] for r in rows if r["status"] == "skip"} == {
        "closed-form", "torch", "invariant", "reference", "known-bugs"}


def test_cli_your_settings_in_16_bits_are_a_precision_row(capsys):
    assert main(["--opt", "adam", "--dtype", "f16", "--family", "precision", "--steps", "10",
                 "--lr", "0.05", "--amsgrad", "--no-progress", "--show", "all"]) == 0
    out = capsys.readouterr().out
    assert "adam: user(lr=0.05" in out and "FAIL" not in out


def test_cli_unknown_dtype_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--opt", "adam", "--dtype", "f8"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'f8'" in err
