"""Learning-rate schedules: the factor by which the base learning rate is multiplied at step t.

A schedule is a callable `factor(t)`, t = 0, 1, ... the number of steps already taken. The
optimizer writes `base_lr * factor(t)` into its hyperparameter tensor before step t, so a
schedule needs no rebuilt graph and no new plan. Each matches a torch.optim.lr_scheduler
stepped once per optimizer step:

    step_decay(k, gamma)        gamma ** floor(t / k)                       (StepLR)
    cosine(T, min_factor)       m + (1 - m) (1 + cos(pi t / T)) / 2         (CosineAnnealingLR,
                                                                             eta_min = m * lr)
    linear_warmup(n, start)     start + (1 - start) min(t, n) / n           (LinearLR)
    warmup_cosine(n, T, start)  linear warmup for n steps, then cosine over the T - n after
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
        if t < self.warmup_steps:
            return LinearWarmup(self.warmup_steps, self.start_factor)(t)
        return Cosine(self.t_max - self.warmup_steps, self.min_factor)(t - self.warmup_steps)


step_decay = StepDecay
cosine = Cosine
linear_warmup = LinearWarmup
warmup_cosine = WarmupCosine
