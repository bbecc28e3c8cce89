"""The pytest plugin: gradcheck's and optcheck's cases as pytest items, so that pytest-xdist
spreads a sweep over processes (`-n auto`) and hosts (`--tx ssh=...`, `--tx socket=...`).

    pytest --gradcheck -n auto                           what `gradcheck --all` checks
    pytest --gradcheck --gradcheck-op pool_2d --gradcheck-engine ggml -n auto
    pytest --gradcheck --gradcheck-random 200 --gradcheck-seed 0 -n auto
    pytest --gradcheck --gradcheck-tier scale --gradcheck-json=report.json -n auto
    pytest --optcheck --optcheck-opt adam -n 2 --junitxml=optcheck.xml

The package registers it (entry point `pytest11`); it is idle, and imports nothing of ours
(gradcheck.pytest makes the items), unless --gradcheck or --optcheck is given. Then the
items are collected without any test file: under one session-level collector per tool,
`gradcheck::CASE` and `optcheck::CASE` (pytest collects no files unless paths are given on
the command line), in the same order in every xdist worker:

- gradcheck: one item per case that `gradcheck` selects with the same options (the
  registry's cases of the tier, gradcheck.runner.select_samples), named by its case string
  (and `[BACKEND]` when more than one backend is checked); it runs exactly what the CLI
  runs for that case, gradcheck.runner.run_checks (repro commands included). With
  --gradcheck-random N, one item per op (and backend), `OP(generated)`, runs that op's
  generated cases, gradcheck.generated.generated_results (hypothesis shrinks a failure
  within the one call). An isolated engine (ggml) runs in one worker process per pytest
  process, kept across items, restarted after a crash.
- optcheck: one item per family, optimizer and dtype, `adam: torch(type=f32)`, runs
  optcheck.runner.run_family; its rows are that family's scenarios.

An item fails when one of its rows fails, errs or crashes (the report: each such row's
message and repro command, gradcheck.pytest.failure_text), is skipped when every row is
skipped or unsupported (with their messages), and passes otherwise. Each call report
carries the item's rows as plain data in `report.gradverify_rows`, which xdist serialises
to the controller, and their status and repro commands as `user_properties` (which
--junitxml writes). On the controller --gradcheck-json FILE (--optcheck-json FILE) writes
every row, in the CLI's order, as the gradverify.results/1 document that `gradcheck
--format json` writes (reports.render, written atomically); its meta.argv is pytest's.

`gradcheck --workers N` and `optcheck --workers N` call run_items: these items, with
`-n N`, in a hermetic pytest run in the CLI's process; the rows come back in the CLI's
order, and the CLI prints its usual report of them.

An xdist worker compiles into a numba cache of its own, `$NUMBA_CACHE_DIR/xdist-gwN`
(default base: ~/.cache/gradverify/numba), as the project's tests do: numba's disk cache is
not safe for two processes compiling one kernel at once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys
import tempfile

import pytest

TOOLS = ("gradcheck", "optcheck")
SWEEP_PLUGIN = "gradverify-sweep"       # the name the plugin's state registers under
MAX_WORKERS = 256       # the CLIs' `--workers N`: N processes on this machine, 1 <= N <= 256

# (option name after --TOOL-, argparse keywords); defaults are what the CLIs default to
GRADCHECK_OPTIONS = (
    ("op", {"action": "append", "metavar": "NAME",
            "help": "op to check (repeatable; default: every op with sample cases)"}),
    ("dtype", {"default": "all", "metavar": "f32|f64|all", "help": "default all"}),
    ("filter", {"metavar": "TEXT", "help": "only cases whose string contains TEXT "
                                           "(gradcheck -k)"}),
    ("tier", {"default": "fast", "metavar": "fast|scale|all", "help": "default fast"}),
    ("random", {"type": int, "default": 0, "metavar": "N",
                "help": "also N generated cases per op: one item per op"}),
    ("seed", {"type": int, "default": 0, "metavar": "S", "help": "of the generated cases"}),
    ("engine", {"default": "engine", "metavar": "NAME",
                "help": "engine under test: engine (ours), torch, ggml, module:attribute"}),
    ("backend", {"action": "append", "metavar": "NAME",
                 "help": "backend of our engine (repeatable; default cpu)"}),
    ("mode", {"default": "auto", "metavar": "auto|full|fast", "help": "default auto"}),
    ("inject", {"metavar": "MUTATION[:FACTOR]", "help": "a known bug in our engine"}),
    ("no-torch", {"action": "store_true", "help": "leave out the torch reference"}),
    ("ggml-lib", {"metavar": "DIR", "help": "with --gradcheck-engine ggml: its libraries"}),
    ("ggml-threads", {"type": int, "metavar": "N", "help": "ggml's compute threads"}),
    ("case-timeout", {"type": float, "metavar": "SECONDS",
                      "help": "an isolated engine's call that takes longer is a crash"}),
    ("json", {"metavar": "FILE", "help": "write every worker's rows to FILE as one "
                                         "gradverify.results/1 document"}),
)
OPTCHECK_OPTIONS = (
    ("opt", {"action": "append", "metavar": "NAME",
             "help": "optimizer (repeatable; default all)"}),
    ("family", {"action": "append", "metavar": "NAME",
                "help": "closed-form, torch, invariant (repeatable; default all)"}),
    ("dtype", {"default": "all", "metavar": "f32|f64|all", "help": "default all"}),
    ("steps", {"type": int, "default": 100, "metavar": "N",
               "help": "steps per trajectory (default 100)"}),
    ("backend", {"default": "cpu", "metavar": "NAME", "help": "default cpu"}),
    ("seed", {"type": int, "default": 0, "metavar": "S", "help": "default 0"}),
    ("json", {"metavar": "FILE", "help": "write every worker's rows to FILE as one "
                                         "gradverify.results/1 document"}),
)
OPTIONS = {"gradcheck": GRADCHECK_OPTIONS, "optcheck": OPTCHECK_OPTIONS}


def _dest(tool: str, name: str) -> str:
    return f"{tool}_{name.replace('-', '_')}"


def pytest_addoption(parser):
    for tool, table in OPTIONS.items():
        group = parser.getgroup(tool, f"{tool} cases as items (gradverify)")
        group.addoption(f"--{tool}", action="store_true",
                        help=f"collect {tool}'s cases as items (see --{tool}-* below)")
        for name, kwargs in table:
            group.addoption(f"--{tool}-{name}", dest=_dest(tool, name), **kwargs)


def _stray_option(config, tool: str) -> str | None:
    """The first --TOOL-* option given a value other than its default (None if none)."""
    for name, kwargs in OPTIONS[tool]:
        if config.getoption(_dest(tool, name)) != kwargs.get(
                "default", False if kwargs.get("action") == "store_true" else None):
            return f"--{tool}-{name}"
    return None


def pytest_configure(config):
    tools = [t for t in TOOLS if config.getoption(t)]
    for tool in set(TOOLS) - set(tools):
        stray = _stray_option(config, tool)
        if stray:
            raise pytest.UsageError(f"{stray} applies to --{tool}, which is not given")
    if not tools:
        return
    if hasattr(config, "workerinput"):
        _worker_numba_cache(config.workerinput["workerid"])
        _one_line_warnings(tools[0])
    config.pluginmanager.register(Sweep(config, tools), SWEEP_PLUGIN)
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = []        # no paths given: collect the sweep's items, no test files


def _one_line_warnings(tool: str) -> None:
    """An xdist worker's warnings that reach its stderr (the terminal's), such as those of
    loading the engine while the items are made, as the tools print them: one line,
    `TOOL: warning: ...` (gradcheck.usage.warning_line). Those raised while an item runs
    are pytest's to record (the CLIs' --workers prints them, _Collect)."""
    import warnings

    from gradcheck.usage import warning_line
    warnings.formatwarning = (lambda message, category, filename, lineno, line=None:
                              warning_line(tool, message, category) + "\n")


def _worker_numba_cache(worker: str) -> None:
    """NUMBA_CACHE_DIR of this xdist worker: `<base>/xdist-<worker>`, base the variable's
    value or ~/.cache/gradverify/numba; left as it is when it already names this worker
    (as the project's tests/conftest.py sets it) or when numba is loaded already (numba
    reads it on import: too late)."""
    if "numba" in sys.modules:
        return
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(cache, "gradverify", "numba")
    leaf = f"xdist-{worker}"
    if os.path.basename(os.path.normpath(base)) != leaf:
        os.environ["NUMBA_CACHE_DIR"] = os.path.join(base, leaf)


class SweepItem(pytest.Item):
    """A gradcheck or optcheck case (or a generated or family run) as a pytest item."""

    def __init__(self, *, job, **kwargs):
        super().__init__(**kwargs)
        self.job = job
        self.rows = None

    def runtest(self):
        from gradcheck.pytest import judge_rows
        self.rows = self.job.run()
        for row in self.rows:
            self.user_properties.append(
                ("status", row.status if row.name == self.name else f"{row.status}: {row.name}"))
            if "repro" in row.metrics:
                self.user_properties.append(("repro", row.metrics["repro"]))
        judge_rows(self.rows)

    def repr_failure(self, excinfo, style=None):
        from gradcheck.pytest import GradcheckFailure
        if isinstance(excinfo.value, GradcheckFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.parent.name}: {self.name}"


class SweepCollector(pytest.Collector):
    """The items of one tool, collected under the session (no file behind them)."""

    def __init__(self, *, jobs, **kwargs):
        super().__init__(**kwargs)
        self.jobs = jobs

    def collect(self):
        return [SweepItem.from_parent(self, name=job.name, job=job) for job in self.jobs]


def is_signal(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt that ended a pytest session is the user's Ctrl-C or a
    SIGTERM (gradcheck.interrupted.Terminated), not pytest's own stop (xdist's
    `--maxfail`, Session.Interrupted) or pytest.exit."""
    return isinstance(exc, KeyboardInterrupt) and not isinstance(exc, pytest.Session.Interrupted)


