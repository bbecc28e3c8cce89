"""numba options for every CPU kernel, set in this one place.

Kernels are compiled lazily on first call and cached on disk (`cache=True`), so importing
the engine compiles nothing and a warm start only loads what it uses. `error_model="numpy"`
makes x/0 give inf/nan as numpy does, instead of raising. No fastmath: results are compared
against torch and against float64 references.

Kernels with prange loops are compiled serial and parallel, and small arrays take the serial
one: starting the worker threads costs microseconds on a quiet machine and milliseconds on a
loaded one, more than a loop over a few thousand elements.
"""

from __future__ import annotations

import types

import numba
import numpy as np

OPTIONS = {"cache": True, "nogil": True, "error_model": "numpy", "boundscheck": False}


def kernel(fn):
    """Compile a serial kernel."""
    return numba.njit(**OPTIONS)(fn)


def scalar_math(fn):
    """Compile a scalar function shared by CPU and CUDA kernels: numba inlines it into each
    caller at IR level (`inline="always"`). Called otherwise, numba-cuda would compile it
    as a device function for the current GPU, and cuda.compile_ptx would need one."""
    return numba.njit(inline="always", **OPTIONS)(fn)


def parallel_kernel(fn):
    """Compile a kernel whose outer loop is a `numba.prange` (worth it on large tensors);
    on small ones its serial compilation runs instead (see SizeDispatch)."""
    return SizeDispatch(fn)


prange = numba.prange

# Below this many elements a kernel with a prange loop runs its serial compilation: waking
# the worker threads costs more than the loop (milliseconds on a loaded machine).
PARALLEL_MIN_SIZE = 1 << 16


class SizeDispatch:
    """A kernel compiled twice, lazily: serial (its prange loops become plain loops) and
    parallel. A call runs the parallel one when its largest array argument has at least
    PARALLEL_MIN_SIZE elements; `for_size(n)` picks one for a known size."""

    def __init__(self, fn):
        # numba's disk cache keys a function by its qualified name and line, not by its
        # options: the serial compilation needs a name of its own, or it would load the
        # parallel machine code from the cache
        serial_fn = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__,
                                       fn.__defaults__, fn.__closure__)
        serial_fn.__qualname__ = f"{fn.__qualname__}__serial"
        self.serial = kernel(serial_fn)
        self.parallel = numba.njit(parallel=True, **OPTIONS)(fn)
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    def for_size(self, size: int):
        return self.parallel if size >= PARALLEL_MIN_SIZE else self.serial

    def __call__(self, *args):
        for a in args:
            if isinstance(a, np.ndarray) and a.size >= PARALLEL_MIN_SIZE:
                return self.parallel(*args)
        return self.serial(*args)
