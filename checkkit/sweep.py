"""A tool's cases as pytest items, so that pytest-xdist spreads a sweep over processes
(`-n auto`) and hosts (`--tx ssh=...`, `--tx socket=...`): the machinery of each tool's
pytest plugin (gradcheck.pytest_plugin, optcheck.pytest_plugin); the command lines'
`--workers N` runs the same items (checkkit.distributed).

    pytest --gradcheck -n auto                           what `gradcheck --all` checks
    pytest --gradcheck --gradcheck-op pool_2d --gradcheck-engine ggml -n auto
    pytest --gradcheck --gradcheck-tier scale --gradcheck-json=report.json -n auto
    pytest --optcheck --optcheck-opt adam -n 2 --junitxml=optcheck.xml

A tool's plugin is a ToolPlugin of its request class (checkkit.request): its options,
`--TOOL-NAME`, are the request's fields, plus `--TOOL` (collect the items) and `--TOOL-json
FILE`. It is idle, and imports nothing heavy, unless `--TOOL` is given. Then the request
is validated as the command line validates it, and its Plan's jobs (checkkit.jobs) become
the items, collected without any test file under one session-level collector per tool,
`gradcheck::CASE` and `optcheck::CASE` (`gradcheck::OP[CASE]` where the case string holds a
"[": item_name), in the same order in every xdist worker; each item
runs exactly what the command line runs for that job.

An item fails when one of its rows fails, errs or crashes (the report: each such row's
message and repro command, failure_text), is skipped when every row is skipped or
unsupported (with their messages), and passes otherwise. Each call report carries the
item's rows as plain data in `report.gradverify_rows`, which xdist serialises to the
controller, and their status and repro commands as `user_properties` (which --junitxml
writes). On the controller `--TOOL-json FILE` writes every row, in the command line's order,
as the gradverify.results/1 document that `TOOL --format json` writes (reports.render,
written atomically); its meta.argv is pytest's.

Every xdist worker, like the command lines and the tests, loads and compiles our kernels in
the one numba cache (NUMBA_CACHE_DIR, else <checkkit.cache.default_cache_dir()>/numba: see
checkkit.cache), which the engine makes safe for processes sharing it
(engine.backends.cpu.disk_cache): a warm command line makes warm workers.
"""

from __future__ import annotations

import os
import re

import pytest

from checkkit.interrupted import (
    interrupted_meta,
    signal_of,
    signal_word,
    sigterm_interrupts,
)
from checkkit.jobs import UsageProblem

SIGNALS_PLUGIN = "gradverify-signals"     # the controller's SIGTERM handler, one per session


def sweep_name(tool: str) -> str:
    """The name a tool's Sweep registers under with pytest's plugin manager."""
    return f"gradverify-sweep-{tool}"


# --- an item's verdict: the same for the plugin's items and for gradcheck.pytest's helpers --
class RowsFailed(AssertionError):
    """Rows that failed, erred or crashed; the message is failure_text(rows)."""

    def __init__(self, rows):
        self.rows = list(rows)
        super().__init__(failure_text(self.rows))


def failure_text(rows) -> str:
    """Per row that is not ok: `CASE: STATUS: MESSAGE`, then `reproduce: COMMAND` unless the
    message already ends with it (crashes and shrunk generated cases say it there)."""
    lines = []
    for row in rows:
        if row.ok and row.status != "vacuous":
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


def judge_rows(rows, failure: type[RowsFailed] = RowsFailed) -> list:
    """`rows` when none failed and not all were skipped; else raise `failure` (any row
    failed, erred, crashed or was vacuous: a test that could not fail is no test) or
    pytest's skip (every row skipped or unsupported)."""
    rows = list(rows)
    if any(not r.ok or r.status == "vacuous" for r in rows):
        raise failure(rows)
    reason = skip_reason(rows)
    if reason:
        pytest.skip(reason)
    return rows


