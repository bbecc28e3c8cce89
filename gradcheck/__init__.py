"""gradcheck: compare an engine's backprop with numerical gradients for every op and sample
case; the engine under test is an adapter (gradcheck.adapters)."""

from gradcheck.api import check_function, check_numpy, check_torch
from gradcheck.check import check_sample
from gradcheck.runner import check_ops, checkable_ops, run_checks, select_samples

__all__ = ["check_function", "check_numpy", "check_ops", "check_sample", "check_torch",
           "checkable_ops", "run_checks", "select_samples"]
