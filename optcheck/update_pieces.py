"""Small update pieces, chained into SGD, Adam and AdamW (torch.optim's semantics) and into
their known variants (optcheck.diagnosis), in the spirit of optax's chains: a variant is the
correct chain with one slot filled by another piece, never a copied optimizer.

A chain steps every parameter at once, flattened into one float64 vector (`Layout`), so
that a step is a dozen numpy operations whatever the number of tensors. The state is a
dict of flat float64 vectors under torch.optim's names (exp_avg, exp_avg_sq,
max_exp_avg_sq, momentum_buffer) and `count`, the step counter, kept per element so that
a counter shared by the tensors is as easy to state as one per tensor.

One step runs the pieces of its slots in this order (`SLOTS`), each reading and writing a
`Work`: theta (the parameters, theta_{t-1} until a piece changes them), g (the direction
being built, first the gradient), t (the step number the corrections use, per element),
bc1/bc2 (the bias corrections the later pieces divide by), `second` (the state entry the
denominator reads) and denom.

    sgd:   count, sign, decay, momentum, store, nesterov, apply, after
    adam:  count, betas, sign, decay, moments, corrections, amsgrad, store, denominator,
           apply, after

With learning rate gamma, weight decay lambda, momentum mu, dampening tau, betas b1, b2:

    count          t = steps so far + 1                     (count_steps)
    sign           g = -g if maximize                        (negate_if_maximize)
    decay          g = g + lambda theta                      (l2_decay: sgd, adam)
                   theta = theta (1 - gamma lambda)          (decoupled_decay: adamw)
    momentum       b = g at t = 1, else mu b + (1 - tau) g   (momentum)
    nesterov       g = g + mu b if nesterov, else b          (nesterov)
    moments        m = m + (1 - b1)(g - m); v = b2 v + (1 - b2) g^2
    corrections    bc1 = 1 - b1^t, bc2 = 1 - b2^t            (bias_corrections)
    amsgrad        vmax = max(vmax, v), read instead of v    (amsgrad_max)
    store          the state as it is stored (nothing: float64)
    denominator    denom = sqrt(v) / sqrt(bc2) + eps         (denominator)
    apply          theta = theta - gamma g                   (sgd: scale_by_lr)
                   theta = theta - gamma / bc1 * m / denom   (adam: scale_by_corrected_lr)
    after          nothing (a decay placed here acts on the updated parameters)

`CORRECT[rule]` fills the slots so that the chain agrees with optcheck.numpy_optimizers to
float64 rounding (tests/optcheck/test_diagnosis.py checks it over the torch family's grid).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import ml_dtypes
import numpy as np

State = dict[str, np.ndarray]
# the state entries that are float tensors, named as torch.optim's state dict names them
FLOAT_STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")
SLOTS = {
    "sgd": ("count", "sign", "decay", "momentum", "store", "nesterov", "apply", "after"),
    "adam": ("count", "betas", "sign", "decay", "moments", "corrections", "amsgrad", "store",
             "denominator", "apply", "after"),
}
SLOTS["adamw"] = SLOTS["adam"]
STORAGE = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each tensor of a dict of parameters sits in the flat vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]          # start of each tensor, then the total size
    segment: np.ndarray               # per element: the index of its tensor

    @classmethod
    def of(cls, params: Mapping[str, np.ndarray]) -> Layout:
        names = tuple(params)
        shapes = tuple(np.shape(params[k]) for k in names)
        sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)]))
        segment = np.repeat(np.arange(len(names)), sizes)
        return cls(names, shapes, offsets, segment)

    @property
    def size(self) -> int:
        return self.offsets[-1]

    def flat(self, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
        """The tensors of `tensors` named as the layout's, as one float64 vector."""
        if not self.names:
            return np.zeros(0)
        return np.concatenate([np.asarray(tensors[k], np.float64).reshape(-1)
                               for k in self.names])

    def split(self, vector: np.ndarray) -> dict[str, np.ndarray]:
        """The flat `vector` as tensors by name (views of it)."""
        return {k: vector[a:b].reshape(s) for k, s, a, b in
                zip(self.names, self.shapes, self.offsets[:-1], self.offsets[1:],
                    strict=True)}


