"""The public API from the package itself: `from gradcheck import assert_numpy, ...` (every
name in gradcheck.__all__), loaded lazily so that `import gradcheck` stays light; and every
import of gradcheck or optcheck that the README and the docs show works."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gradcheck

ROOT = Path(__file__).resolve().parents[2]


def test_every_name_in_all_imports_from_the_package():
    assert {"assert_gradients", "assert_numpy", "assert_torch", "check_function",
            "check_numpy", "check_torch", "Adapter", "VJP", "JVP"} <= set(gradcheck.__all__)
    for name in gradcheck.__all__:
        module = importlib.import_module(gradcheck._EXPORTS[name])
        assert getattr(gradcheck, name) is getattr(module, name), name
    namespace = {}
    exec("from gradcheck import *", namespace)
    assert set(gradcheck.__all__) <= set(namespace)
    assert set(gradcheck.__all__) <= set(dir(gradcheck))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'assert_nothing'"):
        gradcheck.assert_nothing  # noqa: B018
    with pytest.raises(ImportError):
        exec("from gradcheck import assert_nothing", {})


@pytest.mark.parametrize("package", ["gradcheck", "optcheck"])
def test_importing_the_package_loads_nothing_heavy(package):
    done = subprocess.run(
        [sys.executable, "-c", f"import sys, {package}; "
         "print(sorted({'engine', 'numba', 'torch', 'jax', 'checkkit'} & set(sys.modules)))"],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def documented_imports() -> list[str]:
    """Every one-line `from gradcheck... import ...` / `from optcheck... import ...` in the
    README and the docs."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    pattern = re.compile(r"^\s*(from (?:gradcheck|optcheck)(?:\.\w+)* import [\w, ]+)\s*(#.*)?$")
    found = []
    for path in files:
        if path.exists():
            found += [m.group(1).rstrip() for line in path.read_text().splitlines()
                      if (m := pattern.match(line))]
    return sorted(set(found))


def test_the_readme_and_docs_show_their_imports_from_the_packages():
    assert documented_imports(), "no import of gradcheck or optcheck in the README or docs"


@pytest.mark.parametrize("statement", documented_imports())
def test_every_documented_import_works(statement):
    pytest.importorskip("torch")
    exec(statement, {})
