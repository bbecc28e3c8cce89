"""torch.optim as optimizer adapters (optcheck.adapters.base), one per implementation the
installed torch has: the single-tensor for-loop (`torch`), `torch-foreach` and
`torch-fused`. Each is its own choice, so a bug in one path is not hidden by another (torch's
own tests compare foreach and fused with the for-loop, which itself is checked only by the
loss going down). Parameters, gradients and state are in the dtype under test, as
torch.optim keeps them; the snapshot names the state as torch's state dict does.
"""

from __future__ import annotations

from optcheck.torch_stepper import TorchStepper

STATE = {"sgd": ("momentum_buffer",), "adam": ("step", "exp_avg", "exp_avg_sq"),
         "adamw": ("step", "exp_avg", "exp_avg_sq")}


def state_names(optimizer: str, flags: dict) -> tuple[str, ...]:
    """The state torch.optim keeps for a parameter of `optimizer` with these flags."""
    names = STATE[optimizer]
    if optimizer != "sgd" and flags.get("amsgrad"):
        names = (*names, "max_exp_avg_sq")
    return names


class _TorchStepper:
    """TorchStepper with the Stepper interface: snapshots of the state torch keeps, save and
    restore through torch's state dict."""

    def __init__(self, side: TorchStepper, names: dict):
        self.side, self.names = side, names     # parameter -> its state names

    def step(self, grads: dict) -> None:
        self.side.step(grads)

    def snapshot(self) -> dict:
        return self.side.snapshot(self.names)

    def save(self) -> dict:
        return self.side.save()

    def restore(self, saved) -> None:
        self.side.restore(saved)


class TorchOptimizer:
    """torch.optim's SGD, Adam and AdamW in one implementation ("for-loop", "foreach",
    "fused")."""

    implementation = "for-loop"

    def __init__(self):
        import torch
        self.torch = torch
        self.name = "torch" if self.implementation == "for-loop" else \
            f"torch-{self.implementation}"

    def describe(self) -> str:
        return f"torch {self.torch.__version__} ({self.implementation})"

    def unsupported(self, optimizer, dtype, hp, flags) -> str | None:
        """What this torch refuses: tried on a one-element parameter, one step."""
        import numpy as np
        probe = {"w0": np.zeros(1, np.float64 if dtype == "f64" else np.float32)}
        try:
            stepper = self.stepper(optimizer, probe, hp, flags, dtype)
            stepper.step({"w0": np.ones(1, probe["w0"].dtype)})
        except (RuntimeError, ValueError, TypeError) as exc:
            return (f"torch {self.torch.__version__} has no {self.implementation} "
                    f"{optimizer} for these settings on the CPU: {' '.join(str(exc).split())}")
        return None

    def stepper(self, optimizer, init, hp, flags, dtype):
        side = TorchStepper(optimizer, init, hp, flags, dtype=dtype,
                            implementation=self.implementation)
        return _TorchStepper(side, dict.fromkeys(init, state_names(optimizer, flags)))

    def grouped_stepper(self, optimizer, groups):
        side = TorchStepper.grouped(optimizer, groups, self.implementation)
        return _TorchStepper(side, {k: state_names(optimizer, g.flags)
                                    for g in groups for k in g.init})


class TorchForLoop(TorchOptimizer):
    implementation = "for-loop"


class TorchForeach(TorchOptimizer):
    implementation = "foreach"


class TorchFused(TorchOptimizer):
    implementation = "fused"
