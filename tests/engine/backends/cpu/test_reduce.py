"""The CPU sums (engine.backends.cpu.reduce): one fixed order of float64 additions, written
down here in numpy and met bit for bit; the same bits for every thread count; the error of
a float32 sum at the float32 rounding of its result."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.backends.cpu import reduce, threads
from engine.backends.cpu.reduce import cpu_sum

DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.fixture
def split_everything(monkeypatch):
    """Sums split on the engine's threads however small (set_num_threads(n) then decides
    the split of kernels bound afterwards)."""
    monkeypatch.setattr(threads, "MIN_ELEMENTS", 0)
    before = threads.get_num_threads()
    yield threads.set_num_threads
    threads.set_num_threads(before)


# --- the order, in numpy: float64 arrays added element by element, as the kernels do -------
def _lanes_total(acc: np.ndarray) -> float:
    acc = acc.copy()
    w = acc.size
    while w > 1:
        h = (w + 1) // 2
        acc[:w - h] += acc[h:w]
        w = h
    return float(acc[0])


def _lane_sum(v: np.ndarray, w: int) -> float:
    """add_run into w zeroed lanes, then lanes_total."""
    acc = np.zeros(w)
    full = v.size // (8 * w) * (8 * w)
    for lo in range(0, full, 8 * w):
        b = v[lo:lo + 8 * w].reshape(8, w)
        acc += ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]))
    for lo in range(full, v.size, w):
        blk = v[lo:lo + w]
        acc[:blk.size] += blk
    return _lanes_total(acc)


def _interleaved_sum(v: np.ndarray) -> float:
    """run_sum: eight partial sums (lanes j mod 8, the tail in the first), pairwise."""
    s = [0.0] * 8
    n8 = v.size // 8 * 8
    for i in range(n8):
        s[i % 8] += v[i]
    for i in range(n8, v.size):
        s[0] += v[i]
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))


def _row_sum(v: np.ndarray) -> float:
    """The sum of one contiguous run (a row), as the kernels order it."""
    if v.size < 16:
        return _interleaved_sum(v)
    return _lane_sum(v, -(-min(v.size, reduce.LANES) // reduce.LINE) * reduce.LINE)


def _whole_sum(v: np.ndarray) -> float:
    """A whole-tensor sum: chunks set by the size, each in LANES lanes, then in order."""
    nchunks = min(reduce.MAX_CHUNKS, max(1, v.size // 4096))
    chunk = -(-v.size // nchunks)
    total = 0.0
    for c in range(nchunks):
        total += _lane_sum(v[c * chunk:(c + 1) * chunk], reduce.LANES)
    return total


def _engine(x: np.ndarray, axes) -> np.ndarray:
    out = np.empty(tuple(n for i, n in enumerate(x.shape) if i not in axes), x.dtype)
    cpu_sum(out, [x], axes=axes, keepdims=False)
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _at_thread_counts(x: np.ndarray, axes) -> list[np.ndarray]:
    """The sums split on 1, 2, 3 and 7 threads however small (hypothesis' examples run
    inside one test call, so no fixture)."""
    before, saved = threads.get_num_threads(), threads.MIN_ELEMENTS
    threads.MIN_ELEMENTS = 0
    try:
        got = []
        for count in (1, 2, 3, 7):
            threads.set_num_threads(count)
            got.append(_engine(x, axes))
    finally:
        threads.set_num_threads(before)
        threads.MIN_ELEMENTS = saved
    return got


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("n", [3, 15, 16, 17, 64, 100, 511, 512, 513, 1031, 4096, 5000])
def test_row_sums_add_in_the_documented_order(dtype, n):
    """Every row's sum is exactly the order the module doc gives (rounded once into the
    row's dtype): no reordering by the compiler, on any machine."""
    x = np.random.default_rng(n).normal(size=(3, n)).astype(DTYPES[dtype])
    want = np.array([_row_sum(r) for r in x.astype(np.float64)]).astype(x.dtype)
    assert _same_bits(_engine(x, (1,)), want)


@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("size", [1000, 8191, 8192, 300_001, 1_062_961])
def test_whole_sums_add_in_the_documented_order(dtype, size):
    x = np.random.default_rng(size).normal(size=size).astype(DTYPES[dtype])
    want = np.array(_whole_sum(x.astype(np.float64))).astype(x.dtype)
    assert _same_bits(_engine(x, (0,)), want)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), n=st.integers(1, 3000),
       dtype=st.sampled_from(["f32", "f64", "f16", "bf16"]),
       axes=st.sampled_from([(1,), (0, 1), (0,)]), seed=st.integers(0, 2**16))
def test_every_thread_count_gives_the_same_bits(rows, n, dtype, axes, seed):
    """Ragged sizes split on 1, 2, 3 and 7 threads (split_everything, entered per example):
    the same bits each time."""
    x = np.random.default_rng(seed).normal(size=(rows, n)).astype(DTYPES[dtype])
    got = _at_thread_counts(x, axes)
    assert all(_same_bits(g, got[0]) for g in got[1:]), [g.tobytes()[:16] for g in got]


