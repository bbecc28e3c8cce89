"""The console scripts as pyproject.toml declares them, for tests that run one as its
script does: `script_call("optcheck")` is the Python code that calls its entry point."""

from __future__ import annotations

import pathlib

import tomllib

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"


def declared_scripts() -> dict[str, str]:
    """[project.scripts] of pyproject.toml: name -> "module:function"."""
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["scripts"]


def script_call(tool: str) -> str:
    """Two lines of Python that import the entry point of console script `tool` (its name,
    or with `_` for `-`: mnist_train) and call it (sys.argv set before them is its command
    line)."""
    module, _, function = declared_scripts()[tool.replace("_", "-")].partition(":")
    return f"import {module}\n{module}.{function}()\n"
