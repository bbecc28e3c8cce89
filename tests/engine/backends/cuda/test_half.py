"""float16 and bfloat16 on the CUDA backend: conversions, storage, transfers, widened
kernels, plans (engine.backends.cuda.half and .arrays).

The conversions are compared with the CPU backend's (engine.backends.cpu.half, itself tested
against numpy's float16 and ml_dtypes' bfloat16 over every pattern), one kernel launch over
every 16-bit pattern each way, bit for bit (the two share their scalar conversions).
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import engine
from engine import ops
from engine.backends.cpu import CPU
from engine.backends.cpu import half as cpu_half
from engine.registry import OPS
from engine.tensor import DTYPES, FLOAT_NAMES
from tests.engine.ops.op_harness import TOL

cuda = pytest.importorskip("numba.cuda")

FORMATS = [pytest.param(cpu_half.F16, np.float16, id="f16"),
           pytest.param(cpu_half.BF16, ml_dtypes.bfloat16, id="bf16")]
PATTERNS = np.arange(1 << 16, dtype=np.uint16)


@pytest.fixture
def sim():
    from tests.engine.backends.cuda.kernel_harness import needs_cuda
    needs_cuda()


def _cpu_widen(patterns, fmt) -> np.ndarray:
    out = np.empty(patterns.size, np.float32)
    cpu_half.widen_array(patterns, out, fmt)
    return out


def _cpu_narrow(values, fmt) -> np.ndarray:
    out = np.empty(values.size, np.uint16)
    cpu_half.narrow_array(values, out, fmt)
    return out


def _device_16(patterns, fmt):
    """A device array of the format's storage dtype holding `patterns`."""
    return cuda.to_device(patterns.view(np.float16) if fmt == cpu_half.F16 else patterns)


def _rounding_inputs(fmt) -> np.ndarray:
    """float32 values whose rounding to the format is worth checking: every pattern's value
    (NaNs with their payloads, infinities, subnormals), the midpoint of every pair of
    neighbouring finite patterns of one sign (the ties) and the float32 values one ulp
    either side, float32 NaNs whose payload lies below the format's bits, float32
    subnormals, and random float32 patterns."""
    values = _cpu_widen(PATTERNS, fmt)
    finite = np.sort(values[np.isfinite(values) & (values >= 0)].astype(np.float64))
    finite = np.unique(finite)
    mid = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)   # exact: few bits
    mid_bits = mid.view(np.uint32)
    near = np.concatenate([mid_bits - 1, mid_bits + 1]).view(np.float32)
    rng = np.random.default_rng(16)
    special = np.array([0x7F800001, 0x7F800FFF, 0x7FC00000, 0x7F801000, 0x7FFFFFFF,
                        0x00000001, 0x007FFFFF, 0x00800000, 0x33000000, 0x33000001,
                        0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000, 0x7F7FFFFF,
                        0x7F7F8000, 0x7F7F7FFF], np.uint32).view(np.float32)
    positive = np.concatenate([values, mid, near, special,
                               rng.integers(0, 1 << 32, 1 << 14, np.uint32).view(np.float32)])
    return np.concatenate([positive, -positive]).astype(np.float32)


@pytest.mark.cudasim
@pytest.mark.parametrize("fmt, dtype", FORMATS)
def test_widening_every_pattern_gives_the_cpu_bits(sim, fmt, dtype):
    from engine.backends.cuda import half
    out = cuda.device_array(PATTERNS.size, np.float32)
    half.widen_into(out, _device_16(PATTERNS, fmt))          # one launch
    got = out.copy_to_host().view(np.uint32)
    assert np.array_equal(got, _cpu_widen(PATTERNS, fmt).view(np.uint32))


