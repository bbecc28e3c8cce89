"""Users' adapters that raise anything or return garbage, run by `gradcheck --engine
module:attr` in the bounded child: hypothesis draws which method misbehaves (import,
construction, describe, unsupported, declined, vjp, forward, the forward-only variants, the
`backend` attribute), in-process or in a worker process (isolated), on every case or some,
and how: an Exception (MemoryError and RecursionError, raised or real, included), a
BaseException of its own, GeneratorExit, KeyboardInterrupt, SystemExit with an int, str or
None code, or an answer that is no answer (None, wrong shapes, NaN, no array, an object
whose every attribute raises, one that does not pickle).

Beyond check_cli's promises (exit 0, 1 or 2 with one line; no traceback, hang or death): a
raise while loading (import, construction, describe) is exit 2 whose line names what was
raised; a raise in a call is exit 1 with the report written and an error row naming it;
garbage is a report (exit 0 or 1) or one usage line.
"""

from __future__ import annotations

import itertools
import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.checks import check_cli, fuzz_settings
from tests.fuzz.runner import Child
from tests.gradcheck.user_adapter import ADAPTER_HEAD, RELU

pytestmark = pytest.mark.fuzz

BAD = "x=[3,4]"        # the relu cases a "some cases" draw misbehaves on (2 of relu's 11 in f64)
LOADING = ("import", "init", "describe")
WHERE = ("import", "init", "describe", "unsupported", "declined", "vjp", "forward",
         "forward_only_checks", "forward_only_output", "backend")

# what is raised: (the name an error row or usage line shows, the statement)
RAISES = {
    "ValueError": "raise ValueError('bad value')",
    "RuntimeError": "raise RuntimeError('engine says no\\nover two lines')",
    "MyError": "raise MyError('an Exception of its own')",
    "ZeroDivisionError": "1 / 0",
    "MemoryError": "raise MemoryError",
    "MemoryError (real)": "np.ones(2 ** 42)",
    "RecursionError": "raise RecursionError",
    "RecursionError (real)": "(lambda f: f(f))(lambda f: f(f))",
    "Boom": "raise Boom('a BaseException of its own')",
    "GeneratorExit": "raise GeneratorExit",
    "KeyboardInterrupt": "raise KeyboardInterrupt",
    "SystemExit": "raise SystemExit",
    "SystemExit (sys.exit)": "import sys; sys.exit(3)",
}

# answers that are no answer, per method (a statement returning them)
GARBAGE = {
    "describe": ["return 42", "return 'two\\nlines'", "return Weird()"],
    "unsupported": ["return 42", "return 'no\\nway'", "return Weird()", "return ['x']"],
    "declined": ["return 5", "return {'nope': 'no'}", "return {'x': 'no gradient'}",
                 "return Weird()"],
    "vjp": ["return None", "return 'garbage'", "return VJP(np.zeros(1), [np.zeros(1)])",
            "return VJP(np.full(np.shape(arrays[0]), np.nan), "
            "[np.full(np.shape(arrays[0]), np.nan)])",
            "return VJP(object(), [object()])", "return VJP(np.maximum(arrays[0], 0), 5)",
            "return VJP(np.maximum(arrays[0], 0), [])", "return lambda: 0",
            "return Weird()", "return VJP(Weird(), [Weird()])"],
    "forward": ["return None", "return 'abc'", "return np.zeros(1)", "return Weird()"],
    "forward_only_checks": ["return 7", "return {1: 2}", "return Weird()",
                            "return {'fast': Weird()}"],
    "forward_only_output": ["return None", "return (np.zeros(1), 'x')", "return Weird()",
                            "return (np.full(np.shape(arrays[0]), np.inf), arrays)"],
    "backend": ["return 42", "return Weird()", "return 'cuda'"],
}

MODULE = RELU + '''

class Boom(BaseException):
    pass


class MyError(Exception):
    pass


class Weird:
    """An answer whose every use raises."""
    def __getattr__(self, name):
        raise SystemExit("weird " + name)
    def __bool__(self):
        raise Boom("bool")
    def __str__(self):
        raise Boom("str")
    def __repr__(self):
        raise Boom("repr")
    def __iter__(self):
        raise GeneratorExit
    def __len__(self):
        raise KeyboardInterrupt


def hit(case):
    return {every} or "{bad}" in str(case)


{import_}

''' + ADAPTER_HEAD + '''
    def unsupported(self, case):
        if case.op not in ("relu", "clamp_back"):
            return "relu and clamp_back only"
        if hit(case):
            {unsupported}
        return None

    def declined(self, case):
        if hit(case):
            {declined}
        return {{}}

    def vjp(self, case, arrays, weights):
        if hit(case):
            {vjp}
        return relu(arrays, weights)

    def forward(self, case, arrays):
        {forward}
        raise RuntimeError("not drawn: forward is used only with --op clamp_back")

    def forward_only_checks(self, case):
        if hit(case):
            {forward_only_checks}
        return {{"fast": None}} if {variants} else {{}}

    def forward_only_output(self, variant, case, arrays):
        if hit(case):
            {forward_only_output}
        return np.maximum(arrays[0], 0), arrays

    @property
    def backend(self):
        if {every}:
            {backend}
        return "cpu"
'''

