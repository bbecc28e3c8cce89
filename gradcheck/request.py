"""What one gradcheck run checks: the request that the command line, `--workers N`, the
pytest plugin (`pytest --gradcheck`) and the Python API all build and run.

    request = GradcheckRequest(op=("pool_2d",), dtype="f64", random=50)
    problem = request.problem()          # the one place of every usage rule (None: fine)
    with request.plan() as plan:         # its jobs, in the report's order
        ...
    rows = run_request(request)          # what `gradcheck --op pool_2d --dtype f64
                                         #   --random 50` runs, serially

The jobs: each registry case of the tier (gradcheck.runner.select_samples) on every
backend of ours (or in the one engine under test), then, with `random`, one generated run
per op (and backend). `coverage` (ggml) runs the cases of the ops that check ggml's
backward switch and sums them up per ggml op; `repro` runs one case given as text;
`self_test` runs the mutants (gradcheck.selftest). The plugin's options are this class's
fields (checkkit.request), less the command line's actions (coverage, self_test, repro).

This module imports nothing heavy at load (the plugin imports it at every pytest start-up):
the engine loads when a request is checked or planned.
"""

from __future__ import annotations

import dataclasses
import functools
import os

from checkkit.jobs import Job, Plan, UsageProblem, run_jobs, usage_problems
from checkkit.request import Request, cli_flag, field
from checkkit.worker import DEFAULT_CASE_TIMEOUT

# generated cases per op at most (--random): 200 per op over every op take two minutes on
# two cores; 10,000 take hours, and more is a typo, not a sweep
MAX_RANDOM = 10_000
# ggml's GGML_MAX_N_THREADS: the most threads its compute takes
MAX_GGML_THREADS = 512
COVERAGE_AS_IS = "--coverage runs the registry's cases as they are: no --random, -k or --workers"


