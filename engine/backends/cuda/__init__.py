"""The CUDA backend: numba.cuda kernels and device buffers.

Ops name their CUDA kernel in their `kernels` table as a string "module:kernel" (for
example "engine.backends.cuda.norm:cuda_rms_norm"), resolved on first use, so importing the
engine neither imports numba.cuda nor fixes the simulator setting before the user chose it.
A CUDA kernel has the CPU kernel's signature, `kernel(out, ins, **params)`, over device
arrays: `out` C-contiguous, `ins` possibly strided views (stride 0 for broadcast axes).

16-bit floats (float16, bfloat16) are stored in 16 bits on the device (float16 as numba
float16 arrays, bfloat16 as uint16 arrays of its bit patterns: engine.backends.cuda.arrays
and .half say why) and computed in float32: every kernel is the float32 one, widened
(half.widened: inputs widened into float32 temporaries per call, the output rounded to
nearest even on store), except a kernel marked `native_half` that widens them itself
(attention_back, which needs the 16-bit dtype its saved log-sum-exp was rounded to).

Without a GPU, NUMBA_ENABLE_CUDASIM=1 (set before numba.cuda is first imported) runs the
same kernels in numba's simulator, on small shapes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os

from engine.errors import BackendError
from engine.tensor import is_half

ENABLE_HINT = ("run on a machine with an NVIDIA GPU and numba-cuda installed "
               "(pip install 'gradverify[cuda]'), or set NUMBA_ENABLE_CUDASIM=1 before "
               "starting Python to run the CUDA kernels in numba's simulator (slow; small "
               "shapes)")


def cuda_module():
    """numba.cuda, or BackendError saying how to get a CUDA backend."""
    try:
        from numba import cuda
    except ImportError as exc:
        raise BackendError(f"the cuda backend needs numba-cuda ({exc}); {ENABLE_HINT}") \
            from None
    import numba
    if not numba.config.ENABLE_CUDASIM and not cuda.is_available():
        sim = os.environ.get("NUMBA_ENABLE_CUDASIM")
        late = (" (NUMBA_ENABLE_CUDASIM is set, but only after numba.cuda was imported)"
                if sim and sim != "0" else "")
        raise BackendError(f"no CUDA GPU found and the CUDA simulator is off{late}: "
                           f"{ENABLE_HINT}")
    return cuda


def resolve_kernel(op):
    """The op's CUDA kernel (importing its module on first use), or None if it has none."""
    k = op.kernels.get("cuda")
    if isinstance(k, str):
        module, _, name = k.partition(":")
        k = getattr(importlib.import_module(module), name)
        op.kernels["cuda"] = k
    return k


class CudaBackend:
    """Device arrays for buffers, numba.cuda kernels; persistent tensors keep a device copy
    (`Tensor.device`) that is synchronised with the host copy on demand."""

    name = "cuda"

    def __init__(self):
        self.cuda = cuda_module()
        from engine.backends.cuda import arrays, half, transfer
        self.arrays, self.half, self.transfer = arrays, half, transfer

    def running(self, ops=None):
        """The context a plan runs in: nothing to set up for the device."""
        return contextlib.nullcontext()

    def has_kernel(self, op, dtypes=()) -> bool:
        """Whether op `op` has a CUDA kernel for a node of `dtypes` (its output's and its
        sources'): every op with one has it for every dtype, the 16-bit floats through
        the float32 kernel widened."""
        return "cuda" in op.kernels

    def stores(self, dtype) -> bool:
        """Whether its buffers hold `dtype`: every engine dtype (bfloat16 as uint16 bit
        patterns)."""
        return True

    def kernel(self, op, dtypes=()):
        """Op `op`'s CUDA kernel for a node whose output and sources have `dtypes`: where
        one is a 16-bit float, the float32 kernel widened (half.widened), unless the kernel
        widens 16-bit arrays itself (its attribute `native_half`, as the CPU's)."""
        k = resolve_kernel(op)
        if k is None:
            raise BackendError(f"op {op.name} has no cuda kernel")
        if any(is_half(d) for d in dtypes) and not getattr(k, "native_half", False):
            return self.half.widened(k, update=op.kind == "update")
        return k

    def alloc(self, nbytes: int):
        return self.cuda.device_array(max(nbytes, 1), "u1")

    def view(self, arena, offset: int, shape, dtype):
        dtype = self.arrays.storage_dtype(dtype)
        strides, acc = [], dtype.itemsize
        for n in reversed(shape):
            strides.append(acc)
            acc *= max(int(n), 1)
        return self.arrays.strided(arena, shape, tuple(reversed(strides)), offset, dtype)

    def persistent(self, tensor, write: bool = True):
        """The tensor's device copy, current; `write` says the caller may change it."""
        from engine.tensor import BOTH, DEVICE, HOST
        o = tensor.owner()
        if o.device is None:
            o.device = self.arrays.upload(self.cuda, o.host_view())
            o._fresh = BOTH
        elif o._fresh == HOST:
            o.device.copy_to_device(o.host_view())
            o._fresh = BOTH
        if write:
            o._fresh = DEVICE
        return o.device

    def device_view(self, op, ins, params):
        """A view op on a device array: the view the op makes of a numpy probe with the
        same shape and strides, rebuilt over the device memory."""
        import numpy as np
        src = ins[0]
        probe = np.lib.stride_tricks.as_strided(np.zeros(1, src.dtype), shape=src.shape,
                                                strides=src.strides)
        v = op.view([probe, *ins[1:]], **params)
        if not np.shares_memory(v, probe) and v.size:
            raise BackendError(f"view op {op.name} copied its input; it cannot run as a "
                               "view on the device")
        offset = v.__array_interface__["data"][0] - probe.__array_interface__["data"][0]
        return self.arrays.strided(src, v.shape, v.strides, offset)

    def copy(self, dst, src) -> None:
        self.transfer.copy(dst, src)

    def bind_copy(self, dst, src):
        """A zero-argument call of copy(dst, src) (the executor's copy of a view)."""
        return functools.partial(self.transfer.copy, dst, src)

    def accumulate(self, dst, src) -> None:
        self.transfer.accumulate(dst, src)

    def to_host(self, src, host_dst) -> None:
        """Copy a device array (any strides) into the contiguous numpy array `host_dst`
        (16-bit floats: their bit patterns)."""
        if self.arrays.half_format(src) is not None:
            src, host_dst = self.arrays.bits(src), self.arrays.host_bits(host_dst)
        if src.is_c_contiguous():
            src.copy_to_host(host_dst)
        else:
            tmp = self.cuda.device_array(src.shape, src.dtype)
            self.transfer.copy(tmp, src)
            tmp.copy_to_host(host_dst)

    def to_device(self, host_src, dst) -> None:
        """Copy numpy array `host_src` (any strides) into the contiguous device array `dst`
        (16-bit floats: their bit patterns)."""
        import numpy as np
        host_src = np.ascontiguousarray(host_src)
        if self.arrays.half_format(dst) is not None:
            dst, host_src = self.arrays.bits(dst), self.arrays.host_bits(host_src)
        dst.copy_to_device(host_src)


_BACKEND = None


def get_cuda_backend() -> CudaBackend:
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = CudaBackend()
    return _BACKEND