@pytest.mark.cudasim
@pytest.mark.parametrize("fmt, dtype", FORMATS)
def test_rounding_gives_the_cpu_bits(sim, fmt, dtype):
    """Every pattern's value comes back as that pattern (NaN payloads kept as the CPU keeps
    them), and ties, their neighbours and the specials round as on the CPU."""
    from engine.backends.cuda import half
    values = _rounding_inputs(fmt)
    out = cuda.device_array(values.size, np.float16 if fmt == cpu_half.F16 else np.uint16)
    half.narrow_into(out, cuda.to_device(values))           # one launch
    got = out.copy_to_host().view(np.uint16)
    want = _cpu_narrow(values, fmt)
    bad = np.nonzero(got != want)[0]
    assert not bad.size, (f"{bad.size} differ, first float32 bits "
                          f"{values[bad[:5]].view(np.uint32)}: {got[bad[:5]]} vs {want[bad[:5]]}")
    back = got[:PATTERNS.size]                  # every pattern's value: the pattern back,
    nan = np.isnan(_cpu_widen(PATTERNS, fmt))   # a NaN as a NaN of its sign (bfloat16's
    assert np.array_equal(back[~nan], PATTERNS[~nan])          # signalling ones quieted)
    assert np.isnan(back.view(dtype)[nan].astype(np.float32)).all()
    assert np.array_equal(back[nan] >> 15, PATTERNS[nan] >> 15)


@pytest.mark.cudasim
@pytest.mark.parametrize("fmt, dtype", FORMATS)
def test_accumulate_rounds_the_float32_sum(sim, fmt, dtype):
    """dst += src in 16 bits: what numpy's float16 and ml_dtypes' bfloat16 additions give
    (the float32 sum rounded to nearest even), bit for bit."""
    from engine.backends.cuda import transfer
    rng = np.random.default_rng(5)
    a = (rng.standard_normal(300) * 10).astype(dtype)
    b = (rng.standard_normal(300) * 10).astype(dtype)
    dev = _device_16(a.view(np.uint16), fmt)
    transfer.accumulate(dev, _device_16(b.view(np.uint16), fmt))
    assert dev.copy_to_host().view(np.uint16).tobytes() == (a + b).view(np.uint16).tobytes()


# --- storage, views and transfers -----------------------------------------------------------
@pytest.mark.cudasim
@pytest.mark.parametrize("name, storage", [("f16", np.float16), ("bf16", np.uint16)])
def test_buffers_are_16_bit_and_views_keep_the_format(sim, name, storage):
    from engine.backends.cuda import get_cuda_backend
    be = get_cuda_backend()
    assert be.stores(DTYPES[name])
    arena = be.alloc(256)
    v = be.view(arena, 64, (3, 4), DTYPES[name])
    assert v.dtype == storage and v.strides == (8, 2)
    host = np.arange(12, dtype=np.float32).reshape(3, 4).astype(DTYPES[name])
    be.to_device(host.T.copy().T, v)               # a host array in another layout
    perm = OPS["permute"]
    t = be.device_view(perm, [v], {"axes": (1, 0)})
    back = np.empty((4, 3), DTYPES[name])
    be.to_host(t, back)                            # strided: through a device copy
    assert back.tobytes() == host.T.copy().tobytes()
    dst = be.view(arena, 128, (4, 3), DTYPES[name])
    be.copy(dst, t)
    assert dst.copy_to_host().view(np.uint16).tobytes() == host.T.copy().view(np.uint16) \
        .tobytes()


@pytest.mark.cudasim
@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_a_persistent_16_bit_tensor_round_trips_and_fills_on_the_device(sim, name):
    from engine.backends.cuda import get_cuda_backend
    be = get_cuda_backend()
    t = engine.param((2, 3), name, name="w")
    t.set(np.linspace(-1, 1, 6).reshape(2, 3))
    want = t.numpy()
    dev = be.persistent(t)                       # uploaded; the device copy is current
    assert dev.dtype.itemsize == 2 and t.device is dev
    t.fill(1.3)                                  # on the device, rounded to the format
    assert t._fresh == engine.tensor.DEVICE
    assert t.numpy().tobytes() == np.full((2, 3), 1.3).astype(DTYPES[name]).tobytes()
    t.set(want)                                  # the host copy changed: sent on next use
    be.persistent(t, write=False)
    assert dev.copy_to_host().view(np.uint16).tobytes() == want.view(np.uint16).tobytes()


# --- kernels and plans ------------------------------------------------------------------------
def _cast_case(source, target, rng):
    x = (rng.standard_normal((2, 3, 4)) * 100).astype(DTYPES[source]).transpose(2, 0, 1)
    return x, np.empty(x.shape, DTYPES[target])


