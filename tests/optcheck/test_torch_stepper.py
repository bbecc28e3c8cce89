"""The torch side of the torch family: torch.optim stepped on given gradients, its state read
under the engine's names, the engine's schedules mapped onto torch's lr_scheduler."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.optim import schedules
from optcheck.torch_stepper import TorchStepper

pytest.importorskip("torch")

SGD_HP = {"lr": 0.1, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0}
SGD_FLAGS = {"nesterov": False, "maximize": False}
ADAM_HP = {"lr": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
ADAM_FLAGS = {"amsgrad": True, "maximize": False}


def test_sgd_without_momentum_reads_as_the_engine_holds_it():
    """torch keeps neither a step count nor a momentum buffer here; the snapshot gives the
    steps taken and zeros, under the engine's names."""
    side = TorchStepper("sgd", {"w0": np.array([1.0, 2.0])}, SGD_HP, SGD_FLAGS)
    for _ in range(3):
        side.step({"w0": np.array([1.0, -1.0])})
    snap = side.snapshot(("momentum_buffer", "step"))
    assert set(snap) == {"w0", "w0.step", "w0.momentum_buffer"}
    np.testing.assert_allclose(snap["w0"], [0.7, 2.3])
    assert snap["w0.step"].tolist() == [3.0]
    assert snap["w0.momentum_buffer"].tolist() == [0.0, 0.0]


def test_adam_state_and_first_step():
    side = TorchStepper("adam", {"w0": np.array([1.0, -2.0])}, ADAM_HP, ADAM_FLAGS)
    side.step({"w0": np.array([0.5, 0.5])})
    snap = side.snapshot(("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"))
    np.testing.assert_allclose(snap["w0"], [0.9, -2.1])   # the first step moves by lr
    np.testing.assert_allclose(snap["w0.exp_avg"], [0.05, 0.05])
    assert snap["w0.step"].tolist() == [1.0]


def test_state_the_engine_lacks_is_refused():
    side = TorchStepper("adam", {"w0": np.zeros(2)}, ADAM_HP, ADAM_FLAGS)
    side.step({"w0": np.ones(2)})
    with pytest.raises(RuntimeError, match="torch keeps state .*max_exp_avg_sq"):
        side.snapshot(("exp_avg", "exp_avg_sq", "step"))


@pytest.mark.parametrize("schedule, lrs", [
    (("step_decay", {"step_size": 1, "gamma": 0.5}), [0.1, 0.05, 0.025]),
    (("linear_warmup", {"warmup_steps": 2, "start_factor": 0.5}), [0.05, 0.075, 0.1]),
    (("cosine", {"t_max": 2, "min_factor": 0.1}), [0.1, 0.055, 0.01]),
    (("warmup_cosine", {"warmup_steps": 2, "t_max": 4, "start_factor": 0.5,
                        "min_factor": 0.1}), [0.05, 0.075, 0.1, 0.055, 0.01]),
    (("warmup_step", {"warmup_steps": 2, "step_size": 2, "start_factor": 0.5, "gamma": 0.5}),
     [0.05, 0.075, 0.1, 0.1, 0.05, 0.05]),
    (("chained", {"linear_warmup": {"warmup_steps": 2, "start_factor": 0.5},
                  "step_decay": {"step_size": 1, "gamma": 0.5}}), [0.05, 0.0375, 0.025]),
])
def test_schedules_map_onto_torch_schedulers(schedule, lrs):
    np.testing.assert_allclose(torch_lrs(schedule, len(lrs)), lrs)


def torch_lrs(schedule, steps: int) -> list[float]:
    """The learning rates torch's scheduler for `schedule` sets before each of `steps` steps."""
    side = TorchStepper("sgd", {"w0": np.zeros(1)}, SGD_HP, SGD_FLAGS, schedule)
    seen = []
    for _ in range(steps):
        seen.append(side.lr)
        side.step({"w0": np.ones(1)})
    return seen


counts = st.integers(1, 12)


@given(n=counts, rest=counts, start=st.floats(0.05, 1.0), low=st.floats(0.0, 0.9))
def test_warmup_cosine_is_torchs_sequential_lr(n, rest, start, low):
    """Every step, the milestone n and the cosine's own end included: SequentialLR restarts
    CosineAnnealingLR at n, as the engine evaluates its cosine at t - n."""
    args = {"warmup_steps": n, "t_max": n + rest, "start_factor": start, "min_factor": low}
    engine_side = schedules.warmup_cosine(**args)
    want = [SGD_HP["lr"] * engine_side(t) for t in range(n + rest + 3)]
    np.testing.assert_allclose(torch_lrs(("warmup_cosine", args), len(want)), want,
                               rtol=1e-12, atol=1e-15)


@given(n=counts, k=counts, start=st.floats(0.05, 1.0), gamma=st.floats(0.05, 1.0))
def test_warmup_step_is_torchs_sequential_lr(n, k, start, gamma):
    args = {"warmup_steps": n, "step_size": k, "start_factor": start, "gamma": gamma}
    engine_side = schedules.warmup_step(**args)
    want = [SGD_HP["lr"] * engine_side(t) for t in range(n + 3 * k + 1)]
    np.testing.assert_allclose(torch_lrs(("warmup_step", args), len(want)), want,
                               rtol=1e-12, atol=1e-15)


@given(n=counts, k=counts, start=st.floats(0.05, 1.0), gamma=st.floats(0.05, 1.0))
def test_chained_is_torchs_chained_scheduler(n, k, start, gamma):
    warmup = {"warmup_steps": n, "start_factor": start}
    decay = {"step_size": k, "gamma": gamma}
    engine_side = schedules.chained([schedules.linear_warmup(**warmup),
                                     schedules.step_decay(**decay)])
    want = [SGD_HP["lr"] * engine_side(t) for t in range(n + 3 * k + 1)]
    got = torch_lrs(("chained", {"linear_warmup": warmup, "step_decay": decay}), len(want))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_an_unknown_schedule_is_named():
    with pytest.raises(ValueError, match="no torch scheduler for schedule 'exponential'"):
        TorchStepper("sgd", {"w0": np.zeros(1)}, SGD_HP, SGD_FLAGS, ("exponential", {}))