@dataclasses.dataclass(frozen=True)
class GradcheckRequest(Request):
    """gradcheck's options; see the module doc and `gradcheck --help`."""

    tool = "gradcheck"
    plugin = "gradcheck.pytest_plugin"

    op: tuple[str, ...] = field((), metavar="NAME", doc="op to check (repeatable; default: "
                                "every op with sample cases)")
    dtype: str = field("all", metavar="f16|bf16|f32|f64|all", doc="default all")
    filter: str | None = field(None, metavar="TEXT", doc="only cases whose string contains "
                               "TEXT (gradcheck -k)")
    tier: str = field("fast", metavar="fast|scale|all", doc="default fast")
    random: int = field(0, metavar="N", doc="also N generated cases per op: one item per op")
    seed: int = field(0, metavar="S", doc="of the generated cases")
    engine: str = field("engine", metavar="NAME", doc="engine under test: engine (ours), "
                        "torch, ggml, jax, tinygrad, module:attribute")
    backend: tuple[str, ...] = field((), metavar="NAME", doc="backend of our engine "
                                     "(repeatable; default cpu)")
    mode: str = field("auto", metavar="auto|full|fast", doc="default auto")
    ad: str = field("rev", metavar="rev|fwd|both", doc="reverse mode (default), forward "
                    "mode (the JVP) or both")
    order: int = field(1, metavar="1|2", doc="2: also the second derivative (a "
                       "Hessian-vector product)")
    inject: str | None = field(None, metavar="MUTATION[:FACTOR]",
                               doc="a known bug in our engine")
    no_torch: bool = field(False, doc="leave out the torch reference")
    ggml_lib: str | None = field(None, metavar="DIR", doc="with --gradcheck-engine ggml: its "
                                 "libraries")
    ggml_threads: int | None = field(None, metavar="N", kind=int,
                                     doc="ggml's compute threads")
    case_timeout: float = field(DEFAULT_CASE_TIMEOUT, metavar="SECONDS",
                                doc="an isolated engine's call that takes longer is a crash")
    isolate: bool = field(False, doc="every case in a worker process (ours by default only "
                          "for the scale tier and the self-test): a segfault or an abort is "
                          "a crash row")
    no_isolate: bool = field(False, doc="our engine in this process, its scale tier and "
                             "self-test too")
    boundscheck: bool = field(False, doc="our engine's CPU kernels compiled with numba's "
                              "bounds checks, in a worker process with a kernel cache of its "
                              "own: an out-of-bounds index is an error row naming the kernel "
                              "(the first such run compiles them all: minutes)")
    coverage: bool = field(False, plugin=False, doc="ggml's backward ops, one row each")
    self_test: bool = field(False, plugin=False, doc="the mutants, each must be caught")
    repro: str | None = field(None, plugin=False, doc="one case, as a failing row prints it")

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        set_("op", tuple(self.op or ()))
        set_("backend", tuple(dict.fromkeys(self.backend or ())))
        if self.ggml_lib:          # a distributed run leaves the working directory
            set_("ggml_lib", os.path.abspath(self.ggml_lib))

    @property
    def backends(self) -> tuple[str, ...]:
        return self.backend or ("cpu",)

    @property
    def ours(self) -> bool:
        return self.engine == "engine"

    def ahead(self) -> GradcheckRequest:
        """What a compile-ahead helper runs (checkkit.ahead): the same jobs without the
        torch reference and with the numerical check along random directions (mode fast):
        they compile the same kernels, for the same types (a cold `gradcheck --all` and
        `gradcheck --all --no-torch --mode fast` compile the same 654 functions with the
        same signatures), for about a quarter of the checking's CPU time (warm, 8 ops:
        22 s against 5.6 s)."""
        return dataclasses.replace(self, no_torch=True, mode="fast")

    def shared_cases(self, jobs) -> int:
        """The cases of this request's `jobs` (its plan's) that a serial run could share
        with a helper process (checkkit.share): a job per sample case, and per op the
        generated job's `--random N`; of our engine on the CPU alone, in this process (no
        --isolate, --boundscheck), no bug injected, no --repro or --self-test; 0
        otherwise. Sample cases count in the fast tier only: a scale case keeps both cores
        busy with the engine's threads already, by default in a worker process of its own, and
        two at once would double the memory such cases take."""
        if (not self.ours or self.backends != ("cpu",) or self.inject
                or self.self_test or self.repro is not None or self.isolate
                or self.boundscheck):
            return 0
        if not self.random:
            return len(jobs) if self.tier == "fast" else 0
        try:
            return len(jobs) + (self.random - 1) * len(self.op_names())
        except LookupError:
            return 0

    def problem(self, flag=cli_flag) -> str | None:
        """What makes this request unusable, naming options by `flag` (None: nothing)."""
        from engine.tensor import FLOAT_NAMES
        from gradcheck.cotangents import TIERS
        from gradcheck.derivatives import AD_MODES, ORDERS
        from gradcheck.injection import injected_factor, parse
        from gradcheck.modes import MODES
        for name, allowed in (("dtype", (*FLOAT_NAMES, "all")), ("tier", TIERS),
                              ("mode", MODES), ("ad", AD_MODES), ("order", ORDERS)):
            if getattr(self, name) not in allowed:
                return (f"{flag(name)} must be one of {', '.join(map(str, allowed))}, got "
                        f"{getattr(self, name)!r}")
        if not 0 <= self.random <= MAX_RANDOM:
            return (f"{flag('random')} must be a number of cases per op in [0, {MAX_RANDOM}], "
                    f"got {self.random}")
        if not self.case_timeout > 0:
            return (f"{flag('case_timeout')} must be a positive number of seconds, got "
                    f"{self.case_timeout}")
        engine = f"{flag('engine')} {self.engine}"
        for name in ("ggml_lib", "ggml_threads", "coverage"):
            if getattr(self, name) not in (None, False) and self.engine != "ggml":
                return f"{flag(name)} applies to {flag('engine')} ggml, not to {engine}"
        if self.ggml_threads is not None and not 1 <= self.ggml_threads <= MAX_GGML_THREADS:
            return (f"{flag('ggml_threads')} must lie in [1, {MAX_GGML_THREADS}], got "
                    f"{self.ggml_threads}")
        if self.coverage and (self.random or self.filter):
            return COVERAGE_AS_IS
        if (self.coverage or self.self_test) and (self.ad != "rev" or self.order != 1):
            which = flag("coverage") if self.coverage else flag("self_test")
            return (f"{which} runs reverse mode: no {flag('ad')} or {flag('order')} (the "
                    "self-test's own mutants cover forward mode and second order)")
        if self.inject:
            try:
                parse(self.inject)
            except ValueError as exc:
                return f"{flag('inject')}: {exc}"
        if self.inject and not self.ours and injected_factor(self.inject) is None:
            return (f"{flag('inject')} {self.inject}: a named mutant patches our engine; "
                    f"another engine ({engine}) takes a factor mutation (scale[:F]) only")
        if self.isolate and self.no_isolate:
            return f"{flag('isolate')} and {flag('no_isolate')} contradict each other"
        if self.boundscheck and self.no_isolate:
            return (f"{flag('boundscheck')} runs our engine in a worker process: not with "
                    f"{flag('no_isolate')}")
        for name, why in (("backend", "backends are our engine's"),
                          ("self_test", "the self-test injects bugs into our engine"),
                          ("no_isolate", "another engine runs in a worker process where "
                           f"its adapter asks for one, or with {flag('isolate')}"),
                          ("boundscheck", "numba's bounds checks in our kernels")):
            if getattr(self, name) and not self.ours:
                return f"{flag(name)} applies to our engine only ({why}), not to {engine}"
        if self.boundscheck:
            from engine.backends.cpu.environment import writable_dir
            from gradcheck.engine_under_test import boundscheck_cache_dir
            if not writable_dir(boundscheck_cache_dir()):
                return (f"{flag('boundscheck')}: its kernel cache "
                        f"{boundscheck_cache_dir()} cannot be written")
        return None

    @property
    def isolation(self) -> bool | None:
        """EngineUnderTest's `isolate`: True (--isolate), False (--no-isolate), or None, the
        default (ours: the scale tier's cases)."""
        return True if self.isolate else False if self.no_isolate else None

    def engine_under_test(self, adapter=None):
        """The EngineUnderTest of this request: `adapter` (None: ours) with its options."""
        from gradcheck.engine_under_test import EngineUnderTest
        return EngineUnderTest(adapter, self.backends, self.inject, self.case_timeout,
                               self.isolation, self.boundscheck)

    def make_adapter(self):
        """The adapter of `engine` (None: ours). Raises AdapterError when it cannot be set
        up."""
        if self.ours:
            return None
        from gradcheck.adapters import get_adapter
        options = {"lib_dir": self.ggml_lib} if self.ggml_lib else {}
        if self.ggml_threads is not None:
            options["n_threads"] = self.ggml_threads
        return get_adapter(self.engine, **options)

    def plan(self, adapter=None) -> Plan:
        """The jobs of this request, in the report's order, with the engine they share
        (closed with the plan); `adapter`: an adapter object to check instead of the one
        `engine` names. UsageProblem, in one line, on an unknown op or backend, an engine
        that cannot be set up, an optimizer step, no case to run, or a bad --repro case."""
        from checkkit.loading import AdapterError
        from engine.backends import get_backend
        from engine.errors import BackendError, UnknownOpError
        from gradcheck.adapters import describe
        with usage_problems(UnknownOpError, LookupError, BackendError, AdapterError):
            case = self._repro_case()
            for name in self.backends:
                get_backend(name)
            adapter = adapter if adapter is not None else self.make_adapter()
            engine = self.engine_under_test(adapter)
            described = engine.describe() if adapter is None else describe(adapter,
                                                                           self.engine)
            if self.self_test:      # its own cases (gradcheck.selftest): run_plan
                jobs = []
            else:
                jobs = self._case_jobs([case], engine) if case else self._jobs(engine)
        meta = {"engine": described} | ({"injected": self.inject} if self.inject else {})
        return Plan(self.tool, jobs, f"engine under test: {described}", meta, engine.close)

    def _repro_case(self):
        if self.repro is None:
            return None
        from gradcheck.repro import parse_case
        try:
            return parse_case(self.repro)
        except ValueError as exc:
            raise UsageProblem(f"--repro: {exc}") from None

    def op_names(self) -> list[str]:
        """The ops to check: those given, or every checkable op, or ggml's coverage ops."""
        from engine.registry import all_ops, get_op
        from gradcheck.runner import checkable_ops
        if self.coverage:
            from gradcheck.adapters.ggml.coverage import coverage_ops
            return [op for op in coverage_ops() if op in all_ops()]
        names = list(self.op or checkable_ops())
        updates = [n for n in names if get_op(n).kind == "update"]
        if updates:
            raise LookupError(f"{', '.join(updates)}: optimizer steps have no gradient to "
                              f"check; check them with optcheck (optcheck --opt all)")
        return names

    def _jobs(self, engine) -> list[Job]:
        from gradcheck.runner import select_samples
        names = self.op_names()
        samples = select_samples(names, self.dtype, self.filter, self.tier)
        if not samples and not self.random:
            raise LookupError(f"no sample case of {', '.join(names)} matches "
                              f"dtype={self.dtype} filter={self.filter!r} tier={self.tier}")
        jobs = self._case_jobs(samples, engine)
        if self.random:
            jobs += [Job(f"{name}(generated){tag}",
                         functools.partial(self._generated, engine, name, backend), labels)
                     for name in names for backend, tag, labels in self._engines(engine, name)]
        return jobs

    def _engines(self, engine, op: str):
        """(backend, name tag, labels) per engine a job runs in: `[BACKEND]` when there are
        several backends of ours."""
        if not engine.ours:
            return [("cpu", "", {"op": op, "engine": engine.adapter.name})]
        several = len(self.backends) > 1
        return [(b, f"[{b}]" if several else "", {"op": op, "backend": b})
                for b in self.backends]

    def _case_jobs(self, samples, engine) -> list[Job]:
        return [Job(str(case) + tag, functools.partial(self._check, engine, case, backend),
                    labels)
                for case in samples for backend, tag, labels in self._engines(engine, case.op)]

    def _check(self, engine, case, backend) -> list:
        """What gradcheck runs for this one case (gradcheck.runner.run_checks)."""
        from gradcheck.runner import run_checks
        if engine.ours:
            engine = engine.only(backend)
        return run_checks([case], engine, mode=self.mode, use_torch=not self.no_torch,
                          ad=self.ad, order=self.order)

    def _generated(self, engine, name, backend) -> list:
        """What `--random N` adds for the op: its generated cases (gradcheck.generated)."""
        from gradcheck.generated import generated_results
        return generated_results(name, self.random, self.seed, self.dtype, engine,
                                 backend=backend, mode=self.mode, use_torch=not self.no_torch,
                                 ad=self.ad, order=self.order)

    def finish(self, rows) -> list:
        """The report's rows from the jobs' rows: ggml's coverage sums them up per ggml op."""
        if not self.coverage:
            return rows
        from engine.registry import all_ops
        from gradcheck.adapters.ggml.coverage import coverage_rows
        return coverage_rows(rows, all_ops())


