"""CUDA kernels of matmul, dropout, get_rows, get_rows_back and the optimizer steps against
the CPU kernels.

Every registry sample of matmul, dropout, get_rows and get_rows_back is replayed: each
kernel node of its forward and backward graph runs on the CUDA backend on the inputs the
CPU computed, strided views included, and must give the CPU kernel's result. Update ops are
not replayed (their graphs write state), so the optimizer steps run here directly: several
steps of the CUDA kernel and of the CPU kernel from the same state, every flag combination,
every array compared after every step.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine.errors import BackendError
from engine.registry import OPS
from tests.engine.backends.cuda.kernel_harness import (
    cuda,
    cuda_cases,
    needs_cuda,
    replay_family,
)
from tests.engine.ops.op_harness import TOL

# the simulator runs the dropout hash on numpy uint64 scalars, which warn when they wrap
pytestmark = [pytest.mark.cudasim,
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]

FAMILY = {"matmul", "dropout", "get_rows", "get_rows_back"}
# the kernel ops of FAMILY each sample's forward and backward graph must exercise
EXPECTED = {"matmul": {"matmul"}, "dropout": {"dropout"},
            "get_rows": {"get_rows", "get_rows_back"},
            "get_rows_back": {"get_rows_back", "get_rows"}}
SAMPLES = [s for name in EXPECTED for s in cuda_cases(OPS[name].samples())]
DTYPES = [np.float32, np.float64]


needs_cuda()


def _tol(dtype):
    return TOL["f64" if np.dtype(dtype) == np.float64 else "f32"]


def _run(kernel, out_shape, out_dtype, ins, **params):
    """A CUDA kernel's result on host arrays `ins` (uploaded with their strides)."""
    from tests.engine.backends.cuda.kernel_harness import to_device
    out = cuda.device_array(out_shape, out_dtype)
    kernel(out, [to_device(a) for a in ins], **params)
    return out.copy_to_host()


@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_kernels_match_cpu(sample):
    replay_family(sample, FAMILY, EXPECTED)


# --- matmul -------------------------------------------------------------------------------
def _tiles(n: int, extra: int) -> int:
    """n whole matmul tiles and `extra` more (the tile is smaller under the simulator)."""
    from engine.backends.cuda.matmul import TILE
    return n * TILE + extra


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", [
    lambda: ((_tiles(2, 1), _tiles(2, 3)), (_tiles(2, 3), _tiles(1, 2))),  # partial tiles
    lambda: ((2, 1, 3, _tiles(1, 1), 5), (3, 5, 4)),            # three batch axes, broadcast
], ids=["tiles", "batch3"])
def test_matmul_beyond_one_tile_and_two_batch_axes(shapes, dtype):
    from engine.backends.cuda.matmul import cuda_matmul
    a_shape, b_shape = shapes()
    rng = np.random.default_rng(3)
    a = rng.standard_normal(a_shape).astype(dtype)
    b = rng.standard_normal(b_shape).astype(dtype)
    want = np.matmul(a, b)
    got = _run(cuda_matmul, want.shape, dtype, [a, b.swapaxes(-1, -2).copy().swapaxes(-1, -2)])
    np.testing.assert_allclose(got, want, **_tol(dtype))


def test_matmul_grid_loops_over_rows_and_batches(monkeypatch):
    """A grid smaller than the work (one row tile, one batch block) still covers it all."""
    from engine.backends.cuda import matmul
    monkeypatch.setattr(matmul, "MAX_GRID_Y", 1)
    monkeypatch.setattr(matmul, "MAX_BATCH_BLOCKS", 1)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, _tiles(2, 1), 4))
    b = rng.standard_normal((1, 4, 3))
    got = _run(matmul.cuda_matmul, (3, _tiles(2, 1), 3), np.float64, [a, b])
    np.testing.assert_allclose(got, a @ b, **_tol(np.float64))


