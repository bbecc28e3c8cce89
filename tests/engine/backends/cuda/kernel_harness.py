"""Replay every kernel call of a sample's forward and backward graph on the CUDA backend.

The graph of a registry sample (its op, a weighted loss, the backward pass) is evaluated
node by node on the CPU into fresh numpy arrays (views as numpy views, so strided inputs
stay strided). Then each kernel node whose op has a CUDA kernel runs that kernel on device
copies of exactly the same inputs, with the same strides, and its output is compared with
the CPU kernel's. So every CUDA kernel is checked on the inputs the real graphs give it.

16-bit floats: both sides run the float32 kernel widened (engine.backends.cpu.half.widened
on the CPU, engine.backends.cuda.half.widened on the device: the backends' `kernel(op,
dtypes)`; a kernel marked `native_half` widens them itself), and the outputs, 16-bit
patterns rounded to nearest even, are compared within the op harness's tolerance of the
dtype (they are equal bit for bit wherever the two float32
kernels give the same float32 value, which is most nodes: `replay` reports how many).
"""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import ops
from engine.backends.cpu import CPU
from engine.registry import OPS
from engine.tensor import is_float, is_half
from tests.engine.ops.op_harness import TOL, loss_weights

cuda = pytest.importorskip("numba.cuda")


def needs_cuda():
    """Skip unless the simulator is on or a GPU is present."""
    import numba
    if not (numba.config.ENABLE_CUDASIM or cuda.is_available()):
        pytest.skip("needs NUMBA_ENABLE_CUDASIM=1 or a CUDA GPU (tox -e cudasim)",
                    allow_module_level=True)


def sample_graph(sample):
    """(graph, leaves, arrays) of the sample's op with a weighted loss and its backward."""
    arrays = sample.leaf_arrays(sample.generate_inputs())
    leaves = [engine.param(a.shape, a.dtype, name=s.name) if s.grad and is_float(a.dtype)
              else engine.input_tensor(a.shape, a.dtype, name=s.name)
              for s, a in zip(sample.inputs, arrays, strict=True)]
    out = sample.build(*leaves)
    graph = engine.Graph([out.set_output()], name=str(sample))
    if OPS[sample.op].differentiable and is_float(out.dtype) and \
            any(t.is_param for t in leaves):
        w = engine.constant(loss_weights(out.shape).astype(out.dtype), out.dtype)
        loss = ops.sum(ops.mul(out, w)).set_loss()
        graph.expand(loss)
        graph.build_backward(loss)
    for t, a in zip(leaves, arrays, strict=True):
        t.set(a)
    return graph


def dtypes(t) -> tuple:
    """The dtypes a node's kernel meets (the planner's): its output's and its sources'."""
    return (t.dtype, *(s.dtype for s in t.srcs))


def cpu_values(graph) -> dict[int, np.ndarray]:
    """Every node's value, computed kernel by kernel on the CPU without an arena (16-bit
    nodes through the CPU backend's widened kernels)."""
    values = {}
    for t in graph.nodes:
        if t.is_leaf:
            values[t.id] = t.buffer()
            continue
        op = OPS[t.op]
        ins = [values[s.id] for s in t.srcs]
        if op.kind == "view":
            values[t.id] = op.view(ins, **t.params)
        elif op.kind == "update":
            continue
        else:
            out = np.empty(t.shape, t.dtype)
            CPU.kernel(op, dtypes(t))(out, ins, **t.params)
            values[t.id] = out
    return values


def device_array(shape, dtype):
    """A new device array for engine dtype `dtype` (bfloat16 as uint16 patterns)."""
    from engine.backends.cuda.arrays import storage_dtype
    return cuda.device_array(shape, storage_dtype(dtype))


def to_host(dev, dtype) -> np.ndarray:
    """Device array `dev`'s values as a host array of engine dtype `dtype`."""
    return dev.copy_to_host().view(dtype)


