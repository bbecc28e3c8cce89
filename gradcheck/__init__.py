"""gradcheck: compare backprop with numerical gradients for every op and sample case."""

from gradcheck.check import check_sample
from gradcheck.runner import checkable_ops, run_checks, select_samples

__all__ = ["check_sample", "checkable_ops", "run_checks", "select_samples"]
