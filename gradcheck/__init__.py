"""gradcheck: compare an engine's backprop with numerical gradients for every op and sample
case; the engine under test is an adapter (gradcheck.adapters).

    from gradcheck import assert_gradients, check_numpy, check_torch

Your own functions: check_function / assert_gradients (engine ops), check_numpy /
assert_numpy (a forward and a hand-written VJP), check_torch / assert_torch (any torch
callable, a torch.autograd.Function's apply included) (gradcheck.api). The registry's
ops: check_ops, select_samples, run_checks, checkable_ops. Your own engine: subclass or
follow Adapter, returning VJP (and JVP) records (gradcheck.adapters.base); get_adapter
makes one by name. Every result is a reports.Result.

The names below load their modules on first use (PEP 562): importing one submodule, as
pytest does with the plugin gradcheck.pytest_plugin at every start-up, loads no other (so
no engine, numba or torch before the test suite's conftest has set numba's cache)."""

import importlib

_EXPORTS = {"check_function": "gradcheck.api", "check_numpy": "gradcheck.api",
            "check_torch": "gradcheck.api", "assert_gradients": "gradcheck.api",
            "assert_numpy": "gradcheck.api", "assert_torch": "gradcheck.api",
            "FunctionCase": "gradcheck.api", "COTANGENTS": "gradcheck.api",
            "check_sample": "gradcheck.check", "check_ops": "gradcheck.request",
            "checkable_ops": "gradcheck.runner", "run_checks": "gradcheck.runner",
            "select_samples": "gradcheck.runner",
            "Adapter": "gradcheck.adapters.base", "VJP": "gradcheck.adapters.base",
            "JVP": "gradcheck.adapters.base", "get_adapter": "gradcheck.adapters",
            "AdapterError": "gradcheck.adapters", "Result": "reports"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gradcheck' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value          # the next look-up is a plain attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
