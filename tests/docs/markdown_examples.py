"""The code examples of the README and the documentation pages, found and run.

Python: every fenced ```python (or ```py) block runs, alone, in a fresh namespace, in a
temporary working directory; a block marked `notest` is not run, and one marked
`continuation` runs after the block before it, in one program. The marks go in the fence's
info string, plain (```python notest) or in the attribute form that MkDocs' superfences
renders as code ({.python notest}); they are pytest-markdown-docs' marks, so that
`pytest --markdown-docs --markdown-docs-syntax=superfences README.md docs` reads the pages
the same way. The Python examples in the docstrings the API reference renders run too
(docstring_examples).

Shell: in ```bash, ```sh, ```shell and ```console blocks, each command line of one of the
project's tools (a `$ ` prompt and `\\` continuations allowed; what follows a pipe or a
redirection is left out) is a shell example. The cheap ones run (`skip_reason` states the
rule and says why another does not), as a subprocess with a timeout; a command
that the tool accepts and runs to its verdict passes: exit status 0, or 1 when some row
failed (which some examples show on purpose: `--inject`, an engine's known defects). A
usage error (2: an option or op the tool does not know any more) breaks the example, unless
the page shows that refusal: a ```console block whose output lines after the command are
all in the tool's stderr, word for word (a page on bad input shows `gradcheck --op pool2d`
and its did-you-mean line). Any other status, a traceback or the timeout breaks it too.

Fences are found with markdown-it-py (CommonMark), also inside admonitions and content
tabs, whose indented bodies are parsed again.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

from markdown_it import MarkdownIt

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON = ("python", "py", "python3")
SHELL = ("bash", "sh", "shell", "console")
TOOLS = ("gradcheck", "optcheck", "mnist-train", "mnist-eval", "mnist-regress",
         "gradcheck-report")
# the shell's own words that end the command a tool is given
SHELL_OPERATORS = ("|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "&>", ">&2")
COMMAND_TIMEOUT = 180           # seconds a shell example may take


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block: its language, the other words of its info string, its code
    and the line of the page its code starts on (1-based)."""
    path: pathlib.Path
    lang: str
    options: frozenset[str]
    code: str
    line: int


def _info(info: str) -> list[str]:
    """The words of a fence's info string, `{.python notest}` (attribute syntax) read as
    `python notest`."""
    info = info.strip()
    if info.startswith("{"):
        words = info.strip("{}").split()
        lang = next((w for w in words if w.startswith(".")), None)
        if lang:
            words.remove(lang)
            words.insert(0, lang[1:])
        return words
    return info.split()


def _dedent(text: str) -> str:
    lines = text.splitlines()
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return "\n".join(x[indent:] for x in lines)


def code_blocks(text: str, path: pathlib.Path, first_line: int = 0, *,
                indented_code: bool = False) -> list[Block]:
    """The fenced code blocks of Markdown `text`, in page order. An indented block is an
    admonition's or a content tab's body, parsed again for the fences inside it, or, with
    `indented_code` (a docstring, where examples are indented), a code block of its own
    (language "")."""
    blocks = []
    for token in MarkdownIt("commonmark").parse(text):
        if not token.map:
            continue
        if token.type == "fence":
            words = _info(token.info)
            lang = words[0].lower() if words else ""
            blocks.append(Block(path, lang, frozenset(words[1:]), token.content,
                                first_line + token.map[0] + 2))
        elif token.type == "code_block" and indented_code:
            blocks.append(Block(path, "", frozenset(), token.content,
                                first_line + token.map[0] + 1))
        elif token.type == "code_block":
            blocks += code_blocks(_dedent(token.content), path, first_line + token.map[0])
    return blocks