class Sweep:
    """The plugin's state in one pytest process (controller or worker): each tool's jobs,
    the rows that came back, by item, and the JSON documents to write.

    On the controller, SIGTERM stops the session as Ctrl-C does (gradcheck.interrupted);
    either ends it with the finished rows written to the JSON files, `meta.interrupted`
    and `meta.signal` set (and the JUnit file's `interrupted` property), one summary line
    saying so, and exit status 130 (143 for SIGTERM); xdist ends the workers."""

    def __init__(self, config, tools):
        from gradcheck.pytest import make_plan
        self.config = config
        self.plans = {tool: make_plan(tool, config) for tool in tools}
        self.index = {f"{tool}::{job.name}": (tool, i) for tool, plan in self.plans.items()
                      for i, job in enumerate(plan.jobs)}
        self.rows: dict[str, dict[int, list]] = {tool: {} for tool in tools}
        self.written: list[str] = []
        self.signum: int | None = None       # the signal that interrupted the session
        self._sigterm = None
        if not hasattr(config, "workerinput"):
            from gradcheck.interrupted import sigterm_interrupts
            self._sigterm = sigterm_interrupts()
            self._sigterm.__enter__()

    def pytest_keyboard_interrupt(self, excinfo):
        if is_signal(excinfo.value) and self.signum is None:
            from gradcheck.interrupted import signal_of
            self.signum = signal_of(excinfo.value)

    def pytest_report_header(self, config):
        return [f"{tool}: {len(plan.jobs)} items; {plan.describe}"
                for tool, plan in self.plans.items()]

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector):
        report = yield
        if isinstance(collector, pytest.Session) and report.passed:
            report.result.extend(SweepCollector.from_parent(collector, name=tool, nodeid=tool,
                                                            jobs=plan.jobs)
                                 for tool, plan in self.plans.items())
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if isinstance(item, SweepItem) and call.when == "call" and item.rows is not None:
            from reports.json_report import jsonable
            report.gradverify_rows = [jsonable(r.to_dict()) for r in item.rows]
        return report

    def pytest_runtest_logreport(self, report):
        where = self.index.get(report.nodeid)
        if where is None:
            return
        tool, i = where
        rows = getattr(report, "gradverify_rows", None)
        if rows is not None:
            from reports import Result
            self.rows[tool][i] = [Result(**row) for row in rows]
        elif report.failed and i not in self.rows[tool]:
            self.rows[tool][i] = [self.plans[tool].lost_row(i, report)]

    def results(self, tool: str) -> list:
        """The rows of `tool`'s items that ran, in collection order (the CLI's)."""
        got = self.rows.get(tool, {})
        return [row for i in sorted(got) for row in got[i]]

    def _interruption(self) -> dict:
        """The meta entries of an interrupted session ({} when it was not)."""
        if self.signum is None:
            return {}
        from gradcheck.interrupted import interrupted_meta
        return interrupted_meta(self.signum)

    @pytest.hookimpl(tryfirst=True)     # before junitxml writes its file
    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workerinput") or self.config.option.collectonly:
            return
        from gradcheck.interrupted import signal_word
        from reports import OutputError
        marked = self._interruption()
        if marked:
            session.exitstatus = 128 + self.signum
            xml = self._junit()
            if xml is not None:
                xml.add_global_property("interrupted", "true")
                xml.add_global_property("signal", marked["signal"])
        how = f"{signal_word(self.signum)}; " if marked else ""
        for tool, plan in self.plans.items():
            done = self.results(tool)
            if plan.json:
                try:
                    plan.write_json(done, self.config, marked)
                except OutputError as exc:     # says which file and why
                    if not marked:
                        session.exitstatus = pytest.ExitCode.USAGE_ERROR
                    self.written.append(f"{tool}: {how}{exc}")
                else:
                    partial = " finished before it, marked interrupted" if marked else ""
                    self.written.append(f"{tool}: {how}wrote {plan.json} ({len(done)} "
                                        f"results{partial})")
            elif marked:
                self.written.append(f"{tool}: {how}{len(done)} results finished before it")

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
        if self._sigterm is not None:
            self._sigterm.__exit__(None, None, None)
            self._sigterm = None
        for plan in self.plans.values():
            plan.close()


