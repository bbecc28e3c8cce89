"""Replay every kernel call of a sample's forward and backward graph on the CUDA backend.

The graph of a registry sample (its op, a weighted loss, the backward pass) is evaluated
node by node on the CPU into fresh numpy arrays (views as numpy views, so strided inputs
stay strided). Then each kernel node whose op has a CUDA kernel runs that kernel on device
copies of exactly the same inputs, with the same strides, and its output is compared with
the CPU kernel's. So every CUDA kernel is checked on the inputs the real graphs give it.
"""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import ops
from engine.registry import OPS
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
    leaves = [engine.param(a.shape, a.dtype, name=s.name) if s.grad and a.dtype.kind == "f"
              else engine.input_tensor(a.shape, a.dtype, name=s.name)
              for s, a in zip(sample.inputs, arrays, strict=True)]
    out = sample.build(*leaves)
    graph = engine.Graph([out.set_output()], name=str(sample))
    if OPS[sample.op].differentiable and out.dtype.kind == "f" and \
            any(t.is_param for t in leaves):
        w = engine.constant(loss_weights(out.shape).astype(out.dtype), out.dtype)
        loss = ops.sum(ops.mul(out, w)).set_loss()
        graph.expand(loss)
        graph.build_backward(loss)
    for t, a in zip(leaves, arrays, strict=True):
        t.set(a)
    return graph


def cpu_values(graph) -> dict[int, np.ndarray]:
    """Every node's value, computed kernel by kernel on the CPU without an arena."""
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
            op.kernels["cpu"](out, ins, **t.params)
            values[t.id] = out
    return values


def to_device(a: np.ndarray):
    """A device array with `a`'s values and strides (stride-0 axes stay stride 0)."""
    from engine.backends.cuda.arrays import strided
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


def replay(sample, op_names=None) -> list[str]:
    """Run the CUDA kernel of every kernel node (of `op_names`, default all) of the sample's
    graph on the CPU's inputs; returns the op names checked. Fails on any mismatch."""
    from engine.backends.cuda import resolve_kernel
    graph = sample_graph(sample)
    values = cpu_values(graph)
    checked = []
    for t in graph.nodes:
        if t.is_leaf or OPS[t.op].kind in ("view", "update"):
            continue
        if op_names is not None and t.op not in op_names:
            continue
        kernel = resolve_kernel(OPS[t.op])
        if kernel is None:
            continue
        ins = [to_device(values[s.id]) for s in t.srcs]
        out = cuda.device_array(t.shape, t.dtype)
        kernel(out, ins, **t.params)
        got = out.copy_to_host()
        dtype = "f64" if t.dtype == np.float64 else "f32"
        np.testing.assert_allclose(got, values[t.id], **TOL.get(dtype, {}),
                                   err_msg=f"{t.op} in {sample}")
        checked.append(t.op)
    return checked


CUDA_DTYPES = ("f32", "f64")    # the dtypes the CUDA backend has kernels for


def cuda_cases(samples) -> list:
    """The registry cases the CUDA kernels run: float32 and float64 (the 16-bit floats'
    nodes are placed on the CPU, tests/engine/backends/cuda/test_backend.py)."""
    return [s for s in samples if s.dtype in CUDA_DTYPES]
