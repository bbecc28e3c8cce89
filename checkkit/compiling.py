"""A progress line while numba compiles kernels, so that a first run (minutes on a cold
kernel cache) is not silent.

    with compile_progress("gradcheck", "bar"):    # or "lines", or None for nothing
        rows = run(...)

numba fires its "numba:compile" event (numba.core.event) only when a kernel is compiled:
a kernel loaded from the disk cache fires none, so a warm run shows nothing. The listener
counts the compilations and names what they are for: the op (or optimizer) of the job
running (watch_jobs), else the kernel's module (engine.backends.cpu.pool_2d: pool_2d).
"bar": one tqdm line on stderr, "compiling kernels for pool_2d (first run only)", with the
count; "lines": one line per op, for a log (a pipe with --progress); then, either way, one
closing line with the count and the time. Only this
process's compilations are seen: a worker process (--isolate, --workers) compiles unseen.
"""

from __future__ import annotations

import contextlib
import sys
import time

import numba.core.event as numba_event

MODES = ("bar", "lines")
EVENT = "numba:compile"


def kernel_group(dispatcher) -> str:
    """What a compiled kernel belongs to, for a person: the last part of its module's name
    (engine.backends.cpu.pool_2d -> pool_2d), else (a script's) its function's name."""
    func = getattr(dispatcher, "py_func", None)
    module = (getattr(func, "__module__", None) or "").rsplit(".", 1)[-1]
    return module if module not in ("", "__main__") else getattr(func, "__name__", "kernels")


def job_subject(job) -> str:
    """What a job checks, for a person: its "op" or "optimizer" label, else its name up to
    the first parenthesis or colon."""
    for key in ("op", "optimizer"):
        if job.labels.get(key):
            return str(job.labels[key])
    return job.name.split("(", 1)[0].split(":", 1)[0]


class CompileListener(numba_event.Listener):
    """Counts numba's compilations and tells `show(what, count)` of each: `what` is
    `subject` (the job running, watch_jobs) when set, else the kernel's group; nested
    compilations (a kernel calling another) count once each."""

    def __init__(self, show):
        self.count = 0
        self.show = show
        self.subject: str | None = None

    def on_start(self, event):
        self.count += 1
        self.show(self.subject or kernel_group(event.data.get("dispatcher")), self.count)

    def on_end(self, event):
        pass


def watch_jobs(jobs, listener: CompileListener | None) -> None:
    """Make each of `jobs` (checkkit.jobs.Job, changed in place) set `listener.subject` to
    what it checks while it runs; nothing when `listener` is None."""
    if listener is None:
        return
    for job in jobs:
        def run(job=job, inner=job.run):
            listener.subject = job_subject(job)
            try:
                return inner()
            finally:
                listener.subject = None
        job.run = run


def _bar_shower(tool: str, stream):
    from tqdm import tqdm
    bar = None

    def show(group: str, count: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(file=stream, leave=False, unit=" kernels", bar_format="{desc}: {n}"
                       "{unit} [{elapsed}]")
        bar.set_description_str(f"{tool}: compiling kernels for {group} (first run only)",
                                refresh=False)
        bar.update(1)
        bar.refresh()          # each compilation takes a while: no need to save redraws

    def close() -> None:
        if bar is not None:
            bar.close()
    return show, close


def _line_shower(tool: str, stream):
    seen: set[str] = set()

    def show(group: str, count: int) -> None:
        if group not in seen:
            seen.add(group)
            print(f"{tool}: compiling kernels for {group} (first run only)…", file=stream,
                  flush=True)
    return show, lambda: None


@contextlib.contextmanager
def compile_progress(tool: str, mode: str | None, stream=None):
    """Inside: numba's compilations shown on `stream` (default stderr) as `mode` says
    ("bar", "lines"; None: nothing, no listener); on leaving, when any compiled, one line:
    "TOOL: compiled N kernels in S s (kept in numba's cache for the next runs)". Yields the
    CompileListener (None when `mode` is None)."""
    if mode is None:
        yield None
        return
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES} or None, got {mode!r}")
    stream = stream or sys.stderr
    show, close = (_bar_shower if mode == "bar" else _line_shower)(tool, stream)
    listener = CompileListener(show)
    start = time.monotonic()
    try:
        with numba_event.install_listener(EVENT, listener):
            yield listener
    finally:
        close()
        if listener.count:
            print(f"{tool}: compiled {listener.count} kernels in "
                  f"{time.monotonic() - start:.0f} s (kept in numba's cache for the next "
                  f"runs)", file=stream, flush=True)
