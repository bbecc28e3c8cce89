"""Composed learning-rate schedules: a warmup's second phase starts at its own step 0 on the
milestone (shifted by the warmup's length, not evaluated at t), and a chained schedule
multiplies its parts' factors. Their agreement with torch's SequentialLR and ChainedScheduler
is tests/optcheck/test_torch_stepper.py's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import HyperparameterError
from engine.optim import schedules

counts = st.integers(1, 30)
starts = st.floats(0.01, 1.0)
factors = st.floats(0.0, 1.0)


def test_warmup_step_follows_its_closed_form():
    schedule = schedules.warmup_step(3, 2, start_factor=0.25, gamma=0.5)
    assert [schedule(t) for t in range(9)] == [0.25, 0.5, 0.75, 1, 1, 0.5, 0.5, 0.25, 0.25]


def test_chained_multiplies_at_once():
    """Decays during the warmup too: the two act together, not one after the other."""
    schedule = schedules.chained([schedules.linear_warmup(3, 0.25), schedules.step_decay(2, 0.5)])
    assert [schedule(t) for t in range(6)] == [0.25, 0.5, 0.375, 0.5, 0.25, 0.25]


@given(n=counts, k=counts, start=starts, gamma=factors, t=st.integers(0, 200))
def test_warmup_step_is_warmup_then_step_decay_shifted(n, k, start, gamma, t):
    got = schedules.warmup_step(n, k, start_factor=start, gamma=gamma)(t)
    if t < n:
        assert got == schedules.linear_warmup(n, start)(t)
    else:
        assert got == schedules.step_decay(k, gamma)(t - n)


@given(n=counts, rest=counts, start=starts, low=factors, t=st.integers(0, 200))
def test_warmup_cosine_is_warmup_then_cosine_shifted(n, rest, start, low, t):
    got = schedules.warmup_cosine(n, n + rest, start_factor=start, min_factor=low)(t)
    if t < n:
        assert got == schedules.linear_warmup(n, start)(t)
    else:
        assert got == schedules.cosine(rest, low)(t - n)
    if t == n:
        assert got == pytest.approx(1.0, abs=1e-15)     # the second phase starts at its top


@given(n=counts, k=counts, gamma=factors, t=st.integers(0, 200))
def test_chained_is_the_product_of_its_parts(n, k, gamma, t):
    parts = (schedules.linear_warmup(n, 0.5), schedules.step_decay(k, gamma))
    assert schedules.chained(parts)(t) == parts[0](t) * parts[1](t)


@pytest.mark.parametrize("bad, named", [
    (lambda: schedules.warmup_step(0, 2), "warmup_step: warmup_steps"),
    (lambda: schedules.warmup_step(2, True), "warmup_step: step_size"),
    (lambda: schedules.warmup_step(2, 2, start_factor=0.0), "warmup_step: start_factor"),
    (lambda: schedules.warmup_step(2, 2, gamma=1.5), "warmup_step: gamma"),
    (lambda: schedules.chained([]), "chained: parts"),
    (lambda: schedules.chained(schedules.cosine(3)), "chained: parts"),
    (lambda: schedules.chained([schedules.cosine(3), 0.5]), "chained: parts"),
])
def test_bad_composed_schedules_are_refused(bad, named):
    with pytest.raises(HyperparameterError, match=named):
        bad()
