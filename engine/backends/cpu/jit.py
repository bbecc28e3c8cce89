"""numba options for every CPU kernel, set in this one place.

Kernels are compiled lazily on first call and cached on disk (`cache=True`), so importing
the engine compiles nothing and a warm start only loads what it uses. `error_model="numpy"`
makes x/0 give inf/nan as numpy does, instead of raising. No fastmath: results are compared
against torch and against float64 references. Two exceptions, each a flag that loses no
accuracy: `contracting` kernels let LLVM fuse a * b + c into one fused multiply-add
(rounded once, not twice: a polynomial's Horner steps run at twice the speed), and
`any_order` sums let it reorder a plain sum into vector lanes (engine.backends.cpu.patterns);
`any_order_contracting` sums may do both.

Kernels with prange loops are compiled serial and parallel (SizeDispatch). The parallel
compilation runs only where it pays, which is rarely:
- on small arrays never: starting the worker threads costs microseconds on a quiet machine
  and milliseconds on a loaded one, more than a loop over a few thousand elements
  (PARALLEL_MIN_SIZE);
- by default not at all (PARALLEL; set GRADVERIFY_PARALLEL=1 before importing the engine to
  turn it on). numba's worker pool is a second pool of threads beside BLAS's (numpy's
  OpenBLAS), and the two fight for the cores: after a matmul, OpenBLAS's workers spin
  waiting for the next one, so a parallel kernel waits for a worker that has no core; after
  a parallel kernel, numba's OpenMP workers spin, so the next matmul waits. Measured on the
  (shared) 2-core machine, MNIST training steps (engine.train), milliseconds per batch,
  all serial / parallel from PARALLEL_MIN_SIZE, side by side: FC at batch 100 2.7 / 44,
  FC at batch 1000 16-17 / 69-330, the CNN at batch 1000 136-162 / 174-325. A lone
  elementwise kernel of 500k elements right after a matmul: 0.1 ms serial, 5 ms parallel.
  Turn it on where numba's threads have cores of their own (BLAS single-threaded, or a
  graph without matmuls on many cores), and for tests that must run the parallel
  compilations.

The engine's CPU parallelism comes instead from engine.backends.cpu.threads: a kernel's work
split into chunks, each the serial compilation on slices of the arrays, run on worker
threads that block (never spin) between chunks, with BLAS held to one thread while a plan
runs (GRADVERIFY_THREADS sets their number).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import types

from engine.backends.cpu import environment, paths

# before numba reads it (at import): the one cache root, NUMBA_CACHE_DIR or the tools' cache
# directory's numba/ (environment.usable_cache_dir); an unwritable one falls back
_GIVEN_CACHE_DIR = os.environ.get("NUMBA_CACHE_DIR")
if environment.usable_cache_dir() != _GIVEN_CACHE_DIR and "numba" in sys.modules:
    # numba was imported before the engine: make it read the variable again
    import numba.core.config
    numba.core.config.reload_config()

# numba's pool of threads: at least RACE_THREADS, so that gradcheck's scale tier
# (parallel_compilations) runs more prange threads than a small machine has cores: two of
# them then overlap even while another process holds a core, and a race between prange
# iterations shows. A kernel run with GRADVERIFY_PARALLEL=1 uses one per core (PARALLEL
# below). NUMBA_NUM_THREADS, where set, is kept.
RACE_THREADS = 4
if "numba" not in sys.modules:
    os.environ.setdefault("NUMBA_NUM_THREADS",
                          str(max(RACE_THREADS, environment.default_threads())))

# numba's error messages without terminal colours: they end up in report rows, and its
# colours (colorama) leave a stray reset sequence on a terminal at exit
os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba.core import caching  # noqa: E402

from engine.backends.cpu import disk_cache, inline_memo  # noqa: E402

# processes sharing the cache save and load each function's entry under a lock (disk_cache)
disk_cache.install()
# a scalar_math function's untyped IR made once, not at every call site (inline_memo)
inline_memo.install()

OPTIONS = {"cache": True, "nogil": True, "error_model": "numpy", "boundscheck": False}

# --- the disk cache is keyed by every source a kernel may inline ------------------------------
# numba keys a kernel's cached machine code by its own file's contents only. A kernel inlines
# helpers from other files (scalar_math: rope_math, alibi_math, optim_math; the elementwise
# table's scalar functions; half, patterns, layout) and freezes their globals: after an edit
# to a helper, the old code would go on running, and a bug planted there (or a fix) would
# not be what gradcheck checks. So every cached kernel's stamp also holds a fingerprint of
# all of them: an edit to any one recompiles every kernel (the code under test is the code on
# disk), and a kernel whose own file changed recompiles as before.
_ENGINE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INLINED = ("backends", "elementwise.py", "tensor.py", "errors.py", "hyperparams.py")


def inlined_sources() -> list[str]:
    """The files whose contents key every cached kernel (under the engine's directory:
    backends/, recursively, and the modules the kernels import their values from)."""
    files = []
    for name in INLINED:
        path = os.path.join(_ENGINE, name)
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
        elif os.path.exists(path):
            files.append(path)
    return files


def sources_fingerprint() -> str:
    """A sha256 over the paths (relative to the engine) and contents of inlined_sources()."""
    import hashlib
    digest = hashlib.sha256()
    for path in inlined_sources():
        digest.update(os.path.relpath(path, _ENGINE).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read() + b"\0")
    return digest.hexdigest()


FINGERPRINT = sources_fingerprint()


def _stamped(locator):
    """A numba cache locator whose source stamp is its own file's and FINGERPRINT."""
    class Stamped(locator):
        def get_source_stamp(self):
            return (super().get_source_stamp(), FINGERPRINT)
    Stamped.__name__ = Stamped.__qualname__ = f"Stamped{locator.__name__}"
    return Stamped


