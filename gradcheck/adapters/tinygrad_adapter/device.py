"""tinygrad's device, dtypes and compiled-kernel cache for the adapter.

The device is tinygrad's CPU device (DEV=CPU in tinygrad 0.14's terms; the old CPU=1 is
refused there), which compiles each kernel with clang ($CC, default `clang`). Without a
clang on PATH the adapter falls back to tinygrad's PYTHON device, an interpreter that needs
no compiler but is far slower, and its describe() says so.

tinygrad keeps compiled kernels in an SQLite cache ($CACHEDB, by default
$XDG_CACHE_HOME/tinygrad/cache.db); unless the user has set CACHEDB, the adapter points it
at <cache>/tinygrad/cache.db under the tools' cache directory (checkkit.cache), in the
process and in its environment (tinygrad lowers and compiles kernels in a pool of spawned
processes, which read CACHEDB from there), beside jax's, so that a second run compiles
nothing it compiled before. tinygrad keeps there only what the compiler made; lowering a
kernel (its rewrites, in Python) is a large part of a kernel's cost too, so the adapter
keeps the lowered kernels in the same cache too (keep_programs), compressed (an eighth of
their pickled size), at most MAX_KEPT of them: a warm run lowers nothing it lowered before.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import shutil
import tempfile
import zlib

import numpy as np

from checkkit.cache import default_cache_dir
from checkkit.loading import AdapterError
from engine.tensor import DTYPES

INSTALL = "pip install 'gradverify[tinygrad]' (tinygrad 0.14.0, see constraints.txt)"


def import_tinygrad():
    """The tinygrad module, with its kernel cache under the tools' cache directory;
    AdapterError in one line when it is missing."""
    try:
        import tinygrad
        import tinygrad.helpers as helpers
    except ImportError as exc:
        raise AdapterError(f"tinygrad is not installed ({exc}): {INSTALL}") from None
    if "CACHEDB" not in os.environ and getattr(helpers, "_db_connection", None) is None:
        helpers.CACHEDB = str(default_cache_dir() / "tinygrad" / "cache.db")
        # and for tinygrad's compile workers, spawned processes that read it from there
        os.environ["CACHEDB"] = helpers.CACHEDB
    return tinygrad


def compiler() -> str | None:
    """The path of the C compiler tinygrad's CPU device runs, or None when there is none."""
    return shutil.which(os.environ.get("CC", "clang"))


def choose_device(device: str | None) -> str:
    """`device` ("CPU" or "PYTHON"), or CPU when a compiler is found, else PYTHON."""
    if device is None:
        return "CPU" if compiler() else "PYTHON"
    device = device.upper()
    if device not in ("CPU", "PYTHON"):
        raise AdapterError(f"tinygrad device must be CPU or PYTHON, got {device!r}")
    if device == "CPU" and not compiler():
        raise AdapterError(f"tinygrad's CPU device compiles kernels with clang, and "
                           f"{os.environ.get('CC', 'clang')!r} is not on PATH: install "
                           "clang (Debian: apt-get install clang), or use device PYTHON")
    return device


def tinygrad_dtype(name: str):
    """tinygrad's dtype of one of our dtype names (f16, bf16, f32, f64, int32)."""
    from tinygrad import dtypes
    return {"f16": dtypes.float16, "bf16": dtypes.bfloat16, "f32": dtypes.float32,
            "f64": dtypes.float64, "int32": dtypes.int32}[name]


@functools.cache
def dtype_problem(device: str, name: str) -> str | None:
    """Why `device` cannot compute in dtype `name` (its compiler refuses the kernel), or
    None: one small kernel tried, once per process, the compiler's messages caught (the
    first error line becomes the reason) rather than printed."""
    from tinygrad import Tensor
    with tempfile.TemporaryFile() as err:
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            values = np.linspace(1.0, 2.0, 3).astype(DTYPES[name])
            (Tensor(values, device=device) * 3 + 1).numpy()
            return None
        except Exception as exc:                # tinygrad raises the compiler's failure
            failure = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        lines = err.read().decode(errors="replace").splitlines()
    said = next((line.split("error:", 1)[1].strip() for line in lines if "error:" in line), "")
    return said or failure


PROGRAMS_TABLE = "gradverify_programs_z"
# lowered kernels kept on disk at most: some 20 KB each compressed, so about 300 MB; a full
# `gradcheck --engine tinygrad --all` lowers some 5,400 (112 MB, beside 19 MB of clang's
# objects), and --random runs add kernels of their own shapes
MAX_KEPT = 15_000


class _KeptPrograms(dict):
    """tinygrad's in-process cache of lowered kernels (codegen.to_program_cache: compile
    key -> PROGRAM, the rewritten, rendered and compiled kernel) backed by its own disk
    cache (tinygrad.helpers.diskcache_get/put, table PROGRAMS_TABLE plus tinygrad's
    version): tinygrad caches on disk only the compiler's output, so a new process would
    lower every kernel again, which is most of a run's time. The key is tinygrad's own
    (the kernel's content hash, the renderer, its target and the codegen settings)."""

    def _disk_key(self, key) -> str:
        return hashlib.sha256(repr(key).encode()).hexdigest()

    def __contains__(self, key) -> bool:
        if dict.__contains__(self, key):
            return True
        from tinygrad.helpers import diskcache_get
        try:
            found = diskcache_get(self.table, self._disk_key(key))
            found = None if found is None else pickle.loads(zlib.decompress(found))
        except Exception:                   # an unreadable entry is a miss
            found = None
        if found is None:
            return False
        dict.__setitem__(self, key, found)
        return True

    def get(self, key, default=None):
        return self[key] if key in self else default

    def __setitem__(self, key, program) -> None:
        from tinygrad.helpers import diskcache_put
        dict.__setitem__(self, key, program)
        if self.kept >= MAX_KEPT:           # the disk cache is full: memory only
            return
        try:
            diskcache_put(self.table, self._disk_key(key),
                          zlib.compress(pickle.dumps(program), 6))
            self.kept += 1
        except Exception:                   # a kernel that does not pickle stays in memory
            pass


def keep_programs(version: str) -> None:
    """Back tinygrad's lowered-kernel cache with its disk cache (see _KeptPrograms), once."""
    import tinygrad.codegen as codegen
    import tinygrad.engine.realize as realize
    if isinstance(codegen.to_program_cache, _KeptPrograms):
        return
    kept = _KeptPrograms(codegen.to_program_cache)
    kept.table = f"{PROGRAMS_TABLE}_{version.replace('.', '_')}"
    kept.kept = _rows(kept.table)
    codegen.to_program_cache = realize.to_program_cache = kept


def _rows(table: str) -> int:
    """The number of kernels in the disk cache's `table` (0 where it does not exist)."""
    from tinygrad.helpers import VERSION, db_connection
    try:
        return db_connection().execute(f"SELECT COUNT(*) FROM '{table}_{VERSION}'").fetchone()[0]
    except Exception:
        return 0
