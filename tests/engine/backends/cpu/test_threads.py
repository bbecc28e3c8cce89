"""The CPU backend's own threads (engine.backends.cpu.threads): kernels split into chunks."""

from __future__ import annotations

import multiprocessing
import os
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import ops
from engine.backends.cpu import matmul as mm
from engine.backends.cpu import threads
from engine.registry import all_ops
from tests.engine.backends.cpu.test_matmul import assert_matches, blob_images
from tests.engine.ops.op_harness import run_engine, weighted_grads

SPLIT_OPS = sorted(name for name, op in all_ops().items()
                   if hasattr(op.kernels.get("cpu"), "chunks"))
# the backward ops have no samples of their own: their forward ops' backward runs them
SAMPLED_SPLIT_OPS = [name for name in SPLIT_OPS if all_ops()[name].samples is not None]
# sum splits inside its kernel (ranges of kept elements, each summed as whole), norm and
# rms_norm into ranges of rows (their backward ops run in their samples' backward), pad
# into ranges of output rows
THREADED_OPS = SAMPLED_SPLIT_OPS + ["sum", "norm", "rms_norm", "pad"]


@pytest.fixture
def split_everything(monkeypatch):
    """Every splittable kernel split, however small its work: set_num_threads(n) then
    decides the chunks of kernels bound afterwards."""
    monkeypatch.setattr(threads, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(threads, "MIN_MACS", 0)
    before = threads.get_num_threads()
    yield threads.set_num_threads
    threads.set_num_threads(before)


def test_channel_sums_on_threads_are_the_whole_sums_bits(split_everything):
    """A bias gradient's sum over (N, H, W) per channel, big enough to split by default."""
    x = np.random.default_rng(4).standard_normal((64, 16, 30, 30)).astype(np.float32)
    kernel = all_ops()["sum"].kernels["cpu"]
    got = {}
    for n in (1, 2, 3):
        split_everything(n)
        out = np.empty(16, np.float32)
        kernel(out, [x], axes=(0, 2, 3), keepdims=False)
        got[n] = out
    np.testing.assert_array_equal(got[2], got[1])
    np.testing.assert_array_equal(got[3], got[1])
    np.testing.assert_allclose(got[1], x.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-6)


def test_the_models_kernels_are_split():
    assert {"matmul", "im2col", "im2col_back", "pool_2d", "pool_2d_back", "add", "relu",
            "relu_back", "cont"} <= set(SPLIT_OPS)


@pytest.mark.parametrize("name", THREADED_OPS)
def test_split_kernels_give_the_whole_kernels_results(name, split_everything):
    """Every registry sample of a split op, forward and backward, with 1 and 3 threads: the
    same bits (a chunk computes its elements as the whole does), except matmul, a product
    of its own per chunk, which may round differently."""
    for sample in all_ops()[name].samples():
        arrays = sample.generate_inputs()
        split_everything(1)
        want, want_grads = run_engine(sample, arrays)
        split_everything(3)
        got, got_grads = run_engine(sample, arrays)
        for g, w in zip([got, *got_grads], [want, *want_grads], strict=True):
            if w is None:
                assert g is None
            elif name == "matmul":
                tol = 1e-5 if w.dtype == np.float32 else 1e-12
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=str(sample))
            else:   # bit patterns: NaNs too, in every dtype (numpy's NaN == NaN rule
                # depends on ml_dtypes' version for bfloat16)
                np.testing.assert_array_equal(g.view(f"u{g.dtype.itemsize}"),
                                              w.view(f"u{w.dtype.itemsize}"), err_msg=str(sample))


