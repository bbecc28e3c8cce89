"""torch.optim stepped on gradients the caller gives, with snapshots under the engine's names:
the torch side of the torch family, as `harness.EngineStepper` is the engine side.

    side = TorchStepper("adam", init, hp, flags, ("cosine", {"t_max": 50, "min_factor": 0.1}))
    side.step(grads); side.snapshot(("step", "exp_avg", "exp_avg_sq"))

torch.optim runs its single-tensor implementation (foreach=False; `implementation`:
"foreach" or "fused" for the others, IMPLEMENTATIONS) in the dtype of `init`,
or in `dtype` ("f16", "bf16", "f32", "f64") where given; `round_to` (a 16-bit dtype) keeps
each parameter's values in that dtype: after every step the parameter is rounded to it, to
nearest even by torch's own conversion, and kept in its own dtype. With `dtype="f32",
round_to="bf16"` that is a bfloat16 parameter whose step and state are float32, the update
rounded once, on store, which torch.optim cannot be told to do: given a bfloat16 parameter it
keeps the state in bfloat16 too (torch 2.13: exp_avg, exp_avg_sq and momentum_buffer take the
parameter's dtype; only Adam's `step` is float32).
The engine's schedules map onto torch's lr_scheduler: `step_decay` -> StepLR, `cosine` ->
CosineAnnealingLR (eta_min = min_factor lr), `linear_warmup` -> LinearLR (end_factor 1),
`warmup_cosine` and `warmup_step` -> SequentialLR of LinearLR and CosineAnnealingLR (T_max =
t_max - warmup_steps) or StepLR, milestone warmup_steps; `chained` -> ChainedScheduler of
its parts, given as {part name: part arguments}.
"""

from __future__ import annotations

import warnings

import numpy as np

from engine.tensor import TORCH_DTYPE_NAMES, dtype_name

# torch.optim's implementations of one rule, as its constructors choose them
IMPLEMENTATIONS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True},
                   "fused": {"fused": True}}


class TorchStepper:
    """torch.optim (foreach=False) over tensors initialised from `init` (name -> array), with
    flat hyperparameters `hp` (beta1/beta2, as the engine takes them), `flags`, and an
    optional schedule (engine schedule name, its arguments) as an lr_scheduler stepped after
    every optimizer step; snapshots use the engine's names."""

    def __init__(self, optimizer: str, init: dict, hp: dict, flags: dict,
                 schedule: tuple[str, dict] | None = None, dtype: str | None = None,
                 round_to: str | None = None, implementation: str = "for-loop"):
        import torch

        self.torch = torch
        self.round_to = None if round_to is None else _torch_dtype(torch, round_to)
        self.params = {}
        self._build(optimizer, [(init, hp, flags, dtype)], implementation)
        self.scheduler = None
        if schedule is not None:
            self.scheduler = _torch_scheduler(torch, self.opt, hp["lr"], *schedule)
        self.steps_taken = 0

    def _build(self, optimizer, groups, implementation) -> None:
        """The torch optimizer over `groups` ((init, hp, flags, dtype or None) each, one
        param group apiece), with the implementation's constructor options."""
        torch = self.torch
        param_groups = []
        for init, hp, flags, dtype in groups:
            tensors = []
            for k, v in init.items():
                # through float64 (exact for every float dtype): torch takes no ml_dtypes array
                t = torch.tensor(np.asarray(v, np.float64))
                t = t.to(_torch_dtype(torch, dtype) if dtype else _numpy_torch_dtype(torch, v))
                self.params[k] = t.requires_grad_(True)
                tensors.append(t)
            param_groups.append({"params": tensors, **group_options(optimizer, hp, flags)})
        cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam,
               "adamw": torch.optim.AdamW}[optimizer]
        self.opt = cls(param_groups, **IMPLEMENTATIONS[implementation])

    @classmethod
    def grouped(cls, optimizer: str, groups, implementation: str = "for-loop") -> TorchStepper:
        """One torch optimizer over several param groups (optcheck.adapters.base.Group: each
        its own parameters, hyperparameters, flags and dtype)."""
        import torch

        self = cls.__new__(cls)
        self.torch, self.round_to, self.params = torch, None, {}
        self._build(optimizer, [(g.init, g.hp, g.flags, g.dtype) for g in groups],
                    implementation)
        self.scheduler, self.steps_taken = None, 0
        return self

    def save(self) -> dict:
        """Copies of the parameters, torch's state dict and the step count."""
        import copy
        return {"params": {k: p.detach().clone() for k, p in self.params.items()},
                "state": copy.deepcopy(self.opt.state_dict()), "steps": self.steps_taken}

    def restore(self, saved: dict) -> None:
        """Continue from `save()`'s copies (torch's load_state_dict)."""
        import copy
        with self.torch.no_grad():
            for k, p in self.params.items():
                p.copy_(saved["params"][k])
        self.opt.load_state_dict(copy.deepcopy(saved["state"]))
        self.steps_taken = saved["steps"]

    @property
    def lr(self) -> float:
        return float(self.opt.param_groups[0]["lr"])

    def numpy_params(self) -> dict:
        return {k: _float64(p) for k, p in self.params.items()}

    def step(self, grads: dict) -> None:
        for k, p in self.params.items():
            g = self.torch.from_numpy(np.array(grads[k], np.float64))
            p.grad = g.to(p.dtype)
        self.opt.step()
        if self.round_to is not None:
            with self.torch.no_grad():
                for p in self.params.values():
                    p.copy_(p.to(self.round_to).to(p.dtype))
        if self.scheduler is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                self.scheduler.step()
        self.steps_taken += 1

    def snapshot(self, state_names) -> dict:
        """Parameters and the state named as the engine names it; state torch keeps no
        tensor for (SGD's step, its momentum buffer when momentum = 0) reads as the engine
        holds it: the step count, and zeros. `state_names`: the names, or a dict from each
        parameter to its names (param groups with different flags)."""
        snap = self.numpy_params()
        for k, p in self.params.items():
            state = self.opt.state.get(p, {})
            names = state_names[k] if isinstance(state_names, dict) else state_names
            for name in names:
                if name == "step" and "step" not in state:
                    snap[f"{k}.step"] = np.array([float(self.steps_taken)])
                elif name == "step":
                    snap[f"{k}.step"] = np.array([float(state["step"])])
                elif state.get(name) is None:
                    snap[f"{k}.{name}"] = np.zeros(p.shape)
                else:
                    snap[f"{k}.{name}"] = _float64(state[name])
            extra = sorted(set(state) - set(names))
            if extra:
                raise RuntimeError(f"torch keeps state {extra} for {k} that the engine lacks")
        return snap


