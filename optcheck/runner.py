"""optcheck's families by name, one family run (run_family: one optimizer and dtype), and
the user's own settings against torch.optim; a request (optcheck.request) orders the runs."""

from __future__ import annotations

from optcheck import (
    adapter_invariants,
    closed_form,
    invariants,
    known_bugs,
    precision,
    reference,
    torch_trajectories,
)
from optcheck.harness import DTYPES
from reports.record import Result

# family label -> module with run(optimizer, dtype, backend, steps, seed) -> list[Result] and
# skip_reason(dtype) -> str | None
# steps per trajectory at most (--steps): every step of every tensor is kept to name the
# first that diverges; 100 is the default, and 100 times that is already a long run
MAX_STEPS = 10_000
FAMILIES = {"closed-form": closed_form, "torch": torch_trajectories, "invariant": invariants,
            "precision": precision, "reference": reference, "known-bugs": known_bugs}
# the families that step any optimizer adapter (optcheck.adapters); the torch family
# compares our engine's optimizers with torch.optim's at the same precision. The invariant
# family runs optcheck.adapter_invariants for an adapter, and for our engine its own
# invariants (training loop, checkpoint files, schedules) and the adapter ones it lacks
ADAPTER_FAMILIES = ("closed-form", "reference", "invariant", "precision", "known-bugs")
ENGINE_ALSO = ("lr_zero", "param_groups")   # adapter invariants our engine's family adds
_ADAPTERS: dict = {}        # engine name -> (its options, its adapter), made once per process


def adapter_of(engine, options: dict | None = None):
    """The optimizer adapter `engine` names (an adapter object is itself), made with
    `options` (ggml's lib_dir, optcheck.request) once per process and options; None: the
    one made last for `engine`, else one without options (optcheck.adapters.get_adapter;
    AdapterError when it cannot be made)."""
    if not isinstance(engine, str):
        return engine
    made = _ADAPTERS.get(engine)
    if made is None or (options is not None and made[0] != options):
        from optcheck.adapters import get_adapter
        options = dict(options or {})
        _ADAPTERS[engine] = (options, get_adapter(engine, **options))
    return _ADAPTERS[engine][1]


def family_runner(family: str):
    """The family's run function, looked up when called (so a patched `run` is the one used)."""
    return FAMILIES[family].run


def skip_reason(family: str, dtype: str) -> str | None:
    """Why `family` does not run in `dtype` (None: it does): its module's `skip_reason`."""
    return FAMILIES[family].skip_reason(dtype)


def run_family(family: str, optimizer: str, dtype: str, backend: str = "cpu",
               steps: int = 100, seed: int = 0, engine="engine") -> list[Result]:
    """One family on one optimizer and dtype, of the optimizer `engine` (a name as for
    --engine, or an optimizer adapter; its rows are labelled with its name); an exception
    becomes one "error" row, a dtype the family does not judge one "skip" row that says
    why, a family that checks our engine only one "unsupported" row for another."""
    ours = engine == "engine"
    labels = {"optimizer": optimizer, "family": family, "check": "(family)",
              "backend": backend, "dtype": dtype}
    name = engine if isinstance(engine, str) else getattr(engine, "name", "adapter")
    if not ours:
        labels["engine"] = name
    reason = skip_reason(family, dtype)
    if reason:
        return [Result("optcheck", f"{optimizer}: {family}(type={dtype})", "skip", {},
                       reason, labels)]
    if not ours and family not in ADAPTER_FAMILIES:
        return [Result("optcheck", f"{optimizer}: {family}(type={dtype})", "unsupported", {},
                       f"the {family} family checks our engine's optimizers; another "
                       f"optimizer is checked by the {' and '.join(ADAPTER_FAMILIES)} "
                       f"families", labels)]
    try:
        if ours:
            rows = family_runner(family)(optimizer, dtype=dtype, backend=backend, steps=steps,
                                         seed=seed)
            if family == "invariant":
                from optcheck.adapters.engine_adapter import EngineOptimizer
                rows += adapter_invariants.run(optimizer, dtype, EngineOptimizer(backend),
                                               backend, seed, checks=ENGINE_ALSO)
                for row in rows:
                    row.labels.pop("engine", None)
            return rows
        if family == "invariant":
            rows = adapter_invariants.run(optimizer, dtype, adapter_of(engine), backend, seed)
        else:
            rows = family_runner(family)(optimizer, dtype=dtype, backend=backend, steps=steps,
                                         seed=seed, adapter=adapter_of(engine))
    except Exception as exc:  # noqa: BLE001  (a broken family must not hide the others)
        return [Result("optcheck", f"{optimizer}: {family}", "error", {},
                       f"{type(exc).__name__}: {exc}", labels)]
    for row in rows:
        row.labels["engine"] = name
    return rows


def run_user_configs(configs: dict, dtypes=DTYPES, backend: str = "cpu", steps: int = 100,
                     seed: int = 0, engine="engine") -> list[Result]:
    """The row of the user's own settings, for each optimizer in `configs` (optimizer ->
    (hp, flags), or None when the user gave none) and each dtype: the torch family's where
    it runs in the dtype, else the precision family's (16-bit parameters); for another
    optimizer (`engine`), the reference family's, in the dtypes it judges."""
    if engine != "engine":
        adapter, name = adapter_of(engine), engine if isinstance(engine, str) else "adapter"
        rows = [reference.user_row(adapter, optimizer, *config, dtype, steps, seed, backend)
                for optimizer, config in configs.items() if config is not None
                for dtype in dtypes if reference.skip_reason(dtype) is None]
        for row in rows:
            row.labels["engine"] = name
        return rows

    def family(dtype):
        return torch_trajectories if not torch_trajectories.skip_reason(dtype) else precision
    return [row for optimizer, config in configs.items() if config is not None
            for dtype in dtypes
            for row in family(dtype).run_config(optimizer, *config, dtype=dtype,
                                                backend=backend, steps=steps, seed=seed)]
