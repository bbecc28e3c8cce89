"""A static-graph tensor engine with autodiff, a liveness-based planner and numba kernels.

Importing it loads every op module of engine/ops, which registers its ops (engine.registry).

    import engine
    from engine import ops
    x = engine.param((3, 4), name="x")
    loss = ops.sum(ops.relu(x)).set_loss()
    g = engine.Graph([loss]); grads = g.build_backward(loss)
    x.set(engine.init.normal((3, 4), seed=0)); g.compute(); grads[x].numpy()
"""

import functools as _functools
from importlib import metadata as _metadata

from engine import init, ops, optim
from engine.errors import (
    BackendError,
    DTypeError,
    EngineError,
    ParamError,
    ShapeError,
    StalePlanError,
    UnknownOpError,
)
from engine.graph import Graph, compute
from engine.planner import Plan
from engine.registry import OPS, all_ops, get_op
from engine.tensor import Flag, Tensor, constant, input_tensor, new_tensor, param


@_functools.cache
def _version() -> str:
    """The installed distribution's version (looked up once, when a report first asks: not
    at every import of the engine)."""
    try:
        return _metadata.version("gradverify")
    except _metadata.PackageNotFoundError:      # run from a source tree that is not installed
        return "unknown"


def describe(backend: str = "cpu") -> str:
    """The engine and its version on `backend`, as the checkers' reports name it."""
    return f"engine {_version()} ({backend} backend)"


__all__ = ["BackendError", "DTypeError", "EngineError", "Flag", "Graph", "OPS", "ParamError",
           "Plan", "ShapeError", "StalePlanError", "Tensor", "UnknownOpError", "all_ops",
           "compute", "constant", "describe", "get_op", "init", "input_tensor", "new_tensor",
           "ops", "optim", "param"]
