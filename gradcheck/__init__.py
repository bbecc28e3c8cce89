"""gradcheck: compare an engine's backprop with numerical gradients for every op and sample
case; the engine under test is an adapter (gradcheck.adapters).

The names below load their modules on first use (PEP 562): importing one submodule, as
pytest does with the plugin gradcheck.pytest_plugin at every start-up, loads no other (so
no engine, numba or torch before the test suite's conftest has set numba's cache)."""

import importlib

_EXPORTS = {"check_function": "gradcheck.api", "check_numpy": "gradcheck.api",
            "check_torch": "gradcheck.api", "check_sample": "gradcheck.check",
            "check_ops": "gradcheck.request", "checkable_ops": "gradcheck.runner",
            "run_checks": "gradcheck.runner", "select_samples": "gradcheck.runner"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gradcheck' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
