"""optax's optimizers as an optimizer adapter (optcheck.adapters.base): `--engine optax`.

torch.optim's settings map onto optax's own aliases where optax has one, and onto chains of
optax's transforms where torch's rule needs more (applied top to bottom, g the gradient):

    sgd     [add_decayed_weights(wd): g + wd p, L2 as torch adds it]
            [dampening: scale_by_schedule(1 on the first update, 1 - tau after)]
            optax.sgd(lr, momentum or None, nesterov)     trace: b_t = g + mu b_{t-1}, b_0 = 0
    adam    [add_decayed_weights(wd)] optax.adam(lr, b1, b2, eps, eps_root=0)
            amsgrad: scale_by_amsgrad(b1, b2, eps) then scale_by_learning_rate(lr)
    adamw   optax.adamw(lr, b1, b2, eps, weight_decay=wd)
            = scale_by_adam, add_decayed_weights(wd), scale_by_learning_rate(lr): the decay
            is multiplied by lr, as torch's p (1 - lr wd)
            amsgrad: scale_by_amsgrad, add_decayed_weights(wd), scale_by_learning_rate(lr)

optax.trace's first buffer is g + mu 0 = g, torch's first buffer (a clone of g): the same.
torch's dampening scales g by 1 - tau from the second step on but not on the first; no optax
optimizer has it (optax.ema's dampening is tied to its decay and applies on the first step
too), but a schedule on optax's own update count says it exactly, so dampening is
supported. eps is added outside the square root after bias correction (eps_root = 0), as
torch adds it. AMSGrad is optax's own: optax keeps the running maximum of the
bias-corrected second moment, torch that of the raw one (then corrects it); this adapter
does not paper over that, so the reference family reports it.

Parameters, gradients and state live on jax's CPU device in the dtype under test (x64 is
enabled, so float64 runs in float64); one update is one jax.jit-compiled function, compiled
once per settings, shapes and dtypes (steppers with the same settings share it: about 0.2 s
to compile, 0.2 ms a step after). optax has no maximize: the stepper negates the gradient
before the update (exactly, as torch's maximize does), so maximizing is the very update of
minimizing -g. (Negated inside the compiled update, as optax.scale(-1) would, XLA's CPU code
contracts multiply-adds into FMAs differently, and the two differ in the last bit on a CPU
with FMA: a property of the chain this adapter would build, not of optax.)

The snapshot names optax's state as torch does where the meaning is the same: count ->
`w0.step` (shape (1,); the count of Adam's state: SGD, as torch's, has none), mu ->
`w0.exp_avg`, nu -> `w0.exp_avg_sq`, trace -> `w0.momentum_buffer`. AMSGrad's nu_max (a
maximum of corrected moments) is never `w0.max_exp_avg_sq`; a stepper's optax_state() has it
as `w0.nu_max`, with every other field by optax's name. For 16-bit parameters optax keeps mu,
nu and the trace in the parameter's dtype (a stepper's state_dtypes() tells).
"""

from __future__ import annotations

import os

import numpy as np

from checkkit.cache import default_cache_dir
from engine.tensor import DTYPES
from optcheck.adapters.base import RULES, AdapterError

try:
    import jax
    import jax.numpy as jnp
    import optax
except ImportError as exc:      # the extra is not installed: get_adapter says how to
    jax = jnp = optax = None
    _MISSING = exc
else:
    _MISSING = None

INSTALL_HINT = ("optax is not installed (needs jax, jaxlib and optax, CPU only): "
                "pip install 'gradverify[optax]'")
# optax's state field -> torch's state name, where the meaning is the same
STATE_NAMES = {"count": "step", "mu": "exp_avg", "nu": "exp_avg_sq",
               "trace": "momentum_buffer"}
OPTAX_FIELDS = ("count", "mu", "nu", "nu_max", "trace")    # optax_state's, by optax's names


