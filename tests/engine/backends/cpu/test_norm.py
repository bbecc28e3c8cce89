"""engine.backends.cpu.norm: the kernels of norm and rms_norm read 16-bit rows as their
patterns and run in ranges of rows on the engine's threads, the same bits at every thread
count."""

from __future__ import annotations

import numpy as np
import pytest
from ml_dtypes import bfloat16

from engine.backends.cpu import threads
from engine.backends.cpu.norm import cpu_norm, cpu_norm_back, cpu_rms_norm, cpu_rms_norm_back

DTYPES = [np.float32, np.float64, np.float16, bfloat16]


@pytest.fixture
def split_small(monkeypatch):
    monkeypatch.setattr(threads, "MIN_ELEMENTS", 0)
    before = threads.get_num_threads()
    yield threads.set_num_threads
    threads.set_num_threads(before)


def _rows(dtype, shape=(37, 1001), seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=shape) * 3 + 2).astype(dtype)


def _reference(op, g, x, eps):
    """norm and norm_back (or rms_norm and rms_norm_back) in float64 from the rows'
    values."""
    x, g = x.astype(np.float64), g.astype(np.float64)
    if op == "rms_norm":
        s = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
        return x * s, s * g - x * s ** 3 * (g * x).mean(-1, keepdims=True)
    d = x - x.mean(-1, keepdims=True)
    s = 1 / np.sqrt((d * d).mean(-1, keepdims=True) + eps)
    xhat = d * s
    back = s * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return xhat, back


KERNELS = {"norm": (cpu_norm, cpu_norm_back), "rms_norm": (cpu_rms_norm, cpu_rms_norm_back)}


def _both(op, g, x, eps):
    forward, backward = KERNELS[op]
    out, back = np.empty_like(x), np.empty_like(x)
    forward(out, [x], eps=eps)
    backward(back, [g, x], eps=eps)
    return out, back


@pytest.mark.parametrize("op", sorted(KERNELS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_same_bits_at_every_thread_count(op, dtype, split_small):
    x, g = _rows(dtype), _rows(dtype, seed=1)
    split_small(1)
    want = _both(op, g, x, 1e-5)
    for n in (2, 3, 7):
        split_small(n)
        for got, w in zip(_both(op, g, x, 1e-5), want, strict=True):
            np.testing.assert_array_equal(got.view(np.uint8), w.view(np.uint8))


@pytest.mark.parametrize("op", sorted(KERNELS))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, bfloat16])
def test_within_rounding_of_the_float64_values(op, dtype, split_small):
    """Each output is its float64 value rounded to the dtype: one ulp off at most (two for
    float32, whose outputs are rounded from the kernel's float64 sums in an order other
    than numpy's). float64 has no exact float64 reference to hold it to."""
    split_small(3)
    x, g = _rows(dtype), _rows(dtype, seed=1)
    for got, want in zip(_both(op, g, x, 1e-4), _reference(op, g, x, 1e-4), strict=True):
        ulp = np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
        err = np.abs(got.astype(np.float64) - want)
        assert (err <= ulp * (1.0 if np.dtype(dtype).itemsize == 2 else 2.0)).all(), \
            float((err / ulp).max())


@pytest.mark.parametrize("op", sorted(KERNELS))
@pytest.mark.parametrize("dtype", [np.float16, bfloat16])
def test_16_bit_nans_and_infinities_spread_along_their_rows_only(op, dtype):
    """A row holding a NaN or an infinity is stored through the NaN fix-ups
    (patterns.rounded), the others without (patterns.rounded_number); the NaNs lie where
    float32's lie (rms_norm scales a row holding an infinity by 0: NaN at the infinity
    only)."""
    x, g = _rows(dtype, (4, 50)), _rows(dtype, (4, 50), 2)
    x[1, 3], x[2, 7] = np.nan, np.inf
    got = _both(op, g, x, 1e-5)
    want = _both(op, g.astype(np.float32), x.astype(np.float32), 1e-5)
    for a, w in zip(got, want, strict=True):
        a = a.astype(np.float32)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(w))
        assert np.isnan(a[1]).all() and np.isnan(a[2]).any()
        assert np.isfinite(a[[0, 3]]).all()


@pytest.mark.parametrize("op", sorted(KERNELS))
@pytest.mark.parametrize("dtype", [np.float16, bfloat16])
def test_16_bit_rows_of_zeros_without_eps_give_nans(op, dtype):
    """eps = 0 and a row of zeros: 0 / 0 on the fix-ups' path (the row's scale is
    infinite), as in float32."""
    x = _rows(dtype, (3, 40))
    x[1] = 0
    out, back = _both(op, _rows(dtype, (3, 40), 2), x, 0.0)
    want = _both(op, _rows(np.float32, (3, 40), 2), x.astype(np.float32), 0.0)
    for a, w in zip((out, back), want, strict=True):
        np.testing.assert_array_equal(np.isnan(a.astype(np.float32)), np.isnan(w))
        assert np.isnan(a[1].astype(np.float32)).all()
