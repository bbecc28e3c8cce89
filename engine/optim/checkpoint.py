"""Parameters and optimizer state in one GGUF file, so that training resumes exactly.

    save_checkpoint("run.gguf", params, optimizer, arch="mnist-fc")
    load_checkpoint("run.gguf", params, optimizer, arch="mnist-fc")

The parameters are written under their own names (for the MNIST models those are ggml's, so
the file is also a model ggml's example reads); the state under `<param>.<state>` (for
example `fc1.weight.exp_avg`, `fc1.weight.step`). Key-value pairs record the optimizer's
name (`optimizer.name`), its structural flags (`optimizer.flag.<name>`) and its
hyperparameters (`optimizer.hp.<name>`, float64). Loading checks that the file was written for
the same optimizer with the same flags, and that every tensor is present with its shape and
dtype, before anything is changed; it restores the hyperparameters too. Files are written
atomically (engine.gguf_io).
"""

from __future__ import annotations

import dataclasses

from engine.errors import EngineError
from engine.gguf_io import GGUFFormatError, expect_tensors, load_gguf, save_gguf

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
    metadata. Raises GGUFFormatError, changing nothing, when the file does not match."""
    gf = load_gguf(path, arch)
    spec = {p.name: (p.shape, p.dtype) for p in params}
    if optimizer is not None:
        name = gf.metadata.get(PREFIX + "name")
        if name != optimizer.name:
            raise GGUFFormatError(f"{path}: holds the state of optimizer {name!r}, not "
                                  f"{optimizer.name!r}")
        for k, v in optimizer.flags.items():
            got = gf.metadata.get(f"{PREFIX}flag.{k}")
            if got is None or bool(got) != v:
                raise GGUFFormatError(f"{path}: optimizer flag {k}={got} in the file, but the "
                                      f"optimizer has {k}={v}")
        spec.update({t.name: (t.shape, t.dtype)
                     for state in optimizer.state.values() for t in state.values()})
    if optimizer is None:   # a checkpoint with state also loads as parameters alone
        owned = tuple(f"{p.name}." for p in params)
        gf = dataclasses.replace(gf, tensors={k: v for k, v in gf.tensors.items()
                                              if k in spec or not k.startswith(owned)})
    expect_tensors(gf, spec)
    for p in params:
        p.set(gf.tensors[p.name])
    if optimizer is not None:
        optimizer.load_state_arrays(gf.tensors)
        hp = {k: gf.metadata[f"{PREFIX}hp.{k}"] for k in optimizer.HPARAMS
              if f"{PREFIX}hp.{k}" in gf.metadata}
        optimizer.set(**hp)
    return {k: v for k, v in gf.metadata.items() if not k.startswith(PREFIX)}
