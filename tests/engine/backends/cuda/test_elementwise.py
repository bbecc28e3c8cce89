"""CUDA kernels of the elementwise ops (unary maps, activations and their gradients, binary
ops, cont, broadcast_to) against the CPU kernels.

Registry samples are replayed: each kernel node of the sample's forward and backward graph
runs on the CUDA backend on the inputs the CPU computed, strided views included, and must
give the CPU kernel's result. To keep the simulator run short, each op keeps per dtype and
parameter set its smallest sample, every sample with a permuted input, and every binary
sample that broadcasts (of the 16-bit floats' cases, the harness's selection:
kernel_harness.half_selection).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.registry import OPS
from tests.engine.backends.cuda.kernel_harness import cuda, cuda_cases, needs_cuda, replay

pytestmark = [pytest.mark.cudasim]

UNARY = ["neg", "scale", "sqr", "sqrt", "log", "exp", "abs", "sgn", "step", "relu"]
ACTIVATIONS = ["sin", "cos", "tanh", "sigmoid", "gelu", "gelu_erf", "silu", "elu",
               "leaky_relu", "softplus", "hardswish", "clamp", "expm1", "gelu_quick"]
BINARY = ["add", "sub", "mul", "div"]
FAMILY = {*UNARY, *ACTIVATIONS, *(f"{a}_back" for a in ACTIVATIONS), *BINARY, "relu_back",
          "cont", "broadcast_to"}

# kernel ops of the family that each sample's graph must exercise, beyond the op itself
# (the loss's weighting is a mul, and its gradient seed a broadcast_to)
LOSS = {"mul", "broadcast_to"}
GRADIENT = {"neg": {"neg"}, "relu": {"relu_back"}, "abs": {"sgn"}, "sgn": {"scale"},
            "step": {"scale"}, "scale": {"scale"}, "sqrt": {"div", "scale"}, "log": {"div"},
            "sqr": {"scale"}, "sub": {"neg"}, "div": {"neg"},
            **{a: {f"{a}_back"} for a in ACTIVATIONS}}


def _size(sample) -> int:
    return sum(math.prod(i.shape) for i in sample.inputs)


def _selected(samples) -> list:
    """The smallest sample per (dtype, parameters), those with a permuted input, and those
    whose inputs have different shapes (broadcasting)."""
    smallest = {}
    for s in samples:
        key = (s.dtype, s.params)
        if key not in smallest or _size(s) < _size(smallest[key]):
            smallest[key] = s
    return [s for s in samples
            if s is smallest[(s.dtype, s.params)] or any(i.permute for i in s.inputs)
            or len({i.shape for i in s.inputs}) > 1]


SAMPLES = [s for name in sorted(FAMILY) for s in _selected(cuda_cases(OPS[name].samples()))]


@pytest.fixture(autouse=True, scope="module")
def _needs_cuda():
    needs_cuda()


def test_every_op_of_the_family_names_its_cuda_kernel():
    from engine.backends.cuda import resolve_kernel
    for name in FAMILY:
        assert callable(resolve_kernel(OPS[name])), name


def test_the_selection_keeps_every_dtype_and_a_strided_case_per_op():
    for name in FAMILY:
        chosen = [s for s in SAMPLES if s.op == name]
        assert {s.dtype for s in chosen} == {"f32", "f64", "f16", "bf16"}, name
        if any(i.permute for s in cuda_cases(OPS[name].samples()) for i in s.inputs):
            assert any(i.permute for s in chosen for i in s.inputs), name


@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_kernels_match_cpu(sample):
    checked = set(replay(sample, FAMILY))
    assert sample.op in checked, f"{sample}: checked {sorted(checked)}"
    if OPS[sample.op].kind != "backward":
        expected = {sample.op} | LOSS | GRADIENT.get(sample.op, set())
        assert expected <= checked, f"{sample}: checked {sorted(checked)}"


# --- layouts the registry samples do not reach ----------------------------------------------------
def _run(kernel, out_shape, ins, **params):
    """A CUDA kernel's result on host arrays `ins` (uploaded with their strides)."""
    from tests.engine.backends.cuda.kernel_harness import to_device
    out = cuda.device_array(out_shape, ins[0].dtype)
    kernel(out, [to_device(a) for a in ins], **params)
    return out.copy_to_host()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_four_unmergeable_axes_and_five_axes(dtype):
    """A permutation leaving 4 axes that cannot merge (one launch per leading index), and a
    broadcast over 5 axes (two leading axes looped): the values numpy gives, to the bit."""
    from engine.backends.cuda import elementwise
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 3, 5)).astype(dtype).transpose(0, 2, 1, 3)
    assert np.array_equal(_run(elementwise.cuda_neg, x.shape, [x]), -x)
    a = rng.standard_normal((2, 3, 2, 4, 3)).astype(dtype).transpose(4, 3, 2, 1, 0)
    b = rng.standard_normal((3, 1, 2, 1, 2)).astype(dtype)
    assert np.array_equal(_run(elementwise.cuda_mul, (3, 4, 2, 3, 2), [a, b]), a * b)
    assert np.array_equal(_run(elementwise.cuda_broadcast_to, (3, 4, 2, 3, 2), [b],
                               shape=(3, 4, 2, 3, 2)), np.broadcast_to(b, (3, 4, 2, 3, 2)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_binary_ops_give_the_cpu_bits(dtype):
    """+, -, *, / are correctly rounded in both backends: the same bits, broadcast or not."""
    from engine.backends.cpu.elementwise import binary
    from engine.backends.cuda import elementwise
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 5, 4)).astype(dtype).transpose(1, 0, 2)
    b = (rng.standard_normal((5, 1, 4)) + 3.0).astype(dtype)
    for name in BINARY:
        want = np.empty((5, 3, 4), dtype)
        binary(name)(want, [a, b])
        got = _run(getattr(elementwise, f"cuda_{name}"), want.shape, [a, b])
        assert got.tobytes() == want.tobytes(), name


