"""Device arrays for the CUDA backend: strided views, on a GPU and under the simulator.

numba's device arrays slice and reshape only where a contiguous layout allows; kernels also
need arbitrary strided views of one buffer (permuted inputs, broadcast inputs with stride 0,
unit axes added to reach a fixed rank, the arena's typed blocks). `strided` builds them from
(shape, strides in bytes, byte offset) alike on a real device (a DeviceNDArray over the same
device memory) and under NUMBA_ENABLE_CUDASIM=1 (a simulator array over a numpy view).

16-bit floats (engine.tensor.is_half) are stored in 16 bits: float16 as numba float16
arrays, bfloat16 as uint16 arrays of its bit patterns (`storage_dtype`; engine.backends.cuda.half
says why). The engine has no uint16 dtype, so a device array's dtype names its format
(`half_format`); `bits` views either as uint16 patterns, which the conversion kernels read
and write and the copies move. A persistent bfloat16 tensor's device copy (`upload`) also
takes and gives host arrays of ml_dtypes' bfloat16 (Tensor.host_view copies into one).

Kernels that take an array as a 1-D view over its memory (the row reductions) get it from
`flat_view` (any strides: element strides returned beside it) or `rows_view` (C-contiguous
rows); `pad4` brings (size, stride) axes to four. Each such kernel is compiled for one layout
per dtype, `float32[::1]` / `float64[::1]`, whatever the strides of the tensors it is handed.

A flat view in C order is had only through `flat`, which checks that the array is
C-contiguous (`c_contiguous`, from its shape and strides) and refuses any other layout;
never through a device array's `reshape`, whose result for a strided array depends on where
it runs: numba's DeviceNDArray raises ("operation requires copying"), the simulator's
reshapes the numpy array behind it, which silently copies, so that a kernel's writes land
in the copy and are lost. Kernels over arrays of any strides take them as 4-axis views
(`rank4_pieces`: the axes of one or several arrays of one shape merged where all allow).
"""

from __future__ import annotations

import itertools
import math

import numba
import numpy as np

from engine.backends.cpu.half import BF16, F16
from engine.backends.cpu.layout import coalesce
from engine.errors import BackendError
from engine.tensor import DTYPES, is_half

SIMULATED = bool(numba.config.ENABLE_CUDASIM)   # launch shapes: engine.backends.cuda.launch

_STORAGE = {DTYPES["f16"]: np.dtype(np.float16), DTYPES["bf16"]: np.dtype(np.uint16)}
_FORMATS = {np.dtype(np.float16): F16, np.dtype(np.uint16): BF16}


def storage_dtype(dtype) -> np.dtype:
    """The dtype of a device array holding engine dtype `dtype`: uint16 for bfloat16 (its
    bit patterns), the dtype itself otherwise."""
    dtype = np.dtype(dtype)
    return _STORAGE.get(dtype, dtype)


def half_format(arr) -> int | None:
    """F16 or BF16 for a device (or host) array holding a 16-bit float, else None: a float16
    array holds float16, a uint16 one bfloat16's patterns (a host array of ml_dtypes'
    bfloat16 is one too)."""
    dtype = getattr(arr, "dtype", None)
    if dtype is None:
        return None
    if dtype == DTYPES["bf16"]:
        return BF16
    return _FORMATS.get(np.dtype(dtype))


def bits(arr):
    """The uint16 bit patterns of 16-bit device array `arr`: a view of the same memory with
    its shape and strides."""
    return strided(arr, arr.shape, arr.strides, 0, np.uint16)


def host_bits(a: np.ndarray) -> np.ndarray:
    """The uint16 view of a host array of a 16-bit float (float16 or ml_dtypes' bfloat16),
    else `a` itself."""
    return a.view(np.uint16) if is_half(a.dtype) else a


def _host_bf16_type(base: type) -> type:
    """A subclass of device array type `base` whose copies to and from host arrays of
    ml_dtypes' bfloat16 go through their uint16 view (numba's copies refuse a dtype other
    than the device array's)."""
    def copy_to_host(self, ary=None, stream=0):
        if ary is not None and ary.dtype == DTYPES["bf16"]:
            base.copy_to_host(self, ary.view(np.uint16), stream)
            return ary
        return base.copy_to_host(self, ary, stream)

    def copy_to_device(self, ary, stream=0):
        if isinstance(ary, np.ndarray):
            ary = host_bits(ary)
        return base.copy_to_device(self, ary, stream)

    return type(f"Bf16{base.__name__}", (base,),
                {"copy_to_host": copy_to_host, "copy_to_device": copy_to_device,
                 "__doc__": _host_bf16_type.__doc__})


_HOST_BF16_TYPES: dict[type, type] = {}


def upload(cuda, host: np.ndarray):
    """A new device array holding host array `host` (C-contiguous), in its storage dtype; a
    bfloat16 one also copies to and from bfloat16 host arrays (the device copy of a
    persistent tensor: Tensor.host_view copies it into the host buffer)."""
    dev = cuda.to_device(np.ascontiguousarray(host).view(storage_dtype(host.dtype)))
    if host.dtype == DTYPES["bf16"]:
        base = type(dev)
        if base not in _HOST_BF16_TYPES:
            _HOST_BF16_TYPES[base] = _host_bf16_type(base)
        dev.__class__ = _HOST_BF16_TYPES[base]
    return dev


def _address_range(arr) -> tuple[int, int]:
    """[first, last) byte addresses that device array `arr`'s elements occupy."""
    if _is_fake(arr):
        start = arr._ary.__array_interface__["data"][0]
    else:
        start = arr.device_ctypes_pointer.value or 0
    lo = sum(min(0, (n - 1) * s) for n, s in zip(arr.shape, arr.strides, strict=True))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(arr.shape, arr.strides, strict=True))
    return start + lo, start + hi + arr.dtype.itemsize