# --- a tool's plugin ------------------------------------------------------------------------
class ToolPlugin:
    """The pytest hooks of one tool's plugin, made from its request class; the tool's
    plugin module binds them at module level (pytest_addoption, pytest_configure)."""

    def __init__(self, request_class):
        self.request_class = request_class
        self.tool = request_class.tool

    def dest(self, name: str) -> str:
        return f"{self.tool}_{name.replace('-', '_')}"

    def options(self) -> list[tuple[str, dict]]:
        """The --TOOL-* options: the request's fields, then `json`."""
        return [*self.request_class.plugin_options(),
                ("json", {"metavar": "FILE", "help": "write every worker's rows to FILE as "
                                                     "one gradverify.results/1 document"})]

    def pytest_addoption(self, parser):
        tool = self.tool
        group = parser.getgroup(tool, f"{tool} cases as items (gradverify)")
        group.addoption(f"--{tool}", action="store_true",
                        help=f"collect {tool}'s cases as items (see --{tool}-* below)")
        for name, kwargs in self.options():
            group.addoption(f"--{tool}-{name}", dest=self.dest(name), **kwargs)

    def stray_option(self, config) -> str | None:
        """The first --TOOL-* option given a value other than its default (None if none)."""
        for name, kwargs in self.options():
            default = kwargs.get("default", False if kwargs.get("action") == "store_true"
                                 else None)
            if config.getoption(self.dest(name)) != default:
                return f"--{self.tool}-{name}"
        return None

    def pytest_configure(self, config):
        if not config.getoption(self.tool):
            stray = self.stray_option(config)
            if stray:
                raise pytest.UsageError(f"{stray} applies to --{self.tool}, which is not given")
            return
        reporter = None
        if hasattr(config, "workerinput"):
            _one_line_warnings(self.tool)
            from checkkit.compiling import report_compiles
            reporter = report_compiles()     # to the command line's progress (--workers)
        elif not config.pluginmanager.has_plugin(SIGNALS_PLUGIN):
            config.pluginmanager.register(_Signals(), SIGNALS_PLUGIN)
        plan = self.make_plan(config)
        if reporter is not None:
            from checkkit.compiling import watch_jobs
            watch_jobs(plan.jobs, reporter)           # each compilation named by its job
        config.pluginmanager.register(Sweep(config, self.tool, plan), sweep_name(self.tool))
        if config.args_source != pytest.Config.ArgsSource.ARGS:
            config.args = []    # no paths given: collect the sweep's items, no test files

    def make_plan(self, config):
        """The Plan of the request the options in `config` make; pytest.UsageError, in one
        line, on an option the command line would refuse. The JSON file is the
        controller's (an xdist worker, maybe on another host, neither checks nor writes
        it)."""
        from reports import first_unwritable
        tool = self.tool
        path = None
        given = config.getoption(self.dest("json"))
        if given and not hasattr(config, "workerinput"):
            path = os.path.abspath(given)
            problem = first_unwritable(path)
            if problem:
                raise pytest.UsageError(f"--{tool}-json: {problem}")
        try:
            request = self.request_class.from_plugin(
                lambda name: config.getoption(self.dest(name)))
            problem = request.problem(request.plugin_flag)
            if problem:
                raise UsageProblem(problem)
            plan = request.plan()
        except UsageProblem as exc:
            raise pytest.UsageError(f"{tool}: {exc}") from None
        plan.json = path
        return plan


def _one_line_warnings(tool: str) -> None:
    """An xdist worker's warnings that reach its stderr (the terminal's), such as those of
    loading the engine while the items are made, as the tools print them: one line,
    `TOOL: warning: ...` (checkkit.usage.warning_line). Those raised while an item runs
    are pytest's to record (the CLIs' --workers prints them, _Collect)."""
    from checkkit.usage import format_warnings_as
    format_warnings_as(tool)


def item_name(job_name: str) -> str:
    """The pytest name of the item of job `job_name`: the job's name, or, where that holds a
    "[", `OP[JOB_NAME]` (OP: the name up to its first "(", ":" or "["). pytest reads an
    id's parameters from its first "[" to a "]" that ends it (NodeId.parse, which a report
    from an xdist worker and --junitxml go through): `relu(type=f32,x=[3,4])` would come
    back as `relu(type=f32,x=[3,4])]`; `relu[relu(type=f32,x=[3,4])]` comes back whole, the
    case string, which `-k` and the command line's `-k` take, inside the brackets."""
    if "[" not in job_name:
        return job_name
    return f"{re.match(r'[^([:]*', job_name).group().strip()}[{job_name}]"


class SweepItem(pytest.Item):
    """A case of a tool (or a generated or family run) as a pytest item."""

    def __init__(self, *, job, **kwargs):
        super().__init__(**kwargs)
        self.job = job
        self.rows = None

    def runtest(self):
        self.rows = self.job.run()
        for row in self.rows:
            status = row.status if row.name == self.job.name else f"{row.status}: {row.name}"
            self.user_properties.append(("status", status))
            if "repro" in row.metrics:
                self.user_properties.append(("repro", row.metrics["repro"]))
        judge_rows(self.rows)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, RowsFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.parent.name}: {self.job.name}"


class SweepCollector(pytest.Collector):
    """The items of one tool, collected under the session (no file behind them)."""

    def __init__(self, *, jobs, **kwargs):
        super().__init__(**kwargs)
        self.jobs = jobs

    def collect(self):
        return [SweepItem.from_parent(self, name=item_name(job.name), job=job) for job in self.jobs]


