"""Engines under test, by name: `get_adapter("ggml", lib_dir=...)`.

    engine             our engine (EngineAdapter; options: backend, inject)
    torch              the registry op's torch equivalent under torch autograd, in the
                       case's dtype (TorchAdapter; option: fn, any torch callable)
    numpy              a forward and a VJP callable on numpy arrays (NumpyAdapter)
    ggml               ggml's C API through ctypes (GgmlAdapter; option: lib_dir)
    tinygrad           the registry op as tinygrad code under tinygrad's autodiff, on its
                       CPU device (TinygradAdapter; option: device, CPU or PYTHON)
    jax                the registry op's jax equivalent under jax.vjp on the CPU, in the
                       case's dtype (JaxAdapter; option: jit)
    module:attribute   your own adapter: a class or factory called with the options, or an
                       adapter object (see gradcheck.adapters.base.Adapter)

An adapter is rebuilt from its AdapterSpec (name and options) wherever it is needed anew,
e.g. in a worker process (checkkit.worker): specs travel, live adapters do not.
"""

from __future__ import annotations

from checkkit.loading import AdapterError, AdapterSpec, make_adapter, spec_of
from checkkit.loading import describe as _describe
from gradcheck.adapters.base import VJP, Adapter

__all__ = ["ENGINES", "VJP", "Adapter", "AdapterError", "AdapterSpec", "describe",
           "get_adapter", "spec_of"]

# ggml's GGML_MAX_N_THREADS: the most threads its compute takes (here, so that checking a
# --ggml-threads value imports no ggml module)
MAX_GGML_THREADS = 512

# name -> (module, attribute); imported only when asked for (ggml loads C libraries)
ENGINES = {
    "engine": ("gradcheck.adapters.engine_adapter", "EngineAdapter"),
    "torch": ("gradcheck.adapters.torch_adapter", "TorchAdapter"),
    "numpy": ("gradcheck.adapters.numpy_adapter", "NumpyAdapter"),
    "ggml": ("gradcheck.adapters.ggml", "GgmlAdapter"),
    "tinygrad": ("gradcheck.adapters.tinygrad_adapter", "TinygradAdapter"),
    "jax": ("gradcheck.adapters.jax", "JaxAdapter"),
}
# what an adapter must have; the last one tells an adapter object from its factory
REQUIRED = ("name", "isolated", "describe", "unsupported", "vjp")


def get_adapter(name: str, **options) -> Adapter:
    """The adapter called `name` (see the module docstring), made with `options`. Raises
    AdapterError, naming the engine, when it is unknown, cannot be imported or set up, or
    is not an adapter."""
    return make_adapter(name, ENGINES, options, required=REQUIRED,
                        protocol="gradcheck.adapters.base.Adapter",
                        maker="gradcheck.adapters:get_adapter")


def describe(adapter, name: str) -> str:
    """adapter.describe() as a str on one line; AdapterError naming engine `name` when it
    raises (a user's adapter)."""
    return _describe(adapter, name)