@pytest.mark.cudasim
def test_cast_between_every_pair_of_float_dtypes_gives_the_cpu_bits(sim):
    from engine.backends.cuda import get_cuda_backend
    from tests.engine.backends.cuda.kernel_harness import device_array, to_device, to_host
    be = get_cuda_backend()
    rng = np.random.default_rng(9)
    for source, target in itertools.product(FLOAT_NAMES, repeat=2):
        x, want = _cast_case(source, target, rng)
        dtypes = (DTYPES[target], DTYPES[source])
        CPU.kernel(OPS["cast"], dtypes)(want, [x], dtype=target)
        out = device_array(x.shape, DTYPES[target])
        be.kernel(OPS["cast"], dtypes)(out, [to_device(x)], dtype=target)
        assert to_host(out, DTYPES[target]).tobytes() == want.tobytes(), (source, target)


@pytest.mark.cudasim
@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_a_16_bit_graph_runs_on_the_device_with_its_gradients_accumulated(sim, name):
    """No node falls back to the CPU, intermediates are 16-bit device buffers, and values
    and accumulated gradients equal the CPU backend's."""
    def build():
        x = engine.param((4, 5), name, name="x")
        x.set(np.linspace(-2, 2, 20).reshape(4, 5))
        y = ops.softmax(ops.matmul(ops.tanh(x), ops.permute(x, (1, 0))))
        loss = ops.sum(ops.mul(y, 0.5)).set_loss()
        g = engine.Graph([loss])
        g.build_backward(loss, accumulate=True)
        return g, x, loss

    results = {}
    for backend in ("cpu", "cuda"):
        g, x, loss = build()
        g.reset()
        g.compute(backend)
        g.compute(backend)                       # the accumulator adds up on the device
        results[backend] = loss.numpy(), g.grad(x).numpy()
        if backend == "cuda":
            assert g.plan.fallbacks == []
            assert all(be.name == "cuda" for be in g.plan.placement.values())
            outs = [s.out for s in g.plan.steps if getattr(s, "out", None) is not None]
            assert outs and all(o.dtype.itemsize == 2 for o in outs)
    for got, want in zip(results["cuda"], results["cpu"], strict=True):
        assert got.dtype == DTYPES[name]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   **TOL[name])


def _opt_steps(opt_name, name, backend, steps=3):
    from engine.optim.optimizers import make_optimizer
    p = engine.param((3, 4), name, name="p")
    p.set(np.linspace(-1, 1, 12).reshape(3, 4))
    opt = make_optimizer(opt_name, [p], lr=0.05)
    grad = opt.grads[p]
    rng = np.random.default_rng(3)
    for _ in range(steps):
        grad.set(rng.standard_normal((3, 4)))
        opt.step(backend)
    return p.numpy(), opt.state_arrays(), opt.graph.plan


@pytest.mark.cudasim
@pytest.mark.parametrize("name", ["f16", "bf16"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam", "adamw"])
def test_optimizer_steps_update_16_bit_params_on_the_device(sim, opt_name, name):
    """The step writes its 16-bit param back (rounded), its float32 state in place."""
    want_p, want_state, _ = _opt_steps(opt_name, name, "cpu")
    got_p, got_state, plan = _opt_steps(opt_name, name, "cuda")
    assert plan.fallbacks == []
    np.testing.assert_allclose(got_p.astype(np.float64), want_p.astype(np.float64),
                               **TOL[name])
    for key, want in want_state.items():
        np.testing.assert_allclose(got_state[key], want, **TOL["f32"], err_msg=key)


@pytest.mark.cudasim
@pytest.mark.parametrize("fmt, dtype", FORMATS)
def test_widening_five_unmergeable_axes(sim, fmt, dtype):
    """A 16-bit view with more than four axes that cannot merge: one launch per leading
    index, the values numpy gives."""
    from engine.backends.cuda import half
    from tests.engine.backends.cuda.kernel_harness import to_device
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 2, 4, 3)).astype(dtype).transpose(4, 3, 2, 1, 0)
    got = half.widened_copy(to_device(x)).copy_to_host()
    assert got.tobytes() == x.astype(np.float32).tobytes()
