"""Sharing a large run's jobs with a helper process: the run goes forward through its jobs,
one helper process takes them one at a time from the end, and hands each one's rows back;
where they meet, the run stops taking the helper's.

    with sharing(request, plan.jobs) as shared:              # shared.helpers: 0 or 1
        rows = run_jobs(plan.jobs)                             # the same rows, in order

Why: a run's work is spread over its jobs, and the second core halves it. Warm, a
`gradcheck --all --random 200` is checking (about 21,500 cases, one process, 354 s on
the quiet 2-core machine where the target is 180 s): every case's numerical differences,
torch's references, the engine's graphs, hypothesis' drawing (docs/performance.md, "A warm
run"). Cold, a `gradcheck --all` is mostly compiling (215 s of CPU in one process, 162 s
of it numba's, on the AVX2 machine of issue 37's eleventh round), and the helper compiles
the kernels of the jobs it takes: shared, it took 115-116 s of wall time there, against
139 s with a compile-ahead helper (checkkit.ahead), which compiles ahead of the run but
throws its rows away, so the run still checks every job itself. Warm, `gradcheck --all`
took 30 s shared against 50 s in one process (`/usr/bin/time gradcheck --all --no-progress
--format json --output F`, alternately, the same rows field for field but their seconds).
A helper that waited for the run's first block before starting (the kernels every op
shares, which both processes compile otherwise) was slower cold: 122 and 123 s.
`--workers 2` (pytest-xdist) splits a run too, but every
one of its three processes imports and collects the whole plan: on a 10-op sample
(`gradcheck --op softmax ... --random 200`, below) 37.8 s of CPU against 25.0 s in one
process. A helper here costs one interpreter's start (imports: 3-4 s of CPU, on the
other core) and the pickling of the rows it hands back.

The same report: each job is run whole, by one process, with the request's own options
(not the cheaper ones of a compile-ahead helper, checkkit.ahead), and its rows go in at
the job's place, in the same order. Every generated job seeds hypothesis itself, and the
reference kept between cases is keyed by the case and its values (gradcheck.reference).
One thing does depend on the process: hypothesis draws a small share of its values from
the constants of the project's modules the process has loaded so far (its "local
constants"), and a helper has loaded fewer: a warm `gradcheck --all --random 200` gave
the same statuses, but 12 of its 22,040 rows (rope's, drawn in the helper) with other
drawn values, as two one-process runs differ in a few rows too (docs/performance.md).
The helper's plan must be the run's (the digest of the jobs' names), else it runs
nothing.

Who runs what: a shared array holds each job's state. The run claims the job it is at
(FREE -> RUN) and runs it; a job the helper has finished (SENT) it takes from the pipe (a
reader thread takes the rows as they come, so that the helper never blocks in a send).
Where the two meet, the job the helper is on (HELPER), the run waits for while the
helper gets at least BUSY of a core (its CPU time read from /proc every STEP seconds),
else runs it itself too and drops the helper's rows: on the quiet machine a generated
job can take tens of seconds (conv_2d's), and the helper may be nearly done with it; on
a busy one a helper starved of CPU must not hold the run up. A job that raises in the
helper is left to the run (RUN), which raises it as a serial run would. The helper runs
at checkkit.ahead's niceness: on a busy machine it takes only an idle core, and the run
does what it could not.

When: the request says how many cases a helper could take of the run's jobs
(`shared_cases(jobs)`: gradcheck's cases of our engine on the CPU, each generated job
counting its `--random N`); at least MIN_CASES, a second core this process may use
(os.sched_getaffinity) and, unless GRADVERIFY_SHARE says 1 (0: never), two of the
machine's cores idle over a quarter of a second (idle_cores: the run's and the helper's,
less IDLE_MARGIN).
Otherwise, and for `--workers N`, nothing changes; compile-ahead helpers are not started
beside a sharing one (it compiles what its own jobs need, into the same disk cache).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time

from checkkit.ahead import helper_process, names_digest
from checkkit.compiling import job_subject
from checkkit.jobs import done_elsewhere

VARIABLE = "GRADVERIFY_SHARE"
MIN_CASES = 1000       # fewer: a run of seconds a helper's start would not pay for
IDLE_MARGIN = 0.5      # share_helpers: the idle cores it asks for, 2 (the run's, the
#                        helper's) less this
IDLE_SAMPLE = 0.25     # seconds over which idle_cores counts the idle ticks
STEP = 1.0             # seconds between two looks at a helper the run waits for
BUSY = 0.8             # the share of a core a helper must get for the run to wait on it
#                        (the quiet machine gives it a whole one; at a load of 5, with
#                        0.5, the run waited some 20 s on a helper that took half)
FREE, RUN, HELPER, SENT = 0, 1, 2, 3


def read_share(environ=None) -> tuple[bool | None, str | None]:
    """(GRADVERIFY_SHARE's choice, None): False for 0/off (never), True for 1/on (a large
    run shares whatever the load), None when unset or auto (a large run shares where a
    core is idle); or, for a bad value, (None, the problem in one line)."""
    raw = (os.environ if environ is None else environ).get(VARIABLE, "")
    value = raw.strip().lower()
    if value in ("", "default", "auto"):
        return None, None
    if value in ("1", "on", "yes", "true"):
        return True, None
    if value in ("0", "off", "no", "false"):
        return False, None
    return None, (f"{VARIABLE} must be auto (the default), 0/off (no sharing helper) or "
                  f"1/on (whatever the load), got {raw!r}")


def environment_problem(environ=None) -> str | None:
    """A bad GRADVERIFY_SHARE, in one line (None when it is fine)."""
    return read_share(environ)[1]


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system) process `pid` has used, from /proc; None where it
    cannot be read (not Linux, the process gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def idle_cores(seconds: float = IDLE_SAMPLE) -> float:
    """How many of the machine's cores were idle over the next `seconds` (/proc/stat's
    idle and iowait ticks against all, times the cores it counts); where /proc/stat cannot
    be read, the cores less the last minute's load average. Not the load average first:
    right after another run (bench_first_run's warm `--all` before its `--random`) it
    still counts that run for a minute."""
    def ticks():
        with open("/proc/stat", encoding="ascii") as f:
            head = f.readline().split()
        values = [int(v) for v in head[1:9]]    # user nice system idle iowait irq softirq
        return values[3] + values[4], sum(values)   # steal
    cores = os.cpu_count() or 1
    try:
        idle0, all0 = ticks()
        time.sleep(seconds)
        idle1, all1 = ticks()
        return cores * (idle1 - idle0) / max(1, all1 - all0)
    except (OSError, ValueError, IndexError):
        try:
            return cores - os.getloadavg()[0]
        except OSError:
            return 0.0


def share_helpers(request, jobs, environ=None, idle=idle_cores) -> int:
    """How many sharing helpers a serial run of `request`'s `jobs` starts: 1 where it is
    large (the request's `shared_cases(jobs)` at least MIN_CASES), the process may use a
    second core, and GRADVERIFY_SHARE says 1, or nothing and `idle()` (idle_cores) finds a
    core idle beside the run's own (at least 2 - IDLE_MARGIN); else 0."""
    from engine.backends.cpu.environment import default_threads
    choice = read_share(environ)[0]
    if choice is False:
        return 0
    cases = getattr(request, "shared_cases", None)
    if cases is None or cases(jobs) < MIN_CASES:
        return 0
    if default_threads() < 2:
        return 0
    return 1 if choice or idle() >= 2 - IDLE_MARGIN else 0


class Sharing:
    """The run's side (module doc): `jobs` (changed in place) take their rows from the
    helper where it ran them. `helpers` 0: nothing changes."""

    def __init__(self, request, jobs, helpers: int):
        self.request, self.jobs, self.helpers = request, jobs, helpers
        self.proc = None
        self.got: dict[int, list] = {}
        self.taken = 0                       # jobs whose rows came from the helper
        self.twice = 0                       # jobs the helper was on that the run ran too
        self.arrived = threading.Condition()
        self.closed = False                  # the pipe closed: nothing more comes
        if not helpers or not jobs:
            return
        self.ctx = multiprocessing.get_context("spawn")    # never fork: numba's threads
        self.state = self.ctx.Array("b", len(jobs))
        self.conn, child = self.ctx.Pipe(duplex=False)
        self._child = child
        for i, job in enumerate(jobs):
            def run(i=i, inner=job.run):
                rows = self._take(i)
                return inner() if rows is None else rows
            job.run = run
        self.start()

    def start(self) -> None:
        from checkkit.compiling import LOG_VARIABLE
        from checkkit.worker import main_left_alone
        args = (self.request, names_digest(self.jobs), self.state, self._child,
                os.environ.get(LOG_VARIABLE), os.getpid())
        with main_left_alone():
            self.proc = self.ctx.Process(target=_help, args=args, daemon=True,
                                         name=f"{self.request.tool}-share")
            self.proc.start()
        self._child.close()
        self.reader = threading.Thread(target=self._read, name="gradverify-share",
                                       daemon=True)
        self.reader.start()

    def _read(self) -> None:
        """The reader thread: every (index, rows) the helper sends, into self.got, until the
        pipe closes. Reading as they come keeps the helper from blocking in a send."""
        while True:
            try:
                k, rows = self.conn.recv()
            except (EOFError, OSError):
                break
            with self.arrived:
                self.got[k] = rows
                self.arrived.notify_all()
        with self.arrived:
            self.closed = True
            self.arrived.notify_all()

    def _take(self, i: int) -> list | None:
        """Job i's rows from the helper, or None: the run runs it."""
        with self.state.get_lock():
            if self.state[i] == FREE:
                self.state[i] = RUN
                return None
        cpu, at = cpu_seconds(self.proc.pid), time.monotonic()
        with self.arrived:
            while i not in self.got and not self.closed:
                # SENT: the helper's send had returned, the rows are in the pipe or read;
                # HELPER: it is running the job, waited for while it gets a core
                if self.state[i] == RUN:         # it gave the job up
                    break
                self.arrived.wait(STEP)
                if self.state[i] == HELPER and i not in self.got:
                    now_cpu, now = cpu_seconds(self.proc.pid), time.monotonic()
                    if cpu is None or now_cpu is None or now_cpu - cpu < BUSY * (now - at):
                        break                    # starved (or unreadable): run it here
                    cpu, at = now_cpu, now
            rows = self.got.pop(i, None)
        if rows is not None:
            self.taken += 1
        else:
            self.twice += self.state[i] == HELPER
        return rows       # None: the run runs it

    def ahead_of_run(self) -> int:
        """The jobs whose rows the helper has handed back and the run has not taken yet
        (for the progress bar: checkkit.jobs.done_elsewhere)."""
        return len(self.got)

    def close(self) -> None:
        """End the helper (at once: the rows it still owes are the run's own by now)."""
        if self.proc is None:
            return
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join(5.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5.0)
        self.proc = None
        self.reader.join(5.0)
        self.conn.close()


@contextlib.contextmanager
def sharing(request, jobs, helpers: int | None = None):
    """Sharing(request, jobs, helpers: default share_helpers(request, jobs)) while the
    block runs; its helper ended after."""
    shared = Sharing(request, jobs,
                     share_helpers(request, jobs) if helpers is None else helpers)
    try:
        with done_elsewhere(jobs, shared.ahead_of_run):
            yield shared
    finally:
        shared.close()


def _help(request, digest, state, conn, log, parent) -> None:
    """The helper process: the request's plan, its jobs taken from the end one at a time,
    each one's rows sent to the run (checkkit.ahead.helper_process)."""
    helper_process(request, digest, log, lambda jobs, reporter: _run_from_end(
        jobs, state, conn, reporter, parent))


def _run_from_end(jobs, state, conn, reporter, parent) -> None:
    for i in range(len(jobs) - 1, -1, -1):
        if os.getppid() != parent:
            return
        with state.get_lock():
            if state[i] != FREE:
                return                        # the run is here: the rest is its own
            state[i] = HELPER
        reporter.subject = job_subject(jobs[i])
        try:
            rows = jobs[i].run()
        except Exception:                     # noqa: BLE001  (the run raises it itself)
            with state.get_lock():
                state[i] = RUN
            return
        conn.send((i, rows))
        with state.get_lock():
            state[i] = SENT
