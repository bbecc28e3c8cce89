"""What one optcheck run checks: the request that the command line, `--workers N`, the
pytest plugin (`pytest --optcheck`) and the Python API all build and run.

    request = OptcheckRequest(opt=("adam",), family=("torch",), steps=200)
    rows = run_request(request)      # what `optcheck --opt adam --family torch --steps 200`
                                     #   runs, serially

The jobs: each family (closed-form, torch, invariant, precision, reference, known-bugs)
on each optimizer and dtype, in that order (a table per family),
`OPTIMIZER: FAMILY(type=DTYPE)`, of the optimizer under test, `engine` (optcheck.adapters:
ours by default, torch.optim's implementations, ggml's, optax's, yours as
module:attribute). The user's own
hyperparameters (lr, betas, ... : the command line's "your hyperparameters") add their
trajectory rows after the jobs', and `self_test` runs the step-kernel mutants instead,
then the diagnosis's known variants (optcheck.selftest). The plugin's options are the
fields that choose the jobs (checkkit.request); the others are the command line's.

This module imports nothing heavy at load (the plugin imports it at every pytest start-up).
"""

from __future__ import annotations

import dataclasses
import functools
import os

from checkkit.jobs import Job, Plan, UsageProblem, run_jobs, usage_problems
from checkkit.request import Request, cli_flag, field

# seeds go to numpy's default_rng, which takes whole numbers >= 0; 64-bit ones at most here
MAX_SEED = 2**63 - 1
HP_FIELDS = ("lr", "eps", "weight_decay", "momentum", "dampening")
FLAG_FIELDS = ("nesterov", "amsgrad", "maximize")


def _user(doc: str, default=None):
    return field(default, plugin=False, doc=doc)


