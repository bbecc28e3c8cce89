"""The layers of the README's Architecture section, enforced on every module.

The table (layer, modules, may import) is read from README.md. Every module of the checked
packages is parsed with `ast`; each of its imports, at module level or inside a function,
`import a.b`, `from a import b` (b a module or a name) and relative ones, is an edge to
the module it names (the parents that Python also runs, `engine/__init__.py` before
`engine.errors`, are not counted: the table is about the modules named). The check fails
on (a) an import of a layer the importer's row does not allow ("upward"; for `reports`,
anything of ours outside it), (b) an import cycle, function-local imports included, and
a module that no row of the table holds. `engine.ops` imports every module of its package
(pkgutil), so those edges are added too. Every violation is listed, one a line.
"""

from __future__ import annotations

import ast
import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "gradcheck", "optcheck", "reports", "mnist_target")
DISCOVERING = {"engine.ops"}     # packages whose __init__ imports all their modules
MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(\.\*)?$")


# --- the table ----------------------------------------------------------------------------
def read_layers(readme: str) -> list[tuple[int, list[str], set[int]]]:
    """(layer, module patterns, layers it may import) per row of the table under the
    "## Architecture" heading of the README text."""
    section = readme.split("\n## Architecture\n", 1)[1].split("\n## ", 1)[0]
    rows, in_table = [], False
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:3] == ["layer", "modules", "may import"]:
            in_table = True
            continue
        if not in_table or not line.startswith("|"):
            if in_table and rows:
                break
            continue
        if set(cells[0]) <= {"-"}:
            continue
        patterns = [m for m in re.findall(r"`([^`]+)`", cells[1]) if MODULE.match(m)]
        rows.append((int(cells[0]), patterns, _layer_set(cells[2])))
    if not rows:
        raise ValueError("README.md: no layers table (| layer | modules | may import |) "
                         "under ## Architecture")
    return rows


def _layer_set(text: str) -> set[int]:
    """'1-3' -> {1, 2, 3}; '6' -> {6}; '1, 4' -> {1, 4}."""
    out = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        out |= set(range(int(low), int(high or low) + 1))
    return out


def _layers_text(layers: set[int]) -> str:
    return ", ".join(map(str, sorted(layers)))


def layer_of(module: str, rows) -> int | None:
    """The layer of the most specific pattern holding `module` (None: in no row)."""
    best, best_len = None, -1
    for layer, patterns, _ in rows:
        for p in patterns:
            base = p.removesuffix(".*")
            hit = module == base or (p.endswith(".*") and module.startswith(base + "."))
            if hit and len(base) > best_len:
                best, best_len = layer, len(base)
    return best


