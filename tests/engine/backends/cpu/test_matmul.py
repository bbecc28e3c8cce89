"""The CPU matmul kernel's paths (sparse left, sparse right, BLAS) against float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest

from engine import ops
from engine.backends.cpu import matmul as mm
from engine.backends.cpu import threads
from engine.backends.cpu.matmul import cpu_matmul, matmul_path, sparse_products
from tests.engine.ops.op_harness import weighted_grads

DTYPES = [np.float32, np.float64]
# a product large enough for the sparse path (its fixed costs need ~100M multiply-adds)
M, K, N = 400, 600, 512


def sparse(rng, shape, density, dtype, layout="C"):
    """Uniform values in [-1, 1] at a random `density` of the positions, zero elsewhere, as
    a C-contiguous array ("C"), a transposed view ("T") or every other row of a bigger one
    ("strided")."""
    values = rng.uniform(-1, 1, shape) * (rng.random(shape) < density)
    return laid_out(values.astype(dtype), layout)


def blob_images(rng, n, dtype) -> np.ndarray:
    """n flattened 28x28 images, each zero but for a 12x10 blob at a random place, 70% of it
    non-zero (MNIST-like: mostly zeros in clustered runs), shape (n, 784)."""
    x = np.zeros((n, 28, 28), dtype)
    for i in range(n):
        r0, c0 = rng.integers(3, 12, 2)
        x[i, r0:r0 + 12, c0:c0 + 10] = rng.random((12, 10)) * (rng.random((12, 10)) < 0.7)
    return x.reshape(n, 784)


def laid_out(x, layout):
    if layout == "T":
        return np.ascontiguousarray(x.T).T
    if layout == "strided":
        big = np.zeros((2 * x.shape[0], x.shape[1] + 3), x.dtype)
        big[::2, :x.shape[1]] = x
        return big[::2, :x.shape[1]]
    return np.ascontiguousarray(x)


def product(a, b):
    """cpu_matmul(a, b) into a fresh C-contiguous buffer, and the path it took."""
    out = np.empty((a.shape[0], b.shape[1]), a.dtype)
    path = matmul_path(out, a, b)
    cpu_matmul(out, [a, b])
    return out, path


def assert_matches(out, a, b):
    """out equals a @ b up to the rounding of any summation order: |error| <= (k + 2) eps
    (|a| @ |b|), against a float64 reference; NaNs where the reference has them."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = a64 @ b64
        bound = (a.shape[-1] + 2) * np.finfo(a.dtype).eps * (np.abs(a64) @ np.abs(b64))
    assert out.dtype == a.dtype
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    infinite = np.isinf(want)
    np.testing.assert_array_equal(out[infinite], want[infinite])
    finite = np.isfinite(want)
    assert np.all(np.abs(out[finite] - want[finite]) <= bound[finite])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_layout", ["C", "T", "strided"])
