"""bench/gpu_check.sh and bench/bench_gpu.py without a GPU: one line saying so, exit 2,
nothing installed or written; the usage; and bench_gpu.py --quick under the simulator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
BENCH = ROOT / "bench" / "bench_gpu.py"
BASH = shutil.which("bash")
RECORDED = ("python3", "python", "pip", "pip3")   # the fakes record each call and fail

pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")

# the fake nvidia-smi of each case (None: none on PATH) and what the one line must say
NO_GPU = {
    "absent": (None, "nvidia-smi is not on PATH"),
    "failing": ("echo 'NVIDIA-SMI has failed: no driver' >&2; exit 9",
                "nvidia-smi -L failed with exit status 9: NVIDIA-SMI has failed: no driver"),
    "silent": ("exit 0", "nvidia-smi -L lists no GPU"),
}


def _fake_bin(tmp_path: Path, nvidia_smi: str | None) -> Path:
    """A directory for the front of PATH: python3, python, pip and pip3 that append their
    arguments to calls.txt and fail, and nvidia-smi running `nvidia_smi` (if given)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {name: f'echo "{name} $*" >> "{tmp_path / "calls.txt"}"\nexit 1'
               for name in RECORDED}
    if nvidia_smi is not None:
        scripts["nvidia-smi"] = nvidia_smi
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return bin_dir


def _env(bin_dir: Path) -> dict[str, str]:
    """This environment with `bin_dir` first on PATH and no other nvidia-smi on it."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "nvidia-smi").exists()]
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PATH"] = os.pathsep.join([str(bin_dir), *dirs])
    return env


def _run(args, tmp_path: Path, env) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, str(SCRIPT), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", list(NO_GPU))
def test_without_a_gpu_it_says_so_in_one_line_and_does_nothing(case, tmp_path):
    fake, reason = NO_GPU[case]
    work = tmp_path / "work"
    work.mkdir()
    summary = work / "summary.md"
    start = time.monotonic()
    out = _run(["--summary", str(summary)], work, _env(_fake_bin(tmp_path, fake)))
    assert time.monotonic() - start < 10
    assert out.returncode == 2, out
    assert out.stdout == ""
    assert out.stderr.splitlines() == [
        f"gpu_check: no NVIDIA GPU found ({reason}); this check needs a machine with an "
        "NVIDIA GPU and its driver"]
    assert list(work.iterdir()) == []                   # no summary, no logs
    assert not (tmp_path / "calls.txt").exists()        # neither Python nor pip ran


def test_the_default_summary_is_not_written_either(tmp_path):
    out = _run([], tmp_path, _env(_fake_bin(tmp_path, None)))
    assert out.returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]


def test_help_prints_the_usage():
    out = subprocess.run([BASH, str(SCRIPT), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.startswith("usage: bash bench/gpu_check.sh [--summary FILE]")
    for option in ("--logs DIR", "--wheels DIR", "--no-install", "Exit status"):
        assert option in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "gpu_check: unknown option: --bogus (see --help)"),
    (["--summary"], "gpu_check: --summary needs a value (see --help)"),
    (["--summary", "no/such/dir/s.md"], "gpu_check: no directory no/such/dir for the summary"),
    (["--wheels", "nowhere"], "gpu_check: --wheels nowhere is not a directory"),
])
def test_bad_usage_is_one_line_and_exit_2(args, message, tmp_path):
    out = _run(args, tmp_path, _env(_fake_bin(tmp_path, "exit 0")))
    assert (out.returncode, out.stdout, out.stderr.splitlines()) == (2, "", [message])


def test_the_script_parses():
    out = subprocess.run([BASH, "-n", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# --- bench_gpu.py -------------------------------------------------------------------------
def _bench(args, simulator: bool, tmp_path: Path) -> subprocess.CompletedProcess:
    # the simulator runs a Python thread per CUDA thread (32 a block there), which its main
    # thread polls: one FC step took 24 s on one CPU (the script keeps to one there) and
    # 3-5 minutes spread over two; the limit only stops a hang
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)


def _has_gpu() -> bool:
    code = "from numba import cuda; print(cuda.is_available())"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    return out.stdout.strip() == "True"


def test_bench_without_a_cuda_device_says_so_in_one_line(tmp_path):
    if _has_gpu():
        pytest.skip("this machine has a CUDA GPU")
    out = _bench(["--json", "b.json"], simulator=False, tmp_path=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("bench_gpu: no CUDA device found (") and "NUMBA_ENABLE_CUDASIM=1" \
        in line
    assert not (tmp_path / "b.json").exists()


def test_bench_under_the_simulator_runs_only_quick(tmp_path):
    out = _bench([], simulator=True, tmp_path=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["bench_gpu: under NUMBA_ENABLE_CUDASIM=1 only --quick "
                                       "runs (the simulator runs every CUDA thread in Python)"]


@pytest.mark.cudasim
def test_bench_quick_under_the_simulator_writes_its_table_and_json(tmp_path):
    """One MNIST FC step of a single image in numba's simulator (the checked step is the
    timed one; about 30 s)."""
    out = _bench(["--quick", "--json", "b.json", "--markdown", "b.md"], simulator=True,
                 tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    record = json.loads((tmp_path / "b.json").read_text())
    assert record["schema"] == "gradverify.bench_gpu/1"
    cases = [r["case"] for r in record["rows"]]
    assert cases == ["matmul 32x32 @ 32x32 f32", "MNIST FC step, batch 1 (1 x 1), AdamW"]
    assert all(r["engine_s"] > 0 and r["flops"] > 0 for r in record["rows"])
    table = (tmp_path / "b.md").read_text()
    assert "| case | engine ms | torch ms | engine/torch |" in table
    assert "max |engine - " in table
    assert out.stdout.splitlines()[-1].startswith("bench_gpu: matmul 32x32")
