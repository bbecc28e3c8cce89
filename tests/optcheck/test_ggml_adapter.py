"""optcheck's ggml adapter (optcheck.adapters.ggml_adapter): ggml_opt_step_adamw and
ggml_opt_step_sgd against optcheck's families, what they cannot run, param groups,
save/restore, aborts in the worker process, and `--ggml-lib`."""

from __future__ import annotations

import gc
import multiprocessing
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from checkkit import ggml
from checkkit.loading import AdapterError
from checkkit.worker import RemoteError, WorkerCrash
from optcheck import reference
from optcheck.adapters import get_adapter
from optcheck.adapters.base import Group
from optcheck.adapters.ggml_adapter import bias_corrections
from optcheck.runner import run_family
from tests.console_scripts import script_call

try:
    ggml.load()
except AdapterError as exc:
    pytest.skip(f"no ggml libraries to load: {exc}", allow_module_level=True)

VARIANTS = "tests.optcheck.ggml_variants"
ADAMW = {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1}
ADAM_FLAGS = {"amsgrad": False, "maximize": False}
SGD = {"lr": 0.1, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.1}
SGD_FLAGS = {"nesterov": False, "maximize": False}


@pytest.fixture(scope="module")
def adapter():
    with get_adapter("ggml") as made:
        yield made


def _grads(rng, init):
    return {k: rng.standard_normal(np.shape(v)).astype(np.float32) for k, v in init.items()}


def _init(seed=0):
    rng = np.random.default_rng(seed)
    return {"w0": rng.standard_normal((3, 5)).astype(np.float32),
            "w1": rng.standard_normal(()).astype(np.float32)}


# --- the families ------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["reference", "closed-form"])
@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd"])
def test_ggml_passes_what_it_can_run_and_says_why_not_for_the_rest(optimizer, family):
    rows = run_family(family, optimizer, "f32", engine="ggml")
    statuses = {r.status for r in rows}
    assert "pass" in statuses and statuses <= {"pass", "unsupported"}, \
        [(r.name, r.status, r.message) for r in rows if r.status not in ("pass", "unsupported")]
    assert all(r.message for r in rows if r.status == "unsupported")
    assert {r.labels["engine"] for r in rows} == {"ggml"}


@pytest.mark.parametrize("lr", [0.01, 0.1])
def test_adamw_with_betas_away_from_0_and_decay_on_follows_the_float64_reference(adapter, lr):
    """The grid runs (0.9, 0.999) with decay only beside maximize (unsupported here)."""
    row = reference.user_row(adapter, "adamw", {**ADAMW, "lr": lr}, ADAM_FLAGS, "f32")
    assert row.status == "pass", row.message


def test_ggml_keeps_v_with_1_minus_beta2_of_a_float32_beta2(adapter):
    """A finding of ggml 0.20: (1.0f - beta2) of beta2 rounded to float32, so v is off by
    (1 - f32(beta2)) / (1 - beta2) - 1: 1.7e-4 at beta2 = 0.9999, beyond float32's
    tolerance, where torch computes 1 - beta2 in double (and passes)."""
    hp = {**ADAMW, "beta2": 0.9999}
    row = reference.user_row(adapter, "adamw", hp, ADAM_FLAGS, "f32")
    assert row.status == "fail" and "exp_avg_sq" in row.message


def test_bias_corrections_are_rounded_in_float32_as_ggml_opt_rounds_them():
    one = np.float32(1)
    b1h, b2h = bias_corrections(0.9, 0.999, 1)
    assert (b1h, b2h) == (one / (one - np.float32(0.9)), one / (one - np.float32(0.999)))
    assert b1h.dtype == b2h.dtype == np.float32
    assert b2h != np.float32(1 / (1 - 0.999))      # not double's: 1000.0129, not 1000
    assert bias_corrections(0.0, 0.0, 7) == (1.0, 1.0)


def test_a_wrong_params_layout_fails_the_reference_family():
    """beta1h and beta2h swapped: every row whose betas differ fails; (0, 0) cannot tell."""
    rows = run_family("reference", "adamw", "f32", engine=f"{VARIANTS}:SwappedBiasCorrection")
    ran = {r.name: r.status for r in rows if r.status != "unsupported"}
    assert ran["adamw: grid(lr=0.1,betas=(0,0),eps=1e-08,weight_decay=0)"] == "pass"
    assert sorted(ran.values()).count("fail") == len(ran) - 1 >= 2


