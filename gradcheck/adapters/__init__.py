"""Engines under test, by name: `get_adapter("ggml", lib_dir=...)`.

    engine             our engine (EngineAdapter; options: backend, inject)
    torch              the registry op's torch equivalent under torch autograd, in the
                       case's dtype (TorchAdapter; option: fn, any torch callable)
    numpy              a forward and a VJP callable on numpy arrays (NumpyAdapter)
    ggml               ggml's C API through ctypes (GgmlAdapter; option: lib_dir)
    module:attribute   your own adapter: a class or factory called with the options, or an
                       adapter object (see gradcheck.adapters.base.Adapter)

An adapter is rebuilt from its AdapterSpec (name and options) wherever it is needed anew,
e.g. in a worker process (gradcheck.worker): specs travel, live adapters do not.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from typing import Any

from gradcheck.adapters.base import VJP, Adapter, AdapterError
from gradcheck.adapters.raised import SignalWatch, described

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
}
_REQUIRED = ("name", "isolated", "describe", "unsupported", "vjp")


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
    """How to make an adapter: its name (as for get_adapter) and its options, as sorted
    (key, value) pairs; picklable when the options are."""

    name: str
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, name: str, options: dict) -> AdapterSpec:
        return cls(name, tuple(sorted(options.items())))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.options)

    def build(self) -> Adapter:
        return get_adapter(self.name, **self.kwargs)


def _importable_from_cwd() -> None:
    """As `python -m` does: a user's adapter module in the current directory imports (the
    `gradcheck` console script's sys.path holds its own directory instead). Worker
    processes inherit the parent's sys.path, this entry included. The processes of a
    distributed run (`--workers`) start in an empty directory of their own; the user's is
    in $GRADVERIFY_ADAPTER_DIR (gradcheck.pytest_plugin), used instead."""
    given = os.environ.get("GRADVERIFY_ADAPTER_DIR")
    if given:
        if given not in sys.path:
            sys.path.insert(0, given)
    elif os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def _factory(name: str):
    if name in ENGINES:
        module_name, attribute = ENGINES[name]
    elif ":" in name:
        module_name, _, attribute = name.partition(":")
        if not module_name or not attribute:
            raise AdapterError(f"engine {name!r}: expected module:attribute, e.g. "
                               "mypackage.adapter:MyAdapter")
        _importable_from_cwd()
    else:
        raise AdapterError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}, or "
                           "module:attribute for your own adapter")
    # a user's module may raise anything, sys.exit and BaseExceptions of its own included;
    # only the user's Ctrl-C goes on up (gradcheck.adapters.raised)
    with SignalWatch() as watch:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise AdapterError(f"engine {name!r}: cannot import {module_name}: {exc}") \
                from exc
        except BaseException as exc:
            watch.reraise(exc)
            raise AdapterError(f"engine {name!r}: importing {module_name} raised "
                               f"{described(exc)}") from exc
        obj = module
        for part in attribute.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise AdapterError(f"engine {name!r}: {module_name} has no attribute "
                                   f"{attribute!r}") from None
            except BaseException as exc:    # a module's __getattr__, a property
                watch.reraise(exc)
                raise AdapterError(f"engine {name!r}: getting {attribute!r} from "
                                   f"{module_name} raised {described(exc)}") from exc
    return obj


def get_adapter(name: str, **options) -> Adapter:
    """The adapter called `name` (see the module docstring), made with `options`. Raises
    AdapterError, naming the engine, when it is unknown, cannot be imported or set up, or
    is not an adapter."""
    obj = _factory(name)
    with SignalWatch() as watch:
        try:
            makes = isinstance(obj, type) or (callable(obj) and not _has(obj, "vjp"))
            adapter = obj(**options) if makes else obj
        except AdapterError:
            raise
        except BaseException as exc:    # a user's constructor: anything but the user's Ctrl-C
            watch.reraise(exc)
            with_options = f" with options {options}" if options else ""
            raise AdapterError(f"engine {name!r}: cannot be set up{with_options}: "
                               f"{described(exc)}") from exc
    if not makes and options:
        raise AdapterError(f"engine {name!r} is an adapter object: it takes no options, "
                           f"got {options}")
    missing = [a for a in _REQUIRED if not _has(adapter, a)]
    if missing:
        raise AdapterError(f"engine {name!r} is not an adapter: {type(adapter).__name__} "
                           f"lacks {', '.join(missing)} (see gradcheck.adapters.base.Adapter)")
    with SignalWatch() as watch:
        try:
            if getattr(adapter, "spec", None) is None:
                adapter.spec = AdapterSpec.of(name, options)
        except BaseException as exc:   # slots, a read-only property: spec_of falls back
            watch.reraise(exc)
    return adapter


def describe(adapter, name: str) -> str:
    """adapter.describe() as a str on one line; AdapterError naming engine `name` when it
    raises (a user's adapter)."""
    with SignalWatch() as watch:
        try:
            return " ".join(str(adapter.describe()).split())
        except BaseException as exc:
            watch.reraise(exc)
            raise AdapterError(f"engine {name!r}: describe() raised {described(exc)}") from exc


def _has(adapter, attribute: str) -> bool:
    """hasattr that counts a property raising anything (but the user's Ctrl-C) as missing
    (hasattr lets all but AttributeError through)."""
    with SignalWatch() as watch:
        try:
            getattr(adapter, attribute)
        except BaseException as exc:
            watch.reraise(exc)
            return False
    return True


def spec_of(adapter) -> AdapterSpec:
    """The spec that rebuilds `adapter`: the one get_adapter recorded (or the adapter's own),
    else its class by import path, called without options."""
    spec = getattr(adapter, "spec", None)
    if isinstance(spec, AdapterSpec):
        return spec
    cls = type(adapter)
    return AdapterSpec(f"{cls.__module__}:{cls.__qualname__}")