# --- the CLIs' --workers: this plugin's items on pytest-xdist, in this process ------------
class SweepError(RuntimeError):
    """A distributed run that did not get to report its rows (pytest's usage error, an
    internal error, an interruption); says why in one line."""


def workers_problem(workers: int) -> str | None:
    """Why `--workers N` is unusable (None if it is fine)."""
    if not 1 <= workers <= MAX_WORKERS:
        return f"--workers must lie in [1, {MAX_WORKERS}], got {workers}"
    if importlib.util.find_spec("xdist") is None:
        return "--workers needs pytest-xdist: python -m pip install pytest-xdist"
    return None


def gradcheck_args(op_names=None, dtype: str = "all", pattern: str | None = None, *,
                   random: int = 0, seed: int = 0, inject: str | None = None,
                   mode: str = "auto", backends=("cpu",), use_torch: bool = True,
                   engine: str = "engine", ggml_lib: str | None = None,
                   ggml_threads: int | None = None,
                   case_timeout: float | None = None, tier: str = "fast") -> list[str]:
    """The options of this plugin that select what gradcheck.runner.check_ops with these
    arguments checks; `op_names` None: every checkable op."""
    args = ["--gradcheck", f"--gradcheck-dtype={dtype}", f"--gradcheck-tier={tier}",
            f"--gradcheck-random={random}", f"--gradcheck-seed={seed}",
            f"--gradcheck-mode={mode}", f"--gradcheck-engine={engine}"]
    args += [f"--gradcheck-op={name}" for name in op_names or ()]
    if engine == "engine":          # backends are our engine's
        args += [f"--gradcheck-backend={b}" for b in backends or ()]
    ggml_lib = None if ggml_lib is None else os.path.abspath(ggml_lib)  # the run leaves cwd
    for flag, value in (("filter", pattern), ("inject", inject), ("ggml-lib", ggml_lib),
                        ("ggml-threads", ggml_threads), ("case-timeout", case_timeout)):
        if value is not None:
            args.append(f"--gradcheck-{flag}={value}")
    return args + ([] if use_torch else ["--gradcheck-no-torch"])


