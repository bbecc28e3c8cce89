"""optcheck's families by name, one family run (run_family: one optimizer and dtype), and
the user's own settings against torch.optim; a request (optcheck.request) orders the runs."""

from __future__ import annotations

from optcheck import closed_form, invariants, precision, torch_trajectories
from optcheck.harness import DTYPES
from reports.record import Result

# family label -> module with run(optimizer, dtype, backend, steps, seed) -> list[Result] and
# skip_reason(dtype) -> str | None
# steps per trajectory at most (--steps): every step of every tensor is kept to name the
# first that diverges; 100 is the default, and 100 times that is already a long run
MAX_STEPS = 10_000
FAMILIES = {"closed-form": closed_form, "torch": torch_trajectories, "invariant": invariants,
            "precision": precision}


def family_runner(family: str):
    """The family's run function, looked up when called (so a patched `run` is the one used)."""
    return FAMILIES[family].run


def skip_reason(family: str, dtype: str) -> str | None:
    """Why `family` does not run in `dtype` (None: it does): its module's `skip_reason`."""
    return FAMILIES[family].skip_reason(dtype)


def run_family(family: str, optimizer: str, dtype: str, backend: str = "cpu",
               steps: int = 100, seed: int = 0) -> list[Result]:
    """One family on one optimizer and dtype; an exception becomes one "error" row, a dtype
    the family does not judge one "skip" row that says why."""
    labels = {"optimizer": optimizer, "family": family, "check": "(family)",
              "backend": backend, "dtype": dtype}
    reason = skip_reason(family, dtype)
    if reason:
        return [Result("optcheck", f"{optimizer}: {family}(type={dtype})", "skip", {},
                       reason, labels)]
    try:
        return family_runner(family)(optimizer, dtype=dtype, backend=backend, steps=steps,
                                     seed=seed)
    except Exception as exc:  # noqa: BLE001  (a broken family must not hide the others)
        return [Result("optcheck", f"{optimizer}: {family}", "error", {},
                       f"{type(exc).__name__}: {exc}", labels)]


def run_user_configs(configs: dict, dtypes=DTYPES, backend: str = "cpu", steps: int = 100,
                     seed: int = 0) -> list[Result]:
    """The row of the user's own settings, for each optimizer in `configs` (optimizer ->
    (hp, flags), or None when the user gave none) and each dtype: the torch family's where
    it runs in the dtype, else the precision family's (16-bit parameters)."""
    def family(dtype):
        return torch_trajectories if not torch_trajectories.skip_reason(dtype) else precision
    return [row for optimizer, config in configs.items() if config is not None
            for dtype in dtypes
            for row in family(dtype).run_config(optimizer, *config, dtype=dtype,
                                                backend=backend, steps=steps, seed=seed)]