def test_the_split_is_deterministic(split_everything):
    """With a fixed number of threads, every run gives the same bits."""
    split_everything(2)
    sample = all_ops()["conv_2d"].samples()[1]
    arrays = sample.generate_inputs()
    first = run_engine(sample, arrays)
    for _ in range(3):
        again = run_engine(sample, arrays)
        np.testing.assert_array_equal(again[0], first[0])
        for g, w in zip(again[1], first[1], strict=True):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("nthreads", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_path_on_threads(nthreads, dtype, split_everything):
    """The zero-skipping product's row ranges on the engine's threads (each with its dense
    lines by BLAS): results within rounding of float64 numpy, for the FC layer's forward
    product (a column split) and weight gradient (a row split; as the backward builds it,
    g^T @ x, a transposed product that each range writes into its columns of out). 2000
    hidden units and a batch of 1000, as the scale tier's sparse cases: on the cost model
    fitted on the AVX-512 machine the row splits pay only on long rows (at 500 and 600 they
    go to BLAS)."""
    split_everything(nthreads)
    rng = np.random.default_rng(3)
    x = blob_images(rng, 1000, dtype)
    w = rng.uniform(-0.1, 0.1, (2000, 784)).astype(dtype)
    g = rng.uniform(-1, 1, (1000, 2000)).astype(dtype)
    for (a, b), path in (((x, w.T), "sparse_left/cols+blas"),
                         ((x.T, g), "sparse_left/rows+blas"),
                         ((g.T, x), "sparse_right/rows+blas")):
        out = np.empty((a.shape[0], b.shape[1]), dtype)
        assert mm.matmul_path(out, a, b) == path       # dense lines, BLAS'd in each range
        mm.cpu_matmul(out, [a, b])
        assert_matches(out, a, b)
    gx, gw = weighted_grads(lambda a, b: ops.matmul(a, ops.transpose(b)), [x, w], g)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(gw, g.astype(np.float64).T @ x, rtol=tol, atol=tol)
    np.testing.assert_allclose(gx, g.astype(np.float64) @ w, rtol=tol, atol=tol)


@given(n=st.integers(0, 1000), parts=st.integers(1, 16))
def test_bounds_cover_the_range_in_near_equal_parts(n, parts):
    b = threads.bounds(n, parts)
    assert b[0][0] == 0 and b[-1][1] == n
    assert all(hi == lo2 for (_, hi), (lo2, _) in zip(b, b[1:], strict=False))
    sizes = [hi - lo for lo, hi in b]
    assert max(sizes) - min(sizes) <= 1
    assert len(b) == max(1, min(parts, n))


def test_a_failing_chunk_raises_in_the_caller_and_the_pool_goes_on():
    ran = []

    def boom():
        raise ValueError("chunk failed")

    with pytest.raises(ValueError, match="chunk failed"):
        threads.side_by_side([lambda: ran.append(0), boom])()
    with pytest.raises(ValueError, match="chunk failed"):
        threads.side_by_side([boom, lambda: ran.append(1)])()
    threads.side_by_side([lambda: ran.append(2), lambda: ran.append(3)])()
    assert sorted(ran) == [0, 1, 2, 3]


def test_chunks_run_on_another_thread():
    seen = []
    call = threads.side_by_side([lambda: seen.append(threading.get_ident())] * 3)
    call()
    assert len(seen) == 3 and len(set(seen)) == 3 and threading.get_ident() in seen


CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
steerable = pytest.mark.skipif(threads._process_cpus() is None,
                               reason="needs two CPUs and sched_setaffinity/sched_getcpu")


@steerable
def test_workers_run_off_the_callers_cpu(monkeypatch):
    """A chunk handed to a worker runs on a CPU other than the caller's, whichever that is
    (on a VM the scheduler would otherwise wake it there after a pause)."""
    pool = threads._Pool()
    seen = []

    def where():
        seen.append((os.sched_getaffinity(0), threads._GETCPU()))
    for caller in (CPUS[0], CPUS[-1], CPUS[0]):
        monkeypatch.setattr(threads, "current_cpu", lambda caller=caller: caller)
        pool.run([lambda: None, where])
        allowed, ran_on = seen.pop()
        assert allowed == set(CPUS) - {caller} and ran_on != caller


@steerable
def test_a_workers_affinity_is_set_only_when_the_callers_cpu_changes(monkeypatch):
    pool = threads._Pool()
    pool._grow(1)
    calls = []
    real = os.sched_setaffinity
    monkeypatch.setattr(os, "sched_setaffinity", lambda *a: (calls.append(a), real(*a)))
    for cpu in (CPUS[0], CPUS[0], CPUS[-1], CPUS[-1], None):
        pool.steer(1, cpu)
    assert calls == [(pool.thread_ids[0], set(CPUS) - {CPUS[0]}),
                     (pool.thread_ids[0], set(CPUS) - {CPUS[-1]})]


def test_no_steering_where_it_cannot_be_done(monkeypatch):
    """One CPU, a platform without sched_getcpu, or the process's CPUs changed under it (the
    call refused): the chunks still run, nothing is steered."""
    monkeypatch.setattr(threads, "_GETCPU", None)
    assert threads._process_cpus() is None and threads.current_cpu() is None
    pool = threads._Pool()
    ran = []
    pool.run([lambda: ran.append(0), lambda: ran.append(1)])
    assert sorted(ran) == [0, 1] and pool.affinity == {}
    pool.cpus = frozenset({0, 1})

    def refuse(*_):
        raise OSError(22, "Invalid argument")
    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    pool.steer(1, 0)
    assert pool.cpus is None and pool.affinity == {}
    pool.run([lambda: ran.append(2), lambda: ran.append(3)])
    assert sorted(ran) == [0, 1, 2, 3]


def test_plans_on_two_threads_at_once(split_everything):
    """Two threads computing graphs at the same time: the second one's chunks run on its
    own thread (the pool is busy), and both results are right."""
    split_everything(2)
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (64, 32)).astype(np.float32)
    b = rng.uniform(-1, 1, (32, 48)).astype(np.float32)
    results, errors = {}, []

    def work(i):
        try:
            for _ in range(20):
                out = np.empty((64, 48), np.float32)
                mm.cpu_matmul(out, [a, b])
                results[i] = out
        except Exception as e:   # reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for out in results.values():
        np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def _split_in_child(queue):
    out = np.empty((40, 10), np.float32)
    x = np.arange(400, dtype=np.float32).reshape(40, 10)
    ops_add = all_ops()["add"].kernels["cpu"]
    ops_add(out, [x, x])
    queue.put(float(out.sum()))


