"""Backends: where kernels run and where buffers live.

A backend is an object with a `name` and these methods, which the planner and the executor
call (engine/backends/cpu and engine/backends/cuda are the two there are):

- `has_kernel(opdef, dtypes)`, `kernel(opdef, dtypes)`: its kernel for an op (from
  `opdef.kernels[name]`) on a node whose output and sources have `dtypes`, or
  BackendError; a node whose op has no kernel here (for those dtypes) is placed on the CPU
  instead. The CPU's kernel for a node with a 16-bit float widens it to float32
  (engine.backends.cpu.half.widened);
- `stores(dtype)`: whether its buffers hold that dtype (a view of a leaf is placed on the
  plan's backend when it does, else on the CPU);
- `alloc(nbytes)` (an arena) and `view(arena, offset, shape, dtype)` (a buffer in it);
- `persistent(tensor, write)`: a persistent tensor's buffer on this backend, made current;
- `device_view(opdef, ins, params)`: a view op applied to its arrays;
- `copy(dst, src)`, `accumulate(dst, src)` (dst += src), and `to_host(src, host_dst)` /
  `to_device(host_src, dst)` for the copies between backends (the CPU's are numpy copies);
- `running(ops)`: the context manager a plan running ops `ops` runs in (the CPU's holds
  BLAS to one thread when one of them is a product).

A device backend that keeps copies of persistent tensors (`Tensor.device`) registers how to
fill them in place with `engine.tensor.register_device_filler` (see Tensor.fill).
`get_backend(name)` gives the backend called `name`, one of BACKENDS.
"""

from __future__ import annotations

from engine.errors import BackendError

BACKENDS = ("cpu", "cuda")


def get_backend(name: str):
    """The backend called `name`; "cuda" raises BackendError, saying how to enable it, where
    there is neither a GPU nor the simulator."""
    if name == "cpu":
        from engine.backends.cpu import CPU
        return CPU
    if name == "cuda":
        from engine.backends.cuda import get_cuda_backend
        return get_cuda_backend()
    raise BackendError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
