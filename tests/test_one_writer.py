"""Every file a tool writes goes through engine.files (the one atomic writer): no other
module opens a path for writing. A scan of the sources (ast) of engine, gradcheck,
optcheck, reports, mnist_target and bench finds each call that could write a file:

- open / io.open / os.fdopen / Path.open with a mode that writes ("w", "a", "x", "+") or a
  mode that is not a literal;
- os.open with a flag that writes (O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND);
- .write_text / .write_bytes / .tofile / np.save / np.savez / .savefig / GGUFWriter(path)
  / os.replace / os.rename / shutil.copy* / shutil.move / tempfile.mkstemp /
  NamedTemporaryFile.

Outside engine/files.py each one must be in ALLOWED, with the reason it is not a user's
output (a private temporary directory, an in-memory buffer); an entry nothing matches any
more is stale and fails too, so the list stays true."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "checkkit", "gradcheck", "optcheck", "reports", "mnist_target", "bench")
WRITER = "engine/files.py"
WRITING_MODE = set("wax+")
WRITING_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"}
OPENERS = {"open", "os.fdopen", "io.open"}
# calls that write whatever they are given: qualified by their module, or methods whose
# name says nothing else (str.replace, dict.copy and Model.save are not among them)
QUALIFIED = {"os.replace", "os.rename", "os.link", "os.symlink", "shutil.copy",
             "shutil.copy2", "shutil.copyfile", "shutil.copyfileobj", "shutil.move",
             "np.save", "np.savez", "np.savez_compressed", "np.savetxt", "numpy.save",
             "tempfile.mkstemp", "tempfile.NamedTemporaryFile"}
METHODS = {"write_text", "write_bytes", "tofile", "savefig"}
# (file, enclosing function, call) -> why it is not a user's output
ALLOWED = {
    ("checkkit/worker.py", "_serve", "os.open"):
        "the isolated worker's own stderr log, in the directory its parent made with mkdtemp",
    ("checkkit/worker.py", "_serve", "open"):
        "the isolated worker's faulthandler log, in that same private directory",
    ("checkkit/distributed.py", "run_items", "open"):
        "the sweep's pytest.ini, in a TemporaryDirectory of its own",
    ("mnist_target/regress.py", "curves_html", ".savefig"):
        "the plots go to an in-memory buffer (io.StringIO), then into the HTML report",
    ("bench/bench_mnist.py", "main", "np.savez"):
        "the benchmark's data for its child processes, in a TemporaryDirectory",
    ("engine/backends/cpu/disk_cache.py", "index_lock", "os.open"):
        "an empty lock file beside a numba cache index, in the kernel cache, never written",
    ("checkkit/ahead.py", "helper_process", "os.open"):
        "a helper process's stdout and stderr (compile-ahead or sharing) sent to os.devnull",
    ("checkkit/compiling.py", "_children_log", "open"):
        "creates the children's compile log, empty, in a TemporaryDirectory of its own",
    ("checkkit/compiling.py", "on_start", "os.open"):
        "a child appends a line to that log (O_APPEND, no O_CREAT: never makes a file), named "
        "to it by its parent",
    ("reports/scoreboard.py", "_read_capped", "os.open"):
        "reads a result file (O_RDONLY; O_NONBLOCK so that a FIFO cannot hang it)",
}


def _name(func: ast.expr) -> str:
    """'os.open' for os.open(...), 'open' for open(...), '.savefig' for x.savefig(...)."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = func.value.id if isinstance(func.value, ast.Name) else ""
        return f"{base}.{func.attr}"
    return ""


def _mode(call: ast.Call, position: int) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg in ("mode", "flags"):
            return kw.value
    return call.args[position] if len(call.args) > position else None


def _writes(call: ast.Call) -> str | None:
    """What `call` is called in the report when it may write a file, else None."""
    name = _name(call.func)
    method = name.rpartition(".")[2] if isinstance(call.func, ast.Attribute) else None
    if name == "os.open":
        flags = _mode(call, 1)
        leaves = [] if flags is None else [
            n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(flags)
            if isinstance(n, ast.Attribute) or isinstance(n, ast.Name) and not any(
                isinstance(a, ast.Attribute) and a.value is n for a in ast.walk(flags))]
        known = all(leaf.startswith("O_") for leaf in leaves) and leaves
        return None if known and not WRITING_FLAGS & set(leaves) else name
    if name in OPENERS or method == "open":
        # Path.open(mode), open(path, mode), os.fdopen(fd, mode), io.open(path, mode)
        mode = _mode(call, 0 if method == "open" and name not in OPENERS else 1)
        if mode is None:
            return None                  # read, as the default mode is
        literal = isinstance(mode, ast.Constant) and isinstance(mode.value, str)
        return None if literal and not WRITING_MODE & set(mode.value) else \
            ("open" if name in OPENERS else ".open")
    if name == "GGUFWriter" or method == "GGUFWriter":
        first = call.args[0] if call.args else None
        return None if isinstance(first, ast.Constant) and first.value is None \
            else "GGUFWriter"
    if name in QUALIFIED:
        return name
    if method in METHODS:
        return f".{method}"
    return None


def writing_calls(root: pathlib.Path = ROOT) -> list[tuple[str, str, str, int]]:
    """(file, enclosing function, call, line) of every call that may write a file."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), rel)
            _visit(tree, rel, "<module>", found)
    return found


def _visit(node: ast.AST, rel: str, function: str, found: list) -> None:
    for child in ast.iter_child_nodes(node):
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
            else function
        what = _writes(child) if isinstance(child, ast.Call) else None
        if what:
            found.append((rel, function, what, child.lineno))
        _visit(child, rel, inner, found)


def test_only_the_writer_module_writes_files():
    found = [f for f in writing_calls() if f[0] != WRITER]
    stray = [f"{rel}:{line} ({function}): {call}(...) may write a file; write through "
             "engine.files.atomic_write / write_atomic (or, for a private temporary file, "
             "add it to ALLOWED with the reason)"
             for rel, function, call, line in found if (rel, function, call) not in ALLOWED]
    assert not stray, "\n".join(stray)
    stale = set(ALLOWED) - {(rel, function, call) for rel, function, call, _ in found}
    assert not stale, f"ALLOWED entries that match nothing any more: {sorted(stale)}"


def test_the_scan_finds_the_writes_it_is_meant_to(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "files.py").write_text("open(p, 'wb')\n")
    (tmp_path / "engine" / "bad.py").write_text(
        "import os, numpy as np\n"
        "def save(p, a, mode):\n"
        "    open(p, 'w')\n"
        "    open(p, mode)\n"
        "    open(p)\n"
        "    open(p, 'rb')\n"
        "    p.open('a')\n"
        "    os.open(p, os.O_WRONLY | os.O_CREAT)\n"
        "    os.open(p, os.O_RDONLY)\n"
        "    p.write_text('x')\n"
        "    np.save(p, a)\n"
        "    a.tofile(p)\n"
        "    os.replace(p, p)\n"
        "    GGUFWriter(p, 'arch')\n"
        "    GGUFWriter(None, 'arch')\n"
        "    os.open(p, flags)\n"
        "    p.name.replace('a', 'b'), a.copy(), model.save(p), open(p, mode='rb')\n")
    found = [(f, c, line) for f, _, c, line in writing_calls(tmp_path) if f != WRITER]
    assert found == [("engine/bad.py", c, line) for c, line in (
        ("open", 3), ("open", 4), (".open", 7), ("os.open", 8), (".write_text", 10),
        ("np.save", 11), (".tofile", 12), ("os.replace", 13), ("GGUFWriter", 14),
        ("os.open", 16))]
