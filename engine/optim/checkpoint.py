"""Parameters and optimizer state in one GGUF file, so that training resumes exactly.

    save_checkpoint("run.gguf", params, optimizer, arch="mnist-fc")
    load_checkpoint("run.gguf", params, optimizer, arch="mnist-fc")

The parameters are written under their own names (for the MNIST models those are ggml's, so
the file is also a model ggml's example reads); the state under `<param>.<state>` (for
example `fc1.weight.exp_avg`, `fc1.weight.step`). Key-value pairs record the optimizer's
name (`optimizer.name`), its structural flags (`optimizer.flag.<name>`, BOOL) and its
hyperparameters (`optimizer.hp.<name>`, float64).

Loading is all or nothing: it checks everything before it changes anything. The tensors
(names, shapes, dtypes, against the header before any data is read; then every value
finite), the optimizer's name, its flags (each a GGUF BOOL equal to the optimizer's), every
hyperparameter (as the optimizer's own set() checks them), the step counters (whole, >= 0,
the same for every parameter) and the second moments (>= 0). Files are written atomically
(engine.gguf_io).
"""

from __future__ import annotations

import os

import numpy as np

from engine.errors import EngineError, HyperparameterError
from engine.gguf_io import GGUFFormatError, check_tensors, load_gguf, save_gguf
from engine.tensor import is_float

PREFIX = "optimizer."


def save_checkpoint(path, params, optimizer=None, arch: str = "gradverify", metadata=None):
    """Write `params` (param tensors) and, when given, `optimizer`'s state to `path`."""
    tensors = {p.name: p.numpy() for p in params}
    meta = dict(metadata or {})
    if optimizer is not None:
        missing = [p.name for p in optimizer.params if p.name not in tensors]
        if missing:
            raise EngineError(f"save_checkpoint: the optimizer steps {missing}, which are not "
                              "among the params to save")
        tensors.update(optimizer.state_arrays())
        meta[PREFIX + "name"] = optimizer.name
        meta.update({f"{PREFIX}flag.{k}": v for k, v in optimizer.flags.items()})
        # the base learning rate, not this step's scheduled one: a resumed schedule
        # multiplies the base again
        hp = {**optimizer.hparams, "lr": optimizer.base_lr}
        meta.update({f"{PREFIX}hp.{k}": float(v) for k, v in hp.items()})
    save_gguf(path, tensors, arch, meta)


def load_checkpoint(path, params, optimizer=None, arch: str | None = None) -> dict:
    """Restore `params` and, when given, `optimizer` from `path`; returns the file's other
    metadata. Raises GGUFFormatError naming the file and the key or tensor, changing nothing,
    when the file does not match or holds a value the optimizer would refuse.

    Without an optimizer a checkpoint with state loads as parameters alone: the state tensors
    (`<param>.<state>`) are then skipped, never read."""
    where = os.fsdecode(path)
    spec = {p.name: (p.shape, p.dtype) for p in params}
    if optimizer is not None:
        spec.update({t.name: (t.shape, t.dtype)
                     for state in optimizer.state.values() for t in state.values()})
    owned = tuple(f"{p.name}." for p in params)

    def select(file_arch, metadata, header):
        if optimizer is not None:   # the optimizer's name and flags first: the clearer message
            _checked_optimizer(metadata, optimizer, where)
        found = header if optimizer is not None else {
            k: v for k, v in header.items() if k in spec or not k.startswith(owned)}
        check_tensors(f"{where} (architecture {file_arch!r})", found, spec)
        return spec

    gf = load_gguf(path, arch, expect=select)
    hp = None if optimizer is None else _checked_optimizer(gf.metadata, optimizer, where)
    _check_values(gf.tensors, optimizer, where)
    for p in params:
        p.set(gf.tensors[p.name])
    if optimizer is not None:
        optimizer.load_state_arrays(gf.tensors)
        optimizer.set(**hp)
    return {k: v for k, v in gf.metadata.items() if not k.startswith(PREFIX)}


def _checked_optimizer(metadata: dict, optimizer, where: str) -> dict:
    """The file's hyperparameters for `optimizer`, after checking its name, flags and
    hyperparameters; raises GGUFFormatError naming the key."""
    name = metadata.get(PREFIX + "name")
    if name != optimizer.name:
        raise GGUFFormatError(f"{where}: holds the state of optimizer {name!r}, not "
                              f"{optimizer.name!r}")
    flag_keys = {f"{PREFIX}flag.{k}": k for k in optimizer.flags}
    hp_keys = {f"{PREFIX}hp.{k}": k for k in optimizer.HPARAMS}
    unknown = [k for k in metadata if k.startswith(PREFIX) and k != PREFIX + "name"
               and k not in flag_keys and k not in hp_keys]
    if unknown:
        keys = ", ".join(map(repr, unknown))   # a key may hold any character, "\n" too
        raise GGUFFormatError(f"{where}: unknown optimizer key(s) {keys} for optimizer "
                              f"{optimizer.name!r}")
    for key, k in flag_keys.items():
        got, want = metadata.get(key), optimizer.flags[k]
        if type(got) is not bool:
            raise GGUFFormatError(f"{where}: {key} is {got!r}, not a GGUF BOOL")
        if got != want:
            raise GGUFFormatError(f"{where}: optimizer flag {k}={got} in the file, but the "
                                  f"optimizer has {k}={want}")
    missing = [key for key in hp_keys if key not in metadata]
    if missing:
        raise GGUFFormatError(f"{where}: no {', '.join(missing)} in the file")
    hp = {k: metadata[key] for key, k in hp_keys.items()}
    try:
        optimizer.checked_hparams(**hp)
    except HyperparameterError as exc:
        raise GGUFFormatError(f"{where}: {PREFIX}hp.*: {exc}") from None
    return hp


def _check_values(tensors: dict, optimizer, where: str) -> None:
    """Every value finite; step counters whole, >= 0 and equal; second moments >= 0."""
    for name, array in tensors.items():
        if is_float(array.dtype) and not np.isfinite(array).all():
            raise GGUFFormatError(f"{where}: tensor {name!r} holds NaN or infinite values")
    if optimizer is None:
        return
    steps = {}
    for state in optimizer.state.values():
        for s, t in state.items():
            array = tensors[t.name]
            if s == "step":
                step = float(array[0])
                if step < 0 or step != int(step):
                    raise GGUFFormatError(f"{where}: tensor {t.name!r} holds step count {step}; "
                                          "a step count is a whole number >= 0")
                steps[t.name] = step
            elif s.endswith("exp_avg_sq") and (array < 0).any():
                raise GGUFFormatError(f"{where}: tensor {t.name!r} holds negative values; a "
                                      "second moment is >= 0")
    if len(set(steps.values())) > 1:
        raise GGUFFormatError(f"{where}: the step counters differ ("
                              + ", ".join(f"{k}={v:g}" for k, v in steps.items())
                              + "); every parameter steps together")
