"""torch.optim stepped on gradients the caller gives, with snapshots under the engine's names:
the torch side of the torch family, as `harness.EngineStepper` is the engine side.

    side = TorchStepper("adam", init, hp, flags, ("cosine", {"t_max": 50, "min_factor": 0.1}))
    side.step(grads); side.snapshot(("step", "exp_avg", "exp_avg_sq"))

torch.optim runs its single-tensor implementation (foreach=False) in the dtype of `init`.
The engine's schedules map onto torch's lr_scheduler: `step_decay` -> StepLR, `cosine` ->
CosineAnnealingLR (eta_min = min_factor lr), `linear_warmup` -> LinearLR (end_factor 1).
"""

from __future__ import annotations

import warnings

import numpy as np


class TorchStepper:
    """torch.optim (foreach=False) over tensors initialised from `init` (name -> array), with
    flat hyperparameters `hp` (beta1/beta2, as the engine takes them), `flags`, and an
    optional schedule (engine schedule name, its arguments) as an lr_scheduler stepped after
    every optimizer step; snapshots use the engine's names."""

    def __init__(self, optimizer: str, init: dict, hp: dict, flags: dict,
                 schedule: tuple[str, dict] | None = None):
        import torch

        self.torch = torch
        self.params = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
        if optimizer == "sgd":
            cls, kw = torch.optim.SGD, dict(momentum=hp["momentum"], dampening=hp["dampening"],
                                             nesterov=flags["nesterov"])
        else:
            cls = torch.optim.Adam if optimizer == "adam" else torch.optim.AdamW
            kw = dict(betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                      amsgrad=flags["amsgrad"])
        self.opt = cls(list(self.params.values()), lr=hp["lr"], weight_decay=hp["weight_decay"],
                       maximize=flags["maximize"], foreach=False, **kw)
        self.scheduler = None
        if schedule is not None:
            self.scheduler = _torch_scheduler(torch, self.opt, hp["lr"], *schedule)
        self.steps_taken = 0

    @property
    def lr(self) -> float:
        return float(self.opt.param_groups[0]["lr"])

    def numpy_params(self) -> dict:
        return {k: p.detach().numpy().astype(np.float64) for k, p in self.params.items()}

    def step(self, grads: dict) -> None:
        for k, p in self.params.items():
            p.grad = self.torch.from_numpy(np.array(grads[k]))
        self.opt.step()
        if self.scheduler is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                self.scheduler.step()
        self.steps_taken += 1

    def snapshot(self, state_names) -> dict:
        """Parameters and the state named as the engine names it; state torch keeps no
        tensor for (SGD's step, its momentum buffer when momentum = 0) reads as the engine
        holds it: the step count, and zeros."""
        snap = self.numpy_params()
        for k, p in self.params.items():
            state = self.opt.state.get(p, {})
            for name in state_names:
                if name == "step" and "step" not in state:
                    snap[f"{k}.step"] = np.array([float(self.steps_taken)])
                elif name == "step":
                    snap[f"{k}.step"] = np.array([float(state["step"])])
                elif state.get(name) is None:
                    snap[f"{k}.{name}"] = np.zeros(p.shape)
                else:
                    snap[f"{k}.{name}"] = state[name].numpy().astype(np.float64)
            extra = sorted(set(state) - set(state_names))
            if extra:
                raise RuntimeError(f"torch keeps state {extra} for {k} that the engine lacks")
        return snap


def _torch_scheduler(torch, opt, lr: float, name: str, args: dict):
    sched = torch.optim.lr_scheduler
    if name == "step_decay":
        return sched.StepLR(opt, step_size=args["step_size"], gamma=args["gamma"])
    if name == "cosine":
        return sched.CosineAnnealingLR(opt, T_max=args["t_max"],
                                       eta_min=args["min_factor"] * lr)
    if name == "linear_warmup":
        return sched.LinearLR(opt, start_factor=args["start_factor"], end_factor=1.0,
                              total_iters=args["warmup_steps"])
    raise ValueError(f"no torch scheduler for schedule {name!r}")
