"""Optimizers under test, by name: `get_adapter("torch-foreach")`.

    engine             our engine's optimizers (EngineOptimizer; option: backend)
    torch              torch.optim, single-tensor (for-loop) implementation
    torch-foreach      torch.optim, foreach implementation
    torch-fused        torch.optim, fused implementation (where the installed torch has it
                       on the CPU; otherwise every row says so, unsupported)
    ggml               ggml's ggml_opt_step_adamw and ggml_opt_step_sgd (GgmlOptimizer;
                       options: lib_dir, n_threads), stepped in a worker process
    optax              optax's sgd, adam, adamw and amsgrad on jax's CPU, with torch.optim's
                       settings mapped onto chains of optax transforms (OptaxOptimizer; the
                       extra: pip install 'gradverify[optax]')
    module:attribute   your own adapter: a class or factory called with the options, or an
                       adapter object (see optcheck.adapters.base)

A numpy update written in Python is checked through the API (optcheck.api.check_optimizer),
which wraps it in a NumpyUpdate. Loading by name, `module:attribute` included, is the
toolkit's (checkkit.loading).
"""

from __future__ import annotations

from checkkit.loading import AdapterError, make_adapter
from checkkit.loading import describe as _describe
from optcheck.adapters.base import OptimizerAdapter, Stepper

__all__ = ["ENGINES", "AdapterError", "OptimizerAdapter", "Stepper", "describe", "get_adapter"]

# name -> (module, attribute); imported only when asked for
ENGINES = {
    "engine": ("optcheck.adapters.engine_adapter", "EngineOptimizer"),
    "torch": ("optcheck.adapters.torch_adapter", "TorchForLoop"),
    "torch-foreach": ("optcheck.adapters.torch_adapter", "TorchForeach"),
    "torch-fused": ("optcheck.adapters.torch_adapter", "TorchFused"),
    "ggml": ("optcheck.adapters.ggml_adapter", "GgmlOptimizer"),
    "optax": ("optcheck.adapters.optax_adapter", "OptaxOptimizer"),
}
# what an adapter must have; the last one tells an adapter object from its factory
REQUIRED = ("name", "describe", "unsupported", "stepper")


def get_adapter(name: str, **options) -> OptimizerAdapter:
    """The optimizer adapter called `name` (module doc), made with `options`. Raises
    AdapterError, naming it, when it is unknown, cannot be imported or set up, or is not an
    adapter."""
    return make_adapter(name, ENGINES, options, required=REQUIRED,
                        protocol="optcheck.adapters.base.OptimizerAdapter",
                        maker="optcheck.adapters:get_adapter")


def describe(adapter, name: str) -> str:
    """adapter.describe() on one line; AdapterError naming `name` when it raises."""
    return _describe(adapter, name)
