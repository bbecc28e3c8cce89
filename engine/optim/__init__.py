"""Optimizers (SGD, Adam, AdamW) as graphs of in-place step ops, learning-rate schedules,
and optimizer state in GGUF files."""

from engine.optim import schedules
from engine.optim.optimizers import OPTIMIZERS, SGD, Adam, AdamW, Optimizer, make_optimizer

__all__ = ["OPTIMIZERS", "SGD", "Adam", "AdamW", "Optimizer", "make_optimizer", "schedules"]