_names = itertools.count()


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("adapters")


@pytest.fixture(scope="module")
def adapter_child(tmp_path_factory, adapter_dir):
    """A bounded child of its own, with the directory of the drawn adapter modules on its
    path (the shared child's path is fixed when it starts)."""
    child = Child(tmp_path_factory.mktemp("adapter-child"),
                  env={"PYTHONPATH": str(adapter_dir),
                       "GRADVERIFY_CACHE": str(tmp_path_factory.mktemp("cache"))})
    yield child
    child.close()


@pytest.fixture
def adapter_env(fuzz_env, adapter_child):
    """fuzz_env, its command lines run in adapter_child."""
    shared = fuzz_env.child
    fuzz_env.child = adapter_child
    yield fuzz_env
    fuzz_env.child = shared


def _statement(kind: str, what: str, code) -> str:
    """The statement that misbehaves: a return of garbage, or a raise."""
    if kind == "garbage":
        return what
    if what == "SystemExit":
        return f"raise SystemExit({code!r})"
    return RAISES[what]


def _module(where: str, statement: str, isolated: bool, every: bool) -> str:
    """The adapter module's source: `statement` in the method `where` (at module level
    for "import"), `pass` in the others."""
    slots = {w: "pass" for w in WHERE} | {where: statement}
    slots["describe"] += '\n        return "fuzzed adapter 1.0"'
    return MODULE.format(name="fuzzed", every=every or where == "backend", bad=BAD,
                         isolated=isolated,
                         variants=where == "forward_only_output",
                         import_=slots.pop("import"), **slots)


@st.composite
def misbehaviours(draw):
    where = draw(st.sampled_from(WHERE), label="where")
    kinds = ["raise"] + (["garbage"] if where in GARBAGE else [])
    kind = draw(st.sampled_from(kinds), label="kind")
    code = None
    if kind == "garbage":
        what = draw(st.sampled_from(GARBAGE[where]), label="returns")
    else:
        what = draw(st.sampled_from(sorted(RAISES)), label="raises")
        if what == "SystemExit":
            code = draw(st.one_of(st.none(), st.integers(-300, 300),
                                  st.text(st.characters(exclude_categories=("Cs",)),
                                          max_size=20)), label="code")
    # forward runs in the parent only (an isolated adapter's backward op goes through vjp)
    isolated = where != "forward" and draw(st.booleans(), label="isolated")
    every = draw(st.booleans(), label="every case")
    return where, kind, what, code, isolated, every


@fuzz_settings(short=8, long=1000)
@given(drawn=misbehaviours())
def test_adapters_that_raise_or_return_garbage(adapter_env, adapter_dir, drawn):
    where, kind, what, code, isolated, every = drawn
    adapter_env.count(f"cli:gradcheck adapter {where}")
    name = f"gv_fuzzed_{os.getpid()}_{next(_names)}"
    statement = _statement(kind, what, code)
    (adapter_dir / f"{name}.py").write_text(_module(where, statement, isolated, every),
                                           encoding="utf-8")
    argv = ["--engine", f"{name}:A", "--op", "relu", "--dtype", "f64", "--no-torch",
            "--no-progress", "--format", "json", "--output", "{scratch}/r.json"]
    if where == "forward":
        argv += ["--op", "clamp_back"]
    rc = check_cli(adapter_env, "gradcheck", argv)
    if rc is None:              # GRADVERIFY_FUZZ_SURVEY: recorded, go on
        return
    report = os.path.join(adapter_env.scratch, "r.json")
    shown = (drawn, statement)
    if kind == "raise":
        named = what.split(" (")[0]
        if where in LOADING:
            assert rc == 2, shown
            return
        assert rc == 1, shown
        with open(report, encoding="utf-8") as f:
            rows = json.load(f)["results"]
        errors = [r["message"] for r in rows if r["status"] == "error"]
        assert errors and any(named in m for m in errors), (shown, errors[:3])
        return
    if rc in (0, 1):
        assert os.path.exists(report), shown
