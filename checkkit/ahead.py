"""Compiling ahead: while a run whose kernels are not cached compiles and checks its jobs,
helper processes run jobs further on, so that numba compiles their kernels on the other
cores into the shared disk cache, and the run loads them when it gets there.

    with compile_progress(tool, mode) as listener:        # checkkit.compiling
        with compiling_ahead(request, plan.jobs, listener):
            rows = run_jobs(plan.jobs)

Why whole jobs: which kernels a job compiles, and for which types, is known only when it
runs. A numba kernel is compiled once per combination of its arguments' types: each
array's dtype, number of dimensions, layout (C, F or any) and writability, each tuple's
length. A cold `gradcheck --all` compiled 728 functions at commit 3c883fd (429 kernels
it calls, 299 functions they call) made from 306 Python functions, 165 s of CPU time of
its 215 at a load of 6 (`python bench/bench_first_run.py --breakdown`,
docs/performance.md): the same kernels again for other dtypes, window sizes (tuple
lengths), 16-bit formats and, where a dispatcher passes a strided input on, layouts. No
table could list them and stay true, so a helper
runs the run's own jobs, built in a fresh interpreter from the request's `ahead()` (the
same jobs, compiling the same kernels, maybe checked more cheaply: gradcheck's leave
torch out), and throws their rows away. The run's own
process still checks every job itself: a helper changes how long a run takes, never what
it reports (numba's cache is keyed by the code and the types, engine.backends.cpu.jit,
and safe for processes sharing it, engine.backends.cpu.disk_cache).

Which jobs: the run goes forward through its jobs, which come in blocks of consecutive
jobs of one subject (an op's cases: kernels are mostly an op's own). Once the run has
finished its first block (which compiles the kernels every op shares), a helper takes the
second block not yet taken after the one the run is in (GAP: the next one is left to the
run, which gets there before the helper could finish it) and runs it in order. Where the
run reaches a helper's block, the helper leaves the rest of it to the run (whose kernels
it loads where the helper compiled them) and takes another; so the two end up taking
blocks in turn, and the run loads every other op's kernels. Simulated on the per-job
CPU times of a cold serial `gradcheck --all` (its compilations, its checks), the run's
own CPU time falls from 176 s to 126 s this way, and to 150 s with the helper taking
blocks from the end instead: the ops that compile most come early in the registry's
order. A helper stops when no block is left ahead of the run, after QUIET_SECONDS of CPU
time without a compilation (the cache is warm there: a run that compiled one kernel must
not cost a helper's sweep of the rest), or when the run's process is gone.

When: on the first compilation the run sees (its own, or one its isolated worker reports:
checkkit.compiling), checked after each job, if the blocks a helper could still take hold
MIN_JOBS jobs (a run of one op is one block: none). A warm run starts none and costs
nothing. How many: GRADVERIFY_COMPILE_AHEAD=N where set (0 or off: none, for a machine
whose other cores are busy), else one per core beyond the first (os.sched_getaffinity: a
process held to one core starts none), at most MAX_HELPERS. A helper runs at niceness
NICE: on a quiet machine it has a core to itself; on a busy one it must not take the
run's. Measured on the shared 2-core machine at a load of 4-5, a helper at the run's own
priority left the run 138 s of CPU time instead of 178 s but took so much of the cores
that the run's wall time grew from 225 s to 263 s (bench/bench_first_run.py's runs).

Where a run shares its jobs with a helper (checkkit.share: a run of at least
share.MIN_CASES cases of our engine on the CPU, a core idle), no compile-ahead helper
starts: the sharing helper compiles the kernels of the jobs it takes and its rows are
kept, where a compile-ahead helper's are thrown away and the run checks every job itself
(a cold `gradcheck --all` on the AVX2 machine: 116 s shared against 139 s compiling
ahead; checkkit.share's doc). So compiling ahead is for the runs that do not share: runs
of a few ops, --isolate's and --boundscheck's, a machine whose second core is busy.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import signal
import time

from checkkit.compiling import AHEAD, job_subject, report_compiles

VARIABLE = "GRADVERIFY_COMPILE_AHEAD"
MAX_HELPERS = 3        # by default, on a machine with more cores: --workers N uses them all
MAX_SET = 64           # the most GRADVERIFY_COMPILE_AHEAD may ask for
MIN_JOBS = 200         # fewer jobs left: too few kernels to pay a helper's start (2-4 s)
QUIET_SECONDS = 30.0   # CPU seconds of a helper's jobs without a compilation: warm there
WAIT = 0.2             # seconds between two looks at the run's position
GAP = 1                # blocks ahead of the run that a helper leaves to it
NICE = 10              # a helper's niceness: it takes a core only where one is idle


def read_helpers(environ=None) -> tuple[int | None, str | None]:
    """(the helpers GRADVERIFY_COMPILE_AHEAD asks for, None) or, for a bad value, (None,
    the problem in one line); (None, None) when unset: the default."""
    raw = (os.environ if environ is None else environ).get(VARIABLE, "")
    value = raw.strip().lower()
    if value in ("", "default"):
        return None, None
    if value in ("off", "no", "false"):
        return 0, None
    try:
        n = int(value)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_SET:
        return None, (f"{VARIABLE} must be a number of helper processes in [0, {MAX_SET}] "
                      f"(0 or off: none), got {raw!r}")
    return n, None


def environment_problem(environ=None) -> str | None:
    """A bad GRADVERIFY_COMPILE_AHEAD, in one line for a command line to refuse (None when
    it is fine)."""
    return read_helpers(environ)[1]


def helper_count() -> int:
    """The helpers a run may start here: GRADVERIFY_COMPILE_AHEAD where set (a bad value:
    the default), else one per core beyond the first, at most MAX_HELPERS."""
    from engine.backends.cpu.environment import default_threads
    asked = read_helpers()[0]
    return asked if asked is not None else max(0, min(MAX_HELPERS, default_threads() - 1))


def blocks(jobs) -> list[range]:
    """The indices of each run of consecutive jobs with one subject (job_subject), in
    order."""
    spans, start = [], 0
    for i in range(1, len(jobs) + 1):
        if i == len(jobs) or job_subject(jobs[i]) != job_subject(jobs[start]):
            spans.append(range(start, i))
            start = i
    return spans


def names_digest(jobs) -> str:
    """A digest of the jobs' names, in order: a helper's plan must be the run's."""
    return hashlib.sha256("\n".join(job.name for job in jobs).encode()).hexdigest()


