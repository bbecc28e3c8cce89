"""Changes put into the op registry for the duration of a block, and taken out after.

A known bug (a mutant of gradcheck.mutants, or `--inject scale`) is one of these patches:
the op's backward rule, or one of its kernels, replaced by a function made from the real
one. On leaving the block, even on error, the registry holds the very same objects as
before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from engine import ops
from engine.registry import get_op


@contextlib.contextmanager
def backward_replaced(op_name: str, make: Callable):
    """Within the block, op `op_name`'s backward rule is `make(real_rule)`."""
    op = get_op(op_name)
    real = op.backward
    op.backward = make(real)
    try:
        yield
    finally:
        op.backward = real


@contextlib.contextmanager
def kernel_replaced(op_name: str, make: Callable, backend: str = "cpu"):
    """Within the block, op `op_name`'s `backend` kernel is `make(real_kernel)` (in a new
    kernels dict: the op's own dict is put back untouched)."""
    op = get_op(op_name)
    real = op.kernels
    op.kernels = {**real, backend: make(real[backend])}
    try:
        yield
    finally:
        op.kernels = real


def scaled_backward(backward: Callable, factor: float) -> Callable:
    """A backward rule whose every input gradient is `factor` times `backward`'s."""
    def mutated(g, out, *srcs, **params):
        return tuple(None if sg is None else ops.scale(sg, factor)
                     for sg in backward(g, out, *srcs, **params))
    return mutated