class OptaxOptimizer:
    """optax's SGD, Adam, AdamW and AMSGrad with torch.optim's settings (module doc); every
    rule and flag, f16, bf16, f32 and f64."""

    name = "optax"

    def __init__(self):
        if _MISSING is not None:
            raise AdapterError(f"engine 'optax': {INSTALL_HINT} ({_MISSING})")
        jax.config.update("jax_enable_x64", True)
        _persistent_cache()
        self.device = jax.devices("cpu")[0]
        self._compiled: dict = {}   # settings -> (transform, its jit-compiled update)

    def describe(self) -> str:
        return f"optax {optax.__version__} (jax {jax.__version__}, cpu)"

    def unsupported(self, optimizer, dtype, hp, flags) -> str | None:
        if optimizer not in RULES:
            return f"optax adapter: no rule {optimizer!r} (known: {', '.join(RULES)})"
        if dtype not in DTYPES or dtype == "i32":
            return f"optax adapter: {dtype} is no float dtype"
        return None

    def transform(self, optimizer: str, hp: dict, flags: dict):
        """The optax GradientTransformation of torch's rule `optimizer` with these flat
        hyperparameters and flags (module doc)."""
        parts = []
        wd = float(hp.get("weight_decay", 0.0))
        lr = float(hp["lr"])
        if optimizer == "sgd":
            if wd:
                parts.append(optax.add_decayed_weights(wd))
            momentum, tau = float(hp.get("momentum", 0.0)), float(hp.get("dampening", 0.0))
            if momentum and tau:
                parts.append(optax.scale_by_schedule(
                    lambda count: jnp.where(count == 0, 1.0, 1.0 - tau)))
            parts.append(optax.sgd(lr, momentum=momentum or None,
                                   nesterov=bool(flags.get("nesterov"))))
            return optax.chain(*parts)
        b1, b2, eps = float(hp["beta1"]), float(hp["beta2"]), float(hp["eps"])
        if optimizer == "adam" and wd:
            parts.append(optax.add_decayed_weights(wd))
        if flags.get("amsgrad"):
            parts.append(optax.scale_by_amsgrad(b1, b2, eps, eps_root=0.0))
            if optimizer == "adamw":
                parts.append(optax.add_decayed_weights(wd))
            parts.append(optax.scale_by_learning_rate(lr))
        elif optimizer == "adamw":
            parts.append(optax.adamw(lr, b1, b2, eps, eps_root=0.0, weight_decay=wd))
        else:
            parts.append(optax.adam(lr, b1, b2, eps, eps_root=0.0))
        return optax.chain(*parts)

    def stepper(self, optimizer, init, hp, flags, dtype):
        init = {k: np.asarray(v, DTYPES[dtype]) for k, v in init.items()}
        key = (optimizer, _items(hp), _items(flags))
        return OptaxStepper(*self._update_of(key, lambda: self.transform(optimizer, hp, flags)),
                            init, self.device, dict.fromkeys(init, _sign(flags)))

    def grouped_stepper(self, optimizer, groups):
        """One optax.multi_transform over the groups: each group's parameters labelled with
        its index, each label its own transform (its hyperparameters, flags, dtype)."""
        labels = {k: f"group{i}" for i, g in enumerate(groups) for k in g.init}
        init = {k: np.asarray(v, DTYPES[g.dtype]) for g in groups for k, v in g.init.items()}
        key = (optimizer, tuple((tuple(g.init), _items(g.hp), _items(g.flags))
                                for g in groups))

        def make():
            transforms = {f"group{i}": self.transform(optimizer, g.hp, g.flags)
                          for i, g in enumerate(groups)}
            return optax.multi_transform(transforms, labels)
        signs = {k: _sign(g.flags) for g in groups for k in g.init}
        return OptaxStepper(*self._update_of(key, make), init, self.device, signs)

    def _update_of(self, key, make) -> tuple:
        """(transform, jitted update) of these settings, made once per adapter: steppers with
        the same settings share them, and jax.jit compiles once per shapes and dtypes."""
        if key not in self._compiled:
            tx = make()

            def update(params, state, grads):
                updates, state = tx.update(grads, state, params)
                return optax.apply_updates(params, updates), state

            self._compiled[key] = (tx, jax.jit(update))
        return self._compiled[key]


