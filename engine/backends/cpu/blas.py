"""Matrix products called from inside numba kernels: SciPy's BLAS (scipy.linalg.cython_blas,
its own OpenBLAS), so that a kernel that alternates products with row work (attention's
blocks) runs as one compiled call without the GIL, instead of a Python loop that takes the
GIL back between every numpy matmul and every row kernel (engine.backends.cpu.attention).

The functions are reached by name: their addresses are registered with LLVM under a
symbol of ours (llvmlite's add_symbol, at import) and the kernels call an ExternalFunction
of that name, which the linker resolves when a kernel is compiled or loaded from the disk
cache. (A ctypes function pointer would put the address itself into the machine code, and
numba refuses to cache that.)

`gemm(trans_a, trans_b, a, b, c, beta)`: c = op(a) op(b) + beta c on row-major 2-D views
whose last axis has unit stride (their rows may lie apart: a row stride is BLAS's leading
dimension), float32 or float64 alike; op(x) is x or, with its flag, x^T. BLAS is column
major: a row-major m x n matrix is its n x m transpose, so the call computes c^T =
op(b)^T op(a)^T, the same flags, the operands swapped. Which thread calls it changes
nothing: one call is one BLAS call.

SciPy's OpenBLAS keeps a thread pool of its own, apart from numpy's; threads.one_blas_thread
holds it to one thread with numpy's (threadpoolctl's list of libraries is read again when
this module has loaded SciPy's: a plan may have run before).
"""

from __future__ import annotations

import functools

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (loads SciPy's BLAS before threadpoolctl looks)
from llvmlite import binding
from numba import types
from numba.extending import get_cython_function_address

from engine.backends.cpu import threads
from engine.backends.cpu.jit import njit

threads.blas_libraries_loaded()                 # SciPy's (module doc)

_ARGS = 13       # ?gemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)


def _blas(name: str):
    """An ExternalFunction calling SciPy's `name` (every argument a pointer)."""
    symbol = f"gradverify_blas_{name}"
    binding.add_symbol(symbol, get_cython_function_address("scipy.linalg.cython_blas", name))
    return types.ExternalFunction(symbol, types.void(*([types.voidptr] * _ARGS)))


_sgemm = _blas("sgemm")
_dgemm = _blas("dgemm")


@njit
def _lead(x):
    """x's leading dimension: its row stride in elements (BLAS asks at least 1 and at least
    a row's length; a single row's stride means nothing)."""
    if x.shape[0] > 1:
        return max(x.strides[0] // x.itemsize, 1)
    return max(x.shape[1], 1)


@njit
def gemm(trans_a, trans_b, a, b, c, beta):
    """c = op(a) op(b) + beta c (module doc); a, b and c of one dtype, float32 or float64,
    each with unit stride along its last axis."""
    m, n = c.shape
    k = a.shape[0] if trans_a else a.shape[1]
    if m == 0 or n == 0:
        return
    if k == 0:                               # an empty sum: BLAS is not asked
        if beta == 0.0:
            c[:, :] = 0.0
        return
    flags = np.empty(2, np.uint8)
    flags[0] = ord("T") if trans_b else ord("N")
    flags[1] = ord("T") if trans_a else ord("N")
    dims = np.empty(6, np.int32)
    dims[0], dims[1], dims[2] = n, m, k
    dims[3], dims[4], dims[5] = _lead(b), _lead(a), _lead(c)
    scalars = np.empty(2, c.dtype)
    scalars[0], scalars[1] = 1.0, beta
    # (an array's .ctypes holds a reference to its buffer: the scratch lives through the call)
    if c.itemsize == 4:
        _sgemm(flags.ctypes, flags[1:].ctypes, dims.ctypes, dims[1:].ctypes, dims[2:].ctypes,
               scalars.ctypes, b.ctypes, dims[3:].ctypes, a.ctypes, dims[4:].ctypes,
               scalars[1:].ctypes, c.ctypes, dims[5:].ctypes)
    else:
        _dgemm(flags.ctypes, flags[1:].ctypes, dims.ctypes, dims[1:].ctypes, dims[2:].ctypes,
               scalars.ctypes, b.ctypes, dims[3:].ctypes, a.ctypes, dims[4:].ctypes,
               scalars[1:].ctypes, c.ctypes, dims[5:].ctypes)


# gemm reads its arrays' strides and addresses only, so one compilation per dtype serves
# every layout and both flags: made by `ready` for read-only arrays of any layout ('A')
# and run-time flags, its compiling then turned off, so that numba converts every call's
# types to those (a C array to 'A', a writable a or b to read-only, a literal flag to a
# bool) instead of compiling gemm again for each combination. Called from attention's
# compiled tasks with literal flags and their views' layouts, gemm was compiled 12 times
# in a cold `gradcheck --all`, 6.4 s of CPU at a load of 6 (`python
# bench/bench_first_run.py --breakdown --records F`), now twice.
@functools.cache
def ready():
    """gemm, compiled (or loaded from the disk cache) once per dtype for every layout, and
    compiling no other signature: call before the first kernel that calls gemm compiles
    (it types its calls against these)."""
    for dtype in (types.float32, types.float64):
        operand = types.Array(dtype, 2, "A", readonly=True)
        gemm.compile((types.boolean, types.boolean, operand, operand,
                      types.Array(dtype, 2, "A"), types.float64))
    gemm.disable_compile()
    return gemm
