"""torch autograd as the third opinion: the op's torch equivalent, in float64.

torch is optional: without it, or for an op without a torch equivalent, the reference is
absent and the case is judged on backprop against numerical gradients alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class TorchResult:
    output: np.ndarray
    grads: list[np.ndarray | None]    # per input, in the layout the op sees


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def torch_gradients(case, arrays, weights) -> TorchResult | None:
    """Output and input gradients of sum(torch_fn(*inputs) * weights), all in float64.

    `case` gives `torch_fn` (None: no reference), `inputs` (specs with `grad`) and the
    float64 keyword arguments `torch_kwargs`."""
    fn = case.torch_fn
    if fn is None or not torch_available():
        return None
    import torch
    tens = []
    for spec, a in zip(case.inputs, arrays, strict=True):
        t = torch.tensor(np.asarray(a, np.float64) if a.dtype.kind == "f" else a)
        if spec.grad and a.dtype.kind == "f":
            t.requires_grad_(True)
        tens.append(t)
    out = fn(*tens, **case.torch_kwargs)
    grads: list[np.ndarray | None] = [None] * len(tens)
    if out.dtype.is_floating_point and any(t.requires_grad for t in tens):
        w = torch.tensor(np.asarray(weights, np.float64).reshape(tuple(out.shape)))
        (out.to(torch.float64) * w).sum().backward()
        grads = [(t.grad.numpy() if t.grad is not None else np.zeros(t.shape))
                 if t.requires_grad else None for t in tens]
    return TorchResult(out.detach().to(torch.float64).numpy()
                       if out.dtype.is_floating_point else out.detach().numpy(), grads)