def run_plan(request: GradcheckRequest, plan: Plan, progress: bool = False) -> list:
    """The rows of `request`, its `plan` run serially in this process (the self-test: its
    mutants). Ctrl-C raises checkkit.interrupted.Interrupted with the rows finished before
    it."""
    if request.self_test:
        from gradcheck.selftest import run_self_test
        return run_self_test(progress=progress, isolate=request.isolation is not False,
                             boundscheck=request.boundscheck)
    return request.finish(run_jobs(plan.jobs, progress, "gradcheck", "case"))


def run_request(request: GradcheckRequest, progress: bool = False, adapter=None) -> list:
    """The rows of `request`, validated, planned and run serially (run_plan); `adapter`:
    an adapter object instead of the engine it names. UsageProblem on what the command
    line refuses."""
    problem = request.problem()
    if problem:
        raise UsageProblem(problem)
    with request.plan(adapter) as plan:
        return run_plan(request, plan, progress)


def check_ops(op_names=None, dtype: str = "all", pattern: str | None = None, *,
              progress: bool = False, adapter=None, **options) -> list:
    """What `gradcheck --op NAME... --dtype DTYPE -k PATTERN` checks (every checkable op for
    None), with the other options of GradcheckRequest given by field name (random, seed,
    inject, mode, backend, no_torch, engine, tier, ...); `adapter`: an adapter object
    instead of an engine name. UsageProblem on what the command line would refuse."""
    request = GradcheckRequest(op=tuple(op_names or ()), dtype=dtype, filter=pattern,
                               **options)
    return run_request(request, progress, adapter)
