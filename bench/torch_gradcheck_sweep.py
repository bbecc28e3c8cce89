"""torch.autograd.gradcheck over the cases of `gradcheck --all` that torch has, as one
process: the whole-process twin of `gradcheck --all`, started and timed the same way by
bench/bench_gradcheck.py.

    python bench/torch_gradcheck_sweep.py      # prints: N cases, F reported failures

Each case: the op's torch equivalent on the case's inputs in float64, torch's default
tolerances, every differentiable float input checked. `--seconds` also prints the time
spent inside gradcheck's calls (the in-process figure).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from engine.registry import all_ops
from engine.tensor import is_float
from gradcheck.cotangents import registry_cases
from gradcheck.runner import checkable_ops


def torch_cases():
    """The cases `gradcheck --all` checks whose op has a torch equivalent with a gradient."""
    ops = all_ops()
    for name in checkable_ops():
        op = ops[name]
        if op.torch is not None and op.differentiable:
            yield from registry_cases(op)       # with the cotangent cases, as --all


def gradcheck_case(sample) -> bool | None:
    """torch.autograd.gradcheck on one case (None: no float input to check)."""
    arrays = sample.generate_inputs()
    tens, grad_index = [], []
    for i, (spec, a) in enumerate(zip(sample.inputs, arrays, strict=True)):
        t = torch.tensor(np.asarray(a, np.float64) if is_float(a.dtype) else a)
        if spec.grad and is_float(a.dtype):
            t.requires_grad_(True)
            grad_index.append(i)
        tens.append(t)
    if not grad_index:
        return None
    fn, kwargs = sample.torch_fn, sample.torch_kwargs

    def f(*grad_inputs):
        args = list(tens)
        for i, g in zip(grad_index, grad_inputs, strict=True):
            args[i] = g
        return fn(*args, **kwargs)
    try:
        return bool(torch.autograd.gradcheck(f, [tens[i] for i in grad_index],
                                             raise_exception=False))
    except Exception:
        return False


def sweep(cases) -> tuple[float, int, int]:
    """(seconds inside gradcheck_case, cases checked, reported failures)."""
    total, n, failed = 0.0, 0, 0
    for sample in cases:
        t0 = time.perf_counter()
        ok = gradcheck_case(sample)
        if ok is None:
            continue
        total += time.perf_counter() - t0
        n += 1
        failed += not ok
    return total, n, failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", action="store_true", help="also print the in-process time")
    args = p.parse_args(argv)
    seconds, n, failed = sweep(list(torch_cases()))
    print(f"{n} cases, {failed} reported failures")
    if args.seconds:
        print(f"in-process: {seconds:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
