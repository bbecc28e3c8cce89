"""docs/hooks/reference.py, the MkDocs hook that generates the reference pages, imported
for the tests (it is a script of the documentation, not a module of a package)."""

from __future__ import annotations

import importlib.util
import pathlib

HOOK = pathlib.Path(__file__).resolve().parents[2] / "docs" / "hooks" / "reference.py"


def load():
    """A fresh copy of the hook module."""
    spec = importlib.util.spec_from_file_location("docs_reference_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def api_objects() -> list:
    """The objects the API reference documents (the hook's API), with the public members of
    each module and class among them (what mkdocstrings renders of them)."""
    import inspect
    import pkgutil
    found = []
    for _, paths in load().API:
        for path in paths:
            obj = pkgutil.resolve_name(path)
            found.append(obj)
            if inspect.ismodule(obj):
                found += [m for n, m in vars(obj).items() if not n.startswith("_")
                          and getattr(m, "__module__", None) == obj.__name__]
            elif inspect.isclass(obj):
                found += [m for n, m in vars(obj).items() if not n.startswith("_")
                          and (inspect.isfunction(m) or inspect.isclass(m))]
    return found
