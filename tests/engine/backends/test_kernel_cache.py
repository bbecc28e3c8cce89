"""The code under test is the code on disk: numba's disk cache keys a kernel by its own file,
so an edit to a helper it inlines (alibi_math's slope, inlined into the softmax kernel)
would leave the old machine code running. The engine keys every cached kernel by all the
sources a kernel may inline too (engine.backends.cpu.jit.FINGERPRINT): an edited helper
recompiles."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import engine
from engine.backends.cpu import jit

PROBE = textwrap.dedent("""
    import numpy as np, engine
    from engine import ops
    from engine.graph import compute
    x = engine.input_tensor((1, 2, 3), np.float64, name="x")
    x.set(np.arange(6.0).reshape(1, 2, 3) / 5)
    m = engine.input_tensor((2, 3), np.float64, name="m")
    m.set(np.array([[0.0, -1.0, -2.0], [0.0, -2.0, -1.0]]))
    print(compute(ops.softmax(x, 1.0, m, max_bias=8.0))[0].ravel().tolist())
""")


def _run(root: Path, cache: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(root), NUMBA_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_fingerprint_covers_the_inlined_helpers():
    names = {os.path.relpath(p, os.path.dirname(engine.__file__)) for p in jit.inlined_sources()}
    assert {"backends/alibi_math.py", "backends/rope_math.py", "backends/optim_math.py",
            "backends/cpu/half.py", "backends/cpu/patterns.py", "elementwise.py"} <= names


def test_an_edited_helper_recompiles_the_kernel_that_inlines_it(tmp_path):
    root = tmp_path / "src"
    shutil.copytree(os.path.dirname(engine.__file__), root / "engine",
                    ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    first = _run(root, cache)
    assert _run(root, cache) == first                  # warm: the same code, the same bits
    helper = root / "engine" / "backends" / "alibi_math.py"
    text = helper.read_text()
    planted = text.replace("return (2.0 ** (-max_bias / n2)) ** (h + 1.0)",
                           "return (2.0 ** (-max_bias / n2)) ** (h + 2.0)")
    assert planted != text
    helper.write_text(planted)
    assert _run(root, cache) != first                  # the planted bug runs, not the old code
