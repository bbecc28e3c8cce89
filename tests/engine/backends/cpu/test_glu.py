"""The GLU family's vector kernels (engine.backends.cpu.glu, the path `vector:<op>`):
act(a) b from the activations' vectorised float64 math, rounded once, within 0.5001 ulp of
float32 of the float64 reference (geglu_erf and swiglu: from their activation's float32
math, within its bound plus the product's half ulp) over a dense sample of every exponent,
in both layouts (rows of a contiguous input; strided inputs copied contiguous first, the
same bits); a gate of 1 gives the bits of the activation's own vector kernel (whose every
float32 input tests/engine/backends/cpu/test_vector_unary.py checks), in float32 and on all
2^16 patterns of each 16-bit format; the scale cases take the vector kernels and plain
mode the row's libm math."""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
import pytest

from engine.backends.cpu import elementwise as cpu
from engine.backends.cpu import paths
from engine.backends.cpu.glu import ACTIVATIONS, glu
from engine.backends.cpu.vector_unary import FAST
from engine.registry import get_op
from tests.engine.backends.cpu.test_paths import _run
from tests.engine.backends.cpu.test_vector_unary import F32_MATH_ULPS, REFERENCES, dense_sample

VECTOR_OPS = sorted(op for op, act in ACTIVATIONS.items() if act in FAST)
ULPS = 0.5001                     # the activations' forward bound (vector_unary.FAST), but
FLOAT32_MATH = {op: F32_MATH_ULPS[(act, "forward")] + 0.5       # where it is float32 math
                for op, act in ACTIVATIONS.items() if (act, "forward") in F32_MATH_ULPS}
FLT_MAX_ROUNDING = 3.4028235677973366e38     # the float64 values that round to inf beyond
N = 1024                          # row length of the samples laid out as (rows, N)
RNG = np.random.default_rng(20261206)


def _reference(act):
    reference = REFERENCES[(act, "forward")]

    @numba.njit(cache=False)
    def products(a, b, t):
        """t[i] = act(a[i]) b[i] in float64 (the reference's value; its terms never cancel
        for a forward)."""
        for i in range(a.size):
            t[i] = reference(np.float64(a[i]), 1.0)[0] * np.float64(b[i])
    return products


def _rows(v: np.ndarray) -> np.ndarray:
    """v padded with ones to a multiple of N, as (rows, N)."""
    pad = (-v.size) % N
    return np.concatenate([v, np.ones(pad, v.dtype)]).reshape(-1, N)


def _glu(op, ins, out_shape, dtype, swapped=False):
    """The kernel's output, and the paths it took."""
    out = np.empty(out_shape, dtype)
    with paths.recording() as taken:
        glu(op)(out, ins, swapped=swapped)
    return out, taken


def _ulp_errors(y: np.ndarray, t: np.ndarray) -> np.ndarray:
    """y's error in ulps of float32 at the float64 truth t, where t is finite in float32
    (NaN and overflow checked by the caller)."""
    mag = np.abs(t)
    ulp = np.where(mag < 2.0 ** -126, 2.0 ** -149,
                   np.ldexp(1.0, np.frexp(np.maximum(mag, 2.0 ** -126))[1] - 24))
    return np.abs(y.astype(np.float64) - t) / ulp


@pytest.fixture(scope="module")
def sample():
    a = _rows(dense_sample())
    b = RNG.uniform(-2.0, 2.0, a.shape).astype(np.float32)
    return a, b


