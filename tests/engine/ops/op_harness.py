"""Run a registry sample on the engine and on torch, forward and backward."""

from __future__ import annotations

import numpy as np
import torch

import engine
from engine import ops
from engine.registry import get_op

# forward/backward agreement with torch, per dtype (the engine and torch round differently)
TOL = {"f64": dict(rtol=1e-10, atol=1e-12), "f32": dict(rtol=2e-5, atol=2e-6)}


def loss_weights(shape, seed=1234) -> np.ndarray:
    """A fixed random weighting of an op's output (a plain sum would hide softmax's errors)."""
    return np.random.default_rng(seed).uniform(0.5, 1.5, shape) * \
        np.random.default_rng(seed + 1).choice([-1.0, 1.0], shape)


def evaluate(build, *arrays) -> np.ndarray:
    """Forward value of build(*inputs) on the engine, the inputs set from `arrays`."""
    leaves = [engine.input_tensor(a.shape, a.dtype) for a in arrays]
    out = build(*leaves)
    for t, a in zip(leaves, arrays, strict=True):
        t.set(a)
    return engine.compute(out)[0]


def weighted_grads(build, arrays, w, params=None):
    """Gradients of sum(build(*leaves) * w) w.r.t. the leaves flagged in `params` (default:
    the float ones; None for the others)."""
    if params is None:
        params = [a.dtype.kind == "f" for a in arrays]
    leaves = [(engine.param if p else engine.input_tensor)(a.shape, a.dtype)
              for a, p in zip(arrays, params, strict=True)]
    out = build(*leaves)
    loss = ops.sum(ops.mul(out, engine.constant(w, out.dtype))).set_loss()
    graph = engine.Graph([loss])
    grads = graph.build_backward(loss)
    for t, a in zip(leaves, arrays, strict=True):
        t.set(a)
    graph.compute()
    return [grads[t].numpy() if t in grads else None for t in leaves]


def run_engine(sample, arrays, with_grad=True):
    """Forward output and gradients (None where not checked) of `sample` on the engine."""
    arrays = sample.leaf_arrays(arrays)
    leaves = [engine.param(a.shape, a.dtype, name=s.name) if s.grad and a.dtype.kind == "f"
              else engine.input_tensor(a.shape, a.dtype, name=s.name)
              for s, a in zip(sample.inputs, arrays, strict=True)]
    out = sample.build(*leaves)
    out.set_output()
    graph = engine.Graph([out], name=str(sample))
    grads = {}
    if with_grad and out.dtype.kind == "f" and any(t.is_param for t in leaves):
        w = engine.input_tensor(out.shape, out.dtype, name="w")
        w.set(loss_weights(out.shape).astype(out.dtype))
        loss = ops.sum(ops.mul(out, w)).set_loss()
        graph.expand(loss)
        grads = graph.build_backward(loss)
    for t, a in zip(leaves, arrays, strict=True):
        t.set(a)
    graph.compute()
    got = [grads[t].numpy() if t in grads else (np.zeros(t.shape, t.dtype) if t.is_param
                                                else None) for t in leaves]
    got = [None if g is None else spec.from_leaf(g)
           for spec, g in zip(sample.inputs, got, strict=True)]
    return out.numpy(), got


def run_torch(sample, arrays, with_grad=True):
    ref = get_op(sample.op).torch
    tens = [torch.tensor(a, requires_grad=bool(s.grad and a.dtype.kind == "f" and with_grad))
            for s, a in zip(sample.inputs, arrays, strict=True)]
    out = ref(*tens, **sample.kwargs)
    grads = [None] * len(tens)
    if with_grad and out.dtype.is_floating_point and any(t.requires_grad for t in tens):
        w = torch.tensor(loss_weights(tuple(out.shape)), dtype=out.dtype)
        (out * w).sum().backward()
        grads = [t.grad.numpy() if t.requires_grad and t.grad is not None else
                 (np.zeros(t.shape, a.dtype) if t.requires_grad else None)
                 for t, a in zip(tens, arrays, strict=True)]
    return out.detach().numpy(), grads