def to_device(a: np.ndarray):
    """A device array with `a`'s values and strides (stride-0 axes stay stride 0); a 16-bit
    float in its storage dtype (bfloat16: uint16 patterns)."""
    from engine.backends.cuda.arrays import storage_dtype, strided
    a = a.view(storage_dtype(a.dtype))
    if a.size == 0 or a.flags.c_contiguous:
        return cuda.to_device(np.ascontiguousarray(a))
    # upload the smallest block of memory the view spans, then view it with its strides
    lo = sum(min(0, (n - 1) * s) for n, s in zip(a.shape, a.strides, strict=True))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(a.shape, a.strides, strict=True))
    base = np.lib.stride_tricks.as_strided(a, shape=((hi - lo) // a.itemsize + 1,),
                                           strides=(a.itemsize,)) if lo == 0 else None
    if base is None:
        raise NotImplementedError("negative strides")
    dev = cuda.to_device(np.ascontiguousarray(base))
    return strided(dev, a.shape, a.strides)


def tolerance(dtype) -> dict:
    """The op harness's tolerance for a node of numpy dtype `dtype` (integers: exact)."""
    from engine.tensor import dtype_name
    return TOL.get(dtype_name(dtype), {}) if np.dtype(dtype).kind in "fV" else {}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


BIT_EQUAL: dict[str, list[int]] = {}   # op -> [16-bit nodes replayed, of them bit-equal]


def replay(sample, op_names=None) -> list[str]:
    """Run the CUDA kernel of every kernel node (of `op_names`, default all) of the sample's
    graph on the CPU's inputs; returns the op names checked. Fails on any mismatch beyond
    the dtype's tolerance; counts the 16-bit nodes equal bit for bit in BIT_EQUAL."""
    from engine.backends.cuda import get_cuda_backend
    backend = get_cuda_backend()
    graph = sample_graph(sample)
    values = cpu_values(graph)
    checked = []
    for t in graph.nodes:
        if t.is_leaf or OPS[t.op].kind in ("view", "update"):
            continue
        if op_names is not None and t.op not in op_names:
            continue
        if not backend.has_kernel(OPS[t.op], dtypes(t)):
            continue
        kernel = backend.kernel(OPS[t.op], dtypes(t))
        ins = [to_device(values[s.id]) for s in t.srcs]
        out = device_array(t.shape, t.dtype)
        kernel(out, ins, **t.params)
        got, want = to_host(out, t.dtype), values[t.id]
        if any(is_half(d) for d in dtypes(t)):
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                       **tolerance(t.dtype), err_msg=f"{t.op} in {sample}")
            counts = BIT_EQUAL.setdefault(t.op, [0, 0])
            counts[0] += 1
            counts[1] += same_bits(got, want)
        else:
            np.testing.assert_allclose(got, want, **tolerance(t.dtype),
                                       err_msg=f"{t.op} in {sample}")
        checked.append(t.op)
    return checked


def replay_family(sample, family, expected) -> None:
    """`replay` the sample's kernel nodes of the ops `family`, and check that they were
    exactly the ops expected[sample.op] (its graph exercises each kernel it should)."""
    checked = replay(sample, family)
    assert set(checked) == expected[sample.op], f"{sample}: checked {checked}"


CUDA_DTYPES = ("f32", "f64", "f16", "bf16")    # the dtypes the CUDA kernels run
HALF_NAMES = ("f16", "bf16")


def _strided_input(sample) -> bool:
    return any(i.permute or i.slice or i.expand for i in sample.inputs)


def half_selection(samples) -> list:
    """Of each 16-bit dtype's cases, the first and the first with a permuted, sliced or
    expanded input: the float32 kernels they run widened are checked on every case in
    float32, so these check the widening, layouts included, per op and format."""
    out = []
    for name in HALF_NAMES:
        mine = [s for s in samples if s.dtype == name]
        out += mine[:1] + [s for s in mine[1:] if _strided_input(s)][:1]
    return out


def cuda_cases(samples) -> list:
    """The registry cases the CUDA kernels run here: every float32 and float64 case, and a
    selection of the float16 and bfloat16 ones (half_selection), which run the same
    kernels widened and would otherwise more than double the simulator's time."""
    samples = list(samples)
    half = set(map(id, half_selection(samples)))
    return [s for s in samples if s.dtype in ("f32", "f64") or id(s) in half]
