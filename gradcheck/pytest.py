"""gradcheck in pytest: your own ops' cases as test items, and the CLIs' `--workers`.

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

The plugin's items (gradcheck.pytest_plugin) are made here too: `make_plan` turns its
options into Jobs, each running what the CLI runs for one case, and judge_rows gives the
verdict. `import pytest` in this module is pytest itself: imports are absolute.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable

import pytest

from engine.backends import get_backend
from engine.errors import BackendError, UnknownOpError
from engine.registry import OpDef, get_op
from gradcheck.adapters import MAX_GGML_THREADS, AdapterError, get_adapter
from gradcheck.api import FunctionCase, _function_case
from gradcheck.cotangents import TIERS, tier_cases
from gradcheck.generated import generated_results
from gradcheck.injection import parse as parse_injection
from gradcheck.isolated import IsolatedAdapter
from gradcheck.modes import MODES
from gradcheck.repro import FAILING
from gradcheck.runner import (
    DTYPES,
    MAX_RANDOM,
    checkable_ops,
    describe_engines,
    run_checks,
    select_samples,
)
from gradcheck.worker import DEFAULT_CASE_TIMEOUT
from reports import Result, first_unwritable, render, write_atomic


# --- failure text: the same for the plugin's items and for assert_gradcheck ---------------
class GradcheckFailure(AssertionError):
    """Rows that failed, erred or crashed; the message is failure_text(rows)."""

    def __init__(self, rows):
        self.rows = list(rows)
        super().__init__(failure_text(self.rows))


def failure_text(rows) -> str:
    """Per row that is not ok: `CASE: STATUS: MESSAGE`, then `reproduce: COMMAND` unless the
    message already ends with it (crashes and shrunk generated cases say it there)."""
    lines = []
    for row in rows:
        if row.status not in FAILING:
            continue
        lines.append(f"{row.name}: {row.status}: {row.message}")
        repro = row.metrics.get("repro")
        if repro and not row.message.endswith(f"reproduce: {repro}"):
            lines.append(f"reproduce: {repro}")
    return "\n".join(lines)


def skip_reason(rows) -> str | None:
    """The reason to skip an item whose rows are all skipped or unsupported (None when any
    row passed or failed, or there are none)."""
    if not rows or any(r.status not in ("skip", "unsupported") for r in rows):
        return None
    return "; ".join(f"{r.status}: {r.message}" for r in rows)


def judge_rows(rows) -> list[Result]:
    """`rows` when none failed and not all were skipped; else raise GradcheckFailure (any
    row failed, erred or crashed) or pytest's skip (every row skipped or unsupported)."""
    rows = list(rows)
    if any(r.status in FAILING for r in rows):
        raise GradcheckFailure(rows)
    reason = skip_reason(rows)
    if reason:
        pytest.skip(reason)
    return rows


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
    its string is `NAME(x0=[shape],...)`."""
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
    return judge_rows(run_checks([case], inject, False, mode, backends, use_torch, adapter,
                                 case_timeout))[0]


# --- the plugin's plans: what each item of gradcheck.pytest_plugin runs --------------------
@dataclasses.dataclass
class Job:
    """One item's work: its name (the case string), what it runs (a list of Results), and
    the labels of the row that stands for it when it dies without rows."""

    name: str
    run: Callable[[], list]
    labels: dict


class _Engine:
    """The engine under test in this pytest process: `adapter` (None: ours, made per
    case by run_checks); an isolated one runs in one worker process, started at the first
    case, kept across items and restarted after a crash (gradcheck.isolated)."""

    def __init__(self, adapter, case_timeout: float):
        self.adapter, self.case_timeout = adapter, case_timeout
        self._running = None

    def running(self):
        if self.adapter is None or not self.adapter.isolated:
            return self.adapter
        if self._running is None:
            self._running = IsolatedAdapter(self.adapter, self.case_timeout)
        return self._running

    def close(self) -> None:
        if self._running is not None:
            self._running.close()
            self._running = None


@dataclasses.dataclass
class Plan:
    """A tool's items in one pytest process: its jobs, the header line that describes the
    run, the JSON document's meta (less argv) and path, and the engine to close."""

    tool: str
    jobs: list[Job]
    describe: str
    meta: dict
    json: str | None
    engine: _Engine | None = None

    def lost_row(self, index: int, report) -> Result:
        """The row of an item that ended without rows: "crash" when its xdist worker died
        (xdist's report of it says when="???"), else "error", with pytest's last line."""
        job = self.jobs[index]
        status = "crash" if report.when == "???" else "error"
        lines = str(report.longrepr).strip().splitlines() or ["no report"]
        return Result(self.tool, job.name, status, message=f"{status}: {lines[-1]}",
                      labels=dict(job.labels))

    def write_json(self, results, config, extra=None) -> None:
        """The rows as the gradverify.results/1 document, atomically; `extra`: more meta
        (an interrupted run's `interrupted` and `signal`)."""
        meta = {"argv": [str(a) for a in config.invocation_params.args], **self.meta,
                **(extra or {})}
        write_atomic(self.json, render(results, "json", self.tool, meta))

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class _OptionError(Exception):
    """An option value that the CLI would refuse, in one line."""