def test_strided_kernels_get_views_typed_layout_a(monkeypatch):
    """Every view a strided kernel gets has a stride-0 axis (numba types it layout "A", so
    one compilation per dtype serves every layout); contiguous operands take the flat one."""
    from engine.backends.cuda import elementwise
    launched = []

    class Recorder:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args):
                launched.append((self.name, [a.strides for a in args if hasattr(a, "strides")]))
                self.kernel[grid](*args)
            return launch

    add = elementwise.kernels("add")
    for name in ("flat", "strided"):
        monkeypatch.setattr(add, name, Recorder(name, getattr(add, name)))
    rng = np.random.default_rng(5)
    a = rng.standard_normal((4, 3)).astype(np.float32)
    _run(elementwise.cuda_add, (4, 3), [a, a])
    _run(elementwise.cuda_add, (3, 4), [a.T, a.T.copy()])
    assert [n for n, _ in launched] == ["flat", "strided"]
    *views, out = launched[1][1]
    assert all(len(st) == 4 and st[0] == 0 for st in views)
    assert len(out) == 1


def test_empty_tensor_launches_nothing():
    from engine.backends.cuda import elementwise
    x = np.zeros((0, 3), np.float32)
    assert _run(elementwise.cuda_sigmoid, (0, 3), [x]).shape == (0, 3)


def test_every_kernel_has_a_ptx_signature_per_dtype():
    """Every op of the family has its own kernels (cont and broadcast_to share the copy's),
    flat and strided, kept by op name; each is listed for PTX with both dtypes."""
    from engine.backends.cuda import elementwise
    def is_device_function(v):      # the simulator's and numba-cuda's flags
        return getattr(v, "_device", False) or getattr(v, "targetoptions", {}).get("device")
    assert not {name for name, v in vars(elementwise).items()
                if hasattr(v, "py_func") and not is_device_function(v)}   # all kept by op
    names = FAMILY - {"cont", "broadcast_to"} | {"copy"}
    assert set(elementwise.KERNELS) == names
    kernels = {k.py_func.__name__ for name in names
               for k in (elementwise.kernels(name).flat, elementwise.kernels(name).strided)}
    assert len(kernels) == 2 * len(names) == 88
    listed = {(k.py_func.__name__, dt) for k, sig in elementwise.PTX_SIGNATURES
              for dt in ("float32", "float64") if sig.startswith(f"void({dt}")}
    assert listed == {(name, dt) for name in kernels for dt in ("float32", "float64")}


def test_a_toy_activation_row_gets_cuda_kernels(monkeypatch):
    """A row added to the table (tests/engine/test_elementwise.py's toy) gets its CUDA
    kernels from its scalar math with no other edit, giving the CPU kernels' results."""
    from engine.backends.cuda import elementwise, resolve_kernel
    from engine.ops.unary import define_unary, undefine_unary
    from tests.engine.test_elementwise import TOY
    monkeypatch.setattr(elementwise, "KERNELS", dict(elementwise.KERNELS))   # made here only
    define_unary(TOY)
    try:
        rng = np.random.default_rng(6)
        for dtype in (np.float32, np.float64):
            x = rng.uniform(-3, 3, (4, 3, 5)).astype(dtype).transpose(2, 0, 1)
            g = rng.uniform(-1, 1, x.shape).astype(dtype)
            for name, ins in ((TOY.name, [x]), (f"{TOY.name}_back", [g, x])):
                want = np.empty(x.shape, dtype)
                OPS[name].kernels["cpu"](want, ins, k=0.7)
                got = _run(resolve_kernel(OPS[name]), x.shape, ins, k=0.7)
                np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == np.float32
                                           else 1e-13)
    finally:
        undefine_unary(TOY.name)
