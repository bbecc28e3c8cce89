"""Learning-rate schedules: the factor by which the base learning rate is multiplied at step t.

A schedule is a callable `factor(t)`, t = 0, 1, ... the number of steps already taken. The
optimizer writes `base_lr * factor(t)` into its hyperparameter tensor before step t, so a
schedule needs no rebuilt graph and no new plan. Each matches a torch.optim.lr_scheduler
stepped once per optimizer step:

    step_decay(k, gamma)           gamma ** floor(t / k)                  StepLR
    cosine(T, m)                   m + (1 - m) (1 + cos(pi t / T)) / 2    CosineAnnealingLR,
                                                                          eta_min = m lr
    linear_warmup(n, start)        start + (1 - start) min(t, n) / n      LinearLR
    warmup_cosine(n, T, start, m)  linear_warmup(n, start) for t < n,     SequentialLR of
                                   then cosine(T - n, m) at t - n         LinearLR and
                                                                          CosineAnnealingLR,
                                                                          milestone n
    warmup_step(n, k, start, g)    linear_warmup(n, start) for t < n,     SequentialLR of
                                   then step_decay(k, g) at t - n         LinearLR and StepLR,
                                                                          milestone n
    chained(parts)                 the product of the parts' factors      ChainedScheduler

A warmup's second phase starts at its own step 0 on the milestone: it is evaluated at t - n,
not at t, as torch's SequentialLR restarts the next scheduler there (in torch 2.13 these
definitions and SequentialLR agree at every step, the milestone included).
"""

from __future__ import annotations

import dataclasses
import math

from engine.errors import HyperparameterError


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HyperparameterError(f"{name} must be a positive integer, got {value!r}")


def _in_unit(name, value, low_open=False):
    ok = math.isfinite(value) and (0.0 < value if low_open else 0.0 <= value) and value <= 1.0
    if not ok:
        raise HyperparameterError(f"{name} must lie in {'(' if low_open else '['}0, 1], "
                                  f"got {value!r}")


def _check_fields(schedule, name: str, counts=(), factors=(), positive_factors=()) -> None:
    """The fields of `schedule` (`name` in messages): `counts` positive ints, `factors` in
    [0, 1], `positive_factors` in (0, 1]; HyperparameterError naming the first that is not."""
    for field in counts:
        _positive_int(f"{name}: {field}", getattr(schedule, field))
    for field in factors:
        _in_unit(f"{name}: {field}", getattr(schedule, field))
    for field in positive_factors:
        _in_unit(f"{name}: {field}", getattr(schedule, field), low_open=True)


@dataclasses.dataclass(frozen=True)
class StepDecay:
    step_size: int
    gamma: float = 0.1

    def __post_init__(self):
        _check_fields(self, "step_decay", counts=("step_size",), factors=("gamma",))

    def __call__(self, t: int) -> float:
        return self.gamma ** (t // self.step_size)


@dataclasses.dataclass(frozen=True)
class Cosine:
    t_max: int
    min_factor: float = 0.0

    def __post_init__(self):
        _check_fields(self, "cosine", counts=("t_max",), factors=("min_factor",))

    def __call__(self, t: int) -> float:
        m = self.min_factor
        return m + (1.0 - m) * (1.0 + math.cos(math.pi * t / self.t_max)) / 2.0


@dataclasses.dataclass(frozen=True)
class LinearWarmup:
    warmup_steps: int
    start_factor: float = 1.0 / 3.0

    def __post_init__(self):
        _check_fields(self, "linear_warmup", counts=("warmup_steps",),
                      positive_factors=("start_factor",))

    def __call__(self, t: int) -> float:
        s = self.start_factor
        return s + (1.0 - s) * min(t, self.warmup_steps) / self.warmup_steps


@dataclasses.dataclass(frozen=True)
class WarmupCosine:
    warmup_steps: int
    t_max: int
    start_factor: float = 1.0 / 3.0
    min_factor: float = 0.0

    def __post_init__(self):
        LinearWarmup(self.warmup_steps, self.start_factor)
        Cosine(max(1, self.t_max - self.warmup_steps), self.min_factor)
        if self.t_max <= self.warmup_steps:
            raise HyperparameterError(f"warmup_cosine: t_max ({self.t_max}) must exceed "
                                      f"warmup_steps ({self.warmup_steps})")

    def __call__(self, t: int) -> float:
        return _warmup_then(self, Cosine(self.t_max - self.warmup_steps, self.min_factor), t)


@dataclasses.dataclass(frozen=True)
class WarmupStep:
    warmup_steps: int
    step_size: int
    start_factor: float = 1.0 / 3.0
    gamma: float = 0.1

    def __post_init__(self):
        _check_fields(self, "warmup_step", counts=("warmup_steps", "step_size"),
                      factors=("gamma",), positive_factors=("start_factor",))

    def __call__(self, t: int) -> float:
        return _warmup_then(self, StepDecay(self.step_size, self.gamma), t)


def _warmup_then(warmup, after, t: int) -> float:
    """`warmup`'s linear warmup (its warmup_steps n, start_factor) for t < n, then schedule
    `after` at t - n: the second phase starts at its own step 0 on the milestone."""
    n = warmup.warmup_steps
    if t < n:
        return LinearWarmup(n, warmup.start_factor)(t)
    return after(t - n)


@dataclasses.dataclass(frozen=True)
class Chained:
    """Several schedules at once: the product of their factors. torch's ChainedScheduler
    gives that product for schedulers whose recursive step is a ratio (StepLR, LinearLR);
    CosineAnnealingLR's adds eta_min, so chained with eta_min > 0 it is no product."""

    parts: tuple

    def __post_init__(self):
        parts = self.parts
        if not isinstance(parts, (tuple, list)) or not parts or not all(map(callable, parts)):
            raise HyperparameterError(f"chained: parts must be a sequence of one or more "
                                      f"schedules, got {parts!r}")
        object.__setattr__(self, "parts", tuple(parts))

    def __call__(self, t: int) -> float:
        return math.prod(part(t) for part in self.parts)


step_decay = StepDecay
cosine = Cosine
linear_warmup = LinearWarmup
warmup_cosine = WarmupCosine
warmup_step = WarmupStep
chained = Chained