@pytest.mark.parametrize("layout", ["fused", "strided"])
@pytest.mark.parametrize("op", VECTOR_OPS)
def test_products_within_half_an_ulp(op, layout, sample):
    """act(a) b within ULPS of the float64 reference on every exponent of a (the dense
    sample of test_vector_unary), b uniform in [-2, 2]: the fused layout (a contiguous x,
    swapped) by rows, a transposed a and a strided b copied contiguous first (the bits
    of the contiguous split inputs'); NaN where the truth is, the infinity of its sign
    beyond float32's range."""
    a, b = sample
    if layout == "fused":
        out, taken = _glu(op, [np.concatenate([b, a], axis=1)], a.shape, np.float32, True)
    else:
        at = np.ascontiguousarray(a.T).T          # a transposed view of a's values
        bs = np.repeat(b, 2, axis=1)[:, ::2]      # every second column of b's double
        out, taken = _glu(op, [at, bs], a.shape, np.float32)
        dense, _ = _glu(op, [a, b], a.shape, np.float32)
        assert np.array_equal(out.view(np.uint32), dense.view(np.uint32))
    assert taken[f"vector:{op}"] > 0, sorted(taken)
    t = np.empty(a.size)
    _reference(ACTIVATIONS[op])(a.reshape(-1), b.reshape(-1), t)
    y = out.reshape(-1)
    nan = np.isnan(t)
    assert np.array_equal(np.isnan(y), nan), f"{op}: NaN where the truth is not"
    big = ~nan & (np.abs(t) >= FLT_MAX_ROUNDING)
    assert np.array_equal(y[big], np.copysign(np.inf, t[big]).astype(np.float32))
    rest = ~nan & ~big
    err = _ulp_errors(y[rest], t[rest])
    worst = int(np.argmax(err))
    at_a, at_b = a.reshape(-1)[rest][worst], b.reshape(-1)[rest][worst]
    bound = FLOAT32_MATH.get(op, ULPS)
    assert err[worst] <= bound, f"{op}: {err[worst]:.6f} ulp at a = {at_a!r}, b = {at_b!r}"


@pytest.mark.parametrize("op", VECTOR_OPS)
def test_a_gate_of_one_gives_the_activations_bits(op, sample):
    """With b = 1 the product is exact: out is the activation's own float32 vector kernel's
    output, bit for bit, special values included (a NaN's up to its sign, which is the
    compiler's choice: on an AVX2 target the two kernels' NaNs of geglu and geglu_erf
    differed in their sign, at f16f1b4 already)."""
    a, _ = sample
    out, _ = _glu(op, [a, np.ones_like(a)], a.shape, np.float32)
    want = np.empty_like(a)
    cpu.unary(ACTIVATIONS[op])(want, [a])
    sign = np.where(np.isnan(want), np.uint32(0x7FFFFFFF), np.uint32(0xFFFFFFFF))
    assert np.array_equal(out.view(np.uint32) & sign, want.view(np.uint32) & sign)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("op", VECTOR_OPS)
def test_every_16_bit_pattern_through_the_native_kernel(op, dtype):
    """All 2^16 patterns of a 16-bit format as a, b = 1, fused: read and rounded as patterns
    in one pass (the path vector:<op>), the bits of the activation's native 16-bit kernel
    (a NaN's up to its sign);
    with b drawn, the same values as the plain twin's (the row's math in float32 temporaries)
    but for its double rounding, at most one ulp of the format away."""
    a = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype).reshape(-1, 256)
    out, taken = _glu(op, [np.concatenate([a, np.ones_like(a)], axis=1)], a.shape, dtype)
    assert taken[f"vector:{op}"] > 0, sorted(taken)
    want = np.empty_like(a)
    cpu.unary(ACTIVATIONS[op])(want, [a])
    # a NaN result's sign is the compiler's choice (LLVM holds NaN signs unspecified and
    # folds |v| |v| into v v: gelu_erf's float32 math, recompiled with another exp, turned
    # a NaN input's sign from cleared to kept): the same bits but for the sign of a NaN
    sign = np.where(np.isnan(want.astype(np.float32)), np.uint16(0x7FFF), np.uint16(0xFFFF))
    assert np.array_equal(out.view(np.uint16) & sign, want.view(np.uint16) & sign)
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(a.astype(np.float32)) & (np.abs(a.astype(np.float32)) < 1e3)
    b = RNG.uniform(-2.0, 2.0, a.shape).astype(dtype)
    fast, _ = _glu(op, [a, b], a.shape, dtype)
    with paths.plain():
        plain, taken = _glu(op, [a, b], a.shape, dtype)
    assert not taken
    bits = lambda v: v.view(np.int16).astype(np.int32)[finite]  # noqa: E731
    assert np.abs(bits(fast) - bits(plain)).max() <= 1


@pytest.mark.parametrize("op", VECTOR_OPS)
def test_scale_cases_take_the_vector_kernels(op):
    """Every scale case of a GLU op runs its vector kernel (swiglu's split case, a permuted
    a, by 4-D views), compared with its plain twin by gradcheck's scale tier; plain mode
    runs the row's math."""
    for case in get_op(op).scale():
        taken = _run(case)
        assert taken[f"vector:{op}"] > 0, (str(case), sorted(taken))
        with paths.plain():
            assert not _run(case)
