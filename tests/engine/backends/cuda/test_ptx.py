"""Every CUDA kernel compiles to PTX for sm_90 with the real compiler (tox -e cuda-compile).

Each kernel module of engine/backends/cuda lists `PTX_SIGNATURES`, (kernel, signature) for
every dtype and layout it is launched with; this test checks that the list covers every
@cuda.jit kernel of the module (at module level, or made per op and kept in its `KERNELS`,
as the elementwise module does) and compiles each signature with NVVM (numba-cuda[cu13]),
no GPU needed. Code the simulator accepts but the real compiler rejects fails here.
"""

from __future__ import annotations

import importlib
import pkgutil

import numba
import pytest

pytestmark = [pytest.mark.cuda_compile]

if numba.config.ENABLE_CUDASIM:
    pytest.skip("PTX compilation needs the real compiler, not the simulator",
                allow_module_level=True)
cuda = pytest.importorskip("numba.cuda")


def _nvvm_available() -> bool:
    try:
        from numba.cuda.cudadrv.nvvm import NVVM
        NVVM()
        return True
    except Exception:  # noqa: BLE001  (any failure: no compiler here)
        return False


if not _nvvm_available():
    pytest.skip("no NVVM: install numba-cuda[cu13] (tox -e cuda-compile)",
                allow_module_level=True)

import engine.backends.cuda as cuda_backend  # noqa: E402


@pytest.fixture(autouse=True)
def _no_device(monkeypatch):
    """numba-cuda asks the current device for its compute capability when a kernel calls a
    device function, even when compiling for a given cc; there is no device here, so say
    sm_90, the target we compile for."""
    import types

    from numba.cuda import dispatcher
    monkeypatch.setattr(dispatcher, "get_current_device",
                        lambda: types.SimpleNamespace(compute_capability=(9, 0)))

MODULES = sorted(m.name for m in pkgutil.iter_modules(cuda_backend.__path__)
                 if m.name not in ("arrays",))


def _is_kernel(obj) -> bool:
    return type(obj).__name__ == "CUDADispatcher" and not obj.targetoptions.get("device")


def _kernels(module):
    """The module's kernels: those at module level, and those it keeps per op in a dict
    `KERNELS` (op name -> a kernel, or an object holding the op's kernels as attributes)."""
    found = {name: obj for name, obj in vars(module).items() if _is_kernel(obj)}
    for entry in getattr(module, "KERNELS", {}).values():
        for obj in [entry] if _is_kernel(entry) else vars(entry).values():
            if _is_kernel(obj):
                found[obj.py_func.__name__] = obj
    return found


def _cases():
    for name in MODULES:
        module = importlib.import_module(f"engine.backends.cuda.{name}")
        for kernel, sig in getattr(module, "PTX_SIGNATURES", ()):
            yield pytest.param(kernel, sig, id=f"{name}.{kernel.py_func.__name__}:{sig}")


@pytest.mark.parametrize("name", MODULES)
def test_signatures_cover_every_kernel(name):
    module = importlib.import_module(f"engine.backends.cuda.{name}")
    listed = {k.py_func.__name__ for k, _ in getattr(module, "PTX_SIGNATURES", ())}
    missing = sorted(set(_kernels(module)) - listed)
    assert not missing, f"engine/backends/cuda/{name}.py: no PTX_SIGNATURES for {missing}"


@pytest.mark.parametrize("kernel, sig", list(_cases()))
def test_kernel_compiles_to_ptx_for_sm_90(kernel, sig):
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    assert ".target sm_90" in ptx