def group_options(optimizer: str, hp: dict, flags: dict) -> dict:
    """torch.optim's options of one param group of `optimizer` from flat `hp` and `flags`."""
    if optimizer == "sgd":
        kw = dict(momentum=hp["momentum"], dampening=hp["dampening"],
                  nesterov=flags["nesterov"])
    else:
        kw = dict(betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"], amsgrad=flags["amsgrad"])
    return dict(lr=hp["lr"], weight_decay=hp["weight_decay"], maximize=flags["maximize"], **kw)


def _torch_dtype(torch, name: str):
    """torch's dtype of the engine's float dtype `name` ('f16', 'bf16', 'f32', 'f64')."""
    return getattr(torch, TORCH_DTYPE_NAMES[name])


def _numpy_torch_dtype(torch, array):
    """torch's dtype of numpy array `array`'s float dtype (ml_dtypes' bfloat16 included)."""
    return _torch_dtype(torch, dtype_name(np.asarray(array).dtype))


def _float64(t) -> np.ndarray:
    """A float64 numpy copy of torch tensor `t`, of any float dtype (exact): numpy widens
    the dtypes it has; bfloat16, which it lacks, goes through torch's float64."""
    try:
        return t.detach().numpy().astype(np.float64)
    except TypeError:           # bfloat16: no numpy dtype
        return t.detach().double().numpy()


def _torch_scheduler(torch, opt, lr: float, name: str, args: dict):
    """torch's scheduler on `opt` for the engine's schedule `name` with `args` (module doc)."""
    sched = torch.optim.lr_scheduler
    if name in ("warmup_cosine", "warmup_step"):
        n = args["warmup_steps"]
        warmup = sched.LinearLR(opt, start_factor=args["start_factor"], end_factor=1.0,
                                total_iters=n)
        if name == "warmup_cosine":
            after = sched.CosineAnnealingLR(opt, T_max=args["t_max"] - n,
                                            eta_min=args["min_factor"] * lr)
        else:
            after = sched.StepLR(opt, step_size=args["step_size"], gamma=args["gamma"])
        return sched.SequentialLR(opt, [warmup, after], milestones=[n])
    if name == "chained":
        parts = [_torch_scheduler(torch, opt, lr, *part) for part in args.items()]
        return sched.ChainedScheduler(parts, optimizer=opt)
    if name == "step_decay":
        return sched.StepLR(opt, step_size=args["step_size"], gamma=args["gamma"])
    if name == "cosine":
        return sched.CosineAnnealingLR(opt, T_max=args["t_max"],
                                       eta_min=args["min_factor"] * lr)
    if name == "linear_warmup":
        return sched.LinearLR(opt, start_factor=args["start_factor"], end_factor=1.0,
                              total_iters=args["warmup_steps"])
    raise ValueError(f"no torch scheduler for schedule {name!r}")
