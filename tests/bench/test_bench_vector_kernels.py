"""bench/bench_vector_kernels.py on tiny arrays: its options, and that the kernels it times
are the engine's and torch's passes of the same function (their outputs compared), so that
its ns-an-element figures compare like with like."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.backends.cpu.vector_unary import FAST

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
import bench_vector_kernels as bench  # noqa: E402


@pytest.mark.parametrize("argv", [["--sizes", "12,x"], ["--sizes", "0"], ["--repeat", "0"],
                                  ["--op", "relu"], ["--form", "lean", "--op", "silu"],
                                  ["--form", "nope"]])
def test_bad_options_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    assert exit_.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(bench.TORCH))
def test_the_timed_passes_compute_the_same_function(name):
    """The engine's forward and gradient kernels and torch's out= kernels agree to float32
    rounding on values across the sample's range (torch's are about 1 ulp: 1e-5 relative
    plus a small absolute floor near the gradients' zeros)."""
    forward, gradient = bench.engine_kernels(name)
    torch_forward, torch_gradient = bench.TORCH[name]
    n = 4099
    x, y, g, o = (bench.aligned(n) for _ in range(4))
    x[:] = np.linspace(-6.0, 6.0, n, dtype=np.float32)
    g[:] = np.linspace(0.5, 1.5, n, dtype=np.float32)
    ty, to = bench.aligned(n), bench.aligned(n)
    forward(x, y)
    gradient(g, x, o)
    torch_forward(torch.from_numpy(x), torch.from_numpy(ty))
    torch_gradient(torch.from_numpy(g), torch.from_numpy(x), torch.from_numpy(ty),
                   torch.from_numpy(to))
    np.testing.assert_allclose(y, ty, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(o, to, rtol=1e-5, atol=1e-6)
    assert np.abs(o).max() > 0.1          # not a comparison of zeros


def test_a_run_prints_one_row_per_op_and_size(capsys):
    assert bench.main(["--op", "tanh", "--sizes", "64,1000", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("tanh")]
    assert [r.split()[1] for r in rows] == ["64", "1000"]


def test_a_form_times_that_candidate(capsys):
    """--form times F32_CANDIDATES' form: its kernel is the candidate's (lean's forward
    differs from FAST's tight in some bits on a dense sample), and the table says so."""
    import numpy as np
    x = np.linspace(-6.0, 6.0, 4099, dtype=np.float32)
    outs = []
    for form in (None, "lean"):
        forward, _ = bench.engine_kernels("tanh", form)
        y = np.empty_like(x)
        forward(x, y)
        outs.append(y)
    assert not np.array_equal(outs[0], outs[1])
    assert bench.main(["--form", "lean", "--sizes", "64", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "form lean" in out and out.count("\nsigmoid") + out.count("\ntanh") == 2


def test_the_float64_form_times_the_float64_math(capsys):
    """--form float64 times FAST's float64 functions for any op: sigmoid's float32 math
    (tight) differs from them in some bits on a dense sample, and gelu, which has no float32
    math for float32 results, is its own kernel's bits; the table says the form."""
    x = np.linspace(-6.0, 6.0, 4099, dtype=np.float32)
    for name, same in (("sigmoid", False), ("gelu", True)):
        outs = []
        for form in (None, "float64"):
            forward, gradient = bench.engine_kernels(name, form)
            y, o = np.empty_like(x), np.empty_like(x)
            forward(x, y)
            gradient(np.ones_like(x), x, o)
            outs.append(np.concatenate([y, o]).view(np.uint32))
        assert np.array_equal(outs[0], outs[1]) == same, name
    assert bench.main(["--op", "silu", "--form", "float64", "--sizes", "64",
                       "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "form float64" in out and out.count("\nsilu") == 1
    assert FAST["gelu"].forward32 is None and FAST["gelu"].gradient32 is None