@dataclasses.dataclass
class Work:
    """One step in progress (module doc)."""

    theta: np.ndarray
    g: np.ndarray
    state: State
    hp: Mapping[str, float]
    flags: Mapping[str, bool]
    layout: Layout
    t: np.ndarray | None = None
    bc1: np.ndarray | float = 1.0
    bc2: np.ndarray | float = 1.0
    second: str = "exp_avg_sq"
    denom: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Piece:
    """One small transform of a `Work`. `keeps(hp, flags)`: the state entries it owns at
    these settings (zeros at init)."""

    name: str
    apply: Callable[[Work], None]
    keeps: Callable[[Mapping, Mapping], tuple[str, ...]] = lambda hp, flags: ()

    def __str__(self) -> str:
        return self.name


# --------------------------------------------------------------------------- step counter

def count_steps(start: int = 1) -> Piece:
    """t = the steps made so far + `start` (1: the first update is step 1)."""
    def apply(w: Work) -> None:
        w.t = w.state["count"] + start
        w.state["count"] = w.state["count"] + 1.0
    return Piece(f"count_steps(start={start})", apply, lambda hp, flags: ("count",))


def count_shared() -> Piece:
    """One counter for all tensors, advanced by each tensor in turn: at step s the i-th
    tensor (from 0) uses t = (s - 1) n + i + 1, n tensors."""
    def apply(w: Work) -> None:
        w.t = w.state["count"] + w.layout.segment + 1.0
        w.state["count"] = w.state["count"] + len(w.layout.names)
    return Piece("count_shared", apply, lambda hp, flags: ("count",))


# --------------------------------------------------------------------------- sign, betas

def negate_if_maximize() -> Piece:
    """g = -g when maximizing."""
    def apply(w: Work) -> None:
        if w.flags.get("maximize"):
            w.g = -w.g
    return Piece("negate_if_maximize", apply)


def swap_betas() -> Piece:
    """b1 and b2 exchanged for the rest of the step."""
    def apply(w: Work) -> None:
        w.hp = {**w.hp, "beta1": w.hp["beta2"], "beta2": w.hp["beta1"]}
    return Piece("swap_betas", apply)


def round_betas(dtype=np.float32) -> Piece:
    """b1 and b2 rounded to `dtype` (kept in a float32 tensor or variable), and every
    coefficient derived from them (1 - b, b^t) computed from the rounded values."""
    def apply(w: Work) -> None:
        w.hp = {**w.hp, "beta1": float(dtype(w.hp["beta1"])),
                "beta2": float(dtype(w.hp["beta2"]))}
    return Piece("round_betas", apply)


# --------------------------------------------------------------------------- weight decay

def l2_decay() -> Piece:
    """g = g + lambda theta (L2 regularisation through the gradient)."""
    def apply(w: Work) -> None:
        if w.hp["weight_decay"] != 0:
            w.g = w.g + w.hp["weight_decay"] * w.theta
    return Piece("l2_decay", apply)


def decoupled_decay(lr_scaled: bool = True) -> Piece:
    """theta = theta (1 - gamma lambda), or (1 - lambda) when not `lr_scaled`."""
    def apply(w: Work) -> None:
        wd = w.hp["weight_decay"]
        if wd != 0:
            w.theta = w.theta * (1.0 - (w.hp["lr"] * wd if lr_scaled else wd))
    return Piece("decoupled_decay" + ("" if lr_scaled else "(lr_scaled=False)"), apply)


# --------------------------------------------------------------------------- SGD

def momentum(dampening: bool = True, first: str = "gradient") -> Piece:
    """The momentum buffer, when mu != 0: b = mu b + (1 - tau) g (tau -> 0 when not
    `dampening`); its first value (t = 1) is `first`: "gradient" (b = g, torch),
    "dampened" (b = (1 - tau) g) or "zero buffer" (no first-step case: the formula from
    b = 0)."""
    def apply(w: Work) -> None:
        mu = w.hp["momentum"]
        if mu == 0:
            return
        tau = w.hp["dampening"] if dampening else 0.0
        buffer = w.state["momentum_buffer"] * mu + (1.0 - tau) * w.g
        if first == "gradient":
            buffer = np.where(w.t == 1, w.g, buffer)
        elif first == "dampened":
            buffer = np.where(w.t == 1, (1.0 - w.hp["dampening"]) * w.g, buffer)
        w.state["momentum_buffer"] = buffer
    name = "momentum" if dampening and first == "gradient" else \
        f"momentum(dampening={dampening}, first={first!r})"
    return Piece(name, apply, lambda hp, flags: ("momentum_buffer",))


