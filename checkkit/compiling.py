"""A progress line while numba compiles kernels, so that a first run (minutes on a cold
kernel cache) is not silent, whichever process compiles.

    with compile_progress("gradcheck", "bar") as listener:   # or "lines", or None
        with request.plan() as plan:                          # its workers report too
            rows = run(...)

numba fires its "numba:compile" event (numba.core.event) only when a kernel is compiled:
a kernel loaded from the disk cache fires none, so a warm run shows nothing. The listener
counts the compilations and names what they are for: the op (or optimizer) of the job
running (watch_jobs), else the kernel's module (engine.backends.cpu.pool_2d: pool_2d).
"bar": one tqdm line on stderr, "compiling kernels for pool_2d (first run only)", with the
count; "lines": one line per op, for a log (a pipe with --progress); None: nothing shown,
but still counted (checkkit.ahead starts its helpers on the first one). Then, either way
but None, one closing line with the count and the time.

Child processes compile too: an isolated engine's worker (checkkit.worker), the xdist
workers of `--workers N` (checkkit.sweep) and the compile-ahead helpers (checkkit.ahead).
Each appends a line per compilation to a log file that the run's process creates and
names in GRADVERIFY_COMPILE_LOG (report_compiles; an isolated worker, which the
forkserver may have started under an older environment, is handed the name when it
starts), and a thread of the run's process reads it every POLL seconds into the same
listener. A child appends only to a log that exists: one left from an earlier run, or a
run that never listened, gets nothing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time

import numba.core.event as numba_event

MODES = ("bar", "lines")
EVENT = "numba:compile"
LOG_VARIABLE = "GRADVERIFY_COMPILE_LOG"
POLL = 0.25                     # seconds between two reads of the children's log
AHEAD = "ahead"                 # a log line's tag: compiled by a compile-ahead helper


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
    """Counts numba's compilations, this process's and those its children report (child),
    and tells `show(what, count)` of each: `what` is the subject of the job that
    compiled (watch_jobs) when known, else the kernel's group; nested compilations (a
    kernel calling another) count once each. `ahead`: how many a compile-ahead helper
    made."""

    def __init__(self, show=None):
        self.count = 0
        self.ahead = 0
        self.show = show or (lambda what, count: None)
        self.subject: str | None = None
        self.reader: _LogReader | None = None     # of the children's log (compile_progress)
        self._lock = threading.Lock()      # the log's reader is another thread

    def on_start(self, event):
        self._counted(self.subject or kernel_group(event.data.get("dispatcher")))

    def on_end(self, event):
        pass

    def drain(self) -> None:
        """Take in what the children logged so far (before the job running ends: what an
        isolated worker compiled is named after it)."""
        if self.reader is not None:
            self.reader.read()

    def child(self, tag: str, subject: str, group: str) -> None:
        """A compilation a child process reported (a line of the log): named after its own
        job (a helper's), else after this process's job (an isolated worker compiles for
        the call this process waits on), else after the kernel's group."""
        if tag == AHEAD:
            self.ahead += 1
            self._counted(subject or group)
        else:
            self._counted(subject or self.subject or group)

    def _counted(self, what: str) -> None:
        with self._lock:
            self.count += 1
            self.show(what, self.count)


class Reporter(numba_event.Listener):
    """A child's listener: counts its compilations and, given a log `path`, appends a line
    `TAG<TAB>SUBJECT<TAB>GROUP` for each (one write, which O_APPEND keeps whole beside the
    other writers)."""

    def __init__(self, path: str | None, tag: str):
        self.path, self.tag = path, tag
        self.subject: str | None = None
        self.count = 0

    def on_start(self, event):
        self.count += 1
        if self.path is None:
            return
        line = (f"{self.tag}\t{self.subject or ''}\t"
                f"{kernel_group(event.data.get('dispatcher'))}\n")
        with contextlib.suppress(OSError):        # the run that listened is gone
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

    def on_end(self, event):
        pass


_tag = ""          # this process's tag (AHEAD in a helper), handed to its own workers


def report_compiles(path: str | None = None, tag: str | None = None,
                    count_only: bool = False) -> Reporter | None:
    """In a child process of a run: each of numba's compilations from now on appended to
    the run's log, `path` (default: $GRADVERIFY_COMPILE_LOG), tagged `tag` (default: the
    tag this process was given; AHEAD: a compile-ahead helper's, which its own worker
    processes inherit: process_tag). Where there is no such log: None, and nothing done,
    unless `count_only` (a Reporter that only counts). The reporter's `subject` names the
    job running, where the child knows it."""
    global _tag
    path = path or os.environ.get(LOG_VARIABLE)
    if not path or not os.path.isfile(path):
        if not count_only:
            return None
        path = None
    if tag is not None:
        _tag = tag
    reporter = Reporter(path, _tag)
    numba_event.register(EVENT, reporter)
    return reporter


def process_tag() -> str:
    """The tag this process reports its compilations with ("" unless a helper's)."""
    return _tag


def watch_jobs(jobs, listener) -> None:
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
                if hasattr(listener, "drain"):
                    listener.drain()
                listener.subject = None
        job.run = run


class _LogReader(threading.Thread):
    """Reads the lines children append to the log, every POLL seconds, into `listener`."""

    def __init__(self, path: str, listener: CompileListener):
        super().__init__(name="gradverify-compile-log", daemon=True)
        self.path, self.listener = path, listener
        self.offset, self.partial = 0, b""
        self.stopping = threading.Event()
        self.lock = threading.Lock()          # read by the thread and by drain()

    def run(self):
        while not self.stopping.wait(POLL):
            self.read()

    def read(self) -> None:
        with self.lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read()
            except OSError:
                return
            self.offset += len(data)
            *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            fields = line.decode(errors="replace").split("\t")
            if len(fields) == 3:
                self.listener.child(*fields)

    def stop(self) -> None:
        self.stopping.set()
        self.join()
        self.read()                                 # what came after the last poll


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
def _children_log(listener: CompileListener):
    """The log children append to (module doc), named in LOG_VARIABLE while the block runs
    (as it was after), read into `listener` by a thread; removed after."""
    with tempfile.TemporaryDirectory(prefix="gradverify-compiling-") as tmp:
        path = os.path.join(tmp, "compiles.log")
        with open(path, "wb"):
            pass
        before = os.environ.get(LOG_VARIABLE)
        os.environ[LOG_VARIABLE] = path
        reader = listener.reader = _LogReader(path, listener)
        reader.start()
        try:
            yield path
        finally:
            reader.stop()
            listener.reader = None
            if before is None:
                os.environ.pop(LOG_VARIABLE, None)
            else:
                os.environ[LOG_VARIABLE] = before


@contextlib.contextmanager
def compile_progress(tool: str, mode: str | None, stream=None):
    """Inside: numba's compilations, this process's and its children's, counted and shown
    on `stream` (default stderr) as `mode` says ("bar", "lines"; None: counted only); on
    leaving, when any compiled and `mode` is not None, one line: "TOOL: compiled N
    kernels in S s (kept in numba's cache for the next runs)", saying how many of them a
    compile-ahead helper made. Yields the CompileListener."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {MODES} or None, got {mode!r}")
    stream = stream or sys.stderr
    if mode is None:
        show, close = None, lambda: None
    else:
        show, close = (_bar_shower if mode == "bar" else _line_shower)(tool, stream)
    listener = CompileListener(show)
    start = time.monotonic()
    try:
        with numba_event.install_listener(EVENT, listener), _children_log(listener):
            yield listener
    finally:
        close()
        if listener.count and mode is not None:
            ahead = (f", {listener.ahead} of them ahead of the run in helper processes"
                     if listener.ahead else "")
            print(f"{tool}: compiled {listener.count} kernels in "
                  f"{time.monotonic() - start:.0f} s{ahead} (kept in numba's cache for the "
                  f"next runs)", file=stream, flush=True)