@pytest.mark.parametrize("b_layout", ["C", "T", "strided"])
def test_sparse_left_any_layout(dtype, a_layout, b_layout):
    rng = np.random.default_rng(0)
    a = sparse(rng, (M, K), 0.01, dtype, a_layout)
    b = laid_out(rng.uniform(-1, 1, (K, N)).astype(dtype), b_layout)
    out, path = product(a, b)
    assert path.startswith("sparse_left")
    assert_matches(out, a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_layout", ["C", "T"])
def test_sparse_right(dtype, b_layout):
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (1024, K)).astype(dtype)
    b = sparse(rng, (K, 200), 0.01, dtype, b_layout)
    out, path = product(a, b)
    assert path.startswith("sparse_right")
    assert_matches(out, a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_lines_go_to_blas(dtype):
    """Rows (then columns) of s dense enough for BLAS are split off; the rest is sparse."""
    rng = np.random.default_rng(2)
    a = sparse(rng, (M, K), 0.01, dtype)
    a[:20] = rng.uniform(-1, 1, (20, K))              # 20 dense rows
    b = rng.uniform(-1, 1, (K, N)).astype(dtype)
    out, path = product(a, b)
    assert path == "sparse_left/rows+blas"
    assert_matches(out, a, b)
    a = sparse(rng, (M, K), 0.01, dtype)
    a[:, :20] = rng.uniform(-1, 1, (M, 20))           # 20 dense columns
    for b_layout in ("C", "T"):
        bl = laid_out(b, b_layout)
        out, path = product(a, bl)
        assert path == "sparse_left/cols+blas"
        assert_matches(out, a, bl)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("every", [1, 4])
def test_transposed_dense_operand_copied_whole_or_gathered(dtype, every):
    """A transposed d (a weight W read as W^T) is copied whole when the sparse part uses at
    least half of its rows (here: every column of s has a non-zero), and only the rows
    used are gathered otherwise (every 4th: then d's row 4 is the scratch's row 1)."""
    rng = np.random.default_rng(5)
    a = sparse(rng, (M, K), 0.02, dtype)
    a[:, np.arange(K) % every != 0] = 0
    b = laid_out(rng.uniform(-1, 1, (K, N)).astype(dtype), "T")
    out = np.empty((M, N), dtype)
    (p,) = [p for p in sparse_products(out, a, b) if not p.transposed]
    assert p.pays()
    p.run()
    assert_matches(out, a, b)
    assert np.array_equal(p.d_scratch[1], b[1]) == (every == 1)
    assert np.array_equal(p.d_scratch[1], b[4]) == (every == 4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_rows_and_all_zero_operand(dtype):
    rng = np.random.default_rng(3)
    a = sparse(rng, (M, K), 0.02, dtype)
    a[50:120] = 0                                       # empty rows
    a[:, 100:200] = 0                                   # empty columns
    b = rng.uniform(-1, 1, (K, N)).astype(dtype)
    out, path = product(a, b)
    assert path.startswith("sparse_left")
    assert_matches(out, a, b)
    assert not out[50:120].any()
    zeros = np.zeros((M, K), dtype)
    out, path = product(zeros, b)
    assert path.startswith("sparse_left")
    np.testing.assert_array_equal(out, 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_small_batched_and_strided_out_take_blas(dtype):
    rng = np.random.default_rng(4)
    dense_a = rng.uniform(-1, 1, (M, K)).astype(dtype)
    b = rng.uniform(-1, 1, (K, N)).astype(dtype)
    out, path = product(dense_a, b)
    assert path == "blas"
    assert_matches(out, dense_a, b)
    small = sparse(rng, (20, 30), 0.01, dtype)         # m k n below SPARSE_MIN_MACS
    out, path = product(small, b[:30])
    assert path == "blas"
    assert_matches(out, small, b[:30])
    batched = np.stack([sparse(rng, (M, K), 0.01, dtype)] * 2)
    out = np.empty((2, M, N), dtype)
    assert matmul_path(out, batched, b) == "blas"
    cpu_matmul(out, [batched, b])
    for i in range(2):
        assert_matches(out[i], batched[i], b)
    a = sparse(rng, (M, K), 0.01, dtype)
    out = np.empty((N, M), dtype).T                     # not C-contiguous
    assert matmul_path(out, a, b) == "blas"
    cpu_matmul(out, [a, b])
    assert_matches(out, a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_dense_operand_takes_blas(dtype):
    """A skipped 0 * inf would be NaN in BLAS: d with a NaN or inf goes to BLAS."""
    rng = np.random.default_rng(5)
    a = sparse(rng, (M, K), 0.01, dtype)
    a[:, 7] = 0
    a[3, 7] = 0.5
    for bad in (np.inf, -np.inf, np.nan):
        for b_layout in ("C", "T"):
            b = rng.uniform(-1, 1, (K, N)).astype(dtype)
            b[7, 11] = bad
            b = laid_out(b, b_layout)
            with np.errstate(invalid="ignore"):
                out, path = product(a, b)
            assert path == "blas"
            assert_matches(out, a, b)
            assert np.isnan(np.delete(out[:, 11], 3)).all()     # 0 * inf, 0 * nan


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_sparse_operand_propagates(dtype):
    """NaN and inf in s are non-zeros: they stay on the sparse path and spread as in BLAS."""
    rng = np.random.default_rng(6)
    a = sparse(rng, (M, K), 0.01, dtype)
    a[4, 9] = np.nan
    a[8, 10] = np.inf
    b = rng.uniform(-1, 1, (K, N)).astype(dtype)
    b[10, :5] = 0                                       # inf * 0 = NaN there
    out, path = product(a, b)
    assert path.startswith("sparse_left")
    assert_matches(out, a, b)
    assert np.isnan(out[4]).all() and np.isnan(out[8, :5]).all() and np.isinf(out[8, 5:]).all()


def circulant(m, k, per_row, dtype):
    """m x k with exactly per_row non-zeros in every row and about as many per column."""
    a = np.zeros((m, k), dtype)
    for i in range(m):
        a[i, (i + np.arange(per_row) * (k // per_row)) % k] = 1 + (i % 7) / 8
    return a


def use_fit(monkeypatch, kind: str) -> None:
    """The cost model with the constants fitted on CPU kind `kind` (mm.FITS)."""
    for name, value in mm.FITS[kind]._asdict().items():
        monkeypatch.setattr(mm, name, value)


def test_the_fit_is_the_targets():
    """The module's constants are the fit of the CPU numba compiles for: AVX-512 or not."""
    from engine.backends.cpu import patterns
    assert mm.CPU_KIND == ("avx512" if patterns.target_has("avx512f") else "avx2")
    for name, value in mm.FITS[mm.CPU_KIND]._asdict().items():
        assert getattr(mm, name) == value


def test_target_features_follow_numbas_settings(monkeypatch):
    """NUMBA_CPU_FEATURES decides; a CPU named without its features has none."""
    from numba.core import config

    from engine.backends.cpu import patterns
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2,+f16c,-avx512f")
    assert patterns.target_has("f16c") and patterns.target_has("avx2")
    assert not patterns.target_has("avx512f")
    monkeypatch.setattr(config, "CPU_FEATURES", None)
    monkeypatch.setattr(config, "CPU_NAME", "skylake-avx512")
    assert not patterns.target_has("avx512f")


@pytest.mark.parametrize("kind", sorted(mm.FITS))
def test_no_fit_takes_a_dense_operand_off_blas(kind, monkeypatch):
    """A dense line costs at least its multiply-adds on BLAS in every fit (it is BLAS, on
    gathered lines), so a dense operand never looks cheaper on the sparse path; a sparse one
    still goes there."""
    use_fit(monkeypatch, kind)
    assert mm.DENSE_COL_COST >= 1 and mm.DENSE_ROW_COST >= 1
    rng = np.random.default_rng(5)
    for density, want in ((1.0, "blas"), (0.02, "sparse")):
        a = sparse(rng, (M, K), density, np.float32)
        b = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        assert matmul_path(np.empty((M, N), np.float32), a, b).startswith(want)
        assert matmul_path(np.empty((N, M), np.float32), b.T, a.T).startswith(want)


@pytest.mark.parametrize("kind", sorted(mm.FITS))
def test_cost_threshold_boundary(kind, monkeypatch):
    """The path flips exactly where the cost model's estimate crosses SPARSE_MAX_COST, in
    every CPU kind's fit."""
    use_fit(monkeypatch, kind)
    m, k, n = 512, 600, 512
    b = np.random.default_rng(7).uniform(-1, 1, (k, n))
    out = np.empty((m, n))
    (p,) = [p for p in sparse_products(out, np.zeros((m, k)), b) if not p.transposed]
    serial = mm.SERIAL_THREADS     # the counting runs on one thread while the others wait
    overhead = (serial * mm.SCAN_COST * m * k + mm.OUT_COST * m * n + mm.CALL_COST) / n
    assert p.overhead == pytest.approx(overhead)
    limit = mm.SPARSE_MAX_COST * m * k - overhead
    # uniform rows and columns: both splits cost entry_cost(n) per non-zero
    entry = mm.entry_cost(n)
    assert entry == mm.SPARSE_ENTRY_COST + mm.ENTRY_FIXED_COST / n
    per_row = int(limit / (entry * m))
    assert per_row > 0
    for r, want in ((per_row, "sparse_left"), (per_row + 1, "blas")):
        a = circulant(m, k, r, np.float64)
        assert entry * r < mm.DENSE_COL_COST * k       # no line is dense
        cost = entry * np.count_nonzero(a)
        assert (cost <= limit) == (want != "blas")
        out, path = product(a, b)
        assert path.split("/")[0] == want
        assert_matches(out, a, b)


def test_path_does_not_depend_on_the_thread_count():
    """The model counts the serial steps as on SERIAL_THREADS threads at any thread count:
    a product just under the cost limit takes the sparse path on 1, 2 and 7 threads alike
    (its bits then agree: a plan's bits are the same on every thread count)."""
    m, k, n = 512, 600, 512
    b = np.random.default_rng(7).uniform(-1, 1, (k, n))
    out = np.empty((m, n))
    (p,) = [p for p in sparse_products(out, np.zeros((m, k)), b) if not p.transposed]
    per_row = int((mm.SPARSE_MAX_COST * m * k - p.overhead) / (mm.entry_cost(n) * m))
    a = circulant(m, k, per_row, np.float64)
    before = threads.get_num_threads()
    results = {}
    try:
        for count in (1, 2, 7):
            threads.set_num_threads(count)
            got, path = product(a, b)
            assert path.startswith("sparse_left"), (count, path)
            results[count] = got
    finally:
        threads.set_num_threads(before)
    np.testing.assert_array_equal(results[1], results[2])
    np.testing.assert_array_equal(results[1], results[7])


def test_size_and_row_length_thresholds():
    """SPARSE_MIN_MACS and SPARSE_MIN_ROW bound which sides can take the sparse path."""
    def sides(m, k, n):
        out = np.empty((m, n))
        return [not p.transposed for p in sparse_products(out, np.zeros((m, k)),
                                                         np.zeros((k, n)))]
    k = mm.SPARSE_MIN_MACS // (64 * 256)
    assert sides(64, k, 256) == [True, False]          # left and right
    assert sides(63, k, 256) == []
    row = mm.SPARSE_MIN_ROW
    assert sides(row, 2048, 256) == [True, False] and sides(row - 1, 2048, 256) == [True]
    assert sides(1024, 512, row) == [True, False] and sides(1024, 512, row - 1) == [False]


@pytest.mark.parametrize("dtype", DTYPES)
def test_bound_kernel_decides_at_each_run(dtype):
    """A plan binds once; the path follows the data each run (sparse, then dense)."""
    rng = np.random.default_rng(8)
    a = sparse(rng, (M, K), 0.01, dtype)
    b = rng.uniform(-1, 1, (K, N)).astype(dtype)
    out = np.empty((M, N), dtype)
    run = cpu_matmul.bind(out, [a, b])
    run()
    assert_matches(out, a, b)
    a[:] = rng.uniform(-1, 1, a.shape)
    assert matmul_path(out, a, b) == "blas"
    run()
    assert_matches(out, a, b)
    a[:] = sparse(rng, a.shape, 0.01, dtype)
    run()
    assert_matches(out, a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fc_layer_on_sparse_images(dtype):
    """x @ W^T and its gradients through the engine, x mostly zeros in clustered runs (as
    MNIST images): the forward product and the weight gradient x^T @ g go sparse."""
    rng = np.random.default_rng(9)
    x = blob_images(rng, 1000, dtype)
    w = rng.uniform(-0.1, 0.1, (500, 784)).astype(dtype)
    out = np.empty((1000, 500), dtype)
    assert matmul_path(out, x, w.T).startswith("sparse")
    g = rng.uniform(-1, 1, (1000, 500)).astype(dtype)
    assert matmul_path(np.empty((784, 500), dtype), x.T, g).startswith("sparse")
    gx, gw = weighted_grads(lambda a, b: ops.matmul(a, ops.transpose(b)), [x, w], g)
    want_gx = g.astype(np.float64) @ w
    want_gw = g.astype(np.float64).T @ x
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(gx, want_gx, rtol=tol, atol=tol)
    np.testing.assert_allclose(gw, want_gw, rtol=tol, atol=tol)


# --- 16-bit products with their conversions in BLAS's chunks (bind_widened) ------------------
def _widened_kernels():
    """(the backend's widened kernel of matmul, which takes widen:fused where it applies;
    the same kernel without bind_widened: operands widened, product, rounding, one after
    another)."""
    import types

    from engine.backends.cpu import half
    unfused = types.SimpleNamespace(bind=cpu_matmul.bind, __name__="cpu_matmul")
    return half.widened(cpu_matmul, split=True), half.widened(unfused, split=True)


def _half_operands(dtype, case):
    """(a, b) 16-bit for `case`: dense, transposed views, a sparse left operand (the
    zero-skipping product chosen after everything is widened) or one beside an infinity
    (counted, then BLAS)."""
    rng = np.random.default_rng(11)
    m, k, n = (M, K, N) if case.startswith("sparse") else (200, 150, 160)
    a, b = rng.normal(size=(m, k)), rng.normal(size=(k, n))
    if case == "transposed":
        a, b = np.ascontiguousarray(a.T).T, np.ascontiguousarray(b.T).T
    if case in ("sparse", "sparse_inf"):
        a = a * (rng.random((m, k)) < 0.02)
    if case == "sparse_inf":
        b[3, 4] = np.inf
    return a.astype(dtype), b.astype(dtype)


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", ["dense", "transposed", "sparse", "sparse_inf"])
@pytest.mark.parametrize("split_min", [1 << 10, 1 << 19])
def test_a_fused_16_bit_product_gives_the_bits_of_the_unfused_one(dtype, case, split_min,
                                                                  monkeypatch):
    """widen:fused (each chunk widening its rows of a, or a part of an operand every chunk
    reads, and rounding its rows of the product) against the same kernel converting before
    and after the product, at 3 threads, in poisoned temporaries: the same bits, with
    shared operands widened before the product (split_min small) or in the chunks; the
    sparse product where the zeros pay, chosen as the float32 kernel chooses."""
    import ml_dtypes

    from engine.backends.cpu import half, paths
    dt = np.dtype(np.float16) if dtype == "float16" else np.dtype(ml_dtypes.bfloat16)
    monkeypatch.setattr(threads, "THREADS", 3)
    monkeypatch.setattr(threads, "MIN_MACS", 1 << 12)
    monkeypatch.setattr(half, "SPLIT_MIN_ELEMENTS", split_min)
    fused, unfused = _widened_kernels()
    a, b = _half_operands(dt, case)
    want, got = (np.empty((a.shape[0], b.shape[1]), dt) for _ in range(2))
    with paths.poisoned(), paths.recording() as before:
        unfused(want, [a, b])
    for _ in range(2):                     # the second call reuses its sparse products
        with paths.poisoned(), paths.recording() as taken:
            fused(got, [a, b])
        assert taken["widen:fused"] == 1, sorted(taken)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
        sparse_paths = {p for p in taken if p.startswith("matmul:sparse")}
        assert sparse_paths == {p for p in before if p.startswith("matmul:sparse")}
        assert bool(sparse_paths) == (case == "sparse")


def test_a_fused_product_runs_its_chunks_one_by_one_when_the_pool_is_busy(monkeypatch):
    """With the engine's workers held by another plan the chunks run one after another on
    the calling thread: the first widens every shared part, none waits."""
    import ml_dtypes
    monkeypatch.setattr(threads, "THREADS", 3)
    monkeypatch.setattr(threads, "MIN_MACS", 1 << 12)
    fused, unfused = _widened_kernels()
    a, b = _half_operands(np.dtype(ml_dtypes.bfloat16), "transposed")
    want, got = (np.empty((a.shape[0], b.shape[1]), a.dtype) for _ in range(2))
    unfused(want, [a, b])
    assert threads._POOL.lock.acquire(blocking=False)
    try:
        fused(got, [a, b])
    finally:
        threads._POOL.lock.release()
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_a_failing_shared_widening_is_raised_and_nothing_waits_for_ever(monkeypatch):
    """A chunk whose part of a shared operand fails to widen sets its part done and the
    failure: the others stop waiting and the product raises the error."""
    import ml_dtypes

    from engine.backends.cpu import half
    monkeypatch.setattr(threads, "THREADS", 2)
    monkeypatch.setattr(threads, "MIN_MACS", 1 << 12)
    fused, _ = _widened_kernels()
    a, b = _half_operands(np.dtype(ml_dtypes.bfloat16), "transposed")
    real = half.widen_into

    def failing(dst, src, split=False):
        if dst.shape[0] < b.shape[0] and np.may_share_memory(src, b.T[-1]):
            raise ValueError("injected")
        return real(dst, src, split)
    monkeypatch.setattr(half, "widen_into", failing)
    with pytest.raises(ValueError, match="injected"):
        fused(np.empty((a.shape[0], b.shape[1]), a.dtype), [a, b])


def test_plain_mode_and_one_thread_do_not_fuse(monkeypatch):
    """widen:fused needs the engine's threads: plain mode and one thread take the widened
    kernel as it was (kept temporaries only outside plain mode)."""
    import ml_dtypes

    from engine.backends.cpu import paths
    monkeypatch.setattr(threads, "MIN_MACS", 1 << 12)
    fused, _ = _widened_kernels()
    a, b = _half_operands(np.dtype(ml_dtypes.bfloat16), "dense")
    out = np.empty((a.shape[0], b.shape[1]), a.dtype)
    monkeypatch.setattr(threads, "THREADS", 1)
    with paths.recording() as one:
        fused(out, [a, b])
    monkeypatch.setattr(threads, "THREADS", 3)
    with paths.plain(), paths.recording() as plain:
        fused(out, [a, b])
    assert "widen:fused" not in one and not plain
