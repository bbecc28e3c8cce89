"""CPU kernel of matmul: numpy's BLAS-backed matmul, written into the op's buffer.

Batch axes broadcast as in numpy. Inputs may be strided views (a transposed operand goes to
BLAS as a transposed matrix, without a copy, where numpy can).
"""

from __future__ import annotations

import numpy as np


def cpu_matmul(out, ins):
    a, b = ins
    np.matmul(a, b, out=out)