if not getattr(caching.CacheImpl, "_gradverify_stamped", False):
    caching.CacheImpl._locator_classes = [
        _stamped(k) if issubclass(k, caching._SourceFileBackedLocatorMixin) else k
        for k in caching.CacheImpl._locator_classes]
    caching.CacheImpl._gradverify_stamped = True


def njit(fn, **options):
    """numba.njit(**OPTIONS, **options)(fn); where numba finds no directory to cache it in
    ("cannot cache function"), caching is turned off for every later kernel, with a
    warning, instead of failing the import."""
    try:
        return numba.njit(**OPTIONS, **options)(fn)
    except RuntimeError as exc:
        if "cannot cache" not in str(exc) or not OPTIONS["cache"]:
            raise
        OPTIONS["cache"] = False
        environment.warn_setting("numba finds no writable directory to cache compiled "
                                 "kernels in (NUMBA_CACHE_DIR, the package's __pycache__, "
                                 "the user's cache)", "no disk cache (each run compiles anew)")
        return numba.njit(**OPTIONS, **options)(fn)


def kernel(fn):
    """Compile a serial kernel."""
    return njit(fn)


def scalar_math(fn):
    """Compile a scalar function shared by CPU and CUDA kernels: numba inlines it into each
    caller at IR level (`inline="always"`). Called otherwise, numba-cuda would compile it
    as a device function for the current GPU, and cuda.compile_ptx would need one."""
    return njit(fn, inline="always")


def parallel_kernel(fn, **options):
    """Compile a kernel whose outer loop is a `numba.prange`, serial and parallel; which
    one runs is chosen per call (see SizeDispatch and the module doc)."""
    return SizeDispatch(fn, **options)


CONTRACT = {"fastmath": {"contract"}}


def any_order(fn):
    """Compile a serial function whose floating-point additions LLVM may reassociate (see
    the module doc): for a plain sum, which then runs in vector lanes. Not inlined: the
    flag holds for this function's body only, never for a caller's."""
    return njit(fn, fastmath={"reassoc"})


def any_order_contracting(fn):
    """any_order, with a * b + c fused into fused multiply-adds as in `contracting`
    kernels: for a sum of polynomials (softmax.exp_sum's exponentials), whose Horner steps
    took a multiplication and an addition each under `reassoc` alone."""
    return njit(fn, fastmath={"reassoc", "contract"})


def contracting(fn):
    """parallel_kernel, with a * b + c fused into fused multiply-adds (see the module doc):
    for kernels whose time goes into polynomials (patterns.exp_into)."""
    return parallel_kernel(fn, **CONTRACT)


prange = numba.prange

# Below this many elements a kernel with a prange loop runs its serial compilation: waking
# the worker threads costs more than the loop (milliseconds on a loaded machine).
PARALLEL_MIN_SIZE = 1 << 16


