"""The CPU backend's settings from the environment, read without ever raising.

GRADVERIFY_THREADS (engine.backends.cpu.threads) and GRADVERIFY_PARALLEL
(engine.backends.cpu.jit) are read when the engine is imported. A bad value must not make
`import engine` raise (every tool would die with a traceback before its own checks run):
the backend falls back to the default, a library user gets a SettingWarning, and each
command line calls `environment_problem()` first and exits 2 with its one line.

NUMBA_CACHE_DIR: numba's kernels are cached on disk (cache=True), in one root for every
tool, worker and test: NUMBA_CACHE_DIR if the user set it, else numba/ in the tools' cache
directory (default_numba_cache_dir(): $GRADVERIFY_CACHE/numba, else
$XDG_CACHE_HOME/gradverify/numba, else ~/.cache/gradverify/numba), set in the environment
before numba is imported, so that processes started later inherit it. A directory that
cannot be written would make numba refuse to cache, at import: `usable_cache_dir()` falls
back to a per-user directory under the system's temporary directory, with a warning.
Processes sharing the root stay safe by locking (engine.backends.cpu.disk_cache).
"""

from __future__ import annotations

import os
import tempfile
import warnings

THREADS_VARIABLE = "GRADVERIFY_THREADS"
PARALLEL_VARIABLE = "GRADVERIFY_PARALLEL"
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# the most threads a kernel splits into: far more than any machine's cores, and few enough
# that their stacks (8 MiB of address space each) cannot exhaust a process
MAX_THREADS = 512


class SettingWarning(UserWarning):
    """A setting from the environment was unusable; the default is used instead."""


def default_threads() -> int:
    """The cores this process may use (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:               # not on Linux
        return max(1, os.cpu_count() or 1)


def read_threads(environ=None) -> tuple[int, str | None]:
    """(the thread count GRADVERIFY_THREADS asks for, None) or, for a bad value, (the
    default, the problem in one line)."""
    raw = (os.environ if environ is None else environ).get(THREADS_VARIABLE, "")
    value = raw.strip()
    if value in ("", "default"):
        return default_threads(), None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        return default_threads(), (f"{THREADS_VARIABLE} must be a whole number in "
                                    f"[1, {MAX_THREADS}], got {raw!r}")
    return n, None


def read_parallel(environ=None) -> tuple[bool, str | None]:
    """(whether GRADVERIFY_PARALLEL turns numba's parallel compilations on, None) or, for a
    bad value, (False, the problem in one line)."""
    raw = (os.environ if environ is None else environ).get(PARALLEL_VARIABLE, "")
    value = raw.strip().lower()
    if value in ("", "default") or value in _OFF:
        return False, None
    if value in _ON:
        return True, None
    return False, f"{PARALLEL_VARIABLE} must be 1 or 0 (on or off), got {raw!r}"


def environment_problem(environ=None) -> str | None:
    """The first unusable GRADVERIFY_* setting, as one line for a command line to print
    before it exits 2 (None when all are usable)."""
    for read in (read_threads, read_parallel):
        problem = read(environ)[1]
        if problem:
            return problem
    return None


def warn_setting(problem: str, fallback: str) -> None:
    """Warn a library user that a setting is unusable and what is used instead."""
    warnings.warn(f"{problem}; using {fallback}", SettingWarning, stacklevel=3)


def writable_dir(path: str) -> bool:
    """Whether directory `path` exists or can be made, and a file can be written in it."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except (OSError, ValueError):
        return False
    return True


def fallback_cache_dir() -> str:
    """A numba cache directory of this user's under the system's temporary directory."""
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return os.path.join(tempfile.gettempdir(), f"gradverify-numba-cache-{user}")


def default_numba_cache_dir(environ=None) -> str:
    """numba/ in the tools' cache directory: $GRADVERIFY_CACHE/numba, else
    $XDG_CACHE_HOME/gradverify/numba, else ~/.cache/gradverify/numba (the rule of
    checkkit.cache.default_cache_dir, which the engine, a lower layer, cannot import)."""
    environ = os.environ if environ is None else environ
    if environ.get("GRADVERIFY_CACHE"):
        return os.path.join(os.path.expanduser(environ["GRADVERIFY_CACHE"]), "numba")
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.expanduser(cache), "gradverify", "numba")


def usable_cache_dir(environ=None) -> str | None:
    """Set NUMBA_CACHE_DIR (in `environ`, default os.environ) to the one root before numba
    reads it: the user's value, else default_numba_cache_dir(). A directory the user set
    that cannot be written is replaced by fallback_cache_dir(), with a SettingWarning, or
    removed (numba's own locations) when that cannot be written either; an unwritable
    default is replaced the same way, silently. Returns the directory now set (None:
    unset)."""
    environ = os.environ if environ is None else environ
    given = environ.get("NUMBA_CACHE_DIR")
    if not given:
        default = default_numba_cache_dir(environ)
        for root in (default, fallback_cache_dir()):
            if writable_dir(root):
                environ["NUMBA_CACHE_DIR"] = root
                return root
        return None
    if writable_dir(given):
        return given
    fallback = fallback_cache_dir()
    if writable_dir(fallback):
        environ["NUMBA_CACHE_DIR"] = fallback
        warn_setting(f"NUMBA_CACHE_DIR {given!r} cannot be written", f"{fallback} for "
                     "numba's compiled kernels")
        return fallback
    del environ["NUMBA_CACHE_DIR"]
    warn_setting(f"NUMBA_CACHE_DIR {given!r} cannot be written, nor {fallback}",
                 "numba's default cache locations")
    return None
