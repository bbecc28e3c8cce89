"""docs/architecture.md's first recipe, "add an op", followed from outside the repository.

A toy op `double` (y = 2 x) is written as one module in a temporary directory: its shape
rule, backward rule, CPU kernel, torch reference, sample cases and strategy, registered
with engine.registry.register when the module is imported, and its CUDA kernel by name
(a second module, as the CUDA kernels live in engine/backends/cuda). With no other edit,
`gradcheck --list` lists it, `gradcheck --op double` checks it, `engine.ops.double` builds
it, and the tests that run over the registry (tests/engine/ops/test_ops.py,
tests/engine/test_strategies.py, loading the module as a pytest plugin) run it. The fixture
unregisters it afterwards, so every other test sees the registry as before.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest

import engine
from engine import ops
from engine.registry import all_ops, get_op, unregister
from gradcheck.check import check_sample
from gradcheck.cli import main

MODULE = "toy_double_op"
TOY_OP = '''
    """double(x) = 2 x: a toy op, registered from outside engine/ops."""

    import numpy as np

    from engine.errors import DTypeError
    from engine.registry import OpDef, make_node, register
    from engine.samples import InputSpec, Sample, both_dtypes
    from engine.strategies import sample_strategy, shapes
    from engine.tensor import is_float


    def _infer(x):
        if not is_float(x.dtype):
            raise DTypeError(f"double: needs a float input, got {x.dtype}")
        return x.shape, x.dtype


    def double(x):
        """2 x."""
        return make_node("double", (x,))


    def cpu_double(out, ins):
        np.multiply(ins[0], 2.0, out=out)


    @both_dtypes
    def _samples(dtype):
        return [Sample.make("double", [InputSpec("x", s)], dtype) for s in [(3,), (2, 3)]]


    @sample_strategy
    def _strategy(draw, dtype):
        return Sample.make("double", [InputSpec("x", draw(shapes(0, 3)))], dtype)


    register(OpDef("double", infer=_infer,
                   backward=lambda g, out, x: (double(g),),       # d(2 x) = 2 g
                   kernels={"cpu": cpu_double, "cuda": "toy_double_cuda:cuda_double"},
                   build=double, torch=lambda x: 2 * x, samples=_samples,
                   strategy=_strategy, doc="2 x (a toy op of tests/engine/test_op_recipe.py)"))
'''

# its CUDA kernel, in a module of its own as in engine/backends/cuda: imported (with
# numba.cuda) only when the op first runs on the CUDA backend. Its input may be a strided
# view (a permuted or sliced upstream gradient in the backward pass): it is read through its
# strides as 4-D, never reshaped to 1-D (on a GPU a device array refuses, or reads a
# transposed one in memory order; the simulator's numpy arrays hid that until a GPU ran it).
# It is launched and indexed as the engine's kernels are (engine.backends.cuda.launch).
TOY_CUDA_KERNEL = """
    from numba import cuda

    from engine.backends.cuda.arrays import with_rank
    from engine.backends.cuda.launch import grid_stride, unravel4


    @cuda.jit
    def _double(dst, src):
        _, d1, d2, d3 = dst.shape
        for flat in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
            i, j, k, l = unravel4(flat, d1, d2, d3)
            dst[i, j, k, l] = src[i, j, k, l] + src[i, j, k, l]


    def cuda_double(out, ins):
        grid_stride(_double, out.size, with_rank(out, 4), with_rank(ins[0], 4))
"""


def _write_module(directory) -> None:
    (directory / f"{MODULE}.py").write_text(textwrap.dedent(TOY_OP))
    (directory / "toy_double_cuda.py").write_text(textwrap.dedent(TOY_CUDA_KERNEL))


@pytest.fixture
def toy_op(tmp_path, monkeypatch):
    """The toy op, registered for one test and unregistered after it."""
    assert "double" not in all_ops()
    _write_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(MODULE)
    try:
        yield module
    finally:
        unregister("double")
        sys.modules.pop(MODULE, None)
        sys.modules.pop("toy_double_cuda", None)


def test_the_registry_and_engine_ops_hold_it(toy_op):
    assert all_ops()["double"] is get_op("double")
    assert ops.double is toy_op.double              # registered after engine.ops loaded
    x = engine.input_tensor((2, 3), "f64")
    y = ops.double(x).set_output()
    x.set([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    engine.Graph([y]).compute()
    assert y.numpy().tolist() == [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]


def test_gradcheck_list_shows_it(toy_op, capsys):
    assert main(["--list"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.split()[:1] == ["double"]]
    assert len(rows) == 1 and "2 x (a toy op" in rows[0], rows


def test_gradcheck_op_checks_it(toy_op, capsys):
    assert main(["--op", "double", "--no-torch", "--no-progress", "--show", "all"]) == 0
    out = capsys.readouterr().out
    for case in ("double(type=f32,x=[3])", "double(type=f64,x=[2,3])"):
        assert case in out, out


def test_its_samples_pass_gradchecks_check(toy_op):
    for sample in get_op("double").samples():
        result = check_sample(sample)
        assert result.status == "pass", f"{sample}: {result.message}"


def test_the_registry_parameterised_tests_run_it(tmp_path):
    """The module loaded as a pytest plugin (-p) registers the op before the test modules
    are collected: test_ops and test_strategies then hold cases of `double`."""
    _write_module(tmp_path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), root, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
         "-p", MODULE, "-k", "double or every_op",
         "tests/engine/ops/test_ops.py", "tests/engine/test_strategies.py"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    passed = [line for line in run.stdout.splitlines() if line.startswith("PASSED")]
    for test in ("test_forward_matches_torch[double(type=f32,x=[3])]",
                 "test_backward_matches_torch[double(type=f64,x=[2,3])]",
                 "test_generated_cases_fast[double]", "test_generated_cases_match_torch[double]",
                 "test_every_op_with_a_kernel_has_one_on_every_backend"):
        assert any(test in line for line in passed), run.stdout[-3000:]


def test_the_toy_op_is_gone_afterwards():
    """Outside the fixture the registry is as it was (whatever ran before in this process)."""
    assert "double" not in all_ops()
    assert not hasattr(ops, "double")


@pytest.mark.cudasim
def test_gradcheck_op_checks_it_on_the_cuda_backend(toy_op, capsys):
    from tests.engine.backends.cuda.kernel_harness import needs_cuda
    needs_cuda()
    assert main(["--op", "double", "--backend", "cuda", "--no-torch", "--no-progress",
                 "--show", "all"]) == 0
    assert "double(type=f32,x=[3])" in capsys.readouterr().out
