"""The CPU backend: numba kernels (see `jit`) and numpy buffers."""

from __future__ import annotations

import numpy as np

from engine.errors import BackendError


class CpuBackend:
    name = "cpu"

    def kernel(self, op):
        try:
            return op.kernels["cpu"]
        except KeyError:
            raise BackendError(f"op {op.name} has no cpu kernel") from None

    def alloc(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def view(self, arena, offset: int, shape, dtype) -> np.ndarray:
        return np.ndarray(shape, dtype, buffer=arena, offset=offset)

    def persistent(self, tensor) -> np.ndarray:
        return tensor.buffer()

    def copy(self, dst, src) -> None:
        np.copyto(dst, src)

    def accumulate(self, dst, src) -> None:
        np.add(dst, src, out=dst)


CPU = CpuBackend()
