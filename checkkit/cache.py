"""Where the tools keep what they may rebuild: $GRADVERIFY_CACHE if set, else
$XDG_CACHE_HOME/gradverify, else ~/.cache/gradverify (default_cache_dir()).

    <cache>/numba        our engine's compiled CPU kernels: numba's disk cache, one root for
                         the command lines, `--workers`, the pytest plugins (every xdist
                         worker) and the test suite, so that a warm command line makes a warm
                         plugin; NUMBA_CACHE_DIR, where set, replaces it (numba_cache_dir())
    <cache>/numba/boundscheck   the kernels of `gradcheck --boundscheck` (numba's cache has
                         no key for its bounds checks: gradcheck.engine_under_test)
    <cache>/jax          jax's compiled functions (gradcheck --engine jax, optcheck optax)
    <cache>/tinygrad     tinygrad's kernel cache
    <cache>/mnist-*.gguf the decoded MNIST pixels (mnist_target.data_cache)

The first run in an empty numba root compiles every kernel it uses (minutes on 2 cores);
processes sharing the root at once are safe: each function's cache entry is saved and
loaded under a file lock (engine.backends.cpu.disk_cache). Deleting the directory only
costs that first run again. The engine sets NUMBA_CACHE_DIR to the root when it is
imported, before numba is (engine.backends.cpu.environment keeps its own copy of the rule:
the engine cannot import this module), so processes it starts inherit it.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir(environ=None) -> Path:
    """$GRADVERIFY_CACHE if set, else $XDG_CACHE_HOME/gradverify, else ~/.cache/gradverify
    (in `environ`, default os.environ)."""
    environ = os.environ if environ is None else environ
    if environ.get("GRADVERIFY_CACHE"):
        return Path(environ["GRADVERIFY_CACHE"]).expanduser()
    return Path(environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "gradverify"


def numba_cache_dir(environ=None) -> Path:
    """The root of numba's compiled kernels: NUMBA_CACHE_DIR if set, else
    default_cache_dir()/numba (module doc)."""
    environ = os.environ if environ is None else environ
    if environ.get("NUMBA_CACHE_DIR"):
        return Path(environ["NUMBA_CACHE_DIR"]).expanduser()
    return default_cache_dir(environ) / "numba"
