"""Backends: where kernels run and where buffers live.

A backend gives `kernel(opdef)` (its kernel for an op, or BackendError), `alloc(nbytes)` (an
arena), `view(arena, offset, shape, dtype)`, `persistent(tensor)` (a persistent tensor's
buffer), `copy(dst, src)` and `accumulate(dst, src)` (dst += src).
"""

from __future__ import annotations

from engine.errors import BackendError

BACKENDS = ("cpu",)


def get_backend(name: str):
    if name == "cpu":
        from engine.backends.cpu import CPU
        return CPU
    raise BackendError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
