"""gradcheck in pytest: your own ops' cases as test items.

In your own suite, the cases of an op you registered (an engine.registry.OpDef with
`samples`), or of functions of your own (`function_case`), become one test each, with the
case string as the test id and the failure text of `pytest --gradcheck` (the row's message,
then the command that reproduces it):

    import pytest
    from gradcheck.pytest import assert_gradcheck, cases, function_case

    @pytest.mark.parametrize("case", cases("my_op"))        # its registry cases
    def test_my_op(case):
        assert_gradcheck(case, engine="torch")               # or ours (default), ggml, ...

    @pytest.mark.parametrize("case", cases([function_case(swish, [x, beta])]))
    def test_swish(case):
        assert_gradcheck(case)

A failing, erring or crashing row fails the test (AssertionError), a skipped or
unsupported one skips it, with its message.

The verdict is the one the plugin's items get (checkkit.sweep.judge_rows; the plugin is
gradcheck.pytest_plugin). `import pytest` in this module is pytest itself: imports are
absolute.
"""

from __future__ import annotations

import dataclasses

import pytest

from checkkit.sweep import RowsFailed, failure_text, skip_reason  # noqa: F401  (named here too)
from checkkit.sweep import judge_rows as _judge_rows
from checkkit.worker import DEFAULT_CASE_TIMEOUT
from engine.registry import OpDef, get_op
from gradcheck.adapters import get_adapter
from gradcheck.api import FunctionCase, _function_case
from gradcheck.cotangents import tier_cases
from gradcheck.engine_under_test import EngineUnderTest
from gradcheck.runner import run_checks
from reports import Result


# --- the verdict: the same for the plugin's items and for assert_gradcheck ---------------
class GradcheckFailure(RowsFailed):
    """Rows that failed, erred or crashed; the message is failure_text(rows): per row,
    `CASE: STATUS: MESSAGE`, then `reproduce: COMMAND`."""


def judge_rows(rows) -> list[Result]:
    """`rows` when none failed and not all were skipped; else raise GradcheckFailure (any
    row failed, erred or crashed) or pytest's skip (every row skipped or unsupported)."""
    return _judge_rows(rows, GradcheckFailure)


# --- your own suite --------------------------------------------------------------------------
def _filtered(samples, dtype: str, pattern: str | None):
    return [s for s in samples
            if (dtype == "all" or s.dtype == dtype) and (not pattern or pattern in str(s))]


def cases(what, *, dtype: str = "all", pattern: str | None = None, tier: str = "fast"):
    """`pytest.param(case, id=str(case))` for each case of `what`, for
    `@pytest.mark.parametrize`: a registered op's name or OpDef (its cases of `tier`, as
    `gradcheck --op` selects them: the registry samples with their cotangent variants), or
    an iterable of cases (engine.samples.Sample, function_case's FunctionCase, or anything
    with Sample's interface); of one dtype or both, whose string contains `pattern`."""
    if isinstance(what, str):
        what = get_op(what)
    samples = tier_cases(what, tier) if isinstance(what, OpDef) else list(what)
    return [pytest.param(s, id=str(s)) for s in _filtered(samples, dtype, pattern)]


def function_case(build, arrays, *, grad=None, torch_fn=None, name: str | None = None,
                  cotangent: str = "contiguous") -> FunctionCase:
    """The case of `build(*tensors)`, an engine expression of its inputs, at `arrays`, as
    gradcheck.api.check_function checks it for one cotangent layout (engine.samples);
    its string is `NAME(a=[shape],...)`, named after the function and its parameters
    (gradcheck.api.input_names)."""
    case = _function_case(build, arrays, grad, name, "function_case", True, build_fn=build,
                          torch_fn=torch_fn)
    return dataclasses.replace(case, cotangent=cotangent)


def _adapter(engine, options: dict):
    """The adapter of `engine`: None for ours, get_adapter's for a name, else `engine`."""
    if engine is None or engine == "engine":
        return None
    return get_adapter(engine, **options) if isinstance(engine, str) else engine


def assert_gradcheck(case, *, engine=None, backend: str = "cpu", inject: str | None = None,
                     mode: str = "auto", use_torch: bool = True,
                     case_timeout: float = DEFAULT_CASE_TIMEOUT, **engine_options) -> Result:
    """Check one case as `gradcheck` does (gradcheck.runner.run_checks) and return its row
    when it passes. `engine`: None (ours, on `backend`, with the mutation `inject`), an
    engine name as for `gradcheck --engine` (made with `engine_options`, e.g.
    lib_dir=... for ggml) or an adapter object. A failing, erring or crashing row raises
    GradcheckFailure (an AssertionError: the row's message and its repro command); a
    skipped or unsupported one skips the test."""
    adapter = _adapter(engine, engine_options)
    backends = (backend,) if adapter is None else ("cpu",)
    with EngineUnderTest(adapter, backends, inject, case_timeout) as under_test:
        return judge_rows(run_checks([case], under_test, mode=mode, use_torch=use_torch))[0]