def test_a_big_whole_sum_runs_its_chunks_on_the_threads(split_everything):
    from engine.backends.cpu import paths
    x = np.random.default_rng(0).normal(size=(1031, 1031)).astype(np.float32)
    split_everything(3)
    with paths.recording() as taken:
        got = _engine(x, (0, 1))
    assert taken["sum:chunks_split"] == 1 and taken["sum:chunks"] == 1
    split_everything(1)
    assert _same_bits(got, _engine(x, (0, 1)))


@pytest.mark.parametrize("data", ["positive", "cancelling"])
@pytest.mark.parametrize("n", [4096, 65536])
def test_float32_sums_err_at_the_rounding_of_the_result(data, n):
    """A float32 row sum is the exact sum rounded to float32, up to 1e-12 of the sum of
    magnitudes (float64 lanes). Summed in float32 (the same 64 lanes and steps, or as
    torch 2.13 sums), these rows err up to 11-62 times this bound when they cancel, 1.4-2.3
    times when positive (measured with a numpy model of float32 lanes)."""
    rng = np.random.default_rng(n)
    x = (rng.uniform(0.5, 1.0, (8, n)) if data == "positive" else
         rng.normal(size=(8, n))).astype(np.float32)
    exact = np.array([math.fsum(r) for r in x.astype(np.float64)])
    bound = np.spacing(np.abs(exact).astype(np.float32)) / 2 + \
        1e-12 * np.abs(x.astype(np.float64)).sum(-1)
    err = np.abs(_engine(x, (1,)).astype(np.float64) - exact)
    assert (err <= bound).all(), (err / bound).max()


def _grouped_runs_sum(runs: np.ndarray, w: int) -> float:
    """add_runs_grouped into w zeroed lanes, then lanes_total: eight runs at a time, each
    block of w lanes added pairwise across the eight; the runs left one by one."""
    acc = np.zeros(w)
    full = runs.shape[0] // 8 * 8
    for m in range(0, full, 8):
        b = runs[m:m + 8]
        for lo in range(0, runs.shape[1], w):
            c = b[:, lo:lo + w]
            acc[:c.shape[1]] += ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]))
    for m in range(full, runs.shape[0]):
        for lo in range(0, runs.shape[1], w):
            c = runs[m, lo:lo + w]
            acc[:c.size] += c
    return _lanes_total(acc)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("shape", [(8, 3, 4, 4), (13, 5, 7, 7), (500, 16, 7, 7), (19, 2, 14, 14),
                                   (9, 4, 3, 20), (3, 2, 5, 5)])
def test_channel_sums_add_in_the_documented_order(dtype, shape):
    """The sum of (N, C, H, W) over N, H and W (a bias gradient): runs of H W, eight images
    at a time where there are eight or more (sum:runs_grouped), else run by run."""
    from engine.backends.cpu import paths
    x = np.random.default_rng(sum(shape)).normal(size=shape).astype(DTYPES[dtype])
    n, c, h, w = shape
    run = h * w
    lanes = -(-min(run, reduce.LANES) // reduce.LINE) * reduce.LINE
    wide = x.astype(np.float64)
    grouped = run >= 16 and n >= 8 and run < 8 * lanes
    if grouped:
        want = [_grouped_runs_sum(wide[:, k].reshape(n, run), lanes) for k in range(c)]
    elif run >= 16:
        want = []
        for k in range(c):
            acc = np.zeros(lanes)
            for m in range(n):
                full = run // (8 * lanes) * (8 * lanes)
                v = wide[m, k].reshape(-1)
                for lo in range(0, full, 8 * lanes):
                    b = v[lo:lo + 8 * lanes].reshape(8, lanes)
                    acc += ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]))
                for lo in range(full, run, lanes):
                    blk = v[lo:lo + lanes]
                    acc[:blk.size] += blk
            want.append(_lanes_total(acc))
    else:
        want = None                 # short runs: run_sum, checked by the row sums above
    with paths.recording() as taken:
        got = _engine(x, (0, 2, 3))
    assert (taken["sum:runs_grouped"] > 0) == grouped
    if want is not None:
        assert _same_bits(got, np.array(want).astype(x.dtype))


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 40), c=st.integers(1, 9), hw=st.integers(16, 300),
       seed=st.integers(0, 2**16))
def test_channel_sums_give_the_same_bits_on_every_thread_count(n, c, hw, seed):
    x = np.random.default_rng(seed).normal(size=(n, c, hw)).astype(np.float32)
    got = _at_thread_counts(x, (0, 2))
    assert all(_same_bits(g, got[0]) for g in got[1:])
    assert np.allclose(got[0], x.astype(np.float64).sum((0, 2)), rtol=1e-6, atol=1e-5)
