"""The 16-bit conversions of the CPU kernels (engine.backends.cpu.half) against numpy's
float16 and ml_dtypes' bfloat16: every one of the 65,536 patterns each way, the midpoints
between neighbours (ties to even), the edges of the ranges, and random float32 values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.backends.cpu import half

FORMATS = {"f16": (half.F16, np.dtype(np.float16)),
           "bf16": (half.BF16, np.dtype(ml_dtypes.bfloat16))}
ALL_PATTERNS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def widen(bits: np.ndarray, fmt: int) -> np.ndarray:
    out = np.empty(bits.size, np.float32)
    half.widen_array(np.ascontiguousarray(bits).ravel(), out, fmt)
    return out


def narrow(values: np.ndarray, fmt: int) -> np.ndarray:
    values = np.ascontiguousarray(values).ravel()
    out = np.empty(values.size, np.uint16)
    half.narrow_array(values, out, fmt)
    return out


def reference_narrow(values: np.ndarray, dtype) -> np.ndarray:
    with np.errstate(over="ignore"):
        return values.astype(dtype).view(np.uint16)


@pytest.mark.parametrize("name", FORMATS)
def test_every_pattern_widens_exactly(name):
    fmt, dtype = FORMATS[name]
    ours = widen(ALL_PATTERNS, fmt)
    want = ALL_PATTERNS.view(dtype).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(ours), nan)
    assert np.array_equal(ours[~nan].view(np.uint32), want[~nan].view(np.uint32))  # -0 too
    assert np.array_equal(np.signbit(ours[nan]), np.signbit(want[nan]))


@pytest.mark.parametrize("name", FORMATS)
def test_every_pattern_comes_back_from_its_float32(name):
    fmt, dtype = FORMATS[name]
    back = narrow(widen(ALL_PATTERNS, fmt), fmt)
    values = ALL_PATTERNS.view(dtype)
    finite = ~np.isnan(values.astype(np.float32))
    assert np.array_equal(back[finite], ALL_PATTERNS[finite])
    # a NaN stays a NaN of its sign (bfloat16: quiet), never an infinity
    nan_back = back[~finite].view(dtype).astype(np.float32)
    assert np.isnan(nan_back).all()
    assert np.array_equal(np.signbit(nan_back), np.signbit(values[~finite].astype(np.float32)))


@pytest.mark.parametrize("name", FORMATS)
def test_the_midpoints_round_to_even_and_their_neighbours_to_nearest(name):
    """Between each pair of adjacent finite patterns of one sign: the exact midpoint (a tie,
    which goes to the pattern with an even last bit) and the float32 values just beside it."""
    fmt, dtype = FORMATS[name]
    values = ALL_PATTERNS.view(dtype).astype(np.float64)
    positive = ALL_PATTERNS[(values > 0) & np.isfinite(values)]
    low, high = positive[:-1], positive[1:]
    lo, hi = widen(low, fmt).astype(np.float64), widen(high, fmt).astype(np.float64)
    middle = ((lo + hi) / 2).astype(np.float32)       # exact: float32 holds the midpoints
    assert np.array_equal(middle.astype(np.float64), (lo + hi) / 2)
    tie = narrow(middle, fmt)
    assert np.array_equal(tie, np.where(low % 2 == 0, low, high))
    below = np.nextafter(middle, np.float32(0))
    above = np.nextafter(middle, np.float32(np.inf))
    assert np.array_equal(narrow(below, fmt), low)
    assert np.array_equal(narrow(above, fmt), high)
    assert np.array_equal(narrow(-middle, fmt), tie | np.uint16(0x8000))
    for probe in (middle, below, above, -middle):
        assert np.array_equal(narrow(probe, fmt), reference_narrow(probe, dtype))


@pytest.mark.parametrize("name, value, pattern", [
    ("f16", 65504.0, 0x7BFF),                  # the largest finite
    ("f16", 65519.99, 0x7BFF),                 # below the midpoint to infinity
    ("f16", 65520.0, 0x7C00),                  # the midpoint: ties to even, the infinity
    ("f16", 1e6, 0x7C00), ("f16", -1e6, 0xFC00),
    ("f16", 2.0 ** -24, 0x0001),               # the smallest subnormal
    ("f16", 2.0 ** -25, 0x0000),               # half of it: a tie, to even (zero)
    ("f16", 1.5 * 2.0 ** -25, 0x0001),
    ("f16", 2.0 ** -14, 0x0400),               # the smallest normal
    ("f16", 2.0 ** -14 - 2.0 ** -25, 0x0400),  # a subnormal that rounds up into it
    ("f16", -0.0, 0x8000), ("f16", 1e-30, 0x0000),
    ("f16", float("inf"), 0x7C00), ("f16", float("-inf"), 0xFC00),
    ("bf16", 3.3895313892515355e38, 0x7F7F),   # the largest finite
    ("bf16", 3.4e38, 0x7F80),                  # rounds past it: the infinity
    ("bf16", 1.0 + 2.0 ** -8, 0x3F80),         # a tie below an even pattern
    ("bf16", 1.0 + 3 * 2.0 ** -8, 0x3F82),     # a tie above an odd one
    ("bf16", float("-inf"), 0xFF80), ("bf16", -0.0, 0x8000),
    ("bf16", 1e-45, 0x0000),                   # float32's smallest subnormal, rounded
])
def test_range_edges(name, value, pattern):
    fmt, dtype = FORMATS[name]
    got = narrow(np.array([value], np.float32), fmt)[0]
    assert got == pattern, f"{got:#06x}"
    assert got == reference_narrow(np.array([value], np.float32), dtype)[0]


@pytest.mark.parametrize("name", FORMATS)
def test_nan_payloads_stay_nan(name):
    fmt, dtype = FORMATS[name]
    payloads = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F801FFF, 0xFFBFFFFF,
                         0x7FA00000], np.uint32).view(np.float32)
    out = narrow(payloads, fmt).view(dtype).astype(np.float32)
    assert np.isnan(out).all()
    assert np.array_equal(np.signbit(out), np.signbit(payloads))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=64),
       st.sampled_from(sorted(FORMATS)))
def test_random_float32_values_round_as_the_references_do(values, name):
    fmt, dtype = FORMATS[name]
    x = np.array(values, np.float32)
    assert np.array_equal(narrow(x, fmt), reference_narrow(x, dtype))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(allow_nan=False), min_size=1, max_size=32),
       st.sampled_from(sorted(FORMATS)))
def test_float64_values_round_once_correctly(values, name):
    """Through float32 and then 16 bits: still the correctly rounded pattern (2p + 2 rule)."""
    fmt, dtype = FORMATS[name]
    x = np.array(values, np.float64)
    assert np.array_equal(narrow(x, fmt), reference_narrow(x, dtype))


def test_every_float32_with_a_subnormal_float16_rounds_as_numpy_does():
    """Every positive float32 from 2^-26 (below half the smallest subnormal) up to float16's
    smallest normal, 96 million of them: the rounding of the subnormal branch (0.5 added),
    its ties and its carry into the smallest normal, against numpy (the sign only sets
    the sign bit, checked by the tests above)."""
    lo, hi = 101 << 23, 0x38800000 + 1
    step = 1 << 23
    for start in range(lo, hi, step):
        values = np.arange(start, min(start + step, hi), dtype=np.uint32).view(np.float32)
        assert np.array_equal(narrow(values, half.F16), reference_narrow(values, np.float16))


def test_every_float32_nan_keeps_its_payload_as_numpy_does():
    """All 2^24 - 2 float32 NaNs, both signs: the sign, the payload's top 10 bits, and 1
    where those are all zero (so that no NaN becomes an infinity), bit for bit as numpy."""
    payloads = np.arange(1, 1 << 23, dtype=np.uint32)
    values = np.concatenate([payloads | 0x7F800000, payloads | 0xFF800000]).view(np.float32)
    assert np.array_equal(narrow(values, half.F16), reference_narrow(values, np.float16))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_widened_copies_keep_a_permuted_layout(dtype):
    """widened_copy of a permuted view of a contiguous block (a transposed matrix, matmul's
    backward operands) is the same permutation of a contiguous float32 block, widened in
    memory order; other strided views (sliced, broadcast) come back contiguous; the values
    exact in every case."""
    x = np.random.default_rng(3).uniform(-4.0, 4.0, (6, 5, 4)).astype(dtype)
    for view, permuted in [(x, False), (x.T, True), (x.transpose(1, 0, 2), True),
                           (x[:, :, None].transpose(3, 2, 0, 1), True), (x[::2], False),
                           (x[:, 1:4].transpose(2, 0, 1), False),
                           (np.broadcast_to(x[:1], (3, 5, 4)), False)]:
        wide = half.widened_copy(view)
        assert wide.dtype == np.float32 and wide.shape == view.shape
        assert np.array_equal(wide, view.astype(np.float32))
        assert wide.flags.c_contiguous != permuted
        if permuted:
            order = np.argsort([-s for s in view.strides], kind="stable")
            assert wide.transpose(order).flags.c_contiguous


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_conversions_split_on_the_threads_give_the_same_bits(dtype, monkeypatch):
    """widened_copy(split=True) and split_store in ranges on 3 engine threads (ragged: the
    sizes are not multiples of 3) against the conversions in one range, on every pattern
    (NaNs and subnormals included) in a contiguous and a transposed layout, and on values
    that round; the split is recorded (split:half_widen, split:half_store), and not in
    plain mode or below half.SPLIT_MIN_ELEMENTS."""
    from engine.backends.cpu import paths, threads
    monkeypatch.setattr(threads, "THREADS", 3)
    monkeypatch.setattr(half, "SPLIT_MIN_ELEMENTS", 1 << 12)
    patterns = np.resize(ALL_PATTERNS, (163, 409)).view(dtype)
    values = np.random.default_rng(4).normal(size=(409, 163)).astype(np.float32)
    for x in (patterns, patterns.T):
        with paths.recording() as taken:
            wide = half.widened_copy(x, split=True)
        assert taken["split:half_widen"] == 1
        assert np.array_equal(wide.view(np.uint32), half.widened_copy(x).view(np.uint32))
        assert wide.flags.c_contiguous == x.flags.c_contiguous
    for v in (values, values.T):                  # a transposed source is made contiguous
        split, whole = (np.empty(v.shape, dtype) for _ in range(2))
        with paths.recording() as taken:
            half.split_store(split, v)
        half.store(whole, v)
        assert taken["split:half_store"] == 1
        assert np.array_equal(split.view(np.uint16), whole.view(np.uint16))
    with paths.plain(), paths.recording() as taken:
        half.widened_copy(patterns, split=True)
        half.split_store(np.empty(values.shape, dtype), values)
    monkeypatch.setattr(half, "SPLIT_MIN_ELEMENTS", patterns.size + 1)
    with paths.recording() as small:
        half.widened_copy(patterns, split=True)
    assert not taken and not small


def test_a_store_into_a_strided_destination_is_not_split(monkeypatch):
    """split_store hands a non-contiguous destination to store in one range (a flat view
    of it would be a copy)."""
    from engine.backends.cpu import paths, threads
    monkeypatch.setattr(threads, "THREADS", 2)
    monkeypatch.setattr(half, "SPLIT_MIN_ELEMENTS", 1)
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    dst = np.zeros((4, 3), np.float16).T
    with paths.recording() as taken:
        half.split_store(dst, values)
    assert not taken


def _widened_matmul(dtype):
    """A 16-bit product kernel as the backend runs it (half.widened, split), and its
    operands."""
    from engine.backends.cpu.matmul import cpu_matmul
    rng = np.random.default_rng(5)
    a, b = (rng.normal(size=s).astype(dtype) for s in ((37, 41), (41, 29)))
    return half.widened(cpu_matmul, split=True), a, b


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_a_16_bit_product_keeps_its_temporaries_between_calls(dtype):
    """The split widened kernel (matmul's) takes its float32 temporaries from its thread's
    kept buffers (widen:scratch), one per temporary: the same bits as new arrays (plain
    mode, which records nothing), call after call, products of other shapes between."""
    from engine.backends.cpu import paths
    kernel, a, b = _widened_matmul(dtype)
    want = np.empty((37, 29), dtype)
    with paths.plain(), paths.recording() as plain:
        kernel(want, [a, b])
    assert not plain
    for shape_a, shape_b in [((37, 41), (41, 29)), ((300, 9), (9, 200)), ((37, 41), (41, 29))]:
        x, y = a, b
        if shape_a != a.shape:
            x, y = (np.ones(s, dtype) for s in (shape_a, shape_b))
        got = np.empty((x.shape[0], y.shape[1]), dtype)
        with paths.recording() as taken:
            kernel(got, [x, y])
        assert taken["widen:scratch"] == 1
        if x is a:
            assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
        else:
            assert (got == 9).all()
    kept = half._KEPT.buffers
    assert len(kept) == 3 and len({k.ctypes.data for k in kept}) == 3


def test_kept_temporaries_are_poisoned_fresh_in_nested_calls_and_above_the_cap(monkeypatch):
    """Under paths.POISON a kept buffer is handed out filled with NaN bytes, as a new arena
    is; a call nested in one that holds the buffers, and a temporary bigger than
    SCRATCH_MAX_ELEMENTS, get new arrays."""
    from engine.backends.cpu import paths
    seen = []

    def run(scratch):
        first = scratch.empty((4, 5))
        seen.append(first)
        assert not half.Scratch.held(lambda inner: None)        # nested: not held
        big = scratch.empty((half.SCRATCH_MAX_ELEMENTS + 1,))
        assert not any(np.shares_memory(big, k) for k in half._KEPT.buffers)
    with paths.poisoned():
        assert half.Scratch.held(run)
    assert np.isnan(seen[0]).all()
    seen[0][...] = 1.0
    with paths.poisoned():
        half.Scratch.held(lambda scratch: seen.append(scratch.empty((4, 5))))
    assert np.shares_memory(seen[0], seen[1]) and np.isnan(seen[1]).all()


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_widen_into_fills_the_layout_widened_like_gives(dtype, monkeypatch):
    """widen_into writes widened_copy's values into widened_like's array (contiguous, a
    transposed view, every other row of a bigger one, row ranges of its memory block), and
    copies where widened_copy returns an array of its own (the self-test's replacements)."""
    base = np.resize(ALL_PATTERNS, (96, 130)).view(dtype)
    for a in (base, base.T, base[::2]):
        dst = half.widened_like(a, lambda shape: np.full(shape, np.nan, np.float32))
        half.widen_into(dst, a)
        assert np.array_equal(dst.view(np.uint32), half.widened_copy(a).view(np.uint32))
        blocks = half.memory_blocks(a, dst)
        if blocks is not None:
            src, wide = blocks
            assert src.flags.c_contiguous and wide.flags.c_contiguous
            wide[...] = np.nan
            for lo, hi in ((0, 7), (7, src.shape[0])):
                half.widen_into(wide[lo:hi], src[lo:hi])
            assert np.array_equal(dst.view(np.uint32), half.widened_copy(a).view(np.uint32))
    real = half.widened_copy
    monkeypatch.setattr(half, "widened_copy", lambda a, **kwargs: real(a))
    dst = half.widened_like(base.T, lambda shape: np.zeros(shape, np.float32))
    half.widen_into(dst, base.T)
    assert np.array_equal(dst.view(np.uint32), real(base.T).view(np.uint32))
