"""A planted out-of-bounds write in a real numba kernel, put in place when this module is
imported: relu's CPU kernel, for a float32 output, also writes one element 2**36 elements
past its end. Compiled as the engine compiles its kernels (engine.backends.cpu.jit, bounds
checks off), that write lands in unmapped memory (SIGSEGV); compiled with numba's bounds
checks (NUMBA_BOUNDSCHECK=1) it raises IndexError.

Import it only in a worker process (tests.gradcheck.planted_run adds it to what every
worker imports): a process that imports it has a broken float32 relu for good. The float64
references, computed in gradcheck's own process, never meet it.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu import jit
from engine.mutation.patches import rebound
from engine.registry import get_op

PAST = 1 << 36          # elements past the end: far beyond any mapping near the heap


@jit.kernel
def write_past(flat):
    """One element written PAST elements beyond the end of 1-D `flat`."""
    flat[flat.size + PAST] = 1.0


def _planted(real_prepare):
    def cpu_relu_writing_past(out, ins, **params):
        run = real_prepare(out, ins, **params)
        if out.dtype != np.float32:
            return run
        flat = out.reshape(-1)

        def run_and_write_past():
            run()
            write_past(flat)
        return run_and_write_past
    return cpu_relu_writing_past


_relu = get_op("relu")
_relu.kernels = {**_relu.kernels, "cpu": rebound(_relu.kernels["cpu"], _planted)}
