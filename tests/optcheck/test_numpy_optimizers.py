"""The float64 numpy optimizers follow torch.optim step for step, tensor for tensor.

Every case runs torch's single-tensor implementation (foreach=False, float64) and the
numpy optimizer side by side for 60 steps on params of shapes (), (5,) and (3, 4). The gradient is
g(p) = p - sin(2p) + 0.1 (non-convex, with sign changes), evaluated on torch's params and
handed to both, so rounding differences never feed back through the gradient.

The two sides round differently (torch's vectorised kernels use fused multiply-adds), so an
element passes when |numpy - torch| <= RTOL (|torch| + scale), where scale is the largest
|torch| that tensor has reached so far: a pure relative test would fail on rounding-level
differences wherever a moment crosses zero. The worst value seen on the grid is below 1e-15.

Random hyperparameters (the hypothesis test) may be ill-conditioned: with eps = 0 and
beta2 = 0 the step divides by |g_t|, and the two trajectories drift apart by more than
rounding while both are right. There every numpy step restarts from torch's param and
state, which checks each update on its own at the same tolerance.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optcheck.numpy_optimizers import (
    FLAG_NAMES,
    HPARAM_NAMES,
    NUMPY_OPTIMIZERS,
    numpy_trajectory,
    validate_hparams,
)

SHAPES = ((), (5,), (3, 4))
STEPS = 60
RTOL = 1e-14


@dataclass(frozen=True)
class OptimizerCase:
    """One optimizer with its hyperparameters; its string is the pytest id."""

    name: str
    hp: dict
    flags: dict

    def __str__(self) -> str:
        hp = ",".join(f"{key}={value:g}" for key, value in self.hp.items())
        flags = ",".join(key for key, value in self.flags.items() if value)
        return f"{self.name}({hp}{',' + flags if flags else ''})"


def _sgd_grid() -> list[OptimizerCase]:
    cases = []
    for momentum, dampening, nesterov, weight_decay, maximize in itertools.product(
            (0.0, 0.9), (0.0, 0.3), (False, True), (0.0, 0.1), (False, True)):
        if nesterov and (momentum == 0 or dampening != 0):
            continue
        hp = {"lr": 0.05, "momentum": momentum, "dampening": dampening,
              "weight_decay": weight_decay}
        cases.append(OptimizerCase("sgd", hp, {"nesterov": nesterov, "maximize": maximize}))
    return cases


def _adam_grid(name: str) -> list[OptimizerCase]:
    """betas x weight decay x amsgrad x (eps, maximize) in two pairs: maximize only negates
    the gradient, so crossing it with eps as well would double the time and test nothing."""
    cases = []
    for (beta1, beta2), weight_decay, amsgrad, (eps, maximize) in itertools.product(
            ((0.9, 0.999), (0.0, 0.0), (0.5, 0.9)), (0.0, 0.1), (False, True),
            ((1e-8, False), (0.1, True))):
        hp = {"lr": 0.05, "beta1": beta1, "beta2": beta2, "eps": eps,
              "weight_decay": weight_decay}
        cases.append(OptimizerCase(name, hp, {"amsgrad": amsgrad, "maximize": maximize}))
    return cases


GRID = _sgd_grid() + _adam_grid("adam") + _adam_grid("adamw")


def initial_param(shape: tuple[int, ...], rng: np.random.Generator | None = None) -> np.ndarray:
    """Distinct values in [-1.7, 2.3] (or uniform in [-2, 2] from rng), not on a grid point."""
    size = int(np.prod(shape))
    if rng is not None:
        return rng.uniform(-2.0, 2.0, size).reshape(shape)
    return (np.linspace(-1.7, 2.3, size) if size > 1 else np.array([0.7])).reshape(shape)


def gradient(param: np.ndarray) -> np.ndarray:
    """g(p) = p - sin(2p) + 0.1: the gradient of a non-convex function with several minima."""
    return np.asarray(param - np.sin(2.0 * param) + 0.1)


def torch_optimizer(case: OptimizerCase, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    hp, flags = case.hp, case.flags
    if case.name == "sgd":
        return torch.optim.SGD(params, lr=hp["lr"], momentum=hp["momentum"],
                               dampening=hp["dampening"], weight_decay=hp["weight_decay"],
                               nesterov=flags["nesterov"], maximize=flags["maximize"],
                               foreach=False)
    torch_class = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[case.name]
    return torch_class(params, lr=hp["lr"], betas=(float(hp["beta1"]), float(hp["beta2"])),
                       eps=hp["eps"], weight_decay=hp["weight_decay"],
                       amsgrad=flags["amsgrad"], maximize=flags["maximize"], foreach=False)


def torch_state(case: OptimizerCase, torch_param_state: dict, step: int) -> dict:
    """torch's state for one param as numpy arrays under the numpy optimizers' names.

    torch's SGD keeps no step count, so the expected count is the step number; it keeps a
    momentum buffer only when momentum != 0.
    """
    state = {key: value.detach().numpy() for key, value in torch_param_state.items()}
    state["step"] = np.array([float(state["step"]) if "step" in state else float(step)])
    return state


def first_divergence(case: OptimizerCase, shapes=SHAPES, steps: int = STEPS,
                     rtol: float = RTOL, rng: np.random.Generator | None = None,
                     restart_from_torch: bool = False) -> str | None:
    """None if the numpy optimizer follows torch at every step; else the first step, tensor, shape
    and worst element that diverge.

    With ``restart_from_torch`` every numpy step starts from torch's param and state
    before that step, so each step is checked on its own: ill-conditioned hyperparameters
    (eps = 0 with beta2 = 0 divides by |g_t|) then cannot amplify earlier rounding
    differences into a divergence of the trajectory.
    """
    init, update = NUMPY_OPTIMIZERS[case.name]
    params0 = [initial_param(shape, rng) for shape in shapes]
    torch_params = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in params0]
    optimizer = torch_optimizer(case, torch_params)
    numpy_params = [p.copy() for p in params0]
    numpy_states = [init(p, case.hp, case.flags) for p in numpy_params]
    # trajectories[index][key] = ([torch value per step], [numpy value per step])
    trajectories = [{} for _ in shapes]
    for step in range(1, steps + 1):
        grads = [gradient(p.detach().numpy()) for p in torch_params]
        for p, grad in zip(torch_params, grads, strict=True):
            p.grad = torch.from_numpy(grad.copy())
        if restart_from_torch:
            for index, p in enumerate(torch_params):
                before = torch_state(case, optimizer.state[p], step - 1)
                numpy_params[index] = p.detach().numpy().copy()
                numpy_states[index] = {key: before.get(key, value).copy()
                                       for key, value in numpy_states[index].items()}
        optimizer.step()
        for index, (p, grad) in enumerate(zip(torch_params, grads, strict=True)):
            numpy_params[index], numpy_states[index] = update(
                numpy_params[index], grad, numpy_states[index], case.hp, case.flags)
            expected = torch_state(case, optimizer.state[p], step)
            expected["param"] = p.detach().numpy()
            actual = dict(numpy_states[index], param=numpy_params[index])
            for key, want in expected.items():
                pair = trajectories[index].setdefault(key, ([], []))
                pair[0].append(want.copy())
                pair[1].append(actual[key])
    mismatches = [(mismatch[0], f"{case}: step {mismatch[0]}, tensor {key!r} of param shape "
                               f"{shapes[index]}: {mismatch[1]}")
                  for index, by_key in enumerate(trajectories)
                  for key, (wants, gots) in by_key.items()
                  if (mismatch := _first_mismatch(np.stack(wants), np.stack(gots), rtol))]
    return min(mismatches)[1] if mismatches else None


def _first_mismatch(wants: np.ndarray, gots: np.ndarray, rtol: float) -> tuple[int, str] | None:
    """Compare trajectories (axis 0 = step): |got - want| <= rtol (|want| + running scale).

    None if all agree, else (first failing step, counted from 1; its worst element)."""
    if wants.shape != gots.shape:
        return 1, f"shape {gots.shape[1:]} vs torch's {wants.shape[1:]}"
    magnitude = np.abs(wants).reshape(len(wants), -1)
    scale = np.maximum.accumulate(magnitude.max(axis=1, initial=0.0))
    error = np.abs(gots - wants).reshape(len(wants), -1)
    bad = ~(error <= rtol * (magnitude + scale[:, None]))   # NaN is bad
    if not bad.any():
        return None
    step = int(np.argmax(bad.any(axis=1)))
    flat = int(np.argmax(np.where(bad[step], np.nan_to_num(error[step], nan=np.inf), -1.0)))
    worst = tuple(int(i) for i in np.unravel_index(flat, wants.shape[1:]))
    return step + 1, (f"element {worst}: numpy {float(gots[step][worst])!r} vs torch "
                      f"{float(wants[step][worst])!r} (scale {scale[step]:g})")


@pytest.mark.parametrize("case", GRID, ids=str)
def test_numpy_optimizer_follows_torch(case):
    divergence = first_divergence(case)
    assert divergence is None, divergence


def test_comparison_catches_a_one_ulp_scale_error_and_names_it(monkeypatch):
    init, update = NUMPY_OPTIMIZERS["adam"]

    def update_with_error_at_step_17(param, grad, state, hp, flags):
        new_param, new_state = update(param, grad, state, hp, flags)
        if new_state["step"][0] == 17:
            new_state = dict(new_state, exp_avg_sq=new_state["exp_avg_sq"] * (1 + 1e-13))
        return new_param, new_state

    monkeypatch.setitem(NUMPY_OPTIMIZERS, "adam", (init, update_with_error_at_step_17))
    divergence = first_divergence(_adam_grid("adam")[0])
    assert divergence is not None and "'exp_avg_sq'" in divergence
    assert "step 17," in divergence


@pytest.mark.parametrize("name, wrong_update", [
    ("adamw", NUMPY_OPTIMIZERS["adam"][1]),      # L2 weight decay instead of decoupled
    ("adam", NUMPY_OPTIMIZERS["adamw"][1]),
])
def test_comparison_catches_coupled_and_decoupled_decay_swapped(monkeypatch, name,
                                                                wrong_update):
    monkeypatch.setitem(NUMPY_OPTIMIZERS, name, (NUMPY_OPTIMIZERS[name][0], wrong_update))
    case = next(c for c in _adam_grid(name) if c.hp["weight_decay"] != 0)
    divergence = first_divergence(case)
    assert divergence is not None and "step 1," in divergence


@st.composite
def random_cases(draw) -> OptimizerCase:
    name = draw(st.sampled_from(sorted(NUMPY_OPTIMIZERS)))
    unit = lambda high: draw(st.floats(0.0, high, allow_subnormal=False))
    if name == "sgd":
        nesterov = draw(st.booleans())
        momentum = unit(0.99) if not nesterov else draw(st.floats(0.01, 0.99))
        dampening = 0.0 if nesterov else unit(1.0)
        hp = {"lr": unit(0.3), "momentum": momentum, "dampening": dampening,
              "weight_decay": unit(0.5)}
        flags = {"nesterov": nesterov, "maximize": draw(st.booleans())}
    else:
        hp = {"lr": unit(0.3), "beta1": unit(0.999), "beta2": unit(0.9999),
              "eps": unit(0.5), "weight_decay": unit(0.5)}
        flags = {"amsgrad": draw(st.booleans()), "maximize": draw(st.booleans())}
    return OptimizerCase(name, hp, flags)


@settings(max_examples=12, deadline=None)
@given(case=random_cases(), seed=st.integers(0, 2**32 - 1))
def test_numpy_optimizer_follows_torch_for_random_hyperparameters(case, seed):
    validate_hparams(case.name, case.hp, case.flags)
    divergence = first_divergence(case, steps=30, rng=np.random.default_rng(seed),
                                  restart_from_torch=True)
    assert divergence is None, divergence


# ----------------------------------------------------------------------------- API

VALID = {case.name: case for case in (GRID[0], _adam_grid("adam")[0], _adam_grid("adamw")[0])}


@pytest.mark.parametrize("name", sorted(NUMPY_OPTIMIZERS))
@pytest.mark.parametrize("amsgrad", [False, True])
def test_init_state_names_and_update_purity(name, amsgrad):
    case = VALID[name]
    flags = dict(case.flags, amsgrad=amsgrad) if name != "sgd" else case.flags
    init, update = NUMPY_OPTIMIZERS[name]
    param, grad = initial_param((3, 4)), gradient(initial_param((3, 4)))
    state = init(param, case.hp, flags)
    expected = {"sgd": {"step", "momentum_buffer"},
                "adam": {"step", "exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if amsgrad
                                                              else set())}
    assert set(state) == expected["sgd" if name == "sgd" else "adam"]
    assert state["step"].shape == (1,) and state["step"].dtype == np.float64
    inputs = copy.deepcopy((param, grad, state, case.hp, flags))
    for _ in range(2):      # the second step takes the other branch of SGD's momentum buffer
        new_param, new_state = update(param, grad, state, case.hp, flags)
        for before, after in zip(inputs, (param, grad, state, case.hp, flags), strict=True):
            if isinstance(before, dict):
                assert before.keys() == after.keys()
                assert all(np.array_equal(before[k], after[k]) for k in before)
            else:
                np.testing.assert_array_equal(before, after)
        assert not any(np.shares_memory(new_state[k], state[k]) for k in state)
        param, state = new_param, new_state
        inputs = copy.deepcopy((param, grad, state, case.hp, flags))
    assert new_param.shape == (3, 4) and new_state["step"][0] == 2.0


@pytest.mark.parametrize("name", sorted(NUMPY_OPTIMIZERS))
def test_scalar_param_stays_an_array(name):
    case = VALID[name]
    trajectory = numpy_trajectory(name, np.array(0.7), [np.array(0.3)] * 3, case.hp, case.flags)
    assert len(trajectory) == 3
    for param, state in trajectory:
        assert isinstance(param, np.ndarray) and param.shape == () and param.dtype == np.float64
        assert all(isinstance(v, np.ndarray) and v.dtype == np.float64 for v in state.values())


def test_numpy_trajectory_matches_init_update_loop():
    case = VALID["adamw"]
    grads = [gradient(initial_param((5,)) * k) for k in range(1, 6)]
    trajectory = numpy_trajectory("adamw", initial_param((5,)), grads, case.hp, case.flags)
    init, update = NUMPY_OPTIMIZERS["adamw"]
    param = initial_param((5,))
    state = init(param, case.hp, case.flags)
    for grad, (traj_param, traj_state) in zip(grads, trajectory, strict=True):
        param, state = update(param, grad, state, case.hp, case.flags)
        np.testing.assert_array_equal(param, traj_param)
        assert all(np.array_equal(state[k], traj_state[k]) for k in state)


def test_gradient_shape_mismatch_is_rejected():
    case = VALID["sgd"]
    init, update = NUMPY_OPTIMIZERS["sgd"]
    param = np.zeros(())
    with pytest.raises(ValueError, match=r"gradient shape \(1,\) .* parameter shape \(\)"):
        update(param, np.zeros(1), init(param, case.hp, case.flags), case.hp, case.flags)


# ----------------------------------------------------------------------------- validation

BAD_INPUTS = [
    ("rmsprop", {}, {}, r"unknown optimizer 'rmsprop'; known: adam, adamw, sgd"),
    ("sgd", {"lr": -0.1}, {}, r"sgd: lr must be >= 0, got -0.1"),
    ("adam", {"lr": -1e-3}, {}, r"adam: lr must be >= 0, got -0.001"),
    ("adam", {"beta1": 1.0}, {}, r"adam: beta1 must be in \[0, 1\), got 1.0"),
    ("adam", {"beta1": -0.1}, {}, r"adam: beta1 must be in \[0, 1\), got -0.1"),
    ("adamw", {"beta2": 1.5}, {}, r"adamw: beta2 must be in \[0, 1\), got 1.5"),
    ("adam", {"eps": -1e-8}, {}, r"adam: eps must be >= 0, got -1e-08"),
    ("sgd", {"weight_decay": -0.01}, {}, r"sgd: weight_decay must be >= 0, got -0.01"),
    ("adamw", {"weight_decay": -0.01}, {}, r"adamw: weight_decay must be >= 0, got -0.01"),
    ("sgd", {"momentum": -0.9}, {}, r"sgd: momentum must be >= 0, got -0.9"),
    ("sgd", {"dampening": 1.5}, {}, r"sgd: dampening must be in \[0, 1\], got 1.5"),
    ("sgd", {"dampening": -0.5}, {}, r"sgd: dampening must be in \[0, 1\], got -0.5"),
    ("sgd", {"momentum": 0.0}, {"nesterov": True},
     r"sgd: nesterov requires momentum > 0 and dampening == 0, got momentum=0.0"),
    ("sgd", {"momentum": 0.9, "dampening": 0.1}, {"nesterov": True},
     r"sgd: nesterov requires .*dampening=0.1"),
    ("adam", {"betas": (0.9, 0.999)}, {}, r"adam: unknown hyperparameter\(s\) 'betas'; "
                                          r"expected lr, beta1, beta2, eps, weight_decay"),
    ("sgd", {}, {"foreach": False}, r"sgd: unknown flag\(s\) 'foreach'; expected nesterov"),
    ("adam", {"eps": None}, {}, r"adam: eps must be a finite real number, got None"),
    ("sgd", {"lr": float("nan")}, {}, r"sgd: lr must be a finite real number, got nan"),
    ("sgd", {"lr": "0.1"}, {}, r"sgd: lr must be a finite real number, got '0.1'"),
    ("adamw", {}, {"amsgrad": 1}, r"adamw: flag amsgrad must be a bool, got 1"),
]


@pytest.mark.parametrize("name, hp_changes, flag_changes, message", BAD_INPUTS,
                         ids=lambda value: value if isinstance(value, str) else None)
def test_validate_hparams_rejects_and_names_the_bad_input(name, hp_changes, flag_changes,
                                                          message):
    base = VALID.get(name, VALID["sgd"])
    with pytest.raises(ValueError, match=message):
        validate_hparams(name, dict(base.hp, **hp_changes), dict(base.flags, **flag_changes))


@pytest.mark.parametrize("name", sorted(NUMPY_OPTIMIZERS))
def test_validate_hparams_names_missing_keys(name):
    hp = dict(VALID[name].hp)
    del hp["lr"]
    with pytest.raises(ValueError, match=rf"{name}: missing hyperparameter\(s\) 'lr'"):
        validate_hparams(name, hp, VALID[name].flags)
    flags = dict.fromkeys(FLAG_NAMES[name][1:], False)
    with pytest.raises(ValueError, match=rf"missing flag\(s\) '{FLAG_NAMES[name][0]}'"):
        validate_hparams(name, VALID[name].hp, flags)


def test_validate_hparams_accepts_the_grid_and_the_interval_ends():
    for case in GRID:
        validate_hparams(case.name, case.hp, case.flags)
    validate_hparams("sgd", dict(VALID["sgd"].hp, dampening=1.0, lr=0.0), VALID["sgd"].flags)
    validate_hparams("adam", dict(VALID["adam"].hp, beta1=0.0, beta2=0.0, eps=0.0),
                     {"amsgrad": np.bool_(True), "maximize": False})
    assert set(HPARAM_NAMES) == set(FLAG_NAMES) == set(NUMPY_OPTIMIZERS)


@pytest.mark.parametrize("momentum, dampening", list(itertools.product((0.0, 0.9), (0.0, 0.5))))
def test_nesterov_rule_agrees_with_torch(momentum, dampening):
    hp = {"lr": 0.1, "momentum": momentum, "dampening": dampening, "weight_decay": 0.0}
    param = [torch.zeros(1, requires_grad=True)]
    try:
        torch.optim.SGD(param, lr=0.1, momentum=momentum, dampening=dampening, nesterov=True)
        torch_accepts = True
    except ValueError:
        torch_accepts = False
    try:
        validate_hparams("sgd", hp, {"nesterov": True, "maximize": False})
        we_accept = True
    except ValueError:
        we_accept = False
    assert we_accept == torch_accepts