# --- dropout ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_is_bitwise_the_cpu_mask_on_a_strided_five_axis_view(dtype):
    from engine.backends.cpu.dropout import cpu_dropout
    from engine.backends.cuda.dropout import cuda_dropout
    x = np.random.default_rng(6).standard_normal((2, 3, 4, 5, 6)).astype(dtype)
    view = x.transpose(0, 1, 4, 2, 3)         # five axes; merged where they can, three
    want = np.empty(view.shape, dtype)
    cpu_dropout(want, [view], p=0.4, seed=2 ** 64 - 3)
    got = _run(cuda_dropout, view.shape, dtype, [view], p=0.4, seed=2 ** 64 - 3)
    assert got.tobytes() == want.tobytes()


def test_dropout_too_many_axes_is_a_clear_error():
    from engine.backends.cuda.dropout import cuda_dropout
    view = np.zeros((2, 2, 2, 2, 2)).transpose(4, 3, 2, 1, 0)
    with pytest.raises(BackendError, match=r"dropout's input has shape \[2, 2, 2, 2, 2\]"):
        _run(cuda_dropout, view.shape, view.dtype, [view], p=0.5, seed=1)


# --- get_rows -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_get_rows_back_is_bitwise_the_cpu_sum_over_chunks_and_blocks(dtype, monkeypatch):
    """Repeated indices, more than one chunk of staged indices, more elements than the
    grid's threads; values of mixed magnitude so that the summation order shows."""
    from engine.backends.cpu.get_rows import cpu_get_rows_back
    from engine.backends.cuda import launch
    from engine.backends.cuda.get_rows import cuda_get_rows_back
    monkeypatch.setattr(launch, "MAX_BLOCKS", 1)
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 3, (2, 70)).astype(np.int32)
    g = rng.standard_normal((2, 70, 50)) * 10.0 ** rng.integers(-4, 5, (2, 70, 50))
    g = g.astype(dtype)
    want = np.empty((3, 50), dtype)
    cpu_get_rows_back(want, [g, idx], nrows=3)
    got = _run(cuda_get_rows_back, want.shape, dtype, [g, idx], nrows=3)
    assert got.tobytes() == want.tobytes()


def test_bad_indices_show_as_nan():
    """The device cannot raise: a bad row reads as NaN, and get_rows_back's whole output is
    NaN when any index is bad; nothing outside the buffers is touched."""
    from engine.backends.cuda.get_rows import cuda_get_rows, cuda_get_rows_back
    table = np.arange(12.0).reshape(4, 3)
    idx = np.array([1, 4, -1, 3], np.int32)
    got = _run(cuda_get_rows, (4, 3), table.dtype, [table, idx])
    np.testing.assert_array_equal(got[[0, 3]], table[[1, 3]])
    assert np.isnan(got[[1, 2]]).all()
    back = _run(cuda_get_rows_back, (4, 3), table.dtype, [table, idx], nrows=4)
    assert np.isnan(back).all()


# --- optimizer steps ----------------------------------------------------------------------
def _sgd_cases():
    hps = [(0.1, 0.0, 0.0, 0.0), (0.05, 0.9, 0.0, 0.01), (0.02, 0.8, 0.3, 0.0)]
    for hp, nesterov, maximize in itertools.product(hps, (False, True), (False, True)):
        if nesterov and (hp[1] == 0.0 or hp[2] != 0.0):
            continue                          # torch: Nesterov needs momentum, no dampening
        yield "sgd_step", hp, 1, dict(nesterov=nesterov, maximize=maximize)


def _adam_cases():
    # b1 = 0.9 takes lerp's low-weight form (1 - b1 < 0.5), b1 = 0.3 the other one
    hps = [(1e-2, 0.9, 0.999, 1e-8, 0.0), (3e-2, 0.3, 0.99, 1e-6, 0.1)]
    for op, hp, amsgrad, maximize in itertools.product(("adam_step", "adamw_step"), hps,
                                                       (False, True), (False, True)):
        yield op, hp, 3 if amsgrad else 2, dict(amsgrad=amsgrad, maximize=maximize)


OPT_CASES = list(_sgd_cases()) + list(_adam_cases())


def _opt_id(case):
    op, hp, _, flags = case
    return f"{op}(hp={list(hp)},{','.join(f'{k}={v}' for k, v in flags.items())})"


