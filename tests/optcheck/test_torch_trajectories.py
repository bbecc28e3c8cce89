"""The torch family passes on the engine as it is, and fails, naming a step and a tensor, on
mutants of the optimizer kernels injected through the op registry.

A mutant replaces `OPS[op].kernels["cpu"]` with a small numpy kernel `(out, ins, **flags)`
that computes the update with one deliberate mistake; the null mutant (no mistake) must pass,
which shows that failures come from the mistakes and not from the numpy kernels' rounding.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import sys

import numba
import numpy as np
import pytest

from engine.optim import schedules
from engine.registry import OPS
from optcheck import torch_trajectories

pytest.importorskip("torch")

DTYPES = ("f32", "f64")
FAILURE = re.compile(r"first diverged at step (\d+) in (w\d(\.\w+)?) \(\|error\| [^)]+\)")


# --------------------------------------------------------------------------- numpy kernels

def _lerp(start, end, weight, t):
    if weight < 0.5:
        return start + t(weight) * (end - start)
    return end - (end - start) * t(1.0 - weight)


def numpy_adam(decoupled: bool, mistake: str | None):
    """An Adam/AdamW step kernel in numpy, in the engine's order of operations, with
    `mistake` (None, "no_bias_correction", "eps_inside_sqrt", "coupled_decay",
    "amsgrad_max_not_kept")."""
    def kernel(out, ins, amsgrad=False, maximize=False):
        g, step, hp, m, v = ins[1], ins[2], ins[3], ins[4], ins[5]
        step[0] += 1.0
        n = step[0]
        lr, b1, b2, eps, wd = (float(x) for x in hp)
        t = out.dtype.type
        d = -g if maximize else g.copy()
        x = out.copy()
        if wd != 0.0:
            if decoupled and mistake != "coupled_decay":
                x = x * t(1.0 - lr * wd)
            else:
                d = d + t(wd) * x
        m[...] = _lerp(m, d, 1.0 - b1, t)
        v[...] = v * t(b2) + t(1.0 - b2) * d * d
        second = v
        if amsgrad:
            vmax = ins[6]
            vmax[...] = v if mistake == "amsgrad_max_not_kept" else np.maximum(vmax, v)
            second = vmax
        bc1, bc2 = 1.0 - b1**n, 1.0 - b2**n
        if mistake == "no_bias_correction":
            bc1 = bc2 = 1.0
        if mistake == "eps_inside_sqrt":
            denom = np.sqrt(second / t(bc2) + t(eps))
        else:
            denom = np.sqrt(second) / t(math.sqrt(bc2)) + t(eps)
        out[...] = x + t(-lr / bc1) * (m / denom)
    return kernel


def numpy_sgd(mistake: str | None):
    """An SGD step kernel in numpy with `mistake` (None, "dampening_ignored",
    "nesterov_missing")."""
    def kernel(out, ins, nesterov=False, maximize=False):
        g, step, hp, buf = ins[1], ins[2], ins[3], ins[4]
        step[0] += 1.0
        lr, mu, dampening, wd = (float(x) for x in hp)
        t = out.dtype.type
        d = -g if maximize else g.copy()
        if wd != 0.0:
            d = d + t(wd) * out
        if mu != 0.0:
            keep = 1.0 if mistake == "dampening_ignored" else 1.0 - dampening
            buf[...] = d if step[0] == 1.0 else buf * t(mu) + t(keep) * d
            d = d + t(mu) * buf if nesterov and mistake != "nesterov_missing" else buf.copy()
        out[...] = out + t(-lr) * d
    return kernel


@contextlib.contextmanager
def replaced_kernel(op: str, kernel):
    saved = OPS[op].kernels["cpu"]
    OPS[op].kernels["cpu"] = kernel
    try:
        yield
    finally:
        OPS[op].kernels["cpu"] = saved


# (optimizer, op, kernel, mistake)
MUTANTS = [
    ("adam", "adam_step", numpy_adam(False, "no_bias_correction"), "no_bias_correction"),
    ("adam", "adam_step", numpy_adam(False, "eps_inside_sqrt"), "eps_inside_sqrt"),
    ("adam", "adam_step", numpy_adam(False, "amsgrad_max_not_kept"), "amsgrad_max_not_kept"),
    ("adamw", "adamw_step", numpy_adam(True, "coupled_decay"), "coupled_decay"),
    ("adamw", "adamw_step", numpy_adam(True, "amsgrad_max_not_kept"), "amsgrad_max_not_kept"),
    ("sgd", "sgd_step", numpy_sgd("dampening_ignored"), "dampening_ignored"),
    ("sgd", "sgd_step", numpy_sgd("nesterov_missing"), "nesterov_missing"),
]
NULL_MUTANTS = [("adam", "adam_step", numpy_adam(False, None)),
                ("adamw", "adamw_step", numpy_adam(True, None)),
                ("sgd", "sgd_step", numpy_sgd(None))]


# --------------------------------------------------------------------------- tests

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_family_passes_on_the_engine(optimizer, dtype):
    results = torch_trajectories.run(optimizer, dtype, steps=40)
    failed = [f"{r.name}: {r.status} {r.message}" for r in results if r.status != "pass"]
    assert not failed, "\n".join(failed)
    checks = {r.labels["check"] for r in results}
    assert {f"schedule_{name}" for name in torch_trajectories.SCHEDULES} <= checks
    assert {"grid", "schedule_warmup_cosine", "schedule_warmup_step", "schedule_chained"} <= checks
    assert all(r.labels["family"] == "torch" and r.metrics["steps"] == 40 for r in results)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("optimizer, op, kernel", NULL_MUTANTS, ids=[m[0] for m in NULL_MUTANTS])
def test_numpy_kernel_without_mistake_passes(optimizer, op, kernel, dtype):
    with replaced_kernel(op, kernel):
        results = torch_trajectories.run(optimizer, dtype, steps=40)
    assert all(r.status == "pass" for r in results), [r.message for r in results if not r.ok]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("optimizer, op, kernel, mistake", MUTANTS,
                         ids=[f"{m[0]}-{m[3]}" for m in MUTANTS])
def test_mutant_is_caught(optimizer, op, kernel, mistake, dtype):
    with replaced_kernel(op, kernel):
        results = torch_trajectories.run(optimizer, dtype, steps=20)
    failed = [r for r in results if r.status == "fail"]
    assert failed, f"{mistake} passed every row"
    for r in failed:
        match = FAILURE.search(r.message)
        assert match, r.message
        assert int(match.group(1)) == r.metrics["first_step"] >= 1
        assert match.group(2) == r.metrics["first_tensor"]
        assert "the float64 reference agrees with torch" in r.message, r.message


def test_rows_that_cannot_run_become_errors():
    def broken(out, ins, **flags):
        raise RuntimeError("kernel exploded")
    threads = numba.get_num_threads()
    with replaced_kernel("sgd_step", broken):
        results = torch_trajectories.run("sgd", "f64", steps=3)
    assert results and all(r.status == "error" for r in results)
    assert numba.get_num_threads() == threads     # restored after the serial run
    assert "kernel exploded" in results[0].message


def test_skips_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    (row,) = torch_trajectories.run("adam", "f32")
    assert row.status == "skip" and "pip install torch" in row.message


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_grid_covers_every_valid_pair(optimizer):
    factors = torch_trajectories.GRID_FACTORS[optimizer]
    grid = torch_trajectories.pairwise_grid(factors, torch_trajectories._sgd_valid)
    assert all(torch_trajectories._sgd_valid(row) for row in grid)
    valid = [row for row in (dict(zip(factors, values, strict=True))
                             for values in itertools.product(*factors.values()))
             if torch_trajectories._sgd_valid(row)]
    for a, b in itertools.combinations(factors, 2):
        for va, vb in itertools.product(factors[a], factors[b]):
            if any(row[a] == va and row[b] == vb for row in valid):
                assert any(row[a] == va and row[b] == vb for row in grid), (a, va, b, vb)


def test_cases_are_unique_one_line_strings():
    for optimizer in torch_trajectories.GRID_FACTORS:
        cases = [str(s) for s in torch_trajectories.scenarios(optimizer, 100)]
        assert len(set(cases)) == len(cases)
        assert all("\n" not in c and " " not in c for c in cases)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="'rmsprop'"):
        torch_trajectories.run("rmsprop")
    with pytest.raises(ValueError, match="'f16'"):
        torch_trajectories.run("sgd", "f16")
    with pytest.raises(ValueError, match="0"):
        torch_trajectories.run("sgd", steps=0)


# --------------------------------------------------------------------------- schedules

WARMUPS = {"warmup_cosine": schedules.WarmupCosine, "warmup_step": schedules.WarmupStep}


def _misplaced(schedule_class, milestone, shift):
    """`schedule_class`'s factor with its warmup ending at `milestone(n)` and its second
    phase evaluated at t - `shift(n)` (correct: both n). Written with the correct factor:
    its warmup at min(t, n) (which is 1 at n, as the second phase starts), its second phase
    at x as the correct factor at x + n."""
    correct = schedule_class.__call__

    def factor(self, t):
        n = self.warmup_steps
        if t < milestone(n):
            return correct(self, min(t, n))
        return correct(self, max(0, t - shift(n)) + n)
    return factor


# bug -> (milestone, shift, the first step (counted from 1) whose parameters it can change),
# each a function of the warmup's length n
SCHEDULE_BUGS = {
    "unshifted": (lambda n: n, lambda n: 0, lambda n: n + 1),
    "milestone_early": (lambda n: n - 1, lambda n: n - 1, lambda n: n),
    "milestone_late": (lambda n: n + 1, lambda n: n + 1, lambda n: n + 2),
}


def schedule_row(optimizer: str, name: str, dtype: str, steps: int):
    """The torch family's row of schedule `name` alone."""
    (scenario,) = [s for s in torch_trajectories.scenarios(optimizer, steps)
                   if s.check == f"schedule_{name}"]
    return torch_trajectories._row(optimizer, scenario, dtype, "cpu", steps, 0, 0), scenario