def overlap(a, b) -> bool:
    """Whether device arrays `a` and `b` may share memory (their address ranges meet)."""
    if a.size == 0 or b.size == 0:
        return False
    (a0, a1), (b0, b1) = _address_range(a), _address_range(b)
    return a0 < b1 and b0 < a1


def same_elements(a, b) -> bool:
    """Whether device arrays `a` and `b` (of one shape) are views of the same elements in
    the same order: a kernel may then read one and write the other element by element."""
    return tuple(a.strides) == tuple(b.strides) and \
        _address_range(a)[0] == _address_range(b)[0]


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


def element_strides(arr, op: str) -> tuple[int, ...]:
    """arr's strides in elements; negative or unaligned strides raise."""
    item = arr.dtype.itemsize
    out = []
    for n, s in zip(arr.shape, arr.strides, strict=True):
        if n > 1 and (s < 0 or s % item):
            raise BackendError(f"{op}: the cuda kernel needs non-negative strides that are "
                               f"multiples of the item size, got strides {tuple(arr.strides)} "
                               f"for shape {list(arr.shape)}")
        out.append(s // item if n > 1 else 0)
    return tuple(out)


def flat_view(arr, op: str):
    """(view, element strides): a 1-D view of the memory arr spans, from its first element
    to its last, and the strides at which arr's elements lie in that view."""
    strides = element_strides(arr, op)
    if any(n == 0 for n in arr.shape):
        return strided(arr, (0,), (arr.dtype.itemsize,)), strides
    span = 1 + sum((n - 1) * s for n, s in zip(arr.shape, strides, strict=True))
    return strided(arr, (span,), (arr.dtype.itemsize,)), strides


def rows_view(arr, op: str):
    """(view, rows, n): the 1-D view of a C-contiguous array of shape (..., n) whose row r
    is view[r * n : (r + 1) * n]; a strided array raises (the ops insert `cont`)."""
    shape = tuple(arr.shape)    # the simulator's shapes refuse negative indices
    n = shape[-1] if shape else 1
    if not c_contiguous(arr):
        raise BackendError(f"{op}: the cuda kernel needs C-contiguous inputs, got strides "
                           f"{tuple(arr.strides)} for shape {list(arr.shape)}")
    return strided(arr, (arr.size,), (arr.dtype.itemsize,)), math.prod(shape[:-1]), n


def c_contiguous(arr) -> bool:
    """Whether device array `arr`'s elements lie in C order one item apart (the strides of
    unit axes ignored, as numpy's flags ignore them; an empty array is): the arrays that a
    1-D view can stand for. Read from its shape and strides, not from numba's flags."""
    if arr.size == 0:
        return True
    expected = arr.dtype.itemsize
    for d, s in zip(reversed(tuple(arr.shape)), reversed(tuple(arr.strides)), strict=True):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def flat(arr, what: str):
    """The 1-D view of C-contiguous device array `arr` (element i: arr's i-th in C order).
    Any other layout raises BackendError naming `what`: the caller hands a strided array
    where its kernel needs a contiguous one (see the module doc for why not reshape)."""
    if not c_contiguous(arr):
        raise BackendError(f"{what} must be C-contiguous on the cuda backend, got shape "
                           f"{list(arr.shape)} with byte strides {list(arr.strides)}")
    return strided(arr, (arr.size,), (arr.dtype.itemsize,))


def overlapping_elements(arr) -> bool:
    """Whether two elements of device array `arr` may share memory: a stride-0 axis (a
    broadcast view) or strides that interleave. A kernel writing one thread per element
    would race there. Checked on the axes sorted by stride: each must step past all the
    memory the smaller ones span (sufficient, and true of every slice and permutation of a
    buffer)."""
    span = arr.dtype.itemsize
    for s, n in sorted((abs(int(s)), int(n)) for n, s in zip(arr.shape, arr.strides,
                                                             strict=True) if n > 1):
        if s < span:
            return True
        span += s * (n - 1)
    return False


def rank4_pieces(*arrs):
    """Yield (views, start): device arrays `arrs`, of one shape and any strides, as 4-axis
    views (one per array) over the same elements in the same C order, and the C-order
    position of the piece's first element. Axes are merged where every array allows
    (engine.backends.cpu.layout.coalesce), unit axes dropped and put in front; where more
    than four remain, one piece per index of the leading ones."""
    dims = coalesce(tuple(arrs[0].shape), *(tuple(a.strides) for a in arrs))
    sizes = [int(n) for n, _ in dims]
    lead = max(0, len(sizes) - 4)
    inner = sizes[lead:]
    pad = 4 - len(inner)
    block = math.prod(inner)
    for k, index in enumerate(itertools.product(*(range(n) for n in sizes[:lead]))):
        views = []
        for i, a in enumerate(arrs):
            st = [int(s[i]) for _, s in dims]
            offset = sum(j * s for j, s in zip(index, st[:lead], strict=True))
            views.append(strided(a, [1] * pad + inner, [0] * pad + st[lead:], offset))
        yield tuple(views), k * block


def pad4(dims, op: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, strides) of [(size, stride)] axes, padded in front with unit axes to 4."""
    if len(dims) > 4:
        raise BackendError(f"{op}: the cuda kernel handles at most 4 axes that cannot be "
                           f"merged on either side of a reduction, got sizes "
                           f"{[n for n, _ in dims]} with strides {[s for _, s in dims]}")
    pad = 4 - len(dims)
    return (1,) * pad + tuple(n for n, _ in dims), (0,) * pad + tuple(s for _, s in dims)
