"""What every optcheck family shares: the settings an engine optimizer takes, stepping it on
given gradients, snapshots of parameters and state, trajectory comparison, and result
records.

Tensors are named as in torch.optim's state: a parameter `w0` has state `w0.step`,
`w0.exp_avg`, `w0.exp_avg_sq`, `w0.max_exp_avg_sq` or `w0.momentum_buffer`. A snapshot is a
dict from those names (and the parameter names) to float64 copies.
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np

import engine
from engine.errors import HyperparameterError
from engine.optim import OPTIMIZERS, make_optimizer
from engine.tensor import DTYPES as ENGINE_DTYPES
from engine.tensor import FLOAT_NAMES
from reports.record import Result

OPTIMIZER_NAMES = tuple(OPTIMIZERS)
# the parameter dtypes optcheck checks (--dtype); a family that cannot judge one says why
# in a "skip" row (its `skip_reason`); float16 and bfloat16 parameters keep float32 state
DTYPES = FLOAT_NAMES
DTYPE_OF = {name: ENGINE_DTYPES[name] for name in FLOAT_NAMES}   # numpy dtypes by name

# err <= atol * scale + rtol * |want|, scale = max(1, max |want| of that tensor at that step).
# float64: the engine and torch round differently but identically often; float32: a few
# ulps per step, accumulated additively over the steps (gradients come from one trajectory).
TOLERANCES = {"f64": (1e-12, 1e-10), "f32": (2e-6, 2e-5)}
EXACT = (0.0, 0.0)      # (atol, rtol) of results that must agree bit for bit


def tolerance(dtype: str, steps: int = 100) -> tuple[float, float]:
    """The dtype's (atol, rtol), widened in proportion to the steps beyond 100 (rounding
    errors of the steps add up)."""
    atol, rtol = TOLERANCES[dtype]
    k = max(1.0, steps / 100)
    return atol * k, rtol * k


def to_engine_kwargs(name: str, hp: dict, flags: dict) -> dict:
    """Constructor keywords of the engine optimizer `name` from flat hp/flag dicts
    (beta1/beta2 become betas)."""
    kw = {k: v for k, v in hp.items() if k not in ("beta1", "beta2")}
    if "beta1" in hp or "beta2" in hp:
        kw["betas"] = (hp.get("beta1", 0.9), hp.get("beta2", 0.999))
    kw.update(flags)
    return kw


_NOT_SETTINGS = ("params", "grads", "schedule")   # constructor keywords that are no setting


def engine_options(name: str) -> tuple[str, ...]:
    """The settings the engine optimizer `name` takes: the keywords of its constructor but
    the parameters, gradients and schedule (sgd: lr, momentum, dampening, weight_decay,
    nesterov, maximize; adam, adamw: lr, betas, eps, weight_decay, amsgrad, maximize)."""
    keywords = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in inspect.signature(OPTIMIZERS[name]).parameters.values()
                 if p.kind in keywords and p.name not in _NOT_SETTINGS)


def refused_settings(name: str, hp: dict, flags: dict) -> list[str]:
    """The constructor keywords of flat `hp` and `flags` (beta1/beta2 as `betas`) that the
    engine optimizer `name` does not take, in the order `to_engine_kwargs` gives them."""
    options = engine_options(name)
    return [k for k in to_engine_kwargs(name, hp, flags) if k not in options]


def engine_settings(name: str, hp: dict, flags: dict) -> tuple[dict, dict]:
    """(hyperparameters, flags) of the engine optimizer `name` built from flat `hp` and
    `flags`, its defaults filled in and every value validated as the Python API validates it.
    Raises HyperparameterError for a setting `name` does not take or a bad value."""
    refused = refused_settings(name, hp, flags)
    if refused:
        raise HyperparameterError(f"{name} takes no {', '.join(refused)}")
    opt = make_optimizer(name, [engine.param((1,), name="probe")],
                         **to_engine_kwargs(name, hp, flags))
    return opt.hparams, dict(opt.flags)


class EngineStepper:
    """An engine optimizer over parameters initialised from `init` (name -> array), stepped
    on gradients the caller gives."""

    def __init__(self, name: str, init: dict, hp: dict, flags: dict, dtype: str = "f64",
                 backend: str = "cpu", schedule=None):
        self.backend = backend
        self.params = {k: engine.param(np.shape(v), dtype, name=k) for k, v in init.items()}
        for k, v in init.items():
            self.params[k].set(v)
        self.opt = make_optimizer(name, list(self.params.values()), schedule=schedule,
                                  **to_engine_kwargs(name, hp, flags))
        self.dtype = DTYPE_OF[dtype]

    def step(self, grads: dict) -> None:
        for k, p in self.params.items():
            self.opt.grads[p].set(np.asarray(grads[k], self.dtype))
        self.opt.step(self.backend)

    def snapshot(self) -> dict[str, np.ndarray]:
        snap = {k: p.numpy().astype(np.float64) for k, p in self.params.items()}
        snap.update({k: v.astype(np.float64) for k, v in self.opt.state_arrays().items()})
        return snap

    def save(self) -> dict:
        """Copies of the parameters and of every state tensor (the step count among them)."""
        return {"params": {k: p.numpy() for k, p in self.params.items()},
                "state": self.opt.state_arrays()}

    def restore(self, saved: dict) -> None:
        """Continue from `save()`'s copies."""
        for k, p in self.params.items():
            p.set(saved["params"][k])
        self.opt.load_state_arrays(saved["state"])


