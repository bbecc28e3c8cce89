"""One compile cache (checkkit.cache, issue 36): the command line, the pytest plugin under
xdist and the command line's --workers load our kernels from one numba root, so that a warm
command line makes a warm plugin. With an empty root (GRADVERIFY_CACHE in a temporary
directory, NUMBA_CACHE_DIR unset), the command line compiles relu's kernels into
<GRADVERIFY_CACHE>/numba; the plugin with two workers and --workers 2 then write nothing to
the cache (a compilation with cache=True always saves its machine code), and no
per-worker copy appears."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

STRIPPED_ENV = ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
                "PYTEST_XDIST_TESTRUNUID", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "NUMBA_CACHE_DIR",
                "XDG_CACHE_HOME")
CLI = ["--op", "relu", "--dtype", "f64", "--no-torch", "--no-progress"]
PLUGIN = ["--gradcheck", "--gradcheck-op", "relu", "--gradcheck-dtype", "f64",
          "--gradcheck-no-torch"]


def _run(args, cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV}
    env["GRADVERIFY_CACHE"] = str(cache)
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _files(root: Path) -> dict[str, int]:
    """Every file under `root` (lock files aside) and its modification time."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")
            if p.is_file() and not p.name.endswith(".lock")}


def test_a_warm_command_line_makes_a_warm_plugin_and_warm_workers(tmp_path):
    cache = tmp_path / "gradverify"
    root = cache / "numba"
    _run(["gradcheck.cli", *CLI], tmp_path, cache)
    warm = _files(root)
    assert any(name.endswith(".nbc") for name in warm), "the command line cached nothing"
    assert any(name.endswith(".nbi.lock") for name in map(str, root.rglob("*")))

    _run(["pytest", "-p", "no:cacheprovider", *PLUGIN, "-n", "2"], tmp_path, cache)
    assert _files(root) == warm, "the plugin's workers compiled again"
    _run(["gradcheck.cli", *CLI, "--workers", "2"], tmp_path, cache)
    assert _files(root) == warm, "--workers compiled again"
    assert not list(root.glob("xdist-*"))