def _parallel_from_env() -> bool:
    """GRADVERIFY_PARALLEL; for a bad value off, with a SettingWarning (the command lines
    refuse it first: environment.environment_problem)."""
    on, problem = environment.read_parallel()
    if problem:
        environment.warn_setting(problem, "serial compilations only")
    return on


# Whether prange kernels run their parallel compilation at all (module doc: off by default,
# numba's threads and BLAS's fight for the cores). Read when a kernel is called or bound.
PARALLEL = _parallel_from_env()


_every_thread = False   # inside parallel_compilations: numba's whole pool (read at a call)


def _parallel_threads() -> None:
    """numba's threads for a parallel compilation about to run: one per core (at most the
    pool's), or the whole pool inside parallel_compilations."""
    pool = numba.config.NUMBA_NUM_THREADS
    n = pool if _every_thread else min(pool, environment.default_threads())
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)


@contextlib.contextmanager
def parallel_compilations():
    """The parallel compilations on (PARALLEL) while the block runs, on all of numba's
    pool (RACE_THREADS or more), as they were after: for gradcheck's scale tier, which
    must run the code GRADVERIFY_PARALLEL=1 runs (a race between prange iterations exists
    only there). Only kernels bound inside the block are affected."""
    global PARALLEL, _every_thread
    before = PARALLEL, _every_thread
    PARALLEL, _every_thread = True, True
    try:
        yield
    finally:
        PARALLEL, _every_thread = before


class SizeDispatch:
    """A kernel compiled twice, lazily: serial (its prange loops become plain loops) and
    parallel. A call runs the parallel one when PARALLEL is on and its largest array
    argument has at least PARALLEL_MIN_SIZE elements; `for_size(n)` picks one for a known
    size. `.serial` and `.parallel` call one compilation directly."""

    def __init__(self, fn, **options):
        # numba's disk cache keys a function by its qualified name and line, not by its
        # options: the serial compilation needs a name of its own, or it would load the
        # parallel machine code from the cache
        serial_fn = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__,
                                       fn.__defaults__, fn.__closure__)
        serial_fn.__qualname__ = f"{fn.__qualname__}__serial"
        self.serial = njit(serial_fn, **options)
        self.parallel = njit(fn, parallel=True, **options)
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    def _parallel_call(self, *args):
        """The parallel compilation on numba's threads for this call (_parallel_threads:
        numba's count is per calling thread, and a bound call may run on another)."""
        _parallel_threads()
        return self.parallel(*args)

    def for_size(self, size: int):
        if PARALLEL and size >= PARALLEL_MIN_SIZE and not paths.PLAIN:
            paths.taken("parallel")
            return self._parallel_call
        return self.serial

    def for_args(self, args):
        """The compilation a call on `args` runs (by its largest array)."""
        return self.for_size(max((a.size for a in args if isinstance(a, np.ndarray)),
                                 default=0))

    def __call__(self, *args):
        if PARALLEL and not paths.PLAIN:
            for a in args:
                if isinstance(a, np.ndarray) and a.size >= PARALLEL_MIN_SIZE:
                    paths.taken("parallel")
                    return self._parallel_call(*args)
        return self.serial(*args)


def call(fn, *args):
    """A zero-argument call of compiled kernel `fn` on `args`, its serial or parallel
    compilation chosen now (for SizeDispatch kernels), so that running it costs one
    dispatch of numba's, nothing more."""
    if isinstance(fn, SizeDispatch):
        fn = fn.for_args(args)
    return functools.partial(fn, *args)


def bindable(prepare):
    """A CPU kernel `kernel(out, ins, **params)` made from `prepare(out, ins, **params)`,
    which checks and lays out the arrays and returns a zero-argument call that computes.

    A call of the kernel prepares and runs at once. `kernel.bind(out, ins, **params)` only
    prepares: a plan whose buffers never move is bound once, each node to a call, and its
    runs are loops over those calls (engine.executor). A prepared call must read the data
    of its arrays when it runs, never when it is prepared: only shapes, strides and params
    are fixed.
    """
    @functools.wraps(prepare)
    def kernel(out, ins, **params):
        prepare(out, ins, **params)()
    kernel.bind = prepare
    return kernel
