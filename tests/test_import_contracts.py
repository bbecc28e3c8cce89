"""The layers of the code: pyproject.toml's [tool.importlinter] contracts, the one source.

`lint-imports` (import-linter) checks them on the real tree; copies of the packages with a
planted violation (an upward import at module level, one inside a function, gradcheck
importing optcheck, reports importing the engine's graph) must break the contract that
names it, so the check is known to fail when it should. import-linter has no contract for
cycles between modules (its `acyclic_siblings` is about packages: it fails on a module of a
package importing a sibling package that imports back another of its modules, no cycle of
modules), so a cycle of module imports, function-local ones included, is found here on
grimp's graph (import-linter's own), its path printed.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import grimp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "reports", "checkkit", "gradcheck", "optcheck", "mnist_target")
DISCOVERING = ("engine.ops",)   # packages whose __init__ imports all their modules (pkgutil)
LINT_IMPORTS = pathlib.Path(sys.executable).with_name("lint-imports")


def lint_imports(root: pathlib.Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the packages and pyproject.toml under `root` (they, not the ones
    installed, are on its sys.path)."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_every_contract():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


# --- planted violations, in a copy of the packages ----------------------------------------
def _copy_tree(dest: pathlib.Path) -> None:
    """The packages' sources (.py files as text) and pyproject.toml, under `dest`."""
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            target = dest / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


def _plant(root: pathlib.Path, rel: str, code: str) -> tuple[str, int]:
    """Append `code` to the module at `rel`: (its dotted name, the line of the import)."""
    path = root / rel
    lines = path.read_text().splitlines()
    first = len(lines) + 2 + next(i for i, line in enumerate(code.splitlines())
                                  if "import" in line)
    path.write_text("\n".join(lines) + "\n\n" + code)
    return rel.removesuffix(".py").removesuffix("/__init__").replace("/", "."), first


def _an_op_module() -> str:
    return min(p.relative_to(ROOT).as_posix() for p in (ROOT / "engine" / "ops").glob("*.py")
               if p.name != "__init__.py")


PLANTED = {
    # case: (module to plant in, the code appended, the imported module, the contract named)
    "upward import at module level": (
        "engine/errors.py", "import gradcheck\n", "gradcheck",
        "Packages in layers"),
    "upward import inside a function": (
        None, "def _planted():\n    from engine import graph\n    return graph\n",
        "engine.graph", "Engine modules in layers"),
    "gradcheck imports optcheck": (
        "gradcheck/__init__.py", "def _planted():\n    import optcheck.harness\n",
        "optcheck.harness", "gradcheck and optcheck are independent of each other"),
    "reports imports the engine's graph": (
        "reports/__init__.py", "def _planted():\n    from engine.graph import Graph\n",
        "engine.graph", "reports imports nothing of ours but the one atomic writer"),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_violation_breaks_its_contract(case, tmp_path):
    rel, code, imported, contract = PLANTED[case]
    _copy_tree(tmp_path)
    importer, line = _plant(tmp_path, rel or _an_op_module(), code)
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    broken = done.stdout.split("Broken contracts", 1)[1]
    # one section per broken contract: its name, underlined, then its violations
    parts = re.split(r"\n([^\n]+(?:\n[^\n-][^\n]*)?)\n-{5,}\n", broken)
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    section = next((text for name, text in sections.items()
                    if name.replace("\n", "").startswith(contract)), "")
    assert re.search(rf"-\s+{re.escape(f'{importer} -> {imported} (l.{line})')}", section), \
        done.stdout


# --- cycles of module imports ---------------------------------------------------------------
def module_graph(*packages: str) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports (grimp: every import statement,
    inside functions too), plus a discovering package's import of each of its modules."""
    graph = grimp.build_graph(*packages, cache_dir=None)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    for pkg in DISCOVERING:
        if pkg in edges:
            edges[pkg] |= set(graph.find_children(pkg))
    return edges


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Per strongly connected component of more than one module (Tarjan), a shortest cycle
    through its smallest module, that module repeated at the end."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    comps: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set(stack[stack.index(v):])
            del stack[stack.index(v):]
            if len(comp) > 1:
                comps.append(comp)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 100))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    cycles = []
    for comp in comps:
        start = min(comp)
        paths, seen = [[start]], {start}
        while paths:
            path = paths.pop(0)
            if start in edges[path[-1]]:
                cycles.append(path + [start])
                break
            for w in sorted(edges[path[-1]] & comp - seen):
                seen.add(w)
                paths.append(path + [w])
    return sorted(cycles)


def test_no_cycle_of_module_imports():
    cycles = find_cycles(module_graph(*PACKAGES))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_a_cycle_through_a_function_local_import_is_found(tmp_path, monkeypatch):
    for rel, text in {
        "cyc_low/__init__.py": "",
        "cyc_low/base.py": "def f():\n    from cyc_high.mid import g\n    return g\n",
        "cyc_high/__init__.py": "from . import mid\n",
        "cyc_high/mid.py": "from cyc_low.base import f\ng = f\n",
    }.items():
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert find_cycles(module_graph("cyc_low", "cyc_high")) == [
        ["cyc_high.mid", "cyc_low.base", "cyc_high.mid"]]
