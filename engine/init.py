"""Seeded initialisers. Each returns a numpy array; `tensor.set(init.kaiming_uniform(...))`.

fan_in and fan_out follow torch: for a weight of shape (out, in, *kernel), fan_in =
in * prod(kernel) and fan_out = out * prod(kernel); for a 1-D tensor both are its length.
"""

from __future__ import annotations

import math

import numpy as np

from engine.tensor import as_dtype


def _rng(seed):
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def fans(shape) -> tuple[int, int]:
    shape = tuple(shape)
    if len(shape) < 2:
        n = shape[0] if shape else 1
        return n, n
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def uniform(shape, low=-1.0, high=1.0, seed=None, dtype="f32") -> np.ndarray:
    """U(low, high)."""
    return _rng(seed).uniform(low, high, shape).astype(as_dtype(dtype))


def normal(shape, mean=0.0, std=1.0, seed=None, dtype="f32") -> np.ndarray:
    """N(mean, std^2)."""
    return _rng(seed).normal(mean, std, shape).astype(as_dtype(dtype))


def _gain(nonlinearity: str, a: float) -> float:
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1 + a * a))
    if nonlinearity in ("linear", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    raise ValueError(f"unknown nonlinearity {nonlinearity!r}")


def kaiming_uniform(shape, a=0.0, nonlinearity="leaky_relu", mode="fan_in", seed=None,
                    dtype="f32") -> np.ndarray:
    """U(-b, b), b = gain * sqrt(3 / fan). torch's Linear/Conv2d default is a = sqrt(5)."""
    fan = fans(shape)[0 if mode == "fan_in" else 1]
    bound = _gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return uniform(shape, -bound, bound, seed, dtype)


def kaiming_normal(shape, a=0.0, nonlinearity="leaky_relu", mode="fan_in", seed=None,
                   dtype="f32") -> np.ndarray:
    """N(0, std^2), std = gain / sqrt(fan)."""
    fan = fans(shape)[0 if mode == "fan_in" else 1]
    return normal(shape, 0.0, _gain(nonlinearity, a) / math.sqrt(fan), seed, dtype)


def glorot_uniform(shape, gain=1.0, seed=None, dtype="f32") -> np.ndarray:
    """Xavier/Glorot: U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = fans(shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform(shape, -bound, bound, seed, dtype)


def glorot_normal(shape, gain=1.0, seed=None, dtype="f32") -> np.ndarray:
    """Xavier/Glorot: N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = fans(shape)
    return normal(shape, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), seed, dtype)


def bias_uniform(shape, fan_in, seed=None, dtype="f32") -> np.ndarray:
    """torch's bias init for Linear/Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return uniform(shape, -bound, bound, seed, dtype)