# --- what ggml cannot run -----------------------------------------------------------------

@pytest.mark.parametrize("optimizer, dtype, hp, flags, words", [
    ("adamw", "f64", ADAMW, ADAM_FLAGS, "ggml has no f64 tensors"),
    ("adamw", "f16", ADAMW, ADAM_FLAGS, "takes F32 parameters only"),
    ("sgd", "bf16", SGD, SGD_FLAGS, "ggml_opt_step_sgd's CPU kernel takes F32"),
    ("adam", "f32", ADAMW, ADAM_FLAGS, "no Adam with L2 weight decay"),
    ("adamw", "f32", ADAMW, {**ADAM_FLAGS, "amsgrad": True}, "no AMSGrad"),
    ("adamw", "f32", ADAMW, {**ADAM_FLAGS, "maximize": True}, "no maximize"),
    ("sgd", "f32", {**SGD, "momentum": 0.9}, SGD_FLAGS, "no momentum"),
    ("sgd", "f32", {**SGD, "momentum": 0.9}, {**SGD_FLAGS, "nesterov": True}, "Nesterov"),
])
def test_unsupported_settings_say_why(adapter, optimizer, dtype, hp, flags, words):
    assert words in adapter.unsupported(optimizer, dtype, hp, flags)
    if dtype == "f32":
        with pytest.raises(ValueError, match=words):
            adapter.stepper(optimizer, {"w0": np.zeros(2, np.float32)}, hp, flags, dtype)


@pytest.mark.parametrize("optimizer, hp, flags", [
    ("adam", {**ADAMW, "weight_decay": 0.0}, ADAM_FLAGS),
    ("sgd", {**SGD, "dampening": 0.5}, SGD_FLAGS),     # without momentum it changes nothing
])
def test_what_ggml_can_run_is_supported(adapter, optimizer, hp, flags):
    assert adapter.unsupported(optimizer, "f32", hp, flags) is None


# --- groups, save and restore -------------------------------------------------------------

def test_groups_step_as_separate_optimizers_with_their_own_hyperparameters(adapter):
    init = _init()
    hp0, hp1 = ADAMW, {**ADAMW, "lr": 0.1, "weight_decay": 0.0, "beta1": 0.8}
    grouped = adapter.grouped_stepper("adamw", [
        Group({"w0": init["w0"]}, hp0, ADAM_FLAGS, "f32"),
        Group({"w1": init["w1"]}, hp1, ADAM_FLAGS, "f32")])
    alone = [adapter.stepper("adamw", {"w0": init["w0"]}, hp0, ADAM_FLAGS, "f32"),
             adapter.stepper("adamw", {"w1": init["w1"]}, hp1, ADAM_FLAGS, "f32")]
    rng = np.random.default_rng(1)
    for _ in range(5):
        grads = _grads(rng, init)
        grouped.step(grads)
        for s, name in zip(alone, ("w0", "w1"), strict=True):
            s.step({name: grads[name]})
    got = grouped.snapshot()
    want = {**alone[0].snapshot(), **alone[1].snapshot()}
    assert sorted(got) == sorted(want) and "w1.exp_avg_sq" in got and got["w1"].shape == ()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert got["w0.step"].tolist() == [5.0]


def test_repeated_names_and_five_axes_are_refused_before_the_worker(adapter):
    g = Group({"w0": np.zeros(2, np.float32)}, SGD, SGD_FLAGS, "f32")
    with pytest.raises(ValueError, match="repeat"):
        adapter.grouped_stepper("sgd", [g, g])
    with pytest.raises(ValueError, match="at most 4 dimensions; w0 has shape"):
        adapter.stepper("sgd", {"w0": np.zeros((1,) * 5, np.float32)}, SGD, SGD_FLAGS, "f32")


@pytest.mark.parametrize("optimizer, hp, flags", [("adamw", ADAMW, ADAM_FLAGS),
                                                  ("sgd", SGD, SGD_FLAGS)])
def test_a_restored_stepper_continues_exactly_where_the_saved_one_was(adapter, optimizer, hp,
                                                                       flags):
    init = _init()
    rng = np.random.default_rng(2)
    grads = [_grads(rng, init) for _ in range(8)]
    first = adapter.stepper(optimizer, init, hp, flags, "f32")
    for g in grads[:4]:
        first.step(g)
    saved = first.save()
    before = {k: v.copy() for k, v in saved["tensors"].items()}
    for g in grads[4:]:
        first.step(g)
    for k, v in saved["tensors"].items():       # an independent copy: later steps leave it
        np.testing.assert_array_equal(v, before[k])
    second = adapter.stepper(optimizer, init, hp, flags, "f32")
    second.restore(saved)
    for g in grads[4:]:
        second.step(g)
    want, got = first.snapshot(), second.snapshot()
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


