"""The full gradcheck sweep against torch.autograd.gradcheck on the same cases, in one run.

    python bench/bench_gradcheck.py          # or: tox -e bench -- (see tox.ini)

Times `gradcheck --all` as a whole command (a warm-up run first, so the numba cache is
warm), then torch.autograd.gradcheck on the torch equivalents of the same sample cases
(every differentiable case that has a torch reference, on its float64 inputs, torch's
default tolerances). Targets: the sweep under 120 s warm on the 2-core machine, and no
slower than torch's gradcheck on the same cases. The machine is noisy: read the ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np
import torch

from engine.registry import all_ops
from gradcheck.cotangents import registry_cases
from gradcheck.runner import checkable_ops

TARGET_SWEEP_S = 120.0


def sweep_seconds() -> float:
    cmd = [sys.executable, "-m", "gradcheck.cli", "--all", "--no-progress"]
    subprocess.run(cmd, check=False, capture_output=True)       # warm the numba cache
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    print(f"gradcheck --all: exit {proc.returncode}; "
          f"{proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ''}")
    return elapsed


def torch_cases():
    """The cases `gradcheck --all` checks, where torch has an equivalent with a gradient."""
    ops = all_ops()
    for name in checkable_ops():
        op = ops[name]
        if op.torch is not None and op.differentiable:
            yield from registry_cases(op)       # with the cotangent cases, as --all


def torch_gradcheck_seconds() -> tuple[float, int, int]:
    total, cases, failed = 0.0, 0, 0
    for sample in torch_cases():
        arrays = sample.generate_inputs()
        tens, grad_index = [], []
        for i, (spec, a) in enumerate(zip(sample.inputs, arrays, strict=True)):
            t = torch.tensor(np.asarray(a, np.float64) if a.dtype.kind == "f" else a)
            if spec.grad and a.dtype.kind == "f":
                t.requires_grad_(True)
                grad_index.append(i)
            tens.append(t)
        if not grad_index:
            continue
        fn, kwargs = sample.torch_fn, sample.torch_kwargs

        def f(*grad_inputs, tens=tens, grad_index=grad_index, fn=fn, kwargs=kwargs):
            args = list(tens)
            for i, g in zip(grad_index, grad_inputs, strict=True):
                args[i] = g
            return fn(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            ok = torch.autograd.gradcheck(f, [tens[i] for i in grad_index], raise_exception=False)
        except Exception:
            ok = False
        total += time.perf_counter() - t0
        cases += 1
        failed += not ok
    return total, cases, failed


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    ours = sweep_seconds()
    theirs, cases, failed = torch_gradcheck_seconds()
    print(f"gradcheck --all (whole command, warm): {ours:.1f} s (target < {TARGET_SWEEP_S} s)")
    print(f"torch.autograd.gradcheck on the same {cases} cases: {theirs:.1f} s "
          f"({failed} reported failures)")
    print(f"ratio ours / torch: {ours / theirs:.2f} (target <= 1)")
    ok = ours < TARGET_SWEEP_S and ours <= theirs
    print("all targets met" if ok else "SOME TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
