"""What both kinds of invariants share: the configuration of a run and the comparison of
two runs' snapshot traces."""

from __future__ import annotations

import numpy as np
import pytest

from optcheck.harness import Comparison
from optcheck.invariant_setup import SETTINGS, InvariantConfig, compare_traces, hp_text


def test_hp_text_lists_values_then_the_flags_that_are_set():
    assert hp_text({"lr": 0.05, "eps": 1e-3}, {"amsgrad": True, "maximize": False}) == \
        "lr=0.05,eps=0.001,amsgrad"


@pytest.mark.parametrize("dtype, ftype", [("f32", np.float32), ("f64", np.float64)])
def test_config_draws_from_its_seed(dtype, ftype):
    cfg = InvariantConfig("adam", dtype, "cpu", steps=40, seed=3)
    assert cfg.hp == SETTINGS["adam"][0] and cfg.hp is not SETTINGS["adam"][0]
    assert cfg.batches == 5
    init, again = cfg.init(), InvariantConfig("adam", dtype, "cpu", 40, 3).init()
    assert {k: v.shape for k, v in init.items()} == {"w0": (3, 4), "w1": (5,)}
    assert all(v.dtype == ftype and np.array_equal(v, again[k]) for k, v in init.items())
    grads = cfg.gradient_sequence()
    assert len(grads) == 40 and grads[0]["w0"].dtype == ftype
    spread = [float(np.std(g["w0"] - 0.1)) for g in grads]
    assert np.mean(spread[:5]) > 5 * np.mean(spread[-5:])   # the gradients shrink


def test_stepper_runs_the_settings_or_those_given():
    cfg = InvariantConfig("sgd", "f64", "cpu", steps=4, seed=0)
    stepper = cfg.stepper()
    assert stepper.opt.hparams == SETTINGS["sgd"][0]
    other = cfg.stepper("adam", hp={**SETTINGS["adam"][0], "lr": 0.5})
    assert other.opt.hparams["lr"] == 0.5 and other.opt.flags == SETTINGS["adam"][1]


def test_compare_traces_labels_every_tensor_and_counts_steps():
    got = [{"w": np.array([1.0])}, {"w": np.array([2.0])}]
    want = [{"w": np.array([1.0])}, {"w": np.array([2.5])}]
    comparison = Comparison()
    compare_traces(comparison, "run", got, want, "f64", first_step=5)
    assert (comparison.first_step, comparison.first_tensor) == (6, "run:w")
    with pytest.raises(RuntimeError, match="run: 1 snapshots against 2"):
        compare_traces(Comparison(), "run", got[:1], want, "f64")
