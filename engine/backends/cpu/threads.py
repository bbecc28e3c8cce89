"""The CPU backend's own threads: a kernel's work split into chunks that run side by side.

numba's parallel kernels and BLAS's threads fight for the cores (see engine.backends.cpu.jit):
after a threaded matmul, OpenBLAS's workers keep spinning, so whatever runs next on another
thread waits for a core. So the engine owns its threads instead. While a plan runs
(`engine_threads`, the CPU backend's `running()` context, which the executor enters), BLAS
is held to one thread, and a kernel declared splittable (`split`) is bound as THREADS
chunks along one axis of its output. Each chunk is the kernel itself on slices of the
arrays (numba kernels release the GIL, and so does numpy's BLAS); the calling thread runs
the first chunk and a pool of blocking (never spinning) worker threads, kept off the
caller's CPU (_Pool.steer), the others. Work too small to pay for the hand-over (about 100
microseconds) is not split.

    GRADVERIFY_THREADS=1     no splitting, BLAS left as it is (the engine before threads)
    GRADVERIFY_THREADS=N     N chunks (default: the cores this process may use)

A bad value (`abc`, `0`) falls back to the default with a warning; the command lines call
`environment_problem()` first and refuse it.

Results: a chunk computes its elements exactly as the whole would, so elementwise kernels,
im2col and pooling give the same bits split or not. A matmul chunk is a smaller product,
which BLAS (or the sparse path's choice of lines) may sum in another order: float32 results
agree to rounding. With a fixed thread count every run gives the same bits.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import queue
import threading

from engine.backends.cpu import paths
from engine.backends.cpu.environment import (
    MAX_THREADS,
    environment_problem,  # noqa: F401  (the CLIs')
    read_threads,
    warn_setting,
)


def _threads_from_env() -> int:
    """GRADVERIFY_THREADS's count; for a bad value the default, with a SettingWarning (the
    command lines refuse it first: environment_problem)."""
    n, problem = read_threads()
    if problem:
        warn_setting(problem, f"{n} threads")
    return n


THREADS = _threads_from_env()

# Below these sizes a kernel runs whole. Handing chunks to the workers and waiting for them
# costs about 100 microseconds (two thread wake-ups, measured on the 2-core machine:
# a round trip between two threads takes 60), as much as an elementwise pass over about a
# million float32 or a single-threaded product of some 5 * 10^6 multiply-adds.
MIN_ELEMENTS = 1 << 20            # elements of out and of the inputs sliced with it
MIN_MACS = 1 << 23                # multiply-adds, for matmul


def set_num_threads(n: int) -> None:
    """Split kernels bound from now on into `n` chunks (1: no splitting)."""
    global THREADS
    if not 1 <= int(n) <= MAX_THREADS:
        raise ValueError(f"the number of threads must lie in [1, {MAX_THREADS}], got {n!r}")
    THREADS = int(n)


def get_num_threads() -> int:
    return THREADS


def parts() -> int:
    """The chunks a kernel bound now may split into: THREADS, or 1 in plain mode
    (engine.backends.cpu.paths.plain)."""
    return 1 if paths.PLAIN else THREADS


# Where a worker wakes. On a VM, Linux counts an idle vCPU that the host has descheduled as
# preempted and wakes a thread on the waker's own CPU instead: after a pause, a chunk handed
# to a worker then waits for the caller's chunk on the same core, until the load balancer
# moves it, milliseconds later. On the 2-core Intel VM, bfloat16 sigmoid's forward +
# backward over 8M elements took 4.0 ms called back to back and 7.2-8.4 ms after pauses of
# 0.2-0.5 s, as on one thread (8.0-8.3). So before it hands out chunks, the caller keeps its
# workers off the CPU it is on: each worker's affinity is the process's CPUs less that one,
# set only when it changes (a sched_getcpu per hand-off). Where the process has one CPU,
# or the platform lacks either call, nothing is steered.
def _libc_getcpu():
    try:
        return getattr(ctypes.CDLL(None), "sched_getcpu", None)
    except (OSError, TypeError):          # no C library to open this way (Windows)
        return None


_GETCPU = _libc_getcpu()


def current_cpu() -> int | None:
    """The CPU the calling thread runs on (None where unknown)."""
    if _GETCPU is None:
        return None
    cpu = _GETCPU()
    return cpu if cpu >= 0 else None


def _process_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on, where there are two or more to steer among."""
    if not hasattr(os, "sched_setaffinity") or _GETCPU is None:
        return None
    cpus = frozenset(os.sched_getaffinity(0))
    return cpus if len(cpus) > 1 else None


