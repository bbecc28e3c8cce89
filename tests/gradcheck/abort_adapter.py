"""Test adapters that kill their worker process on one case, the way a foreign engine's C
code does, and run every other relu case correctly (numpy). Importable in a worker:
`gradcheck --engine tests.gradcheck.abort_adapter:AbortAdapter --op relu --dtype f64`.
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

from gradcheck.adapters.base import VJP

CRASH_CASE = "relu(type=f64,x=[3,4])"
ASSERT_TEXT = "abort_adapter.c:42: GGML_ASSERT(ne[0] % 4 == 0) failed"


def relu_vjp(arrays, weights) -> VJP:
    """relu and its VJP: output max(x, 0), gradient weights * (x > 0)."""
    (x,) = arrays
    w = np.asarray(weights).astype(x.dtype)
    return VJP(np.maximum(x, 0), [w * (x > 0)])


class AbortAdapter:
    """relu in numpy; on CRASH_CASE, an assertion message on stderr, then abort()."""

    name = "abort"
    isolated = True

    def describe(self) -> str:
        return f"{type(self).__name__} (a test engine that dies on {CRASH_CASE})"

    def unsupported(self, case) -> str | None:
        return None if case.op == "relu" else f"{self.name} has only relu, not {case.op}"

    def die(self) -> None:
        os.write(2, (ASSERT_TEXT + "\n").encode())
        os.abort()

    def vjp(self, case, arrays, weights) -> VJP:
        if str(case) == CRASH_CASE:
            self.die()
        return relu_vjp(arrays, weights)


class SegfaultAdapter(AbortAdapter):
    def die(self) -> None:
        ctypes.string_at(0)        # reads address 0: SIGSEGV


class ExitAdapter(AbortAdapter):
    def die(self) -> None:
        os._exit(3)


class HangAdapter(AbortAdapter):
    def die(self) -> None:
        time.sleep(600)


class RaisingAdapter(AbortAdapter):
    def die(self) -> None:
        raise RuntimeError("engine refused the case")


class WrongAdapter(AbortAdapter):
    """Not isolated: a relu whose gradient is off by 2% (a plain failing engine)."""

    name = "wrong"
    isolated = False

    def vjp(self, case, arrays, weights) -> VJP:
        right = relu_vjp(arrays, weights)
        return VJP(right.output, [g * 1.02 for g in right.grads])
