"""The CPU argmax kernel (engine.backends.cpu.argmax): its maximum found by integer keys,
then the first index holding it, picks what numpy's argmax picks: the first of tied
values, the first of +0 and -0, the first NaN of either sign, infinities."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.backends.cpu.argmax import cpu_argmax

SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 3.0, -3.0]


def _engine(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape[:-1], np.int32)
    cpu_argmax(out, [x])
    return out


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 6), n=st.integers(1, 70),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_argmax_matches_numpy_on_special_values(rows, n, dtype, seed):
    """Rows of few distinct values (many ties), signed zeros, infinities and NaNs whose
    sign bit is set or clear."""
    rng = np.random.default_rng(seed)
    x = rng.choice(np.array(SPECIALS), size=(rows, n)).astype(dtype)
    x[rng.random((rows, n)) < 0.7] = 0.0     # fewer NaNs: most rows without one
    signs = rng.random((rows, n)) < 0.5
    x[signs] = np.copysign(x[signs], -1.0)   # -NaN and -0 too
    np.testing.assert_array_equal(_engine(x), np.argmax(x, -1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_argmax_of_long_rows(dtype):
    x = np.random.default_rng(0).normal(size=(5, 32000)).astype(dtype)
    x[1, 31999] = 50.0
    x[2, [7, 9]] = 50.0
    x[3, 31998] = -np.nan
    x[4, :] = -np.inf
    np.testing.assert_array_equal(_engine(x), np.argmax(x, -1))
    assert list(_engine(x)[1:]) == [31999, 7, 31998, 0]
