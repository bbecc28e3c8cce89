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