def make_plan(tool: str, config) -> Plan:
    """The Plan of `tool` from the plugin's options in `config`; pytest.UsageError, in one
    line, on an option the CLI would refuse. The JSON file is the controller's (an xdist
    worker, maybe on another host, neither checks nor writes it)."""
    get = lambda name: config.getoption(f"{tool}_{name.replace('-', '_')}")
    path = None
    if get("json") and not hasattr(config, "workerinput"):
        path = os.path.abspath(get("json"))
        problem = first_unwritable(path)
        if problem:
            raise pytest.UsageError(f"--{tool}-json: {problem}")
    try:
        plan = _gradcheck_plan(get) if tool == "gradcheck" else _optcheck_plan(get)
    except (_OptionError, UnknownOpError, BackendError, AdapterError) as exc:
        raise pytest.UsageError(f"{tool}: {exc}") from None
    plan.json = path
    return plan


def _gradcheck_problem(get) -> str | None:
    """What the gradcheck CLI would refuse in these options (None if nothing)."""
    for name, value, allowed in (("dtype", get("dtype"), (*DTYPES, "all")),
                                 ("tier", get("tier"), TIERS), ("mode", get("mode"), MODES)):
        if value not in allowed:
            return f"--gradcheck-{name} must be one of {', '.join(allowed)}, got {value!r}"
    if not 0 <= get("random") <= MAX_RANDOM:
        return (f"--gradcheck-random must be a number of cases per op in [0, {MAX_RANDOM}], "
                f"got {get('random')}")
    timeout = get("case-timeout")
    if timeout is not None and not timeout > 0:
        return f"--gradcheck-case-timeout must be a positive number of seconds, got {timeout}"
    engine, threads = get("engine"), get("ggml-threads")
    for flag, given in (("ggml-lib", get("ggml-lib")), ("ggml-threads", threads is not None)):
        if given and engine != "ggml":
            return f"--gradcheck-{flag} applies to --gradcheck-engine ggml, not to {engine}"
    if threads is not None and not 1 <= threads <= MAX_GGML_THREADS:
        return (f"--gradcheck-ggml-threads must lie in [1, {MAX_GGML_THREADS}], got "
                f"{threads}")
    for flag, given in (("inject", get("inject")), ("backend", get("backend"))):
        if given and engine != "engine":
            return f"--gradcheck-{flag} applies to our engine only, not to {engine}"
    return None