def optcheck_args(optimizers, families, dtypes, backend: str = "cpu", steps: int = 100,
                  seed: int = 0) -> list[str]:
    """The options of this plugin that select what optcheck.runner.run_checks with these
    arguments runs."""
    return (["--optcheck", f"--optcheck-backend={backend}", f"--optcheck-steps={steps}",
             f"--optcheck-seed={seed}"]
            + [f"--optcheck-opt={o}" for o in optimizers]
            + [f"--optcheck-family={f}" for f in families]
            + [f"--optcheck-dtype={d}" for d in dtypes])


class _Collect:
    """A pytest plugin object for run_items: takes the sweep's rows of `tool` at the end of
    the session and shows a progress bar of the items done."""

    def __init__(self, tool: str, progress: bool):
        self.tool, self.progress = tool, progress
        self.rows: list | None = None
        self.bar = None
        self.interrupts: list[BaseException] = []      # Ctrl-C or SIGTERM that ended the run
        self.warned: set[str] = set()

    def _start(self, total: int):
        if self.progress and self.bar is None:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=self.tool, unit="case", leave=False)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self._start(len(ids))

    def pytest_collection_finish(self, session):
        self._start(len(session.items))

    def pytest_runtest_logreport(self, report):
        if self.bar is not None and report.when == "call":
            self.bar.update(1)

    def pytest_keyboard_interrupt(self, excinfo):
        if is_signal(excinfo.value):
            self.interrupts.append(excinfo.value)

    def pytest_warning_recorded(self, warning_message, when, nodeid, location):
        """A warning of the run, which pytest's own output (kept from the user) would list:
        each distinct one once, on stderr, in the one line a serial run prints."""
        from gradcheck.usage import warning_line
        line = warning_line(self.tool, warning_message.message, warning_message.category)
        if line not in self.warned:
            self.warned.add(line)
            sys.stderr.write(line + "\n")

    def pytest_sessionfinish(self, session):
        if self.bar is not None:
            self.bar.close()
        sweep = session.config.pluginmanager.get_plugin(SWEEP_PLUGIN)
        if sweep is not None:
            self.rows = sweep.results(self.tool)