def nesterov(look_ahead: bool = True) -> Piece:
    """When mu != 0: g = g + mu b with Nesterov momentum (unless not `look_ahead`), else
    g = b."""
    def apply(w: Work) -> None:
        mu = w.hp["momentum"]
        if mu == 0:
            return
        buffer = w.state["momentum_buffer"]
        w.g = w.g + mu * buffer if w.flags.get("nesterov") and look_ahead else buffer
    return Piece("nesterov" if look_ahead else "nesterov(look_ahead=False)", apply)


def scale_by_lr() -> Piece:
    """theta = theta - gamma g."""
    def apply(w: Work) -> None:
        w.theta = w.theta - w.hp["lr"] * w.g
    return Piece("scale_by_lr", apply)


# --------------------------------------------------------------------------- Adam

def _lerp(start, end, weight):
    """start + weight (end - start), rounded as torch's scalar lerp (numpy_optimizers)."""
    if abs(weight) < 0.5:
        return start + weight * (end - start)
    return end - (end - start) * (1.0 - weight)


def first_moment() -> Piece:
    """m = m + (1 - b1)(g - m)."""
    def apply(w: Work) -> None:
        w.state["exp_avg"] = _lerp(w.state["exp_avg"], w.g, 1.0 - w.hp["beta1"])
    return Piece("first_moment", apply, lambda hp, flags: ("exp_avg",))


def second_moment() -> Piece:
    """v = b2 v + (1 - b2) g^2."""
    def apply(w: Work) -> None:
        b2 = w.hp["beta2"]
        w.state["exp_avg_sq"] = w.state["exp_avg_sq"] * b2 + (1.0 - b2) * w.g * w.g
    return Piece("second_moment", apply, lambda hp, flags: ("exp_avg_sq",))


def bias_corrections(m: bool = True, v: bool = True, times: int = 1) -> Piece:
    """bc1 = (1 - b1^t)^times when `m` (else 1), bc2 likewise when `v`."""
    def apply(w: Work) -> None:
        if m:
            w.bc1 = (1.0 - w.hp["beta1"] ** w.t) ** times
        if v:
            w.bc2 = (1.0 - w.hp["beta2"] ** w.t) ** times
    default = m and v and times == 1
    return Piece("bias_corrections" if default else
                 f"bias_corrections(m={m}, v={v}, times={times})", apply)


def amsgrad_max(of: str = "v") -> Piece:
    """With amsgrad, the denominator reads vmax = max(vmax, x) instead of v, x being `of`:
    "v" (torch), "m" (exp_avg taken for exp_avg_sq), "corrected v" (v / bc2, then no
    further correction: optax's scale_by_amsgrad) or "current v" (vmax = v: the maximum
    not kept)."""
    def apply(w: Work) -> None:
        if not w.flags.get("amsgrad"):
            return
        vmax = w.state["max_exp_avg_sq"]
        if of == "v":
            vmax = np.maximum(vmax, w.state["exp_avg_sq"])
        elif of == "m":
            vmax = np.maximum(vmax, w.state["exp_avg"])
        elif of == "corrected v":
            vmax = np.maximum(vmax, w.state["exp_avg_sq"] / w.bc2)
            w.bc2 = 1.0
        else:
            vmax = w.state["exp_avg_sq"].copy()
        w.state["max_exp_avg_sq"] = vmax
        w.second = "max_exp_avg_sq"
    return Piece("amsgrad_max" if of == "v" else f"amsgrad_max(of={of!r})", apply,
                 lambda hp, flags: ("max_exp_avg_sq",) if flags.get("amsgrad") else ())


def store_state_in(dtype: str) -> Piece:
    """Every float state entry rounded to `dtype` ("bf16", "f16", "f32"), as kept in it."""
    storage = STORAGE[dtype]

    def apply(w: Work) -> None:
        for name in FLOAT_STATE:
            if name in w.state:
                w.state[name] = w.state[name].astype(storage).astype(np.float64)
    return Piece(f"store_state_in({dtype})", apply)


