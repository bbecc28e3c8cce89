"""Backends: where kernels run and where buffers live.

A backend gives `has_kernel(opdef)`, `kernel(opdef)` (its kernel for an op, or
BackendError), `alloc(nbytes)` (an arena), `view(arena, offset, shape, dtype)`,
`persistent(tensor, write)` (a persistent tensor's buffer on this backend, made current),
`device_view(opdef, ins, params)` (a view op applied to its arrays), `copy(dst, src)`,
`accumulate(dst, src)` (dst += src), and `to_host(src, host_dst)` / `to_device(host_src,
dst)` for the scheduler's copies between backends (the CPU's are plain numpy copies).
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