def _gradcheck_plan(get) -> Plan:
    problem = _gradcheck_problem(get)
    if problem:
        raise _OptionError(problem)
    try:
        if get("inject"):
            parse_injection(get("inject"))
    except ValueError as exc:
        raise _OptionError(f"--gradcheck-inject: {exc}") from None
    backends = tuple(dict.fromkeys(get("backend") or ["cpu"]))
    for name in backends:
        get_backend(name)
    options = {"lib_dir": os.path.abspath(get("ggml-lib"))} if get("ggml-lib") else {}
    if get("ggml-threads") is not None:
        options["n_threads"] = get("ggml-threads")
    adapter = _adapter(get("engine"), options)
    timeout = get("case-timeout") or DEFAULT_CASE_TIMEOUT
    names = list(get("op") or checkable_ops())
    updates = [n for n in names if get_op(n).kind == "update"]
    if updates:
        raise _OptionError(f"{', '.join(updates)}: optimizer steps have no gradient to check; "
                          f"check them with optcheck (pytest --optcheck)")
    samples = select_samples(names, get("dtype"), get("filter"), get("tier"))
    if not samples and not get("random"):
        raise _OptionError(f"no sample case of {', '.join(names)} matches dtype={get('dtype')} "
                          f"filter={get('filter')!r} tier={get('tier')}")
    engine = _Engine(adapter, timeout)
    described = describe_engines(adapter, backends)
    meta = {"engine": described} | ({"injected": get("inject")} if get("inject") else {})
    return Plan("gradcheck", _gradcheck_jobs(get, names, samples, backends, engine),
                f"engine under test: {described}", meta, None, engine)


def _gradcheck_jobs(get, names, samples, backends, engine) -> list[Job]:
    """The registry cases, each on every backend (ours) or in the one engine, then one
    generated run per op (and backend), as check_ops orders them; a name ends in
    `[BACKEND]` when there are several."""
    if engine.adapter is not None:
        backends = ("cpu",)
    tag = (lambda b: f"[{b}]") if len(backends) > 1 else (lambda b: "")
    where = ((lambda b: {"backend": b}) if engine.adapter is None else
             (lambda b: {"engine": engine.adapter.name}))
    jobs = [Job(str(case) + tag(b), functools.partial(_check_case, get, engine, case, b),
                {"op": case.op} | where(b))
            for case in samples for b in backends]
    if get("random"):
        jobs += [Job(f"{name}(generated)" + tag(b),
                     functools.partial(_generated, get, engine, name, b),
                     {"op": name} | where(b))
                 for name in names for b in backends]
    return jobs


def _check_case(get, engine, case, backend) -> list[Result]:
    """What `gradcheck --op` runs for this one case (gradcheck.runner.run_checks)."""
    return run_checks([case], get("inject"), False, get("mode"), (backend,),
                      not get("no-torch"), engine.running(), engine.case_timeout)


def _generated(get, engine, name, backend) -> list[Result]:
    """What `gradcheck --op NAME --random N` adds for the op: its generated cases."""
    adapter = engine.running()
    if adapter is None:
        return generated_results(name, get("random"), get("seed"), get("dtype"), get("mode"),
                                 backend, get("inject"), not get("no-torch"))
    return generated_results(name, get("random"), get("seed"), get("dtype"), get("mode"),
                             use_torch=not get("no-torch"), adapter=adapter,
                             case_timeout=engine.case_timeout)


def _chosen(values, known, flag: str) -> tuple:
    """`values` (None or containing "all": every one of `known`), each checked."""
    for v in values or ():
        if v != "all" and v not in known:
            raise _OptionError(f"{flag} must be one of {', '.join([*known, 'all'])}, got {v!r}")
    if not values or "all" in values:
        return tuple(known)
    return tuple(dict.fromkeys(values))


def _optcheck_plan(get) -> Plan:
    from optcheck.harness import DTYPES as OPT_DTYPES
    from optcheck.harness import OPTIMIZER_NAMES
    from optcheck.runner import FAMILIES, MAX_STEPS, run_family

    optimizers = _chosen(get("opt"), OPTIMIZER_NAMES, "--optcheck-opt")
    families = _chosen(get("family"), tuple(FAMILIES), "--optcheck-family")
    dtypes = _chosen([get("dtype")], OPT_DTYPES, "--optcheck-dtype")
    if not 1 <= get("steps") <= MAX_STEPS:
        raise _OptionError(f"--optcheck-steps must lie in [1, {MAX_STEPS}], got "
                           f"{get('steps')}")
    backend, steps, seed = get("backend"), get("steps"), get("seed")
    get_backend(backend)
    jobs = [Job(f"{o}: {f}(type={d})",
                functools.partial(run_family, f, o, d, backend, steps, seed),
                {"optimizer": o, "family": f, "backend": backend, "dtype": d})
            for f in families for o in optimizers for d in dtypes]
    return Plan("optcheck", jobs, f"backend {backend}, {steps} steps, seed {seed}", {}, None)