def denominator(eps: str = "outside") -> Piece:
    """denom from the second moment s read (v or vmax): sqrt(s) / sqrt(bc2) + eps
    ("outside", torch), sqrt(s / bc2 + eps) ("inside") or (sqrt(s) + eps) / sqrt(bc2)
    ("corrected": eps scaled by the correction too, the paper's efficient form)."""
    def apply(w: Work) -> None:
        s, root_bc2, e = w.state[w.second], np.sqrt(w.bc2), w.hp["eps"]
        if eps == "outside":
            w.denom = np.sqrt(s) / root_bc2 + e
        elif eps == "inside":
            w.denom = np.sqrt(s / w.bc2 + e)
        else:
            w.denom = (np.sqrt(s) + e) / root_bc2
    return Piece("denominator" if eps == "outside" else f"denominator(eps={eps!r})", apply)


def scale_by_corrected_lr() -> Piece:
    """theta = theta - gamma / bc1 * m / denom."""
    def apply(w: Work) -> None:
        w.theta = w.theta - (w.hp["lr"] / w.bc1) * w.state["exp_avg"] / w.denom
    return Piece("scale_by_corrected_lr", apply)


# --------------------------------------------------------------------------- chains

CORRECT: dict[str, dict[str, tuple[Piece, ...]]] = {
    "sgd": {"count": (count_steps(),), "sign": (negate_if_maximize(),),
            "decay": (l2_decay(),), "momentum": (momentum(),), "store": (),
            "nesterov": (nesterov(),), "apply": (scale_by_lr(),), "after": ()},
    "adam": {"count": (count_steps(),), "betas": (), "sign": (negate_if_maximize(),),
             "decay": (l2_decay(),), "moments": (first_moment(), second_moment()),
             "corrections": (bias_corrections(),), "amsgrad": (amsgrad_max(),),
             "store": (), "denominator": (denominator(),),
             "apply": (scale_by_corrected_lr(),), "after": ()},
}
CORRECT["adamw"] = {**CORRECT["adam"], "decay": (decoupled_decay(),)}


@dataclasses.dataclass(frozen=True)
class Chain:
    """The pieces of one rule, in slot order; `init` and `step` act on flat vectors."""

    pieces: tuple[Piece, ...]

    @classmethod
    def of(cls, rule: str, **swaps: tuple[Piece, ...]) -> Chain:
        """The correct chain of `rule` with the slots named in `swaps` refilled."""
        unknown = sorted(set(swaps) - set(SLOTS[rule]))
        if unknown:
            raise ValueError(f"{rule} has no slot {', '.join(unknown)}; its slots: "
                             f"{', '.join(SLOTS[rule])}")
        slots = {**CORRECT[rule], **swaps}
        return cls(tuple(p for slot in SLOTS[rule] for p in slots[slot]))

    def __str__(self) -> str:
        return "chain(" + ", ".join(map(str, self.pieces)) + ")"

    def init(self, layout: Layout, hp: Mapping, flags: Mapping) -> State:
        """Zeros for every state entry a piece keeps at these settings."""
        names = dict.fromkeys(n for p in self.pieces for n in p.keeps(hp, flags))
        return {n: np.zeros(layout.size) for n in names}

    def step(self, theta: np.ndarray, grad: np.ndarray, state: State, hp: Mapping,
             flags: Mapping, layout: Layout) -> tuple[np.ndarray, State]:
        """One update of the flat parameters `theta` with the flat gradient `grad`; the
        arguments are not changed."""
        work = Work(theta, grad, dict(state), hp, flags, layout)
        for piece in self.pieces:
            piece.apply(work)
        return work.theta, work.state


def run_chain(chain: Chain, init: Mapping[str, np.ndarray], grads, hp: Mapping,
              flags: Mapping) -> list[tuple[dict, dict]]:
    """[(params, state) by tensor name, for t = 1..len(grads)] of `chain` from `init` under
    the gradients `grads` (a list per step of name -> array); float64, as
    optcheck.numpy_optimizers.numpy_trajectory gives one tensor's."""
    layout = Layout.of(init)
    theta, state = layout.flat(init), chain.init(layout, hp, flags)
    out = []
    with np.errstate(all="ignore"):
        for grad in grads:
            theta, state = chain.step(theta, layout.flat(grad), state, hp, flags, layout)
            out.append((layout.split(theta.copy()),
                        {n: layout.split(v.copy()) for n, v in state.items()}))
    return out
