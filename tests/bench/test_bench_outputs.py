"""bench/bench_gpu.py's outputs (--json, --markdown) go through engine.files: an output that
cannot be written is one line and exit 2 before any benchmark runs, GPU or not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("option", ["--json", "--markdown"])
def test_an_unwritable_output_is_refused_before_the_benchmarks(tmp_path, option):
    (tmp_path / "out").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_gpu.py"), option,
                           "out"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == ["bench_gpu: cannot write out: it is a directory"]
    assert os.listdir(tmp_path / "out") == []
