"""One numba cache shared by processes (engine.backends.cpu.disk_cache): two processes
compiling different overloads of the same cached functions at the same moment, into one
cache, leave an index whose every entry loads back its own machine code.

numba's own save reads the index, picks a data file number, writes the index, then the
data: two writers at once pick the same number, and one index entry is lost or names the
other's code. Here each writer waits a little (a slow disk) before writing the index and
before writing the data, so that their saves overlap on every function; the control test
shows that without the lock this harness does see the race."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

fcntl = pytest.importorskip("fcntl")

FUNCTIONS = 5
# each function returns its input doubled plus its number: an int64 call must give an int,
# a float64 call a float
SOURCE = "".join(f"""
@numba.njit(cache=True)
def f{k}(x):
    return x * 2 + {k}
""" for k in range(FUNCTIONS))

WRITER = textwrap.dedent("""
    import os, random, sys, time
    role, folder, locked, count = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
    from engine.backends.cpu import disk_cache        # the engine installs the lock
    if not locked:
        disk_cache.uninstall()
    from numba.core import caching
    random.seed(role)
    def slow(method):                                 # a slow disk, inside numba's save
        def slowly(self, *args):
            time.sleep(random.uniform(0.02, 0.08))
            return method(self, *args)
        return slowly
    caching.IndexDataCacheFile._save_index = slow(caching.IndexDataCacheFile._save_index)
    caching.IndexDataCacheFile._save_data = slow(caching.IndexDataCacheFile._save_data)
    sys.path.insert(0, folder)
    import numpy as np
    import functions
    value = np.int64(3) if role == "int" else np.float64(3.0)
    other = "float" if role == "int" else "int"
    for k in range(int(count)):
        open(os.path.join(folder, f"{role}.{k}"), "w").close()       # both start together
        while not os.path.exists(os.path.join(folder, f"{other}.{k}")):
            time.sleep(0.0005)
        getattr(functions, f"f{k}")(value)
""")

READER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import engine.backends.cpu.disk_cache
    import numpy as np
    import functions
    wrong = []
    for k in range(int(sys.argv[2])):
        f = getattr(functions, f"f{k}")
        for value, expected in ((np.int64(3), 6 + k), (np.float64(3.0), 6.0 + k)):
            try:
                got = f(value)
            except Exception as exc:
                wrong.append(f"f{k}({value!r}) raised {exc!r}")
                continue
            if got != expected or type(got) is not type(expected):
                wrong.append(f"f{k}({value!r}) = {got!r}")
        misses = sum(f.stats.cache_misses.values())
        if misses:
            wrong.append(f"f{k}: {misses} overloads not in the cache")
    print(json.dumps(wrong))
""")


def _race(tmp_path: Path, locked: bool) -> list[str]:
    """Two writers (int64 and float64 overloads) at once into one cache, then a reader:
    what the reader found wrong."""
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "functions.py").write_text("import numba\n" + SOURCE)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, role, str(folder),
                                 "1" if locked else "0", str(FUNCTIONS)],
                                env=env, stderr=subprocess.PIPE, text=True)
               for role in ("int", "float")]
    for writer in writers:
        _, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err
    done = subprocess.run([sys.executable, "-c", READER, str(folder), str(FUNCTIONS)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_two_processes_saving_overloads_at_once_leave_every_entry_right(tmp_path):
    assert _race(tmp_path, locked=True) == []


def test_without_the_lock_the_harness_sees_numbas_race(tmp_path):
    """The control: numba 0.68.1's save unlocked loses or crosses entries here (should a
    numba release make saving safe, this fails and the lock may go)."""
    assert _race(tmp_path, locked=False) != []


def test_a_save_holds_the_lock_beside_the_index(tmp_path):
    from numba.core import caching

    from engine.backends.cpu import disk_cache
    cache_file = caching.IndexDataCacheFile(str(tmp_path), "f-1.py", "stamp")
    seen = []

    def probe(self, name, data):      # while numba writes the data: is the lock held?
        fd = os.open(str(tmp_path / "f-1.py.nbi.lock"), os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            seen.append("free")
        except BlockingIOError:
            seen.append("held")
        finally:
            os.close(fd)
    saved = caching.IndexDataCacheFile._save_data
    caching.IndexDataCacheFile._save_data = probe
    try:
        disk_cache.install()
        cache_file.save(("key",), ("data",))
    finally:
        caching.IndexDataCacheFile._save_data = saved
    assert seen == ["held"]