class Ahead:
    """The run's side: `jobs` (changed in place) publish which one runs, and after each,
    once `listener` (checkkit.compiling.CompileListener) has counted a compilation and at
    least `min_jobs` are left, `helpers` helper processes start (default helper_count()),
    each stopping after `quiet_seconds` of CPU time without a compilation. close() ends
    them."""

    def __init__(self, request, jobs, listener, helpers: int | None = None,
                 min_jobs: int = MIN_JOBS, quiet_seconds: float = QUIET_SECONDS):
        self.request, self.jobs, self.listener = request, jobs, listener
        self.helpers = helper_count() if helpers is None else helpers
        self.min_jobs, self.quiet_seconds = min_jobs, quiet_seconds
        self.ctx = multiprocessing.get_context("spawn")    # never fork: numba's threads
        self.spans = blocks(jobs)
        self.position = self.ctx.Value("q", -1, lock=False)   # the job the run is at
        self.claimed = self.ctx.Array("b", len(self.spans))   # the blocks helpers took
        self.procs: list = []
        self.started = False
        for i, job in enumerate(jobs):
            def run(i=i, inner=job.run):
                self.position.value = i
                try:
                    return inner()
                finally:
                    self._maybe_start(i)
            job.run = run

    def _maybe_start(self, i: int) -> None:
        """After job `i`: start the helpers if the run has compiled and the blocks a helper
        could take (those starting after the next job) hold at least min_jobs jobs."""
        if self.started or not self.helpers or not self.listener.count:
            return
        if sum(len(b) for b in self.spans if b.start > i + 1) < max(1, self.min_jobs):
            return
        self.started = True
        self.start()

    def start(self) -> None:
        """Start the helpers now."""
        from checkkit.compiling import LOG_VARIABLE
        from checkkit.worker import main_left_alone
        args = (self.request.ahead(), names_digest(self.jobs), self.position, self.claimed,
                os.environ.get(LOG_VARIABLE), os.getpid(), self.quiet_seconds)
        with main_left_alone():
            for n in range(self.helpers):
                proc = self.ctx.Process(target=_help, args=args, daemon=True,
                                        name=f"{self.request.tool}-ahead-{n}")
                proc.start()
                self.procs.append(proc)

    def close(self) -> None:
        """End the helpers (at once: one killed while it saves a kernel leaves the cache
        whole, each file of it being replaced atomically under its lock)."""
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        self.procs = []