@dataclasses.dataclass
class Comparison:
    """The agreement of two trajectories: worst errors over every tensor and step, and the
    first (step, tensor) out of tolerance with its error (None when all agree)."""

    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    first_step: int | None = None
    first_tensor: str | None = None
    first_err: float | None = None
    first_what: str = ""        # what was wrong, where not an error's size (NaN, shape)
    compared: int = 0

    @property
    def ok(self) -> bool:
        return self.first_step is None

    def add(self, step: int, got: dict, want: dict, dtype: str, names=None,
            tol: tuple[float, float] | None = None) -> None:
        """Compare one step's snapshots over `names` (default: every name in `want`)."""
        atol, rtol = tol or TOLERANCES[dtype]
        finite: list[tuple[str, np.ndarray, np.ndarray]] = []   # (name, got, want)
        for name in names or want:
            w = np.asarray(want[name], np.float64).reshape(-1)
            g = np.asarray(got[name], np.float64).reshape(-1)
            if np.shape(got[name]) != np.shape(want[name]):
                self._flush(step, finite, atol, rtol)
                finite = []
                self._first(step, name, float("inf"),
                            f"shape {np.shape(got[name])}, expected {np.shape(want[name])}")
                continue
            self.compared += 1
            if np.isfinite(g).all() and np.isfinite(w).all():
                finite.append((name, g, w))     # the common case: judged all at once
            else:
                self._flush(step, finite, atol, rtol)
                finite = []
                self._add_one(step, name, g, w, atol, rtol)
        self._flush(step, finite, atol, rtol)

    def _flush(self, step, tensors, atol, rtol) -> None:
        """Judge tensors whose values and references are all finite, in one pass: each
        element against atol * max(1, max |want| of its tensor) + rtol * |want|."""
        tensors = [t for t in tensors if t[1].size]
        if not tensors:
            return
        got = np.concatenate([g for _, g, _ in tensors])
        want = np.concatenate([w for _, _, w in tensors])
        sizes = np.array([w.size for _, _, w in tensors])
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        err, size = np.abs(got - want), np.abs(want)
        self.max_abs_err = max(self.max_abs_err, float(err.max()))
        nonzero = size != 0                 # relative to zero means nothing
        if nonzero.any():
            self.max_rel_err = max(self.max_rel_err, float((err[nonzero] /
                                                            size[nonzero]).max()))
        scale = np.repeat(np.maximum(1.0, np.maximum.reduceat(size, starts)), sizes)
        over = err > atol * scale + rtol * size
        if over.any():
            first = int(np.searchsorted(starts, int(np.argmax(over)), side="right")) - 1
            a, b = starts[first], starts[first] + sizes[first]
            self._first(step, tensors[first][0], float(err[a:b][over[a:b]].max()))

    def _add_one(self, step, name, g, w, atol, rtol) -> None:
        """add() of one tensor holding a NaN or an infinity (on either side)."""
        err = np.abs(g - w)
        bad_nan = ~np.isfinite(g) & ~(np.isnan(g) & np.isnan(w)) & (g != w)
        scale = max(1.0, float(np.max(np.abs(w), initial=0.0, where=np.isfinite(w))))
        finite = np.isfinite(err)
        if finite.any():
            self.max_abs_err = max(self.max_abs_err, float(err[finite].max()))
            nonzero = finite & (w != 0)
            if nonzero.any():
                rel = err[nonzero] / np.abs(w[nonzero])
                self.max_rel_err = max(self.max_rel_err, float(rel.max()))
        over = finite & (err > atol * scale + rtol * np.abs(w))
        if bad_nan.any() or over.any():
            worst = float("inf") if bad_nan.any() else float(err[over].max())
            what = ""
            if bad_nan.any():
                kinds = sorted({"NaN" if np.isnan(x) else "inf" for x in g[bad_nan]})
                what = f"{' and '.join(kinds)} where the reference has " + \
                    ("finite values" if np.isfinite(w[bad_nan]).all() else "others")
            self._first(step, name, worst, what)

    def _first(self, step, name, err, what=""):
        if self.first_step is None:
            self.first_step, self.first_tensor, self.first_err = step, name, err
            self.first_what = what

    def describe(self) -> str:
        if self.ok:
            return ""
        detail = self.first_what or f"|error| {self.first_err:.3g}"
        return f"first diverged at step {self.first_step} in {self.first_tensor} ({detail})"


def result(optimizer: str, family: str, check: str, case: str, dtype: str, backend: str,
           comparison: Comparison | None = None, ok: bool | None = None, message: str = "",
           status: str | None = None, **metrics) -> Result:
    """One optcheck row. `case` is the one-line description of the scenario and its
    hyperparameters; the status comes from `comparison` unless `ok` or `status` (e.g.
    "error", "skip") is given."""
    if ok is None:
        ok = comparison.ok if comparison is not None else True
    m = {}
    if comparison is not None:
        m = {"max_abs_err": comparison.max_abs_err, "max_rel_err": comparison.max_rel_err,
             "first_step": comparison.first_step, "first_tensor": comparison.first_tensor}
        if not ok and not message:
            message = comparison.describe()
    m.update(metrics)
    m.setdefault("max_abs_err", None)
    status = status or ("pass" if ok else "fail")
    return Result("optcheck", f"{optimizer}: {case}", status, m, message,
                  {"optimizer": optimizer, "family": family, "check": check,
                   "backend": backend, "dtype": dtype})


def status_of(exc: BaseException) -> str:
    """The status of a row whose run raised `exc`: "crash" when the optimizer's worker
    process died or hung (checkkit.worker.WorkerCrash: an abort in C code), else "error"."""
    from checkkit.worker import WorkerCrash
    return "crash" if isinstance(exc, WorkerCrash) else "error"