# --- the worker process -------------------------------------------------------------------

def test_an_abort_in_ggml_is_a_worker_crash_and_the_next_stepper_works(adapter):
    """ggml's own abort: its opt-step kernel on F16 parameters (GGML_ABORT in ops.cpp)."""
    f16 = adapter.stepper("adamw", {"w0": np.ones(3, np.float16)}, ADAMW, ADAM_FLAGS, "f16")
    with pytest.raises(WorkerCrash, match="SIGABRT.*ops.cpp.*fatal error"):
        f16.step({"w0": np.ones(3)})
    with pytest.raises(RemoteError, match="restarted after a crash"):
        f16.snapshot()
    starts = adapter.worker.starts
    s = adapter.stepper("sgd", {"w0": np.ones(3, np.float32)}, SGD, SGD_FLAGS, "f32")
    s.step({"w0": np.ones(3)})
    np.testing.assert_allclose(s.snapshot()["w0"], 1 - 0.1 * 0.1 - 0.1, rtol=1e-6)
    assert adapter.worker.starts == starts


def test_a_crashing_row_is_a_crash_row_and_the_rows_after_it_run():
    rows = run_family("reference", "adamw", "f32", engine=f"{VARIANTS}:AssertsAtLr")
    ran = [(r.name, r.status, r.message) for r in rows if r.status != "unsupported"]
    crashed = [m for name, status, m in ran if status == "crash"]
    assert len(crashed) == 2 and all("lr=0.1," in n for n, s, _ in ran if s == "crash")
    assert all("GGML_ASSERT(a->flags & GGML_TENSOR_FLAG_PARAM) failed" in m for m in crashed)
    assert [s for _, s, _ in ran][-1] == "pass"           # after the crashes: a fresh worker


def test_steppers_let_go_are_freed_in_the_worker_and_close_ends_it():
    with get_adapter("ggml") as made:
        gone = made.stepper("sgd", {"w0": np.ones(3, np.float32)}, SGD, SGD_FLAGS, "f32")
        key = gone.key
        del gone
        gc.collect()
        made.stepper("sgd", {"w0": np.ones(3, np.float32)}, SGD, SGD_FLAGS, "f32")
        with pytest.raises(RemoteError, match=f"stepper {key} is not in this worker"):
            made.call("worker_call", key, "snapshot")
        child = made.worker._proc
        assert child.is_alive()
    assert not child.is_alive() and child not in multiprocessing.active_children()
    assert made.worker is None


# --- the request and the command line -----------------------------------------------------

def test_ggml_lib_applies_to_engine_ggml_only():
    from optcheck.request import OptcheckRequest
    problem = OptcheckRequest(opt=("adamw",), engine="torch", ggml_lib="/x").problem()
    assert problem == "--ggml-lib applies to --engine ggml, not to --engine torch"
    assert OptcheckRequest(opt=("adamw",), engine="ggml", ggml_lib="/x").problem() is None


def test_the_command_line_runs_ggml(tmp_path, adapter):
    from optcheck.cli import main
    from reports import load_json
    path = tmp_path / "r.json"
    assert main(["--engine", "ggml", "--opt", "sgd", "--family", "reference", "--dtype", "f32",
                 "--no-progress", "--format", "json", "--output", str(path)]) == 0
    rows = load_json(path.read_text())["results"]
    assert {r["engine"] for r in rows} == {"ggml"} and {r["status"] for r in rows} == {
        "pass", "unsupported"}
    assert adapter.describe().startswith(f"ggml {ggml.load().version} (commit ")


@pytest.mark.parametrize("lib, words", [
    ("no/such/dir", "does not exist"),
    (".", "lacks libggml-base.so and libggml-cpu.so"),
])
def test_a_bad_ggml_lib_is_one_line_and_exit_2(tmp_path, lib, words):
    argv = ["--engine", "ggml", "--ggml-lib", lib, "--opt", "adamw", "--no-progress"]
    code = textwrap.dedent(f"""
        import sys
        sys.argv = ["optcheck", *{argv!r}]
        """) + script_call("optcheck")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("optcheck: ggml: ") and words in lines[0]