@contextlib.contextmanager
def compiling_ahead(request, jobs, listener, **options):
    """Ahead(request, jobs, listener, **options) while the block runs; its helpers ended
    after."""
    ahead = Ahead(request, jobs, listener, **options)
    try:
        yield ahead
    finally:
        ahead.close()


def helper_process(request, digest, log, work) -> None:
    """The body of a helper process (this module's and checkkit.share's): interrupts
    ignored (the run ends its helpers itself), niceness NICE, nothing written to the
    terminal, its compilations reported to the run's log as AHEAD's; then
    `work(jobs, reporter)` on the request's plan, where the plan's jobs are the run's (their
    names' digest `digest`). Whatever it raises ends the helper quietly: a helper only ever
    gives up, the run does the work itself. SIGTERM (the run's close(), at once) ends it
    through SystemExit, so that its exit handlers still run: killed outright, it left the
    named semaphores it had made (tqdm's lock) to the resource tracker, which warned of
    them on the terminal when a stopped run ended."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_quietly)
    with contextlib.suppress(OSError):
        os.nice(NICE)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    reporter = report_compiles(log, AHEAD, count_only=True)
    try:
        with request.plan() as plan:
            if names_digest(plan.jobs) == digest:
                work(plan.jobs, reporter)
    except BaseException:                   # noqa: BLE001  (a helper only ever gives up)
        return


def _exit_quietly(signum, frame):
    raise SystemExit(0)


def _help(request, digest, position, claimed, log, parent, quiet_seconds) -> None:
    """A helper process: the request's plan, its jobs run as the module doc says, their
    rows and errors thrown away."""
    helper_process(request, digest, log, lambda jobs, reporter: _run_blocks(
        jobs, position, claimed, reporter, parent, quiet_seconds))


def _run_blocks(jobs, position, claimed, reporter, parent,
                quiet_seconds: float = QUIET_SECONDS) -> None:
    spans = blocks(jobs)
    # the run's first block compiles the kernels every op shares (copies, sums, the
    # reference's): started meanwhile, a helper would compile them again
    while spans and position.value < spans[0].stop - 1:
        if os.getppid() != parent:
            return
        time.sleep(WAIT)
    compiled, at = reporter.count, time.process_time()
    while True:
        with claimed.get_lock():
            ahead = [k for k, span in enumerate(spans)
                     if not claimed[k] and span.start > position.value + 1]
            if not ahead:
                return
            k = ahead[min(GAP, len(ahead) - 1)]
            claimed[k] = 1
        for i in spans[k]:
            if os.getppid() != parent:
                return
            if i <= position.value + 1:      # the run got here: the rest is its own
                break
            reporter.subject = job_subject(jobs[i])
            with contextlib.suppress(Exception):
                jobs[i].run()
            if reporter.count > compiled:
                compiled, at = reporter.count, time.process_time()
            elif time.process_time() - at > quiet_seconds:
                return
