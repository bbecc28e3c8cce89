"""cast's one-pass CPU kernel between a 16-bit float and float32 or float64 (the path
half:cast): the bits of its plain twin, the widened copy (half.widened), for every 16-bit
pattern widened and for float32 and float64 values rounded (specials, ties, overflow and
subnormals among them), strided inputs too; the scale cases take it, plain mode does not."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from engine.backends.cpu import paths
from engine.ops.cast import cpu_cast
from engine.registry import get_op
from tests.engine.backends.cpu.test_paths import _run

HALF = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def _both(x, dtype, name):
    """(the kernel's output, its plain twin's, the paths the first took)."""
    fast, plain = np.empty(x.shape, dtype), np.empty(x.shape, dtype)
    with paths.recording() as taken:
        cpu_cast(fast, [x], dtype=name)
    with paths.plain():
        cpu_cast(plain, [x], dtype=name)
    return fast, plain, taken


@pytest.mark.parametrize("wide", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(HALF))
def test_every_pattern_widens_as_the_plain_twin(name, wide):
    """All 2^16 patterns, contiguous and transposed: the plain twin's bits (zeros' signs,
    subnormals, infinities), NaN where it has NaN."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(HALF[name]).reshape(256, 256)
    for view in (x, x.T):
        fast, plain, taken = _both(view, wide, "f32" if wide == np.float32 else "f64")
        assert taken["half:cast"] == 1
        nan = np.isnan(plain)
        assert np.array_equal(np.isnan(fast), nan)     # NaN payloads: numpy's conversions'
        assert np.array_equal(fast[~nan].view(np.uint8), plain[~nan].view(np.uint8))


@pytest.mark.parametrize("wide", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(HALF))
def test_values_round_as_the_plain_twin(name, wide):
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).astype(wide)          # every exponent, NaNs and infinities
    x[:4] = [65520.0, 65519.99, 2.0 ** -25, 1.0 + 2.0 ** -8]    # float16's edges, a tie
    x = x.reshape(256, 256)
    for view in (x, x.T):
        fast, plain, taken = _both(view, HALF[name], name)
        assert taken["half:cast"] == 1
        assert np.array_equal(fast.view(np.uint16), plain.view(np.uint16))


def test_between_16_bit_formats_and_in_plain_mode_the_widened_twin_runs():
    x = np.linspace(-3.0, 3.0, 64).astype(np.float16)
    _, _, taken = _both(x, ml_dtypes.bfloat16, "bf16")
    assert not taken


@pytest.mark.parametrize("name", sorted(HALF))
def test_the_scale_cases_take_the_one_pass_kernel(name):
    """The cast of float32 to a 16-bit float rounds in one pass, its gradient (the cast
    back) widens in one pass; plain mode takes the widened twin."""
    case = next(c for c in get_op("cast").scale() if f"dtype={name})" in str(c))
    taken = _run(case)
    assert taken["half:cast"] >= 2, sorted(taken)
    with paths.plain():
        assert not _run(case)
