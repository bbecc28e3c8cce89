"""Every code example of the README and the documentation pages runs (tests/docs/
markdown_examples.py says how examples are found, which shell commands run and what breaks
one), and a broken example fails these tests."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from tests.docs.markdown_examples import (
    ShellExample,
    code_blocks,
    docstring_examples,
    is_sketch,
    pages,
    python_examples,
    run_command,
    run_python,
    shell_examples,
    skip_reason,
)
from tests.docs.reference_hook import api_objects

PYTHON_EXAMPLES = [e for page in pages() for e in python_examples(page)]
# the docstrings the API reference renders (docs/hooks/reference.py's API), their members'
# included
DOCSTRING_EXAMPLES = docstring_examples(api_objects())


def _first_of_each_command() -> list[ShellExample]:
    """Each command once, where it first appears (the README's before the pages')."""
    first: dict[tuple[str, ...], ShellExample] = {}
    for page in pages():
        for example in shell_examples(page):
            first.setdefault(example.argv, example)
    return list(first.values())


SHELL_EXAMPLES = _first_of_each_command()


@pytest.mark.parametrize("example", PYTHON_EXAMPLES, ids=lambda e: e.label)
def test_python_example_runs(example, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_python(example)


@pytest.mark.parametrize("example", DOCSTRING_EXAMPLES, ids=lambda e: e.label)
def test_docstring_example_runs(example, tmp_path, monkeypatch):
    if is_sketch(example.source):
        pytest.skip("a sketch: a bare `...` stands for the reader's code")
    monkeypatch.chdir(tmp_path)
    run_python(example)


@pytest.mark.parametrize("example", SHELL_EXAMPLES, ids=lambda e: e.label)
def test_shell_example_runs(example, tmp_path):
    reason = skip_reason(example)
    if reason:
        pytest.skip(f"not run: {reason}")
    problem = run_command(example, tmp_path)
    assert problem is None, f"{example.label}: {problem}"


def test_the_pages_have_examples():
    """The collection above finds examples in the README and in docs/ (an empty list would
    pass them all)."""
    readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"
    found = {e.path for e in PYTHON_EXAMPLES + SHELL_EXAMPLES}
    assert readme in found
    assert any(path != readme for path in found)


# --- a broken example fails ------------------------------------------------------------------

PLANTED = '''# A page

Some prose, then a working example:

```python
import math
assert math.isclose(math.sqrt(4.0), 2.0)
```

```python notest
this is not python, and is not run
```

!!! note "In an admonition"

    ```python
    from gradcheck.api import no_such_function
    ```

```python
total = 1 + 1
```

```python continuation
assert total == 3, "a continuation sees the block before it"
```

```bash
$ gradcheck --list
$ gradcheck --op no_such_op \\
    --dtype f64
$ gradcheck --all | tail -3
$ NUMBA_CACHE_DIR=$(mktemp -d) gradcheck --op relu
```

```console
$ optcheck --opt sgd
optcheck --opt adam: this line is output, not a command
```
'''


@pytest.fixture()
def planted(tmp_path) -> pathlib.Path:
    page = tmp_path / "page.md"
    page.write_text(PLANTED, encoding="utf-8")
    return page


def test_a_planted_broken_python_example_fails(planted):
    examples = python_examples(planted)
    assert [e.line for e in examples] == [6, 17, 21]      # notest left out
    run_python(examples[0])
    with pytest.raises(ImportError, match="no_such_function"):
        run_python(examples[1])                   # found inside the admonition
    with pytest.raises(AssertionError, match="continuation") as raised:
        run_python(examples[2])
    # the traceback names the page and the line of the failing statement
    assert raised.traceback[-1].path == planted
    assert raised.traceback[-1].lineno + 1 == 25


def test_a_planted_broken_shell_example_fails(planted, tmp_path):
    examples = shell_examples(planted)
    assert [e.argv for e in examples[:3]] == [
        ("gradcheck", "--list"),
        ("gradcheck", "--op", "no_such_op", "--dtype", "f64"),
        ("gradcheck", "--all")]
    assert examples[3].argv[0].startswith("NUMBA_CACHE_DIR=")
    assert examples[4].argv == ("optcheck", "--opt", "sgd")
    assert examples[4].output == ("optcheck --opt adam: this line is output, not a command",)
    assert [e.line for e in examples] == [29, 30, 32, 33, 37]
    listed, unknown, everything, cold, _ = examples
    assert skip_reason(listed) is None and skip_reason(unknown) is None
    assert "--all" in skip_reason(everything)
    assert "environment variable" in skip_reason(cold)
    assert run_command(listed, tmp_path) is None
    problem = run_command(unknown, tmp_path)
    assert problem is not None and "exit status 2" in problem and "no_such_op" in problem
    # a refusal the page shows after the command, word for word, is the example working
    # (a page on bad input); a refusal the page does not show breaks it
    said = [x for x in problem.splitlines()[1:] if x.strip()]
    quoted = dataclasses.replace(unknown, output=tuple(said))
    assert said and run_command(quoted, tmp_path) is None
    misquoted = dataclasses.replace(unknown, output=("gradcheck: not what it says",))
    assert "exit status 2" in run_command(misquoted, tmp_path)


def test_a_command_that_outlives_its_timeout_fails(tmp_path):
    example = ShellExample(tmp_path, 1, "gradcheck --op conv_2d", ("gradcheck", "--op",
                                                                   "conv_2d"))
    problem = run_command(example, tmp_path, timeout=0.01)
    assert problem is not None and "still running" in problem


def test_a_docstring_example_is_found_and_a_broken_one_fails():
    def planted():
        """What it does; an example:

            import math
            assert math.isclose(math.sqrt(2.0) ** 2, 3.0)

        And a sketch:

            def update(params):
                ...
        """
    example, sketch = docstring_examples([planted])
    assert not is_sketch(example.source) and is_sketch(sketch.source)
    assert example.path == pathlib.Path(__file__)
    assert example.line == planted.__code__.co_firstlineno + 3
    with pytest.raises(AssertionError):
        run_python(example)


@pytest.mark.parametrize("fence, lang, options", [
    ("```python notest", "python", {"notest"}),
    ("``` py title=\"x.py\"", "py", {'title="x.py"'}),
    ("```{.python continuation}", "python", {"continuation"}),
    ("~~~bash", "bash", set()),
])
def test_fence_info_strings(tmp_path, fence, lang, options):
    close = fence[:3]
    [block] = code_blocks(f"{fence}\ncode\n{close}\n", tmp_path)
    assert (block.lang, set(block.options), block.code) == (lang, options, "code\n")


@pytest.mark.parametrize("argv, runs", [
    (("gradcheck", "--op", "relu"), True),
    (("gradcheck", "--op", "relu", "--engine", "torch"), True),
    (("gradcheck", "--engine", "mypkg.adapter:MyAdapter", "--op", "relu"), False),
    (("gradcheck", "--engine", "tinygrad", "--op", "relu"), False),
    (("gradcheck", "--op", "relu", "--random", "50"), False),
    (("gradcheck", "--all", "--help"), True),
    (("optcheck", "--opt", "adam"), True),
    (("optcheck", "--opt", "all"), False),
    (("optcheck", "--self-test"), False),
    (("mnist-train", "--arch", "fc"), False),
    (("mnist-regress", "--help"), True),
    (("gradcheck", "--repro", "Sample(...)"), False),
    (("gradcheck", "--op", "NAME"), False),
    (("gradcheck", "--op", "<op>"), False),
])
def test_which_shell_examples_run(tmp_path, argv, runs):
    example = ShellExample(tmp_path, 1, " ".join(argv), argv)
    assert (skip_reason(example) is None) == runs