def pages(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """The README and every Markdown page of the documentation, sorted."""
    found = [root / "README.md"] if (root / "README.md").exists() else []
    return found + sorted((root / "docs").rglob("*.md"))


def _label(path: pathlib.Path, line: int) -> str:
    try:
        path = path.relative_to(ROOT)
    except ValueError:
        pass
    return f"{path}:{line}"


# --- python ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PythonExample:
    """A program made of one ```python block and the continuation blocks after it."""
    path: pathlib.Path
    line: int
    source: str        # padded with blank lines so that its line numbers are the page's

    @property
    def label(self) -> str:
        return _label(self.path, self.line)


def python_examples(path: pathlib.Path) -> list[PythonExample]:
    """The Python examples of one page: each ```python block not marked notest, one
    continuation block joined to the example before it."""
    examples: list[PythonExample] = []
    for block in code_blocks(path.read_text(encoding="utf-8"), path):
        if block.lang not in PYTHON or "notest" in block.options:
            continue
        if "continuation" in block.options and examples:
            before = examples.pop()
            padding = "\n" * max(block.line - 1 - before.source.count("\n"), 0)
            examples.append(dataclasses.replace(before, source=before.source + padding
                                                + block.code))
        else:
            examples.append(PythonExample(path, block.line,
                                          "\n" * (block.line - 1) + block.code))
    return examples


def run_python(example: PythonExample) -> None:
    """Run the example as a program of its own (a fresh namespace, named after its page,
    so that a traceback points at the page's lines); whatever it raises propagates."""
    code = compile(example.source, str(example.path), "exec")
    exec(code, {"__name__": "__docs_example__"})


def is_sketch(source: str) -> bool:
    """Whether a docstring's example is a sketch rather than a program: a statement of its
    is a bare `...` standing for code the reader writes (`def update(...): ...`)."""
    return any(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
               and node.value.value is Ellipsis for node in ast.walk(ast.parse(source)))


def docstring_examples(objects) -> list[PythonExample]:
    """The Python examples in the docstrings of `objects` (modules, classes, functions: the
    ones the API reference renders), which the site shows as code: each indented or fenced
    block of a docstring that parses as Python, labelled with the source file and line it
    starts on."""
    examples = []
    for obj in objects:
        doc = obj.__doc__ if isinstance(obj.__doc__, str) else None
        if not doc:
            continue
        path = pathlib.Path(inspect.getsourcefile(obj))
        source = path.read_text(encoding="utf-8").splitlines()
        start = 0 if inspect.ismodule(obj) else inspect.getsourcelines(obj)[1] - 1
        for block in code_blocks(inspect.cleandoc(doc), path, indented_code=True):
            if block.lang not in ("", *PYTHON) or "notest" in block.options:
                continue
            try:
                ast.parse(block.code)
            except SyntaxError:      # a formula or a shell line, not a program
                continue
            first = block.code.strip().splitlines()[0].strip()
            line = next((i + 1 for i, text in enumerate(source)
                         if i >= start and text.strip() == first), 1)
            examples.append(PythonExample(path, line, "\n" * (line - 1)
                                          + textwrap.dedent(block.code)))
    return examples


# --- shell -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ShellExample:
    """One command line of a tool, as a page shows it, the argv it runs, and the output
    the page shows for it (a ```console block's lines after the command)."""
    path: pathlib.Path
    line: int
    text: str
    argv: tuple[str, ...]
    output: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return _label(self.path, self.line)


def _command_lines(code: str, first_line: int, console: bool = False):
    """(line, text, output) of each logical line of a shell block: `\\` continuations
    joined, a `$ ` prompt dropped; in a block with prompts (always in a ```console block)
    the lines without one are the output the page shows for the command before them."""
    prompts = console or any(x.lstrip().startswith("$ ") for x in code.splitlines())
    commands: list[tuple[int, str, list[str]]] = []
    pending, start = "", 0
    for i, raw in enumerate(code.splitlines()):
        text = raw.strip()
        if not pending:
            start = first_line + i
            if prompts and not text.startswith("$ "):
                if commands and text:
                    commands[-1][2].append(text)
                continue
            if prompts:
                text = text[2:]
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        commands.append((start, pending + text, []))
        pending = ""
    if pending:
        commands.append((start, pending, []))
    return [(line, text, tuple(output)) for line, text, output in commands]


def shell_examples(path: pathlib.Path) -> list[ShellExample]:
    """The command lines of the project's tools (TOOLS) in a page's shell blocks, each
    cut at the first shell operator (a pipe, a redirection, `&&`)."""
    found = []
    for block in code_blocks(path.read_text(encoding="utf-8"), path):
        if block.lang not in SHELL:
            continue
        for line, text, output in _command_lines(block.code, block.line,
                                                 block.lang == "console"):
            try:
                words = shlex.split(text, comments=True)
            except ValueError:       # not a command line (unbalanced quotes in prose)
                continue
            if not words or words[0] not in TOOLS and not _assigns(words[0]):
                continue
            cut = next((i for i, w in enumerate(words) if w in SHELL_OPERATORS), len(words))
            found.append(ShellExample(path, line, text, tuple(words[:cut]), output))
    return found


def _assigns(word: str) -> bool:
    """Whether a shell word sets an environment variable (`NAME=value`)."""
    name, eq, _ = word.partition("=")
    return bool(eq) and name.isidentifier()


# options that make a run long (every op, many processes, generated cases, the big tier,
# a cold kernel compile), and engines whose first use compiles for long
LONG_OPTIONS = {
    "gradcheck": ("--all", "--self-test", "--random", "--tier", "--workers",
                  "--boundscheck", "--coverage", "--backend"),
    "optcheck": ("--self-test", "--workers", "--steps", "--random"),
}
LONG_ENGINES = ("tinygrad",)
# an argument that stands for the reader's own value: `...`, `<case>`, `NAME`, `FILE`
PLACEHOLDER = re.compile(r"\.\.\.|…|<[^<>]+>|^[A-Z][A-Z_]+$")


def skip_reason(example: ShellExample) -> str | None:
    """Why a shell example is not run (None: it runs). The rule: `--help` of any tool
    runs; gradcheck runs with `--list`, `--op NAME` or `--repro CASE` and optcheck with
    `--opt NAME` (not `all`), unless an option in LONG_OPTIONS or an engine in
    LONG_ENGINES makes it long, or the command depends on the page's context (an
    environment variable set before it, a placeholder (PLACEHOLDER, or your own adapter
    module as `--engine module:attribute`), an input file an earlier command made); the
    MNIST commands train for minutes and never run; gradcheck-report reads result files
    an earlier command wrote."""
    argv = example.argv
    if _assigns(argv[0]):
        return "sets an environment variable for the command (e.g. a cold kernel cache)"
    tool, args = argv[0], argv[1:]
    placeholders = [a for a in args if PLACEHOLDER.search(a)]
    if placeholders:
        return f"{placeholders[0]} is a placeholder for a value of yours"
    if "--help" in args or "-h" in args:
        return None
    if tool not in LONG_OPTIONS:
        return f"{tool} runs for minutes or reads files an earlier command wrote"
    long = [a for a in args if a.split("=")[0] in LONG_OPTIONS[tool]]
    if long:
        return f"{' '.join(long)} makes the run long"
    engine = _value(args, "--engine")
    if engine and (":" in engine or engine in LONG_ENGINES):
        return (f"--engine {engine}: " + ("a placeholder for your own adapter module"
                                         if ":" in engine else "its first run compiles"))
    if tool == "gradcheck" and not {"--list", "--op", "--repro"} & set(args):
        return "gradcheck runs only with --list, --op or --repro"
    if tool == "optcheck":
        opts = _values(args, "--opt")
        if not opts or "all" in opts:
            return "optcheck runs only with --opt NAME (not all)"
    return None


def _values(args, option: str) -> list[str]:
    found = []
    for i, a in enumerate(args):
        if a == option and i + 1 < len(args):
            found.append(args[i + 1])
        elif a.startswith(option + "="):
            found.append(a.partition("=")[2])
    return found


def _value(args, option: str) -> str | None:
    values = _values(args, option)
    return values[-1] if values else None


def _documented_refusal(example: ShellExample, done) -> bool:
    """Whether a usage error (exit 2) is the one the page shows: a page that documents bad
    input shows the command and the tool's one-line refusal, which must still be the
    tool's, word for word."""
    shown = [line for line in example.output if line]
    said = {line.strip() for line in done.stderr.splitlines()}
    return done.returncode == 2 and bool(shown) and all(line in said for line in shown)


def run_command(example: ShellExample, cwd: pathlib.Path,
                timeout: float = COMMAND_TIMEOUT) -> str | None:
    """Run a shell example's tool (the console script beside this Python) in `cwd`; None
    when it ran to a verdict (exit 0 or 1) or refused its input as the page shows (exit 2,
    _documented_refusal), with no traceback; else what went wrong."""
    tool = pathlib.Path(sys.executable).with_name(example.argv[0])
    argv = [str(tool) if tool.exists() else example.argv[0], *example.argv[1:]]
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "COLUMNS": "100"})
    except subprocess.TimeoutExpired:
        return f"{example.text}: still running after {timeout:g} s"
    if "Traceback (most recent call last)" in done.stderr or (
            done.returncode not in (0, 1) and not _documented_refusal(example, done)):
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        return f"{example.text}: exit status {done.returncode}\n{tail}"
    return None
