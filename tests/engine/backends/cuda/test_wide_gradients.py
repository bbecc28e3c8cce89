"""The wide broadcast gradients (engine.graph) on the CUDA backend: the CPU test's cases
(tests/engine/test_wide_gradients.py), the 16-bit ones with 8 copies instead of 64 (the
simulator runs a thread at a time), computed by the CUDA backend's plans: its cast kernels
and float32 and float64 kernels make the terms, and each result is held to the same bound
(one ulp of the dtype at the truth plus float32's rounding of the terms), which terms
rounded to the dtype before their sum miss by 2 to 65 times on these 8 copies."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.engine import test_wide_gradients as wide
from tests.engine.backends.cuda.kernel_harness import needs_cuda

pytestmark = [pytest.mark.cudasim]
needs_cuda()

# a case of each kind of broadcast: a binary op's, matmul's batch, softmax's mask (with
# ALiBi; in float32 its float64 path), a view's (expand into cross_entropy and a GLU;
# broadcast_to into an elementwise op)
NAMES = ("mul-f16", "matmul-bf16", "softmax-alibi-f16", "softmax-plain-f32",
         "cross_entropy-f16", "reglu-bf16", "broadcast_to-exp-f16")


def _small(case: wide.Case, n: int = 8) -> wide.Case:
    """The case on its first n copies along the broadcast's first axis (every array and
    shape of that length cut to n; builds that name the length rebuilt for n)."""
    def cut(a):
        return a[:n] if a is not None and a.ndim and a.shape[0] == wide.N else a
    arrays = tuple(cut(a) for a in case.arrays)
    full = (n,) + case.full[1:]
    build = case.build
    if case.name.startswith(("cross_entropy", "reglu", "broadcast_to")):
        op = case.name.split("-")[0]
        build = {"cross_entropy": lambda lg, lb: wide.ops.cross_entropy_loss(
                     wide.ops.expand(lg, shape=full), lb),
                 "reglu": lambda x: wide.ops.reglu(wide.ops.expand(x, shape=full)),
                 "broadcast_to": lambda x: wide.ops.exp(wide.ops.broadcast_to(x, full))}[op]
    return dataclasses.replace(case, arrays=arrays, full=full, build=build,
                               weights=cut(case.weights))


@pytest.mark.parametrize("name", NAMES)
def test_broadcast_gradient_on_cuda(name):
    case = _small(next(c for c in wide.CASES if c.name == name))
    terms = wide.reference_terms(case)
    truth, tol, dtype = wide.bound(case, terms)
    # terms rounded to the dtype before the sum fail the bound (by 2 to 65 times here)
    old = wide.sum_to(wide.rounded(terms, dtype).astype(np.float64), truth.shape)
    assert np.max(np.abs(old - truth) / tol) > 1.5
    got = wide.engine_gradient(case, backend="cuda")
    err = np.abs(got - truth) / tol
    assert err.max() <= 1.0, (name, got, truth)