def _run_steps(op, hp, n_states, flags, dtype, shape, n_steps, grad_view=None):
    """Run n_steps of the op's CUDA and CPU kernels from the same state, a new gradient
    each step (through `grad_view`, a function of a host array, if given), and compare
    param, states and step counter after every step."""
    from engine.backends.cuda import resolve_kernel
    from tests.engine.backends.cuda.kernel_harness import to_device
    rng = np.random.default_rng(11)
    param = rng.standard_normal(shape).astype(dtype)
    states = [np.zeros(shape, dtype) for _ in range(n_states)]
    host = {"param": param, "step": np.zeros(1), "hp": np.array(hp, np.float64),
            **{f"state{i}": s for i, s in enumerate(states)}}
    dev = {name: cuda.to_device(a) for name, a in host.items()}
    cpu_kernel, cuda_kernel = OPS[op].kernels["cpu"], resolve_kernel(OPS[op])
    names = ["step", "hp"] + [f"state{i}" for i in range(n_states)]
    for step in range(1, n_steps + 1):
        grad = rng.standard_normal(shape).astype(dtype)
        grad = grad_view(grad) if grad_view else grad
        cpu_kernel(host["param"], [host["param"], grad] + [host[n] for n in names], **flags)
        cuda_kernel(dev["param"], [dev["param"], to_device(grad)] + [dev[n] for n in names],
                    **flags)
        for name, want in host.items():
            got = dev[name].copy_to_host()
            np.testing.assert_allclose(got, want, **_tol(dtype),
                                       err_msg=f"{op} {flags}: {name} after step {step}")
        assert dev["step"].copy_to_host()[0] == step


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", OPT_CASES, ids=_opt_id)
def test_optimizer_step_matches_cpu_every_step(case, dtype):
    op, hp, n_states, flags = case
    _run_steps(op, hp, n_states, flags, dtype, (3, 5), n_steps=4)


@pytest.mark.parametrize("op, hp, n_states, flags", [
    ("sgd_step", (0.05, 0.9, 0.0, 0.01), 1, dict(nesterov=True, maximize=False)),
    ("adamw_step", (1e-2, 0.9, 0.999, 1e-8, 0.1), 3, dict(amsgrad=True, maximize=False))])
def test_optimizer_step_many_blocks_strided_gradient(op, hp, n_states, flags):
    """More elements than one block (the counter still counts once per step), and a
    transposed gradient view."""
    _run_steps(op, hp, n_states, flags, np.float32, (24, 30), n_steps=3,
               grad_view=lambda g: g.T.copy().T)


def test_optimizer_state_must_be_contiguous():
    from engine.backends.cuda.optim import cuda_sgd_step
    p = cuda.to_device(np.zeros((4, 4)))
    buf = cuda.to_device(np.zeros((4, 4)))
    from engine.backends.cuda.arrays import strided
    buf_t = strided(buf, (4, 4), (8, 32))
    ins = [p, p, cuda.to_device(np.zeros(1)), cuda.to_device(np.array([0.1, 0.9, 0.0, 0.0])),
           buf_t]
    with pytest.raises(BackendError, match=r"sgd_step: .*momentum buffer.*\[8, 32\]"):
        cuda_sgd_step(p, ins)


# --- compile check coverage ---------------------------------------------------------------
def _is_device_function(f) -> bool:
    """A @cuda.jit(device=True) function: compiled into the kernels that call it, it has no
    signature of its own (`_device` is the simulator's flag, `targetoptions` numba-cuda's)."""
    return bool(getattr(f, "targetoptions", {}).get("device") or getattr(f, "_device", False))


@pytest.mark.parametrize("module", ["matmul", "optim", "dropout", "get_rows"])
def test_every_kernel_has_a_ptx_signature_per_dtype(module):
    import importlib
    mod = importlib.import_module(f"engine.backends.cuda.{module}")
    kernels = {v.py_func.__name__ for v in vars(mod).values()
               if hasattr(v, "py_func") and v.py_func.__module__ == mod.__name__
               and not _is_device_function(v)}
    listed = {(k.py_func.__name__, dt) for k, sig in mod.PTX_SIGNATURES
              for dt in ("float32", "float64") if dt in sig}
    want = {(name, dt) for name in kernels for dt in ("float32", "float64")
            if name != "_count_step"}
    assert want <= listed
    assert {k.py_func.__name__ for k, _ in mod.PTX_SIGNATURES} == kernels
