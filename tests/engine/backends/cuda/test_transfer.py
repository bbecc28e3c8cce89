"""The CUDA backend's device copies, fills and dst += src on strided device arrays
(engine.backends.cuda.transfer, and half.accumulate for 16-bit floats), against numpy.

Each case is a view (transposed, sliced with steps and an offset, permuted, five axes that
do not merge, or broadcast with stride 0) into a bigger buffer on the device, and the same
view of the same buffer on the host; after the operation the whole device buffer must equal
the host buffer after numpy's operation, bit for bit: the view's elements written, the gaps
between them untouched.

The simulator's device arrays reshape as numpy arrays do (a strided one silently copied),
where a GPU's DeviceNDArray reshapes through numba's dummyarray (a transposed array read in
memory order, a stepped slice refused): the fixture `gpu_reshape` gives the simulator's
arrays the GPU's reshape, so that code reshaping a device array fails here as it would on a
GPU, whichever of the two it meets.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from engine.errors import BackendError
from tests.engine.backends.cuda.kernel_harness import cuda, needs_cuda

pytestmark = [pytest.mark.cudasim]
needs_cuda()

# dtype name -> (host storage dtype, value dtype): 16-bit floats as their storage
DTYPES = {"f32": (np.float32, np.float32), "f64": (np.float64, np.float64),
          "i32": (np.int32, np.int32), "f16": (np.float16, np.float16),
          "bf16": (np.uint16, ml_dtypes.bfloat16)}
FLOATS = ["f32", "f64", "f16", "bf16"]
SHAPES = [(6, 5), (3, 4, 5), (2, 3, 2, 3, 4)]      # 2 to 5 axes (5: in pieces)
WRITABLE = ["contiguous", "transposed", "stepped", "permuted"]
READABLE = [*WRITABLE, "expanded"]


def _gpu_dummyarray():
    """numba-cuda's dummyarray module, which DeviceNDArray reshapes through: under the
    simulator `numba.cuda.cudadrv.dummyarray` is a stub, so it is loaded from its file
    (it imports nothing of numba's)."""
    import importlib.util
    import pathlib
    spec = importlib.util.find_spec("numba_cuda")
    path = pathlib.Path(spec.origin).parent / "numba" / "cuda" / "cudadrv" / "dummyarray.py"
    spec = importlib.util.spec_from_file_location("_gpu_dummyarray", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def gpu_reshape(monkeypatch):
    """FakeCUDAArray.reshape as numba's DeviceNDArray.reshape (see the module doc)."""
    import numba
    if not numba.config.ENABLE_CUDASIM:
        return                                      # a real GPU: its own reshape
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    dummyarray = _gpu_dummyarray()

    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        a = self._ary
        dummy = dummyarray.Array.from_desc(0, a.shape, a.strides, a.itemsize)
        new, extents = dummy.reshape(*shape, order=order)
        if extents is not None and extents != [dummy.extent]:
            raise NotImplementedError("operation requires copying")
        return FakeCUDAArray(np.lib.stride_tricks.as_strided(a, new.shape, new.strides))
    monkeypatch.setattr(FakeCUDAArray, "reshape", reshape)


def _values(dtype: str, shape, rng) -> np.ndarray:
    storage, value = DTYPES[dtype]
    if dtype == "i32":
        return rng.integers(-1000, 1000, shape).astype(np.int32)
    return (rng.standard_normal(shape) * 10).astype(value).view(storage)


def _view(base: np.ndarray, layout: str, shape) -> np.ndarray:
    """`layout`'s view of logical shape `shape` into host buffer `base` (_base's)."""
    nd = len(shape)
    if layout == "contiguous":
        return base
    if layout == "transposed":
        return base.transpose(tuple(reversed(range(nd))))
    if layout == "stepped":
        return base[(slice(1, None, 2),) * (nd - 1) + (slice(2, None, 3),)]
    if layout == "permuted":
        return base.transpose((1, 0, *range(2, nd))) if nd > 2 else base.T[:, ::2]
    if layout == "expanded":
        return np.broadcast_to(base, shape)
    raise ValueError(layout)


def _base_shape(layout: str, shape) -> tuple[int, ...]:
    nd = len(shape)
    if layout == "transposed":
        return tuple(reversed(shape))
    if layout == "stepped":
        return tuple(2 * n + 1 for n in shape[:-1]) + (3 * shape[-1] + 2,)
    if layout == "permuted":
        return (shape[1], shape[0], *shape[2:]) if nd > 2 else (2 * shape[1], shape[0])
    if layout == "expanded":
        return (1, *shape[1:])
    return tuple(shape)


def _pair(dtype: str, layout: str, shape, rng):
    """(host buffer, host view, device buffer, device view): the same view of the same
    values on both sides."""
    from engine.backends.cuda.arrays import strided
    base = _values(dtype, _base_shape(layout, shape), rng)
    view = _view(base, layout, shape)
    assert view.shape == tuple(shape)
    dev = cuda.to_device(base)
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return base, view, dev, strided(dev, view.shape, view.strides, offset)


def _same(dev, host: np.ndarray) -> bool:
    return dev.copy_to_host().tobytes() == host.tobytes()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("src_layout", READABLE)
@pytest.mark.parametrize("dst_layout", WRITABLE)
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "bf16"])
def test_copy_between_strided_views(dtype, dst_layout, src_layout, shape):
    from engine.backends.cuda import transfer
    rng = np.random.default_rng(1)
    dbase, dview, ddev, ddview = _pair(dtype, dst_layout, shape, rng)
    _, sview, _, sdview = _pair(dtype, src_layout, shape, rng)
    transfer.copy(ddview, sdview)
    np.copyto(dview, sview)
    assert _same(ddev, dbase)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("src_layout", READABLE)
