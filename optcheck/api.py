"""optcheck from Python, for an optimizer written as two numpy functions:

    from optcheck import assert_optimizer, check_optimizer

    def init(params):                                  # dicts of arrays, name -> array
        return {k: {"exp_avg": np.zeros_like(p), "exp_avg_sq": np.zeros_like(p)}
                for k, p in params.items()}

    def update(params, grads, state, step, hparams):   # step counts from 1
        ...
        return new_params, new_state

    rows = check_optimizer(init, update, rule="adamw", hparams={"lr": 1e-3})
    assert_optimizer(init, update, rule="adamw")       # in a test: fails with the rows' text

The update is run by the families that step any optimizer (closed-form, reference) in
float32 and float64, and, with `hparams`, one more reference trajectory at exactly those
settings (torch.optim's names: lr, betas, eps, weight_decay, momentum, dampening, nesterov,
amsgrad, maximize). What `init` and `update` take and return: optcheck.adapters.numpy_adapter.
"""

from __future__ import annotations

from checkkit.sweep import RowsFailed
from optcheck.adapters.numpy_adapter import NumpyUpdate
from optcheck.numpy_optimizers import FLAG_NAMES
from optcheck.runner import ADAPTER_FAMILIES, run_family
from optcheck.torch_trajectories import scenario_of
from reports.record import Result

DEFAULTS = {"sgd": {"momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0},
            "adam": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
            "adamw": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}}


class OptimizerCheckFailure(RowsFailed):
    """Rows that failed, erred or crashed; the message is each one's case and message."""


def flat_settings(rule: str, hparams: dict) -> tuple[dict, dict]:
    """(hp, flags) as the families take them (beta1/beta2) from torch-named `hparams`, with
    torch's defaults; ValueError naming a key the rule does not take, or a missing lr."""
    known = {"lr", *DEFAULTS[rule], *FLAG_NAMES[rule]}
    unknown = sorted(set(hparams) - known)
    if unknown:
        raise ValueError(f"{rule} takes no {', '.join(unknown)}; it takes "
                         f"{', '.join(sorted(known))}")
    if "lr" not in hparams:
        raise ValueError(f"hparams must give lr, got {sorted(hparams)}")
    user = scenario_of("user", {**DEFAULTS[rule], **dict.fromkeys(FLAG_NAMES[rule], False),
                                **hparams})
    return user.hp, user.flags


def check_optimizer(init, update, rule: str = "adamw", hparams: dict | None = None, *,
                    dtypes=("f32", "f64"), steps: int = 100, seed: int = 0,
                    name: str = "numpy") -> list[Result]:
    """optcheck's rows for the numpy optimizer `init`/`update` implementing `rule` (module
    doc): every family that steps any optimizer, in each of `dtypes`, then the reference
    trajectory at `hparams` when given."""
    adapter = NumpyUpdate(init, update, rule, name)
    rows = [row for family in ADAPTER_FAMILIES for dtype in dtypes
            for row in run_family(family, rule, dtype, steps=steps, seed=seed, engine=adapter)]
    if hparams is not None:
        from optcheck import reference
        hp, flags = flat_settings(rule, hparams)
        for dtype in dtypes:
            row = reference.user_row(adapter, rule, hp, flags, dtype, steps, seed)
            row.labels["engine"] = name
            rows.append(row)
    return rows


def assert_optimizer(init, update, rule: str = "adamw", hparams: dict | None = None,
                     **options) -> list[Result]:
    """check_optimizer's rows when none failed; else OptimizerCheckFailure (an
    AssertionError whose message names each failing row and what it saw)."""
    rows = check_optimizer(init, update, rule, hparams, **options)
    if any(not r.ok for r in rows):
        raise OptimizerCheckFailure(rows)
    return rows
