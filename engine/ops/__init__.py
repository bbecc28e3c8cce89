"""The engine's ops: every module of this package is an op module, loaded here once.

Importing the package (which `import engine` does) imports each module of engine/ops (found
with pkgutil, no hand-kept list), and each registers its OpDefs in engine.registry. The
package then exports every registered op's `build` under the op's name, and then the names
in each op module's `__all__` (its user-facing builders where they differ from the
registry's, such as `mul` turning a python number into `scale`, and helpers that are not
ops, such as `cont_if_strided`):

    from engine import ops
    ops.relu(x); ops.pool_2d(x, "max", 2); ops.cont_if_strided(x)

An op registered later, by a module outside engine/ops (engine.registry.register), is
reachable here too: `ops.<name>` falls back to the registry.

Op modules import each other only along an acyclic order (tests/test_import_contracts.py
checks it); where an op needs the op of a module that imports its own, it builds it through
`engine.registry.registered.<name>`.
"""

from __future__ import annotations

import importlib
import pkgutil

from engine import tensor as _tensor
from engine.errors import UnknownOpError as _UnknownOpError
from engine.registry import all_ops as _all_ops
from engine.registry import get_op as _get_op

MODULES = tuple(importlib.import_module(f"{__name__}.{info.name}")
                for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name))

for _name, _op in _all_ops().items():
    globals()[_name] = _op.build
for _module in MODULES:
    for _name in getattr(_module, "__all__", ()):
        globals()[_name] = getattr(_module, _name)

__all__ = sorted({*_all_ops(), *(n for m in MODULES for n in getattr(m, "__all__", ()))})

_tensor.OPERATORS.update({name: globals()[name] for name in _tensor.OPERATOR_OPS})


def __getattr__(name: str):
    """An op registered after this package was loaded: its build function."""
    try:
        return _get_op(name).build
    except _UnknownOpError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