@pytest.mark.parametrize("dst_layout", WRITABLE)
@pytest.mark.parametrize("dtype", FLOATS)
def test_accumulate_into_strided_views(dtype, dst_layout, src_layout, shape):
    """dst += src: float32 and float64 as numpy adds; float16 and bfloat16 as numpy's and
    ml_dtypes' additions (the float32 sum rounded to nearest even)."""
    from engine.backends.cuda import transfer
    rng = np.random.default_rng(2)
    dbase, dview, ddev, ddview = _pair(dtype, dst_layout, shape, rng)
    _, sview, _, sdview = _pair(dtype, src_layout, shape, rng)
    transfer.accumulate(ddview, sdview)
    value = DTYPES[dtype][1]
    dview[...] = (dview.view(value) + sview.view(value)).view(dview.dtype)
    assert _same(ddev, dbase)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", WRITABLE)
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "f16", "bf16"])
def test_fill_strided_views(dtype, layout, shape):
    from engine.backends.cuda import transfer
    base, view, dev, dview = _pair(dtype, layout, shape, np.random.default_rng(3))
    transfer.fill(dview, 2.7)
    view[...] = np.asarray(2.7).astype(DTYPES[dtype][1]).view(view.dtype)
    assert _same(dev, base)


@pytest.mark.parametrize("dtype", FLOATS)
def test_a_source_overlapping_the_destination_is_read_as_it_was(dtype):
    """A transposed view of the destination's own buffer: numpy's copyto and add read it
    as it was before the operation; so do the device's (through a copy)."""
    from engine.backends.cuda import transfer
    rng = np.random.default_rng(4)
    for op in (transfer.copy, transfer.accumulate):
        base, view, dev, dview = _pair(dtype, "contiguous", (7, 7), rng)
        op(dview, dview.T)
        value = DTYPES[dtype][1]
        want = view.T.copy() if op is transfer.copy else \
            (view.view(value) + view.T.view(value)).view(view.dtype)
        assert _same(dev, want), op.__name__


@pytest.mark.parametrize("dtype", FLOATS)
def test_accumulate_into_itself_doubles(dtype):
    from engine.backends.cuda import transfer
    base, view, dev, dview = _pair(dtype, "stepped", (5, 4), np.random.default_rng(5))
    transfer.accumulate(dview, dview)
    value = DTYPES[dtype][1]
    view[...] = (view.view(value) * 2).view(view.dtype)
    assert _same(dev, base)


@pytest.mark.parametrize("dtype", FLOATS)
def test_a_broadcast_destination_is_refused_naming_the_operation(dtype):
    """A destination whose elements share memory (stride 0) cannot be written one thread
    per element: the caller's bug, refused before any kernel runs."""
    from engine.backends.cuda import half, transfer
    from engine.backends.cuda.arrays import broadcast
    rng = np.random.default_rng(6)
    _, _, dev, dview = _pair(dtype, "contiguous", (1, 5), rng)
    _, _, _, src = _pair(dtype, "contiguous", (4, 5), rng)
    before = dev.copy_to_host()
    ops = [transfer.copy, transfer.accumulate] + ([half.accumulate] if dtype in
                                                  ("f16", "bf16") else [])
    for op in ops:
        with pytest.raises(BackendError, match=r"accumulate|copy"):
            op(broadcast(dview, (4, 5)), src)
    assert _same(dev, before)


def test_shapes_must_agree():
    from engine.backends.cuda import transfer
    a, b = cuda.to_device(np.zeros((3, 4))), cuda.to_device(np.zeros((4, 3)))
    for op in (transfer.copy, transfer.accumulate):
        with pytest.raises(BackendError, match=r"\[3, 4\].*\[4, 3\]"):
            op(a, b)


def test_flat_views_only_of_c_contiguous_arrays():
    """arrays.flat: the 1-D view of a C-contiguous array (unit axes of any stride
    included), a BackendError naming the array for any other layout."""
    from engine.backends.cuda.arrays import c_contiguous, flat, strided
    dev = cuda.to_device(np.arange(24.0))
    assert flat(strided(dev, (1, 4, 6), (999, 48, 8)), "x").copy_to_host().tolist() == \
        list(range(24))
    for shape, strides in [((6, 4), (8, 48)), ((4, 3), (48, 16)), ((4, 6), (0, 8))]:
        view = strided(dev, shape, strides)
        assert not c_contiguous(view)
        with pytest.raises(BackendError, match=r"the output must be C-contiguous"):
            flat(view, "the output")


@pytest.mark.parametrize("module", ["transfer", "half"])
def test_every_kernel_is_listed_for_the_ptx_compile_check(module):
    """Every kernel of the module has PTX signatures (tests/engine/backends/cuda/test_ptx.py
    compiles them with the real compiler), transfer's for every dtype it moves."""
    import importlib
    mod = importlib.import_module(f"engine.backends.cuda.{module}")
    kernels = {name for name, v in vars(mod).items()
               if type(v).__name__ in ("CUDADispatcher", "FakeCUDAKernel")
               and not (getattr(v, "targetoptions", {}).get("device")
                        or getattr(v, "_device", False))}
    listed = {k.py_func.__name__ for k, _ in mod.PTX_SIGNATURES}
    assert listed == kernels
    if module == "transfer":
        for name in ("_copy_4d", "_copy_strided", "_fill", "_fill_strided"):
            sigs = " ".join(sig for k, sig in mod.PTX_SIGNATURES if k.py_func.__name__ == name)
            assert all(t in sigs for t in ("float32", "float64", "int32", "uint16")), name
