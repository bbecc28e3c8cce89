"""A numpy update written in Python as an optimizer adapter (optcheck.adapters.base): what
optcheck.api.check_optimizer wraps around the user's two functions.

    init(params) -> state
    update(params, grads, state, step, hparams) -> (params, state)

`params` and `grads` are dicts of arrays (name -> array, in the dtype under test); `step`
counts from 1 (the first update is step 1, as in the papers); `hparams` holds `lr`,
`betas`, `eps`, `weight_decay`, `momentum`, `dampening` and the flags `nesterov`,
`amsgrad`, `maximize`, named as torch.optim names them (only those of the rule). The state
is the user's own; where it is a dict of per-parameter dicts (`state["w0"]["exp_avg"]`)
whose entries carry torch's state names (exp_avg, exp_avg_sq, max_exp_avg_sq,
momentum_buffer, step), those are compared too.

What `update` hands back is checked at every step: the same parameter names, shapes and
dtype; a wrong one is an error row that says what was wrong.
"""

from __future__ import annotations

import numpy as np

from engine.tensor import DTYPES
from optcheck.adapters.base import RULES
from optcheck.harness import to_engine_kwargs

STATE_NAMES = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")


class UpdateError(ValueError):
    """What the user's update handed back is not what it must be."""


class _NumpyStepper:
    def __init__(self, adapter, optimizer, init, hp, flags, dtype):
        self.update, self.dtype = adapter.update, DTYPES[dtype]
        self.hparams = to_engine_kwargs(optimizer, hp, flags)   # torch's names: betas
        self.params = {k: np.array(v, self.dtype) for k, v in init.items()}
        self.state = adapter.init({k: v.copy() for k, v in self.params.items()})
        self.t = 0

    def step(self, grads: dict) -> None:
        self.t += 1
        given = {k: np.asarray(grads[k], self.dtype) for k in self.params}
        answer = self.update({k: v.copy() for k, v in self.params.items()}, given,
                             self.state, self.t, dict(self.hparams))
        if not isinstance(answer, tuple) or len(answer) != 2:
            raise UpdateError(f"update must return (params, state), got "
                              f"{type(answer).__name__}")
        params, self.state = answer
        self.params = self._checked(params)

    def _checked(self, params) -> dict:
        if not isinstance(params, dict) or set(params) != set(self.params):
            got = sorted(params) if isinstance(params, dict) else type(params).__name__
            raise UpdateError(f"update returned parameters {got}, expected "
                              f"{sorted(self.params)}")
        out = {}
        for k, old in self.params.items():
            new = np.asarray(params[k])
            if new.shape != old.shape or new.dtype != old.dtype:
                raise UpdateError(f"update returned {k} of shape {new.shape} and dtype "
                                  f"{new.dtype}, expected {old.shape} and {old.dtype}")
            out[k] = new.copy()
        return out

    def save(self):
        """Copies of the parameters, the user's state and the step count: the state must
        hold everything the update needs (nothing kept in a closure or a global)."""
        import copy
        return copy.deepcopy((self.params, self.state, self.t))

    def restore(self, saved) -> None:
        import copy
        self.params, self.state, self.t = copy.deepcopy(saved)

    def snapshot(self) -> dict:
        snap = {k: v.astype(np.float64) for k, v in self.params.items()}
        if isinstance(self.state, dict):
            for k in self.params:
                entries = self.state.get(k)
                if isinstance(entries, dict):
                    snap.update({f"{k}.{s}": np.asarray(entries[s], np.float64).reshape(-1)
                                 if s == "step" else np.asarray(entries[s], np.float64)
                                 for s in STATE_NAMES if s in entries})
        return snap


class NumpyUpdate:
    """The user's `init` and `update` (module doc), implementing `rule` ("sgd", "adam" or
    "adamw")."""

    def __init__(self, init, update, rule: str = "adamw", name: str = "numpy"):
        if rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
        self.init, self.update, self.rule, self.name = init, update, rule, name

    def describe(self) -> str:
        return f"{self.name}: {getattr(self.update, '__qualname__', 'update')} ({self.rule})"

    def unsupported(self, optimizer, dtype, hp, flags) -> str | None:
        if optimizer != self.rule:
            return f"this update implements {self.rule}, not {optimizer}"
        return None

    def stepper(self, optimizer, init, hp, flags, dtype):
        return _NumpyStepper(self, optimizer, init, hp, flags, dtype)
