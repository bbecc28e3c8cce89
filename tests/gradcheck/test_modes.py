"""Mode choice and random projections, apart from any engine."""

from __future__ import annotations

import numpy as np

from engine.samples import InputSpec, Sample
from gradcheck.modes import FULL_BUDGET, choose_mode, project, random_directions


def test_auto_is_full_up_to_the_budget_then_fast():
    assert choose_mode("auto", FULL_BUDGET) == "full"
    assert choose_mode("auto", FULL_BUDGET + 1) == "fast"
    assert choose_mode("full", 10 * FULL_BUDGET) == "full"
    assert choose_mode("fast", 1) == "fast"


def test_directions_are_unit_and_seeded_by_the_case():
    case = Sample.make("mul", [InputSpec("a", (3, 4)), InputSpec("b", (4,))], "f64")
    dirs = random_directions(case, [(3, 4), (4,)], 5)
    assert len(dirs) == 5 and [v.shape for v in dirs[0]] == [(3, 4), (4,)]
    for d in dirs:
        assert np.isclose(sum(float(np.sum(v * v)) for v in d), 1.0)
    again = random_directions(case, [(3, 4), (4,)], 5)
    assert all(np.array_equal(x, y) for d, e in zip(dirs, again, strict=True)
               for x, y in zip(d, e, strict=True))


def test_projection_sums_over_the_inputs():
    grads = [np.ones((2, 2)), np.full(3, 2.0)]
    dirs = [[np.eye(2), np.zeros(3)], [np.zeros((2, 2)), np.ones(3)]]
    assert project(grads, dirs).tolist() == [2.0, 6.0]