class _Pool:
    """Worker threads that block on a queue until given a call; `run(calls)` runs calls[0]
    on the calling thread and the rest on workers, kept off the caller's CPU, and returns
    when all are done (even when interrupted: no chunk is left writing after it returns),
    raising the first error."""

    def __init__(self):
        self.lock = threading.Lock()
        self.workers: list[queue.SimpleQueue] = []
        self.thread_ids: list[int] = []
        self.cpus = _process_cpus()
        self.affinity: dict[int, frozenset[int]] = {}     # thread id -> the mask last set

    def _grow(self, n: int) -> None:
        while len(self.workers) < n:
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            started: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_work, args=(jobs, started), daemon=True,
                             name=f"gradverify-cpu-{len(self.workers) + 1}").start()
            self.thread_ids.append(started.get())
            self.workers.append(jobs)

    def steer(self, n: int, cpu: int | None) -> None:
        """Keep the first `n` workers off `cpu` (the caller's)."""
        if self.cpus is None or cpu is None:
            return
        mask = self.cpus - {cpu}
        if not mask:
            return
        for tid in self.thread_ids[:n]:
            if self.affinity.get(tid) != mask:
                try:
                    os.sched_setaffinity(tid, mask)
                except OSError:        # the process's CPUs changed under it: steer no more
                    self.cpus = None
                    return
                self.affinity[tid] = mask

    def run(self, calls) -> None:
        if not self.lock.acquire(blocking=False):
            for c in calls:                # another thread's plan holds the workers
                c()
            return
        try:
            self._grow(len(calls) - 1)
            self.steer(len(calls) - 1, current_cpu())
            done: queue.SimpleQueue = queue.SimpleQueue()
            for jobs, c in zip(self.workers, calls[1:], strict=False):
                jobs.put((c, done))
            error = None
            try:
                calls[0]()
            except BaseException as e:
                error = e
            waiting = len(calls) - 1
            while waiting:
                try:
                    e = done.get()
                except BaseException as interrupt:      # Ctrl-C: wait for the chunks
                    error = error or interrupt
                    continue
                waiting -= 1
                error = error or e
            if error is not None:
                raise error
        finally:
            self.lock.release()


def _work(jobs: queue.SimpleQueue, started: queue.SimpleQueue) -> None:
    started.put(threading.get_native_id())
    while True:
        fn, done = jobs.get()
        try:
            fn()
            done.put(None)
        except BaseException as e:         # handed to the caller, which raises it
            done.put(e)


_POOL = _Pool()


def _reset_after_fork() -> None:
    global _POOL
    _POOL = _Pool()                        # the parent's workers do not exist in a child


os.register_at_fork(after_in_child=_reset_after_fork)


def side_by_side(calls):
    """One zero-argument call that runs `calls` on the pool's threads at once."""
    if len(calls) == 1:
        return calls[0]
    calls = list(calls)
    return lambda: _POOL.run(calls)


def bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """`parts` near-equal [lo, hi) ranges covering range(n) (fewer when n < parts)."""
    parts = max(1, min(parts, n))
    edges = [n * i // parts for i in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def row_ranges(name: str, rows: int, size: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of `rows` rows for the engine's threads, one range when `size` (the
    elements the kernel reads and writes) is below MIN_ELEMENTS or there is one part;
    recorded as the fast path split:`name` when cut."""
    n = parts()
    ranges = [(0, rows)] if n == 1 or size < MIN_ELEMENTS else bounds(rows, n)
    if len(ranges) > 1:
        paths.taken(f"split:{name}")
    return ranges


def aligned(a, out) -> bool:
    """Whether input `a` runs along out's axis 0 (and so is sliced with it): same number
    of axes and the same length there. A broadcast input has fewer axes or length 1."""
    return a.ndim == out.ndim and out.ndim > 0 and a.shape[0] == out.shape[0]


def along_axis0(out, ins, parts: int):
    """Chunks along out's axis 0, the inputs that run along it sliced with it."""
    return [(out[lo:hi], [a[lo:hi] if aligned(a, out) else a for a in ins])
            for lo, hi in bounds(out.shape[0], parts)]


