"""numba's disk cache made safe for processes that share it (engine.backends.cpu.environment:
one root for every tool, xdist worker and test).

numba keeps a function's compilations in one index file (`NAME.nbi`: key -> data file) and
numbered data files (`NAME.N.nbc`: machine code). Saving an overload reads the index, takes
the first number no entry uses, writes the index, then the data (numba 0.68.1,
IndexDataCacheFile.save). Each file is replaced atomically, but the sequence is not: two
processes saving different overloads of one function at once both take number 1, and the
index then names the other's machine code for one of them; a later load runs it on the
wrong types ("can't unbox array from PyObject"), or worse. So a save holds an exclusive
lock, and a load a shared one, on `NAME.nbi.lock` beside the index (fcntl.flock, released
when the process dies): a save's read-pick-write-write is one step for every other process,
and a load never reads an index whose data is being replaced. Where the lock file cannot be
opened (a read-only cache) or flock does not exist (Windows), numba runs as it would alone.
"""

from __future__ import annotations

import contextlib
import functools
import os

from numba.core import caching

try:
    import fcntl
except ImportError:            # not on a POSIX system: numba's cache unlocked, as it ships
    fcntl = None


@contextlib.contextmanager
def index_lock(index_path: str, exclusive: bool):
    """Hold the lock of the cache index at `index_path` (module doc) while the block runs:
    exclusive to save, shared to load; no lock where none can be had."""
    fd = None
    if fcntl is not None:
        for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
            try:
                fd = os.open(index_path + ".lock", flags, 0o666)
                break
            except OSError:
                continue
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        if fd is not None:
            os.close(fd)        # releases the lock


def _locking(method, exclusive: bool):
    @functools.wraps(method)
    def locked(self, *args):
        with index_lock(self._index_path, exclusive):
            return method(self, *args)
    locked._gradverify_locked = True
    return locked


def install() -> None:
    """Lock numba's IndexDataCacheFile.save, .flush (exclusive) and .load (shared), once per
    process; before any kernel is compiled or loaded (engine.backends.cpu.jit does it)."""
    cache_file = caching.IndexDataCacheFile
    if getattr(cache_file.save, "_gradverify_locked", False):
        return
    cache_file.save = _locking(cache_file.save, exclusive=True)
    cache_file.flush = _locking(cache_file.flush, exclusive=True)
    cache_file.load = _locking(cache_file.load, exclusive=False)


def uninstall() -> None:
    """numba's own save, flush and load again (for a test that shows the race they have)."""
    cache_file = caching.IndexDataCacheFile
    for name in ("save", "flush", "load"):
        method = getattr(cache_file, name)
        if getattr(method, "_gradverify_locked", False):
            setattr(cache_file, name, method.__wrapped__)