@pytest.mark.parametrize("steps", [20, 40, 100])
@pytest.mark.parametrize("name", sorted(WARMUPS))
def test_warmup_rows_reach_both_phases_and_tell_a_shift(name, steps):
    """Several steps of the second phase (a few decays, most of the cosine) are in the
    trajectory, and a second phase evaluated at t is measurably off from the milestone on."""
    args = torch_trajectories.SCHEDULES[name](steps)
    schedule, n = getattr(schedules, name)(**args), args["warmup_steps"]
    assert 1 < n < steps - 10
    unshifted = _misplaced(WARMUPS[name], *SCHEDULE_BUGS["unshifted"][:2])
    assert abs(unshifted(schedule, n) - schedule(n)) > 0.2
    factors = {schedule(t) for t in range(n, steps)}
    assert len(factors) >= 3, factors      # the second phase changes the lr within the row


def test_chained_row_decays_during_the_warmup():
    args = torch_trajectories.SCHEDULES["chained"](100)
    assert args["step_decay"]["step_size"] < args["linear_warmup"]["warmup_steps"] < 100


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bug", sorted(SCHEDULE_BUGS))
@pytest.mark.parametrize("name, optimizer", [("warmup_cosine", "adam"), ("warmup_step", "sgd")])
def test_a_misplaced_second_phase_fails_its_row(monkeypatch, name, optimizer, bug, dtype):
    """The engine's schedule, not its kernels, carries the bug (torch's SequentialLR keeps
    milestone n): the row passes without it and fails with it, no earlier than the bug can
    show; the float64 reference, run on torch's learning rates, agrees with torch."""
    steps = 40
    row, scenario = schedule_row(optimizer, name, dtype, steps)
    assert row.status == "pass", row.message
    milestone, shift, first = SCHEDULE_BUGS[bug]
    monkeypatch.setattr(WARMUPS[name], "__call__", _misplaced(WARMUPS[name], milestone, shift))
    row, _ = schedule_row(optimizer, name, dtype, steps)
    assert row.status == "fail", f"{bug} passed {scenario}"
    n = scenario.schedule[1]["warmup_steps"]
    assert row.metrics["first_step"] >= first(n), row.message
    if bug == "unshifted":      # off by a factor 0.78 or 0.5 at once
        assert row.metrics["first_step"] == first(n), row.message
    assert "the float64 reference agrees with torch" in row.message, row.message