@dataclasses.dataclass(frozen=True)
class OptcheckRequest(Request):
    """optcheck's options; see the module doc and `optcheck --help`."""

    tool = "optcheck"
    plugin = "optcheck.pytest_plugin"

    opt: tuple[str, ...] = field((), metavar="NAME", doc="optimizer (repeatable; default all)")
    family: tuple[str, ...] = field((), metavar="NAME", doc="closed-form, torch, invariant, "
                                    "precision, reference, known-bugs (repeatable; "
                                    "default all)")
    dtype: str = field("all", metavar="f16|bf16|f32|f64|all", doc="default all")
    steps: int = field(100, metavar="N", doc="steps per trajectory (default 100)")
    backend: str = field("cpu", metavar="NAME", doc="default cpu")
    seed: int = field(0, metavar="S", doc="default 0")
    engine: str = field("engine", metavar="NAME", doc="optimizer under test: engine (ours), "
                        "torch, torch-foreach, torch-fused, ggml, optax, module:attribute")
    ggml_lib: str | None = field(None, metavar="DIR", doc="with --optcheck-engine ggml: its "
                                 "libraries (default: the libggml-python wheel's)")
    self_test: bool = field(False, plugin=False, doc="the step-kernel mutants")
    lr: float | None = _user("your learning rate")
    betas: tuple[float, float] | None = _user("your (beta1, beta2)")
    eps: float | None = _user("your eps")
    weight_decay: float | None = _user("your weight decay")
    momentum: float | None = _user("your momentum")
    dampening: float | None = _user("your dampening")
    nesterov: bool = _user("Nesterov momentum", False)
    amsgrad: bool = _user("AMSGrad", False)
    maximize: bool = _user("maximize", False)

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        set_("opt", tuple(self.opt or ()))
        set_("family", tuple(self.family or ()))
        if self.ggml_lib:          # worker processes may start elsewhere
            set_("ggml_lib", os.path.abspath(self.ggml_lib))

    def _chosen(self, name: str, known) -> tuple[str, ...]:
        """The values of field `name` (a tuple or one value; none or "all": all `known`)."""
        values = getattr(self, name)
        values = values if isinstance(values, tuple) else (values,)
        if not values or "all" in values:
            return tuple(known)
        return tuple(dict.fromkeys(values))

    def optimizers(self) -> tuple[str, ...]:
        from optcheck.harness import OPTIMIZER_NAMES
        return self._chosen("opt", OPTIMIZER_NAMES)

    def families(self) -> tuple[str, ...]:
        from optcheck.runner import FAMILIES
        return self._chosen("family", FAMILIES)

    def dtypes(self) -> tuple[str, ...]:
        from optcheck.harness import DTYPES
        return self._chosen("dtype", DTYPES)

    def problem(self, flag=cli_flag) -> str | None:
        """What makes this request unusable, naming options by `flag` (None: nothing)."""
        from optcheck.harness import DTYPES, OPTIMIZER_NAMES
        from optcheck.runner import FAMILIES, MAX_STEPS
        for name, known in (("opt", OPTIMIZER_NAMES), ("family", tuple(FAMILIES)),
                            ("dtype", DTYPES)):
            values = getattr(self, name)
            for v in values if isinstance(values, tuple) else (values,):
                if v != "all" and v not in known:
                    return (f"{flag(name)} must be one of {', '.join([*known, 'all'])}, got "
                            f"{v!r}")
        if not 1 <= self.steps <= MAX_STEPS:
            return f"{flag('steps')} must lie in [1, {MAX_STEPS}], got {self.steps}"
        if not 0 <= self.seed <= MAX_SEED:
            return f"{flag('seed')} must lie in [0, {MAX_SEED}], got {self.seed}"
        if self.ggml_lib is not None and self.engine != "ggml":
            return (f"{flag('ggml_lib')} applies to {flag('engine')} ggml, not to "
                    f"{flag('engine')} {self.engine}")
        if self.engine != "engine" and self.self_test:
            return (f"{flag('self_test')} checks optcheck itself on our engine; it takes no "
                    f"{flag('engine')} {self.engine}")
        return None

    def user_configs(self) -> dict:
        """optimizer -> the user's hyperparameters for it as (hp, flags), defaults filled in,
        or None when none was given. An option the optimizer does not take is refused first
        (the first in the order lr, eps, weight_decay, momentum, dampening, betas, flags),
        then the values are validated by building the engine optimizer. Raises
        HyperparameterError."""
        from engine.errors import HyperparameterError
        from optcheck.harness import engine_settings, refused_settings
        hp = {k: getattr(self, k) for k in HP_FIELDS if getattr(self, k) is not None}
        if self.betas is not None:
            hp["beta1"], hp["beta2"] = self.betas
        flags = {f: True for f in FLAG_FIELDS if getattr(self, f)}
        configs = {}
        for optimizer in self.optimizers():
            if not hp and not flags:
                configs[optimizer] = None
                continue
            refused = refused_settings(optimizer, hp, flags)
            if refused:
                raise HyperparameterError(f"{optimizer} takes no "
                                          f"--{refused[0].replace('_', '-')}")
            configs[optimizer] = engine_settings(optimizer, hp, flags)
        return configs

    def plan(self) -> Plan:
        """The family runs, in the report's order. UsageProblem on a backend that cannot
        run or a hyperparameter the optimizer refuses."""
        from checkkit.loading import AdapterError
        from engine.backends import get_backend
        from engine.errors import EngineError
        from optcheck.adapters import describe
        from optcheck.runner import adapter_of, run_family
        shared = {}            # what the jobs share, closed with the plan
        with usage_problems(EngineError, AdapterError):
            get_backend(self.backend)
            self.user_configs()
            described = f"backend {self.backend}"
            if self.engine != "engine":
                adapter = adapter_of(self.engine, self.engine_options())
                described = describe(adapter, self.engine)
                if getattr(adapter, "isolated", False) and hasattr(adapter, "close"):
                    shared["close"] = adapter.close    # its worker process (restarts on use)
        which = {} if self.engine == "engine" else {"engine": self.engine}
        jobs = [Job(f"{o}: {f}(type={d})",
                    functools.partial(run_family, f, o, d, self.backend, self.steps, self.seed,
                                      self.engine),
                    {"optimizer": o, "family": f, "backend": self.backend, "dtype": d, **which})
                for f in self.families() for o in self.optimizers() for d in self.dtypes()]
        return Plan(self.tool, [] if self.self_test else jobs,
                    f"{described}, {self.steps} steps, seed {self.seed}", which, **shared)

    def engine_options(self) -> dict:
        """The options the adapter of `engine` is made with (optcheck.adapters.get_adapter):
        ggml's library directory."""
        return {"lib_dir": self.ggml_lib} if self.ggml_lib is not None else {}

    def finish(self, rows) -> list:
        """The report's rows: the jobs' `rows`, then those of the user's own hyperparameters
        (optcheck.runner.run_user_configs). Ctrl-C raises Interrupted with `rows` and the
        user's rows finished before it."""
        from checkkit.interrupted import interrupted_with
        from optcheck.runner import run_user_configs
        try:
            return rows + run_user_configs(self.user_configs(), self.dtypes(), self.backend,
                                           self.steps, self.seed, self.engine)
        except KeyboardInterrupt as exc:
            raise interrupted_with(rows, exc) from None


def run_plan(request: OptcheckRequest, plan: Plan, progress: bool = False) -> list:
    """The rows of `request`, its `plan` run serially in this process, then the user's own
    settings' rows (the self-test: the mutants' rows, then the diagnosis's, in float64).
    Ctrl-C raises checkkit.interrupted.Interrupted with the rows finished before it."""
    if request.self_test:
        from optcheck.selftest import run_self_test
        return run_self_test(request.families(), "f64", request.steps, request.seed,
                             request.backend, progress, diagnosis=True)
    return request.finish(run_jobs(plan.jobs, progress, "optcheck", "run"))


def run_request(request: OptcheckRequest, progress: bool = False) -> list:
    """The rows of `request`, validated, planned and run serially (run_plan). UsageProblem
    on what the command line refuses."""
    problem = request.problem()
    if problem:
        raise UsageProblem(problem)
    with request.plan() as plan:
        return run_plan(request, plan, progress)
