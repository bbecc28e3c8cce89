"""gradcheck and optcheck on the CUDA backend, under the simulator, on small cases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.registry import get_op
from gradcheck.cli import main as gradcheck
from optcheck.cli import main as optcheck
from tests.engine.backends.cuda.kernel_harness import needs_cuda

pytestmark = [pytest.mark.cudasim]


@pytest.fixture(autouse=True, scope="module")
def _cuda():
    needs_cuda()


def test_gradcheck_pool_2d_on_cuda_reports_cuda_against_cpu(tmp_path):
    path = tmp_path / "r.json"
    assert gradcheck(["--op", "pool_2d", "--backend", "cuda", "--dtype", "f64", "-k",
                      "x=[1,1,5,6]", "--format", "json", "--output", str(path),
                      "--no-progress"]) == 0
    rows = json.loads(path.read_text())["results"]
    assert rows and all(r["backend"] == "cuda" and r["vs_cpu"] == "agree" for r in rows)


def test_a_wrong_cuda_kernel_is_caught_by_the_cross_backend_column(capsys):
    relu = get_op("relu")
    from engine.backends.cuda import resolve_kernel
    right = resolve_kernel(relu)

    def wrong(out, ins):
        right(out, ins)
        out[:1] = np.full(1, 7.0, out.dtype) if out.size else out[:1]

    relu.kernels["cuda"] = wrong
    try:
        assert gradcheck(["--op", "relu", "--backend", "cuda", "--dtype", "f64",
                          "--no-progress", "--no-torch"]) == 1
    finally:
        relu.kernels["cuda"] = right
    assert "backend: cuda differs from cpu: forward" in capsys.readouterr().out


def test_optcheck_on_cuda_passes_the_torch_family(capsys):
    assert optcheck(["--opt", "adamw", "--backend", "cuda", "--family", "torch",
                     "--steps", "3", "--dtype", "f32", "--no-progress", "--verbose"]) == 0
    assert " cuda " in capsys.readouterr().out  # the backend column: --verbose only
