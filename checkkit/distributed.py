"""The command lines' `--workers N`: a request's items (checkkit.sweep) on N local processes
with pytest-xdist, in a hermetic pytest run inside the command line's process; the rows come
back in the serial order, and the command line prints its usual report of them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys
import tempfile

import pytest

from checkkit.interrupted import Interrupted, signal_of, sigterm_interrupts
from checkkit.loading import ADAPTER_DIR_VARIABLE
from checkkit.sweep import is_signal, sweep_name

MAX_WORKERS = 256       # the CLIs' `--workers N`: N processes on this machine, 1 <= N <= 256


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


class _Collect:
    """A pytest plugin object for run_items: takes the rows of `tool`'s sweep at the end of
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
        from checkkit.usage import warning_line
        line = warning_line(self.tool, warning_message.message, warning_message.category)
        if line not in self.warned:
            self.warned.add(line)
            sys.stderr.write(line + "\n")

    def pytest_sessionfinish(self, session):
        if self.bar is not None:
            self.bar.close()
        sweep = session.config.pluginmanager.get_plugin(sweep_name(self.tool))
        if sweep is not None:
            self.rows = sweep.results()


# environment variables that hold paths: made absolute before a run leaves the user's directory
_PATH_VARIABLES = ("NUMBA_CACHE_DIR", "HYPOTHESIS_STORAGE_DIRECTORY", "GRADVERIFY_CACHE",
                   "XDG_CACHE_HOME", "PYTHONPYCACHEPREFIX")


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


def run_items(request, workers: int, progress: bool = False) -> list:
    """Run the items of `request` (a tool's request, checkkit.request) under pytest-xdist
    with `workers` local processes (`pytest -n N`, in this process), the request's plugin
    given its options (request.plugin_args); their rows, in the serial CLI's order.

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
    tool = request.tool
    collect = _Collect(tool, progress)
    stopped: list[BaseException] = []
    with tempfile.TemporaryDirectory(prefix="gradverify-sweep-") as tmp:
        run_dir = os.path.join(tmp, "run")
        os.mkdir(run_dir)
        ini = os.path.join(tmp, "pytest.ini")
        with open(ini, "w", encoding="utf-8") as f:
            f.write("[pytest]\n")
        args = ["-c", ini, "--rootdir", run_dir, "--confcutdir", run_dir, "--noconftest",
                "-p", "xdist.plugin", "-p", request.plugin, "-p", "no:cacheprovider",
                "--assert=plain", "-q", "-n", str(workers), *request.plugin_args()]
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


def distributed_rows(request, workers: int, progress: bool = False) -> list:
    """run_items for a command line: a run that ends before reporting its rows is a
    UsageProblem (exit status 2, one line) instead of a SweepError."""
    from checkkit.jobs import UsageProblem
    try:
        return run_items(request, workers, progress)
    except SweepError as exc:
        raise UsageProblem(str(exc)) from None
