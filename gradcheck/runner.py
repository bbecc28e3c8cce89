"""Select sample cases from the registry and check them."""

from __future__ import annotations

from tqdm import tqdm

from engine.registry import all_ops, get_op
from gradcheck.check import check_sample

DTYPES = ("f32", "f64")


def select_samples(op_names, dtype: str = "all", pattern: str | None = None):
    """The registry's samples of `op_names` (unknown names raise UnknownOpError), of one
    dtype or both, whose string contains `pattern`."""
    samples = []
    for name in op_names:
        op = get_op(name)
        samples += list(op.samples()) if op.samples else []
    if dtype != "all":
        samples = [s for s in samples if s.dtype == dtype]
    if pattern:
        samples = [s for s in samples if pattern in str(s)]
    return samples


def checkable_ops() -> list[str]:
    """Ops with sample cases, less the dedicated backward ops: they have no gradient of
    their own and are checked through their forward op (`--op NAME` still runs them)."""
    return [name for name, op in all_ops().items() if op.samples and op.kind != "backward"]


def run_checks(samples, inject: str | None = None, progress: bool = False, mode="auto",
               backends=("cpu",), use_torch: bool = True):
    """Check every sample on every backend; a list of Results in the same order."""
    jobs = [(s, b) for s in samples for b in backends]
    it = tqdm(jobs, desc="gradcheck", unit="case", disable=not progress, leave=False)
    return [check_sample(s, inject, mode, b, use_torch) for s, b in it]