def test_a_forked_child_gets_workers_of_its_own(split_everything):
    """Workers do not survive a fork: the child's pool starts its own (no hang)."""
    split_everything(2)
    threads.side_by_side([lambda: None, lambda: None])()      # the parent's workers exist
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_split_in_child, args=(q,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert q.get(timeout=5) == float(2 * np.arange(400).sum())


def test_engine_threads_holds_blas_to_one_thread_and_restores_it(monkeypatch):
    # numpy's BLAS, as the engine found it: a library loaded later (torch's own BLAS, when a
    # test imported torch) computes none of the engine's products
    blas = threads._blas_controllers()
    if not blas:
        pytest.skip("threadpoolctl finds no BLAS to drive")
    monkeypatch.setattr(threads, "THREADS", 2)
    before = [lib.get_num_threads() for lib in blas]
    with threads.engine_threads():
        inside = [lib.get_num_threads() for lib in blas]
    after = [lib.get_num_threads() for lib in blas]
    assert inside == [1] * len(blas)
    assert after == before


class _FakeBlas:
    def __init__(self, filepath, n):
        self.filepath, self.n, self.calls = filepath, n, 0

    def get_num_threads(self):
        self.calls += 1
        return self.n

    def set_num_threads(self, n):
        self.calls += 1
        self.n = n


def test_nested_blas_holds_call_the_libraries_only_at_the_outermost(monkeypatch):
    libs = [_FakeBlas("a.so", 4), _FakeBlas("b.so", 1)]
    monkeypatch.setattr(threads, "_blas_controllers", lambda: libs)
    with threads.one_blas_thread():
        assert [lib.n for lib in libs] == [1, 1]
        calls = [lib.calls for lib in libs]
        for _ in range(3):
            with threads.one_blas_thread():
                assert [lib.n for lib in libs] == [1, 1]
        assert [lib.calls for lib in libs] == calls         # nested: not called again
        assert [lib.n for lib in libs] == [1, 1]            # nor restored
    assert [lib.n for lib in libs] == [4, 1]                # restored once, at the end
    assert libs[1].calls == 1                               # already on one: only read


def test_a_blas_library_loaded_within_a_hold_is_held_and_restored(monkeypatch):
    libs = [_FakeBlas("a.so", 2)]
    cleared = []
    monkeypatch.setattr(threads, "_blas_controllers", lambda: list(libs))
    monkeypatch.setattr(threads._blas_controllers, "cache_clear", lambda: cleared.append(1),
                        raising=False)
    with threads.one_blas_thread():
        libs.append(_FakeBlas("scipy.so", 3))
        threads.blas_libraries_loaded()
        assert cleared and [lib.n for lib in libs] == [1, 1]
    assert [lib.n for lib in libs] == [2, 3]


@pytest.mark.parametrize("value, want", [("1", 1), ("3", 3), (" 2 ", 2), ("", None),
                                         ("default", None)])
def test_thread_count_from_the_environment(monkeypatch, value, want):
    monkeypatch.setenv("GRADVERIFY_THREADS", value)
    got = threads._threads_from_env()
    assert got == want if want is not None else got >= 1


@pytest.mark.parametrize("value", ["0", "-2", "-1", "two", "abc", "1.5", "1e3", "513"])
def test_a_bad_thread_count_falls_back_with_a_warning_and_is_the_tools_problem(
        monkeypatch, value):
    """A bad GRADVERIFY_THREADS never makes `import engine` raise: the default is used, a
    library user is warned, and environment_problem() gives the CLIs their one line."""
    from engine.backends.cpu.environment import SettingWarning, default_threads
    monkeypatch.setenv("GRADVERIFY_THREADS", value)
    with pytest.warns(SettingWarning,
                      match=r"GRADVERIFY_THREADS must be a whole number in \[1, 512\]"):
        assert threads._threads_from_env() == default_threads()
    assert threads.environment_problem() == (
        f"GRADVERIFY_THREADS must be a whole number in [1, 512], got {value!r}")
    with pytest.raises(ValueError, match=r"number of threads must lie in \[1, 512\]"):
        threads.set_num_threads(0)


def test_a_good_environment_has_no_problem(monkeypatch):
    monkeypatch.setenv("GRADVERIFY_THREADS", "2")
    monkeypatch.delenv("GRADVERIFY_PARALLEL", raising=False)
    assert threads.environment_problem() is None


@given(st.text(max_size=8))
def test_reading_any_thread_count_never_raises(value):
    from engine.backends.cpu.environment import read_threads
    n, problem = read_threads({"GRADVERIFY_THREADS": value})
    assert n >= 1
    assert (problem is None) == (value.strip() in ("", "default") or (
        _is_int(value) and int(value) >= 1))


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("shape", [(64, 48, 40), (2, 48, 40)])   # rows, or columns, split
@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_blas_product_on_threads(shape, nthreads, split_everything):
    """A product that the sparse path declined, on BLAS in chunks: as numpy's."""
    split_everything(nthreads)
    m, k, n = shape
    rng = np.random.default_rng(6)
    a, b = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
    out = np.empty((m, n))
    mm.blas_product(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12)


def test_every_op_whose_kernel_calls_blas_holds_it_for_the_plan():
    """A plan running an op whose CPU kernel calls BLAS holds BLAS to one thread for all
    its runs (CpuBackend.running, BLAS_OPS): an op left out runs correctly but pays its
    kernel's own hold at every call. The kernels calling BLAS are found in their modules'
    sources (a product through blas.gemm, numpy's matmul, or a hold of their own)."""
    import inspect
    import sys

    from engine.backends.cpu import BLAS_OPS
    from engine.registry import OPS
    calls_blas = set()
    for name, op in OPS.items():
        kernel = op.kernels.get("cpu")
        module = sys.modules.get(getattr(kernel, "__module__", ""))
        if kernel is None or isinstance(kernel, str) or module is None:
            continue
        if (not module.__name__.startswith("engine.backends.cpu.")
                or module.__name__ == threads.__name__):    # the hold's own module
            continue
        source = inspect.getsource(module)
        if any(s in source for s in ("gemm(", "np.matmul(", "one_blas_thread(")):
            calls_blas.add(name)
    assert {"matmul", "conv_2d", "attention_fwd"} <= calls_blas      # the scan finds them
    assert calls_blas <= BLAS_OPS, sorted(calls_blas - BLAS_OPS)