class OptaxStepper:
    """Parameters (name -> array) and the state of one optax transform, stepped by one
    jit-compiled update."""

    def __init__(self, tx, update, init: dict, device, signs: dict):
        self.device, self._update, self.signs = device, update, signs   # -1: maximize
        self.params = {k: jax.device_put(np.asarray(v), device) for k, v in init.items()}
        # committed to the device, as the update's outputs are: one compilation, not two
        self.state = jax.device_put(tx.init(self.params), device)

    def step(self, grads: dict) -> None:
        given = {k: jax.device_put(self.signs[k] * np.asarray(grads[k], p.dtype),
                                   self.device)
                 for k, p in self.params.items()}
        self.params, self.state = self._update(self.params, self.state, given)

    def snapshot(self) -> dict:
        snap = {k: np.asarray(p, np.float64) for k, p in self.params.items()}
        snap.update({f"{k}.{STATE_NAMES[field]}": np.asarray(v, np.float64)
                     for (k, field), v in _state_tensors(self.state, self.params).items()
                     if field in STATE_NAMES})
        return snap

    def optax_state(self) -> dict:
        """optax's own state tensors by optax's names (`w0.mu`, `w0.nu_max`, `w0.count`,
        ...), as optax keeps them (their own dtype; count of shape (1,))."""
        return {f"{k}.{field}": np.asarray(v)
                for (k, field), v in _state_tensors(self.state, self.params).items()}

    def state_dtypes(self) -> dict:
        """The dtype optax keeps each state tensor in, by torch's name where it has one
        (`w0.exp_avg` -> "bfloat16", ...) and optax's otherwise (`w0.nu_max`)."""
        return {f"{k}.{STATE_NAMES.get(field, field)}": np.dtype(v.dtype).name
                for (k, field), v in _state_tensors(self.state, self.params).items()}

    def save(self) -> tuple:
        """Host copies of the parameters and optax's state."""
        return jax.tree.map(np.array, (self.params, self.state))

    def restore(self, saved) -> None:
        """Continue from `save()`'s copies."""
        self.params, self.state = jax.tree.map(
            lambda x: jax.device_put(np.array(x), self.device), saved)


def _persistent_cache() -> None:
    """jax's compiled updates kept on disk, in <cache>/jax (checkkit.cache), so that a
    second run does not compile them again (a full run compiles about two hundred, 0.1 to
    0.2 s each); left alone when the user has chosen a cache directory for jax."""
    if jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    jax.config.update("jax_compilation_cache_dir", str(default_cache_dir() / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _sign(flags: dict):
    """-1 to maximize (the gradient negated before the update), else 1."""
    return -1 if flags.get("maximize") else 1


def _items(settings: dict) -> tuple:
    """Hashable settings: sorted (name, value) pairs."""
    return tuple(sorted((k, float(v) if not isinstance(v, bool) else v)
                        for k, v in settings.items()))


def _state_tensors(state, params) -> dict:
    """(parameter name, optax field) -> tensor, for every field of OPTAX_FIELDS that optax
    keeps per parameter (moments, nu_max, traces) and the update count of a state that
    keeps such tensors (shape (1,); the count a schedule alone keeps is no step of
    torch's). A group's state under optax.multi_transform holds MaskedNode for the other
    groups' parameters."""
    out = {}
    if isinstance(state, dict):
        for value in state.values():
            out.update(_state_tensors(value, params))
        return out
    if not isinstance(state, tuple):
        return out
    fields = getattr(state, "_fields", ())
    kept = [f for f in fields if f in OPTAX_FIELDS and f != "count"]
    if not kept:
        for child in state:
            out.update(_state_tensors(child, params))
        return out
    owned = getattr(state, kept[0])
    for k in params:
        if k not in owned or isinstance(owned[k], optax.MaskedNode):
            continue
        out.update({(k, f): getattr(state, f)[k] for f in kept})
        if "count" in fields:
            out[(k, "count")] = jnp.reshape(state.count, (1,))
    return out