# --- the modules and their imports --------------------------------------------------------
def find_modules(root: pathlib.Path, packages) -> dict[str, pathlib.Path]:
    """Dotted name -> file of every module of `packages` under `root`."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: pathlib.Path, known) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement in the file, resolved to the
    module it names: `from a import b` names a.b if that is a module, else a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub if sub in known else base, node.lineno))
    return out


def import_graph(modules) -> dict[str, list[tuple[str, int]]]:
    """Module -> its imports of our packages (first line of each)."""
    ours = {m.split(".")[0] for m in modules}
    graph = {}
    for name, path in modules.items():
        seen = {}
        for target, line in imports_of(name, path, modules):
            if target.split(".")[0] in ours and target != name:
                seen.setdefault(target, line)
        graph[name] = sorted(seen.items())
    for pkg in DISCOVERING & set(modules):
        graph[pkg] += [(m, 0) for m in modules if m.rpartition(".")[0] == pkg]
    return graph


def find_cycles(graph) -> list[tuple[list[str], set[str]]]:
    """Per strongly connected component of more than one module (Tarjan): one cycle path
    through it (first module repeated at the end) and all its modules."""
    index, low, stack, on_stack, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(set(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [(_cycle_in(comp, graph), comp) for comp in comps]


def _cycle_in(comp: set[str], graph) -> list[str]:
    """A shortest cycle through the smallest module of the component (breadth first)."""
    start = min(comp)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w, _ in graph[path[-1]]:
            if w == start:
                return path + [start]
            if w in comp and w not in seen:
                seen.add(w)
                paths.append(path + [w])
    raise AssertionError(f"no cycle through {start}")


def violations(modules, rows) -> list[str]:
    """Every import the table forbids, every cycle, every module in no row."""
    graph = import_graph(modules)
    allowed = {layer: may for layer, _, may in rows}
    out = []
    for name in sorted(graph):
        layer = layer_of(name, rows)
        if layer is None:
            out.append(f"{name}: in no row of the layers table (README, ## Architecture)")
            continue
        for target, line in graph[name]:
            t_layer = layer_of(target, rows)
            if t_layer is None:
                if target not in modules:
                    out.append(f"{name}:{line}: imports {target}, which is not a module of "
                               "ours")
                continue
            if t_layer not in allowed[layer]:
                why = "an upward import" if t_layer > layer else \
                    f"layer {layer} may import layers {_layers_text(allowed[layer])} only"
                out.append(f"{name}:{line} (layer {layer}) imports {target} (layer "
                           f"{t_layer}): {why}")
    for cycle, comp in find_cycles(graph):
        also = sorted(comp - set(cycle))
        out.append("import cycle: " + " -> ".join(cycle)
                   + (f" (and through it: {', '.join(also)})" if also else ""))
    return out


def _report(found) -> str:
    return f"{len(found)} layering violations:\n" + "\n".join(found)


# --- the checks on this repository -----------------------------------------------------------
ROWS = read_layers((ROOT / "README.md").read_text())
MODULES = find_modules(ROOT, PACKAGES)


def test_every_module_keeps_to_its_layer_and_no_import_closes_a_cycle():
    found = violations(MODULES, ROWS)
    assert not found, _report(found)


def test_the_table_is_ordered_and_names_existing_modules():
    layers = [layer for layer, _, _ in ROWS]
    assert layers == sorted(set(layers)), f"layers out of order or repeated: {layers}"
    for layer, patterns, may in ROWS:
        assert may and max(may) <= layer, f"layer {layer} may import {sorted(may)}: above it"
        for p in patterns:
            base = p.removesuffix(".*")
            assert any(m == base or m.startswith(base + ".") for m in MODULES), \
                f"layer {layer} names {p}, which holds no module"


# --- the checker itself, on temporary packages -------------------------------------------------
def _package(tmp_path, files: dict[str, str]) -> dict[str, pathlib.Path]:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return find_modules(tmp_path, sorted({rel.split("/")[0] for rel in files}))


TOY_README = """
## Architecture

| layer | modules | may import |
|---|---|---|
| 1 | `low` | 1 |
| 2 | `rep.*` | 2 |
| 3 | `high.*`, `low.top` | 1-3 |

## Next
"""


def test_checker_fails_on_an_upward_import_inside_a_function(tmp_path):
    modules = _package(tmp_path, {
        "low/__init__.py": "def f():\n    from high.mid import g\n    return g\n",
        "low/top.py": "import low\n",
        "high/__init__.py": "",
        "high/mid.py": "from low import f\ng = f\n",
        "rep/__init__.py": "from . import out\n",
        "rep/out.py": "",
    })
    found = violations(modules, read_layers(TOY_README))
    assert "low:2 (layer 1) imports high.mid (layer 3): an upward import" in found
    assert "import cycle: high.mid -> low -> high.mid" in found
    assert len(found) == 2, _report(found)


def test_checker_fails_when_reports_imports_anything_of_ours(tmp_path):
    modules = _package(tmp_path, {
        "low/__init__.py": "", "high/__init__.py": "",
        "rep/__init__.py": "from .out import x\n",
        "rep/out.py": "import json\nfrom low import y\nx = 1\n",
    })
    found = violations(modules, read_layers(TOY_README))
    assert found == ["rep.out:2 (layer 2) imports low (layer 1): layer 2 may import "
                     "layers 2 only"], _report(found)


def test_checker_fails_on_an_upward_import_added_to_an_engine_module(tmp_path):
    """The repository's own table: engine.errors gains a function-local import of the
    graph module (a copy of errors.py stands in for the real one)."""
    probe = tmp_path / "errors.py"
    probe.write_text(MODULES["engine.errors"].read_text()
                     + "\n\ndef _probe():\n    from engine.graph import Graph\n    return Graph\n")
    found = violations({**MODULES, "engine.errors": probe}, ROWS)
    assert any(v.startswith("engine.errors:") and "imports engine.graph (layer 5): an upward "
               "import" in v for v in found), _report(found)


def test_checker_reports_a_module_in_no_row(tmp_path):
    modules = _package(tmp_path, {"low/__init__.py": "", "stray/__init__.py": ""})
    assert violations(modules, read_layers(TOY_README)) == [
        "stray: in no row of the layers table (README, ## Architecture)"]


@pytest.mark.parametrize("text, layers", [("1-3", {1, 2, 3}), ("6", {6}), ("1, 4", {1, 4})])
def test_layer_sets(text, layers):
    assert _layer_set(text) == layers
