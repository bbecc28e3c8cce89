"""gemm, SciPy's BLAS called from numba kernels (engine.backends.cpu.blas), against
numpy's matmul: both transposes, rows lying apart (leading dimensions), beta 0 and 1,
empty products, float32 and float64."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.backends.cpu.blas import ready

gemm = ready()      # the compilations the kernels call: one per dtype, any layout


def _rows(rng, shape, dtype, pad):
    """A (rows, cols) view whose rows lie `pad` elements apart beyond their length."""
    whole = rng.normal(size=(shape[0], shape[1] + pad)).astype(dtype)
    return whole[:, :shape[1]]


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 9), n=st.integers(0, 9), k=st.integers(0, 9),
       trans_a=st.booleans(), trans_b=st.booleans(), beta=st.sampled_from([0.0, 1.0]),
       pads=st.tuples(*[st.integers(0, 3)] * 3), dtype=st.sampled_from(["f4", "f8"]),
       seed=st.integers(0, 2**16))
def test_gemm_matches_numpy(m, n, k, trans_a, trans_b, beta, pads, dtype, seed):
    rng = np.random.default_rng(seed)
    a = _rows(rng, (k, m) if trans_a else (m, k), dtype, pads[0])
    b = _rows(rng, (n, k) if trans_b else (k, n), dtype, pads[1])
    whole = np.full((m, n + pads[2]), 7.0, dtype)
    c = whole[:, :n]
    if beta:
        c[...] = rng.normal(size=(m, n))
    want = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b) + beta * c
    gemm(trans_a, trans_b, a, b, c, beta)
    tol = 1e-5 if dtype == "f4" else 1e-13
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol)
    assert np.all(whole[:, n:] == 7.0)            # the gaps between rows are not written


def test_an_empty_sum_clears_c_at_beta_0_and_keeps_it_at_1():
    c = np.full((3, 4), 5.0, np.float32)
    gemm(False, False, np.empty((3, 0), np.float32), np.empty((0, 4), np.float32), c, 1.0)
    assert np.all(c == 5.0)
    gemm(False, False, np.empty((3, 0), np.float32), np.empty((0, 4), np.float32), c, 0.0)
    assert np.all(c == 0.0)