def is_signal(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt that ended a pytest session is the user's Ctrl-C or a
    SIGTERM (checkkit.interrupted.Terminated), not pytest's own stop (xdist's
    `--maxfail`, Session.Interrupted) or pytest.exit."""
    return isinstance(exc, KeyboardInterrupt) and not isinstance(exc, pytest.Session.Interrupted)


class _Signals:
    """On the controller, one per session whatever the tools: SIGTERM stops the session as
    Ctrl-C does (checkkit.interrupted), and the signal that stopped it is kept (`signum`)
    for the sweeps to mark their reports."""

    def __init__(self):
        self.signum: int | None = None
        self._sigterm = sigterm_interrupts()
        self._sigterm.__enter__()

    def pytest_keyboard_interrupt(self, excinfo):
        if is_signal(excinfo.value) and self.signum is None:
            self.signum = signal_of(excinfo.value)

    def pytest_unconfigure(self, config):
        if self._sigterm is not None:
            self._sigterm.__exit__(None, None, None)
            self._sigterm = None


class Sweep:
    """The plugin's state for one tool in one pytest process (controller or worker): its
    plan's jobs, the rows that came back, by item, and the JSON document to write.

    On the controller either Ctrl-C or SIGTERM (_Signals) ends the session with the
    finished rows written to the JSON file, `meta.interrupted` and `meta.signal` set (and
    the JUnit file's `interrupted` property), one summary line saying so, and exit status
    130 (143 for SIGTERM); xdist ends the workers."""

    def __init__(self, config, tool: str, plan):
        self.config, self.tool, self.plan = config, tool, plan
        self.index = {f"{tool}::{item_name(job.name)}": i for i, job in enumerate(plan.jobs)}
        self.rows: dict[int, list] = {}
        self.written: list[str] = []

    def pytest_report_header(self, config):
        return [f"{self.tool}: {len(self.plan.jobs)} items; {self.plan.describe}"]

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector):
        report = yield
        if isinstance(collector, pytest.Session) and report.passed:
            report.result.append(SweepCollector.from_parent(
                collector, name=self.tool, nodeid=self.tool, jobs=self.plan.jobs))
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if (isinstance(item, SweepItem) and item.parent.name == self.tool
                and call.when == "call" and item.rows is not None):
            from reports.json_report import jsonable
            report.gradverify_rows = [jsonable(r.to_dict()) for r in item.rows]
        return report

    def pytest_runtest_logreport(self, report):
        i = self.index.get(report.nodeid)
        if i is None:
            return
        rows = getattr(report, "gradverify_rows", None)
        if rows is not None:
            from reports import Result
            self.rows[i] = [Result(**row) for row in rows]
        elif report.failed and i not in self.rows:
            status = "crash" if report.when == "???" else "error"   # xdist: its worker died
            lines = str(report.longrepr).strip().splitlines() or ["no report"]
            self.rows[i] = [self.plan.lost_row(i, status, lines[-1])]

    def results(self) -> list:
        """The rows of the items that ran, in collection order (the CLI's)."""
        return [row for i in sorted(self.rows) for row in self.rows[i]]

    def _signum(self) -> int | None:
        signals = self.config.pluginmanager.get_plugin(SIGNALS_PLUGIN)
        return None if signals is None else signals.signum

    @pytest.hookimpl(tryfirst=True)     # before junitxml writes its file
    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workerinput") or self.config.option.collectonly:
            return
        from reports import OutputError
        signum = self._signum()
        marked = {} if signum is None else interrupted_meta(signum)
        if marked:
            session.exitstatus = 128 + signum
            xml = self._junit()
            if xml is not None and ("interrupted", "true") not in xml.global_properties:
                xml.add_global_property("interrupted", "true")
                xml.add_global_property("signal", marked["signal"])
        how = f"{signal_word(signum)}; " if marked else ""
        done, plan = self.results(), self.plan
        if plan.json:
            try:
                self.write_json(done, marked)
            except OutputError as exc:     # says which file and why
                if not marked:
                    session.exitstatus = pytest.ExitCode.USAGE_ERROR
                self.written.append(f"{self.tool}: {how}{exc}")
            else:
                partial = " finished before it, marked interrupted" if marked else ""
                self.written.append(f"{self.tool}: {how}wrote {plan.json} ({len(done)} "
                                    f"results{partial})")
        elif marked:
            self.written.append(f"{self.tool}: {how}{len(done)} results finished before it")

    def write_json(self, results, extra=None) -> None:
        """The rows as the gradverify.results/1 document, atomically; `extra`: more meta
        (an interrupted run's `interrupted` and `signal`)."""
        from reports import render, write_atomic
        meta = {"argv": [str(a) for a in self.config.invocation_params.args],
                **self.plan.meta, **(extra or {})}
        write_atomic(self.plan.json, render(results, "json", self.tool, meta))

    def _junit(self):
        """junitxml's LogXML of this session, None without --junitxml."""
        try:
            from _pytest.junitxml import xml_key
        except ImportError:       # pragma: no cover  (pytest moved it)
            return None
        return self.config.stash.get(xml_key, None)

    def pytest_terminal_summary(self, terminalreporter):
        for line in self.written:
            terminalreporter.write_line(line)

    def pytest_unconfigure(self, config):
        self.plan.close()
