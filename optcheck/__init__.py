"""optcheck: compare optimizer updates with closed-form expectations, torch.optim trajectories
and invariants (the families closed_form, torch_trajectories, invariants; the float64 numpy
optimizers of numpy_optimizers as a third opinion).

    from optcheck import assert_optimizer, check_optimizer

Your own numpy optimizer: check_optimizer / assert_optimizer (optcheck.api). An engine's
optimizers: follow OptimizerAdapter and its Stepper (optcheck.adapters.base), or name one
for get_adapter; run_family runs one family on one. Every result is a reports.Result.

The names below load their modules on first use (PEP 562), as gradcheck's do: importing the
plugin optcheck.pytest_plugin loads no engine, numba or torch."""

import importlib

_EXPORTS = {"check_optimizer": "optcheck.api", "assert_optimizer": "optcheck.api",
            "OptimizerCheckFailure": "optcheck.api",
            "OptimizerAdapter": "optcheck.adapters.base", "Stepper": "optcheck.adapters.base",
            "Group": "optcheck.adapters.base", "get_adapter": "optcheck.adapters",
            "AdapterError": "optcheck.adapters", "run_family": "optcheck.runner",
            "Result": "reports"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'optcheck' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value          # the next look-up is a plain attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
