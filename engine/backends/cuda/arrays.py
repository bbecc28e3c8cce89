"""Device arrays for the CUDA backend: strided views, on a GPU and under the simulator.

numba's device arrays slice and reshape only where a contiguous layout allows; kernels also
need arbitrary strided views of one buffer (permuted inputs, broadcast inputs with stride 0,
unit axes added to reach a fixed rank, the arena's typed blocks). `strided` builds them from
(shape, strides in bytes, byte offset) alike on a real device (a DeviceNDArray over the same
device memory) and under NUMBA_ENABLE_CUDASIM=1 (a simulator array over a numpy view).

Launch shapes under the simulator: it runs every CUDA thread of a block as a Python thread
(starting one costs about as much as a few hundred loop steps) and each syncthreads as a
barrier that a polling thread releases (milliseconds each, whatever the work between). A
launch there is cheap when it has few threads that each loop over many elements and few
barriers; `grid_stride_shape` gives grid-stride kernels that shape (SIM_THREADS threads in
each of at most SIM_BLOCKS blocks) there, and the GPU's shape on a GPU.
"""

from __future__ import annotations

import numba
import numpy as np

SIMULATED = bool(numba.config.ENABLE_CUDASIM)
SIM_THREADS = 32    # threads per block of a grid-stride launch under the simulator
SIM_BLOCKS = 2      # blocks of a grid-stride launch under the simulator (more than one, so
                    # that small test shapes still cover blockIdx > 0)


def grid_stride_shape(n: int, threads: int, max_blocks: int) -> tuple[int, int]:
    """(blocks, threads per block) of a grid-stride launch over n items: `threads` per block
    and ceil(n / threads) blocks, at most `max_blocks` (at least one block); under the
    simulator at most SIM_THREADS threads and SIM_BLOCKS blocks."""
    if SIMULATED:
        threads, max_blocks = min(threads, SIM_THREADS), min(max_blocks, SIM_BLOCKS)
    return max(1, min(-(-n // threads), max_blocks)), threads


def _is_fake(arr) -> bool:
    return hasattr(arr, "_ary")


def strided(arr, shape, strides, offset: int = 0, dtype=None):
    """A view of device array `arr`'s memory with `shape`, byte `strides` and byte `offset`
    (dtype defaults to arr's). The caller keeps it inside the buffer."""
    dtype = np.dtype(dtype or arr.dtype)
    shape, strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
    if _is_fake(arr):
        base = arr._ary
        holder = _Interface(base, shape, strides, dtype,
                            base.__array_interface__["data"][0] + offset)
        return type(arr)(np.asarray(holder))
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    data = arr.gpu_data.view(offset) if offset else arr.gpu_data
    return DeviceNDArray(shape, strides, dtype, gpu_data=data)


class _Interface:
    """An __array_interface__ over another array's memory (kept alive by the reference)."""

    def __init__(self, owner, shape, strides, dtype, address):
        self.owner = owner
        self.__array_interface__ = {"shape": shape, "strides": strides, "typestr": dtype.str,
                                    "data": (address, False), "version": 3}


def like_numpy(arr) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, byte strides) of a device array."""
    return tuple(arr.shape), tuple(arr.strides)


def broadcast(arr, shape):
    """`arr` broadcast to `shape` (numpy's rules): stride 0 on the new and size-1 axes."""
    src_shape, src_strides = like_numpy(arr)
    nd = len(shape)
    pad = nd - len(src_shape)
    strides = []
    for i, n in enumerate(shape):
        j = i - pad
        if j < 0 or src_shape[j] == 1 and n != 1:
            strides.append(0)
        elif src_shape[j] == n:
            strides.append(src_strides[j])
        else:
            raise ValueError(f"cannot broadcast {list(src_shape)} to {list(shape)}")
    return strided(arr, shape, strides)


def with_rank(arr, ndim: int):
    """`arr` with unit axes in front up to `ndim` axes (a view)."""
    shape, strides = like_numpy(arr)
    pad = ndim - len(shape)
    return strided(arr, (1,) * pad + shape, (0,) * pad + strides)
