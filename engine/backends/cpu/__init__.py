"""The CPU backend: numba kernels (see `jit`) and numpy buffers."""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from engine.backends.cpu import half, paths
from engine.backends.cpu.threads import engine_threads
from engine.errors import BackendError
from engine.tensor import is_half, line_aligned

COPY_KERNEL_MIN = 1 << 12       # elements of a strided view below which numpy copies it
# the ops whose CPU kernels call BLAS: a plan running one holds BLAS to one thread for all
# its runs (running), where each kernel's own hold (threads.one_blas_thread) would set and
# restore every BLAS library's threads at each call (conv_2d's: 15 of its small cases' 150
# microseconds a run, 538,000 calls into threadpoolctl in a warm `gradcheck --op conv_2d
# --op conv_2d_back_w` under cProfile)
BLAS_OPS = frozenset({"matmul", "attention_fwd", "attention_back", "conv_2d", "conv_2d_back_x",
                      "conv_2d_back_w"})


class CpuBackend:
    name = "cpu"

    def running(self, ops=None):
        """The context a plan runs in: while the engine's own threads split the kernels,
        BLAS held to one thread (engine.backends.cpu.threads.engine_threads). `ops`: the
        names of the ops the plan runs (None: any); a plan without a product (matmul and
        attention's kernels call BLAS) needs no holding, and skips its cost (two calls into
        each BLAS library per run: a quarter of a small graph's run time)."""
        if ops is not None and BLAS_OPS.isdisjoint(ops):
            return contextlib.nullcontext()
        return engine_threads()

    def kernel(self, op, dtypes=()):
        """Op `op`'s CPU kernel for a node whose output and sources have `dtypes`: where one
        is a 16-bit float, the float32 kernel widened (half.widened: inputs widened to
        float32, the output rounded to nearest even on store), unless the kernel reads the
        16-bit patterns itself (patterns.native_half) and the node has one 16-bit dtype; the
        conversions on the engine's threads for a kernel marked half.widens_on_threads."""
        try:
            k = op.kernels["cpu"]
        except KeyError:
            raise BackendError(f"op {op.name} has no cpu kernel") from None
        halves = {np.dtype(d) for d in dtypes if is_half(d)}
        if halves and not (getattr(k, "native_half", False) and len(halves) == 1):
            return half.widened(k, update=op.kind == "update",
                                split=getattr(k, "widens_on_threads", False))
        return k

    def alloc(self, nbytes: int) -> np.ndarray:
        arena = line_aligned(nbytes)
        if paths.POISON:                   # garbage, as a reused arena holds
            arena.fill(0xFF)
        return arena

    def view(self, arena, offset: int, shape, dtype) -> np.ndarray:
        return np.ndarray(shape, dtype, buffer=arena, offset=offset)

    def stores(self, dtype) -> bool:
        return True

    def has_kernel(self, op, dtypes=()) -> bool:
        return "cpu" in op.kernels

    def persistent(self, tensor, write: bool = True) -> np.ndarray:
        """The tensor's host buffer, current; `write` says the caller may change it."""
        return tensor.buffer() if write else tensor.host_view()

    def device_view(self, op, ins, params):
        return op.view(ins, **params)

    def copy(self, dst, src) -> None:
        np.copyto(dst, src)

    def bind_copy(self, dst, src):
        """A zero-argument call copying `src` (any strides) into contiguous `dst`, as the
        executor copies a view into its persistent buffer: a big strided view by `cont`'s
        kernel (a transposed one in tiles, on the engine's threads: 22 ms where numpy's
        copy took 173 for a (4096, 2048) float32 transpose, issue 37), anything else by
        numpy (whose call costs less than binding a kernel on small arrays)."""
        if src.flags.c_contiguous or src.size < COPY_KERNEL_MIN or src.dtype != dst.dtype:
            return functools.partial(np.copyto, dst, src)
        from engine.backends.cpu.elementwise import cont  # the kernels load on first use
        return cont.bind(dst, [src])

    def accumulate(self, dst, src) -> None:
        np.add(dst, src, out=dst)

    def to_host(self, src, host_dst) -> None:
        np.copyto(host_dst, src)

    def to_device(self, host_src, dst) -> None:
        np.copyto(dst, host_src)


CPU = CpuBackend()
