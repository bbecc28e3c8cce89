"""numba options for every CPU kernel, set in this one place.

Kernels are compiled lazily on first call and cached on disk (`cache=True`), so importing
the engine compiles nothing and a warm start only loads what it uses. `error_model="numpy"`
makes x/0 give inf/nan as numpy does, instead of raising. No fastmath: results are compared
against torch and against float64 references.
"""

from __future__ import annotations

import numba

OPTIONS = {"cache": True, "nogil": True, "error_model": "numpy", "boundscheck": False}


def kernel(fn):
    """Compile a serial kernel."""
    return numba.njit(**OPTIONS)(fn)


def parallel_kernel(fn):
    """Compile a kernel whose outer loop is a `numba.prange` (worth it on large tensors)."""
    return numba.njit(parallel=True, **OPTIONS)(fn)


prange = numba.prange