# environment variables that hold paths: made absolute before a run leaves the user's directory
_PATH_VARIABLES = ("NUMBA_CACHE_DIR", "HYPOTHESIS_STORAGE_DIRECTORY", "GRADVERIFY_CACHE",
                   "XDG_CACHE_HOME", "PYTHONPYCACHEPREFIX")
# the directory a `module:attr` adapter is imported from, in processes that do not start in
# it (gradcheck.adapters reads it)
ADAPTER_DIR_VARIABLE = "GRADVERIFY_ADAPTER_DIR"


@contextlib.contextmanager
def _hermetic(workdir: str):
    """The surroundings of a CLI's pytest run, its xdist workers' included, restored after:
    no other pytest plugins (only those run_items names: PYTEST_DISABLE_PLUGIN_AUTOLOAD, no
    PYTEST_PLUGINS), no PYTEST_ADDOPTS, and `workdir` (empty, private) as the working
    directory. xdist starts its workers as `python -c ...` in the controller's working
    directory, and `-c` puts that directory first on sys.path: in the user's directory, a
    `random.py` or `xdist.py` lying there would run in every worker. The user's directory is
    kept in ADAPTER_DIR_VARIABLE, for a `module:attr` adapter of theirs, which their command
    line asked for; relative paths in path variables are made absolute first."""
    names = ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_ADDOPTS", "PYTEST_PLUGINS",
             ADAPTER_DIR_VARIABLE, *_PATH_VARIABLES)
    saved = {k: os.environ.get(k) for k in names}
    home = os.getcwd()
    for key in _PATH_VARIABLES:
        if os.environ.get(key):
            os.environ[key] = os.path.abspath(os.environ[key])
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    os.environ.pop("PYTEST_ADDOPTS", None)
    os.environ.pop("PYTEST_PLUGINS", None)
    os.environ.setdefault(ADAPTER_DIR_VARIABLE, home)
    os.chdir(workdir)
    try:
        yield
    finally:
        os.chdir(home)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_items(tool: str, plugin_args: list[str], workers: int,
              progress: bool = False) -> list:
    """Run the items of `tool` ("gradcheck" or "optcheck") that `plugin_args` select, under
    pytest-xdist with `workers` local processes (`pytest -n N`, in this process); their
    rows, in the serial CLI's order.

    The run is hermetic: it reads no configuration file (`-c` names an empty one), no
    conftest.py (`--noconftest`), no cache and no plugin of the user's (only pytest-xdist
    and ours), and it runs from an empty directory of its own (_hermetic), so nothing lying
    in the user's directory runs. pytest's own output is kept from stdout and shown on
    stderr only when the run fails to report.

    Ctrl-C (and SIGTERM) stop it as they stop a serial run: the workers are ended and
    Interrupted is raised with the rows finished so far, in order. Raises SweepError when
    the run ends for another reason before reporting its rows."""
    problem = workers_problem(workers)
    if problem:
        raise SweepError(problem)
    from gradcheck.interrupted import Interrupted, signal_of, sigterm_interrupts
    collect = _Collect(tool, progress)
    stopped: list[BaseException] = []
    with tempfile.TemporaryDirectory(prefix="gradverify-sweep-") as tmp:
        run_dir = os.path.join(tmp, "run")
        os.mkdir(run_dir)
        ini = os.path.join(tmp, "pytest.ini")
        with open(ini, "w", encoding="utf-8") as f:
            f.write("[pytest]\n")
        args = ["-c", ini, "--rootdir", run_dir, "--confcutdir", run_dir, "--noconftest",
                "-p", "xdist.plugin", "-p", __name__, "-p", "no:cacheprovider",
                "--assert=plain", "-q", "-n", str(workers), *plugin_args]
        out = io.StringIO()
        try:
            with _hermetic(run_dir), sigterm_interrupts(), contextlib.redirect_stdout(out):
                code = pytest.main(args, plugins=[collect])
        except KeyboardInterrupt as exc:     # a second Ctrl-C, while pytest was ending
            stopped.append(exc)
            code = pytest.ExitCode.INTERRUPTED
    stopped += collect.interrupts
    if stopped:
        raise Interrupted(collect.rows or [], signal_of(stopped[0]))
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) or collect.rows is None:
        sys.stderr.write(out.getvalue())
        raise SweepError(f"the distributed run (pytest {' '.join(args)}) ended with exit "
                         f"status {int(code)} before reporting its rows")
    return collect.rows