def elementwise_chunks(out, ins, parts: int):
    """The chunking of elementwise-like kernels (each output element computed from the
    inputs' elements at its own index along axis 0): along axis 0, if big enough."""
    if out.ndim == 0 or out.size + sum(a.size for a in ins if aligned(a, out)) < MIN_ELEMENTS:
        return None
    return along_axis0(out, ins, parts)


def split(kernel, chunks=elementwise_chunks):
    """Kernel `kernel` (a bindable CPU kernel: engine.backends.cpu.jit.bindable) whose bound
    call runs as chunks side by side. `chunks(out, ins, parts)` gives [(out_chunk,
    ins_chunk)], each computable on its own, or None to run whole. A kernel without a
    `bind` is called as it is on each chunk."""
    prepare = getattr(kernel, "bind", None) or (
        lambda out, ins, *args, **params: functools.partial(kernel, out, ins, *args, **params))
    name = getattr(kernel, "__name__", "kernel").removeprefix("_").removesuffix("_prepare")

    @functools.wraps(prepare)
    def bind(out, ins, *args, **params):
        n = parts()
        pieces = chunks(out, ins, n) if n > 1 else None
        if not pieces or len(pieces) == 1:
            return prepare(out, ins, *args, **params)
        paths.taken(f"split:{name}")
        return side_by_side([prepare(o, i, *args, **params) for o, i in pieces])

    @functools.wraps(prepare)
    def run(out, ins, *args, **params):
        bind(out, ins, *args, **params)()
    run.bind = bind
    run.chunks = chunks
    return run


@functools.cache
def _blas_controllers() -> list:
    """numpy's BLAS libraries as threadpoolctl finds them (none where it cannot)."""
    try:
        from threadpoolctl import ThreadpoolController
        return ThreadpoolController().select(user_api="blas").lib_controllers
    except Exception:                      # no threadpoolctl, or a BLAS it cannot drive
        return []


def engine_threads():
    """While a plan runs with more than one thread: BLAS held to one thread (the engine's
    chunks are the parallelism), restored afterwards."""
    return contextlib.nullcontext() if THREADS <= 1 else one_blas_thread()


def blas_libraries_loaded() -> None:
    """A module has loaded a BLAS library: threadpoolctl's list is read again at the next
    hold (engine.backends.cpu.blas, SciPy's), and within a hold the new library is held
    too."""
    _blas_controllers.cache_clear()
    _HOLD.take_new()


class _BlasHold:
    """Every BLAS library held to one thread from the outermost entry to its matching exit,
    from any thread (a lock orders them); a nested entry only counts. Kernels that call
    BLAS side by side hold it at each call (conv_2d, attention), and inside a plan's hold
    (engine_threads) that was two calls into each library per kernel call: a tenth of a
    warm `gradcheck --op conv_2d_back_w --op conv_2d_back_x --no-torch` (cProfile: 0.73 of
    6.8 s, 130,000 holds)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._depth = 0
        self._restore = []               # [(library, its thread count before the hold)]

    def _hold(self, libs) -> None:
        held = {lib.filepath for lib, _ in self._restore}
        for lib in libs:
            n = lib.get_num_threads()
            if n != 1 and lib.filepath not in held:      # one already on one thread: left
                lib.set_num_threads(1)
                self._restore.append((lib, n))

    def take_new(self) -> None:
        with self._lock:
            if self._depth:
                self._hold(_blas_controllers())

    def __enter__(self):
        with self._lock:
            if not self._depth:
                self._hold(_blas_controllers())
            self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._depth -= 1
            if not self._depth:
                restore, self._restore = self._restore, []
                for lib, n in restore:
                    lib.set_num_threads(n)


_HOLD = _BlasHold()


def one_blas_thread() -> _BlasHold:
    """Every BLAS library held to one thread while the block runs, restored when the
    outermost such block ends (a library already on one thread is not called)."""
    return _HOLD
