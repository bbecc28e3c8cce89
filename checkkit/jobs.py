"""A tool's work as a list of jobs, and the one way to run them in order.

A request (checkkit.request) makes a Plan: its jobs, in the order of the report (a case,
a generated run of one op, a family run of one optimizer), the line that says what runs,
the report's meta, and what to close afterwards (a worker process kept across jobs). The
serial command line runs the jobs here (run_jobs); `--workers N` and `pytest --TOOL` run the
same jobs as pytest items (checkkit.sweep), one job per item, and put their rows back in
this order. A helper process that runs some of the jobs ahead of the run (checkkit.share)
says how many it has finished (done_elsewhere), and the progress bar counts them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

from checkkit.interrupted import interrupted_with
from reports import Result


class UsageProblem(ValueError):
    """A request that cannot run as given (a bad option value, an unknown op, an engine that
    cannot be set up), in one line: the command line's exit status 2, the plugin's usage
    error."""


@dataclasses.dataclass
class Job:
    """One unit of a tool's work: its name (the case string, or `OP(generated)`, or
    `OPTIMIZER: FAMILY(type=DTYPE)`), what it runs (a list of Results), and the labels of
    the row that stands for it when it dies without rows."""

    name: str
    run: Callable[[], list]
    labels: dict


@dataclasses.dataclass
class Plan:
    """A request's jobs in the report's order, the line that describes the run (`engine
    under test: ...`), the report's meta (less argv), and `close`, which frees what the
    jobs share (an isolated engine's worker). A context manager: leaving it closes."""

    tool: str
    jobs: list[Job]
    describe: str
    meta: dict
    close: Callable[[], None] = lambda: None
    json: str | None = None        # the plugin's --TOOL-json file (checkkit.sweep)

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def lost_row(self, index: int, status: str, last_line: str) -> Result:
        """The row of job `index` when it ended without rows ("crash": its process died;
        "error"), with the last line of what was reported."""
        job = self.jobs[index]
        return Result(self.tool, job.name, status, message=f"{status}: {last_line}",
                      labels=dict(job.labels))


# id(jobs) -> how many of those jobs, not reached by the run yet, a helper has finished
_ELSEWHERE: dict[int, Callable[[], int]] = {}


@contextlib.contextmanager
def done_elsewhere(jobs, count: Callable[[], int]):
    """While the block runs, run_jobs' progress bar over `jobs` counts `count()` more jobs
    done: those a helper has finished ahead of the run (their rows handed back, not yet
    taken), so that the bar's rate and its estimate of the time left are the two
    processes'."""
    _ELSEWHERE[id(jobs)] = count
    try:
        yield
    finally:
        _ELSEWHERE.pop(id(jobs), None)


def run_jobs(jobs, progress: bool = False, desc: str = "", unit: str = "case") -> list:
    """Every job's rows, in order, with a progress bar when `progress` (done_elsewhere's
    jobs counted too). Ctrl-C (or SIGTERM, checkkit.interrupted) raises Interrupted with the
    rows of the jobs finished before it."""
    from tqdm import tqdm

    results: list = []
    elsewhere = _ELSEWHERE.get(id(jobs), lambda: 0)
    try:
        with tqdm(total=len(jobs), desc=desc, unit=unit, disable=not progress,
                  leave=False) as bar:
            for i, job in enumerate(jobs, 1):
                results += job.run()
                bar.update(min(len(jobs), i + elsewhere()) - bar.n)
    except KeyboardInterrupt as exc:       # Ctrl-C: the finished rows go with it
        raise interrupted_with(results, exc) from None
    return results


@contextlib.contextmanager
def usage_problems(*kinds: type[BaseException]):
    """Exceptions of `kinds` raised inside become UsageProblem, with their message."""
    try:
        yield
    except kinds as exc:
        raise UsageProblem(str(exc)) from None
