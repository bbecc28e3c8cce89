"""The engine under test, as an adapter: one case's forward and vector-Jacobian product.

gradcheck judges every engine the same way. An adapter only runs the case in its engine:
given the case, its input values (in the layout the op sees) and the weighting that reduces
the op's output to a scalar loss, it returns the output and the gradient of
sum(output * weights) with respect to each checked input. Everything else (the float64
reference and its numerical gradients, kinks, tolerances, the torch reference, modes,
reports, exit codes) stays gradcheck's.

An adapter that cannot run a case says why through `unsupported`; the case is reported
`unsupported`, never skipped silently. An adapter whose engine may abort the process (C code
with assertions) sets `isolated`, and gradcheck runs its cases in worker processes, where
an abort becomes a `crash` row.

An engine that differentiates only some of a case's inputs declines the others through the
optional method `declined(case) -> dict[str, str]`: input name -> why the engine computes no
gradient of it (ggml has no backward for soft_max's mask). gradcheck then checks the other
inputs' gradients and ignores what `vjp` returns for the declined ones (None is best); the
row passes or fails on what was checked, and its `declined` metric and message name each
declined input with the reason, so that a pass never hides it. A case whose every checked
input is declined is `unsupported`. A name that is not one of the case's inputs is an error
row; declining an input that is not checked anyway (integer indices, grad False) changes
nothing.

A case's inputs may be views of their leaves (engine.samples.InputSpec: permuted, sliced
with an offset and strides, expanded with stride 0): the values given are the view's, in
its shape. An adapter that builds the views in its engine (ours, torch's, ggml's) returns
each input's gradient as its leaf's, viewed as the op sees it (InputSpec.from_leaf: along
an expanded axis every element shows its leaf element's gradient), and sets the optional
attribute `leaf_gradients`. Any other adapter returns the gradient of each element of the
values as an independent input, and gradcheck gathers it (summed along expanded axes).

A case's `cotangent` (engine.samples: contiguous, permuted or expanded) says how the engine
should receive the upstream gradient of the op's output: an adapter builds its loss so that
the gradient reaching the op has that layout (`cotangent_axes`, `cotangent_view`); the
weights and so the answer are the same whatever the layout.

gradcheck calls `vjp` twice per case and compares the two answers bit for bit (its
determinism check, the same for every engine); an adapter need not repeat a run itself, and
`VJP.differs` adds what it may see on its own. Optional attributes that gradcheck reads when
present: `backend` (the row's backend label, default "cpu"), `spec` (a
gradcheck.adapters.AdapterSpec that rebuilds the adapter, e.g. in a worker; get_adapter
sets it), `on_cpu()` (the same engine on the CPU, for the `vs_cpu` column),
`declined(case)` (above), `leaf_gradients` (above) and `forward(case, arrays) -> array`,
the case's output alone (a dedicated backward op, which has no gradient of its own, runs
through it; without it, gradcheck.backward_ops takes the output of `vjp`), and
`forward_only_checks(case)` with `forward_only_output(variant, case, arrays)`: ops of the
engine without a backward that compute the case's op, checked on their forward alone in
rows of their own (gradcheck.forward_only; ggml's flash attention).

Forward mode and second order (`gradcheck --ad fwd|both`, `--order 2`; gradcheck.derivatives)
are two more optional methods, for engines that have them:

- `jvp(case, arrays, tangents) -> JVP`: the output and the Jacobian-vector product J t,
  the derivative of the output along `tangents` (per case input, an array shaped and laid
  out as its values, or None for an input that is not checked: held constant);
- `hvp(case, arrays, weights, direction, method) -> VJP`: the output and, per checked input,
  the Hessian-vector product of the loss sum(output * weights) along `direction` (laid out
  as `tangents`), i.e. the gradient of <grad loss, direction>, with the same layout rules
  as `vjp`'s gradients (`leaf_gradients` included). `method` is one of the adapter's
  `hvp_methods`, e.g. "rev-rev" (reverse over reverse) and "fwd-rev" (forward over
  reverse); each is checked.

Either may raise `Unsupported(reason)` for a case it cannot differentiate so (an op whose
backward is not differentiable); the row is then `unsupported` with the reason. An adapter
without the method has no such mode: its rows say so.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import numpy as np

# here too: the adapter API's errors (Unsupported: raised by `jvp` or `hvp` for a case the
# engine cannot differentiate that way; the row is `unsupported`, with its message)
from checkkit.loading import AdapterError, Unsupported  # noqa: F401


def cotangent_axes(ndim: int) -> tuple[int, ...]:
    """The axis order of a "permuted" cotangent (engine.samples): all axes reversed. The
    engine's loss reads its output y through cont(permute(y, axes)), so that the gradient
    reaching the op is permute(g, axes), a strided view."""
    return tuple(reversed(range(ndim)))


SLICED_BORDER = 1000.0      # the buffer around a "sliced" cotangent: far from any weight


def sliced_weights(weights: np.ndarray) -> np.ndarray:
    """The buffer a "sliced" cotangent is a view of: one element larger on each side of
    every axis, `weights` in the middle (offset 1) and SLICED_BORDER around them, so that
    a kernel reading outside its view reads values no weight has."""
    weights = np.asarray(weights)
    big = np.full(tuple(d + 2 for d in weights.shape), SLICED_BORDER, weights.dtype)
    big[(slice(1, -1),) * weights.ndim] = weights
    return big


def cotangent_view(weights: np.ndarray, cotangent: str) -> np.ndarray:
    """The weights as a numpy view in the layout `cotangent` names: "contiguous" as given,
    "permuted" a transposed view of a copy stored in reversed axis order, "expanded" a
    read-only stride-0 view along the last axis (the weights are constant along it, see
    gradcheck.backprop.loss_weights), "expanded_first" the same along the first axis,
    "sliced" the middle of sliced_weights (an offset view with the larger buffer's
    strides). Equal to `weights` element for element."""
    weights = np.asarray(weights)
    if cotangent == "permuted":
        axes = cotangent_axes(weights.ndim)
        return np.ascontiguousarray(weights.transpose(axes)).transpose(np.argsort(axes))
    if cotangent == "expanded":
        return np.broadcast_to(weights[..., :1], weights.shape)
    if cotangent == "expanded_first" and weights.ndim:
        return np.broadcast_to(weights[:1], weights.shape)
    if cotangent == "sliced" and weights.ndim:
        return sliced_weights(weights)[(slice(1, -1),) * weights.ndim]
    return weights


@dataclasses.dataclass
class VJP:
    """What an engine computed for one case.

    output: the op's forward output, in the case's shape (numpy order).
    grads: per case input, the gradient of sum(output * weights) in the layout the op sees
        (the same layout as the input values given), or None for an input that is not
        checked (an integer input, or one whose spec has grad False) or that the adapter
        declines (see `declined` in the module docstring).
    differs: the engine was run twice and the two runs gave different bits (optional: see
        the module docstring).
    """

    output: np.ndarray
    grads: list[np.ndarray | None]
    differs: bool = False


@dataclasses.dataclass
class JVP:
    """What an engine computed in forward mode for one case: its output and the
    Jacobian-vector product J t, shaped like the output (see the module docstring)."""

    output: np.ndarray
    tangent: np.ndarray


@runtime_checkable
class Adapter(Protocol):
    """An engine under test (the module doc has the whole contract): `--engine
    module:Class` names one, and gradcheck builds it with no arguments. It runs a case's
    forward and VJP (`vjp`; forward mode and second order through the optional `jvp` and
    `hvp`), says which cases it cannot run (`unsupported`) and names its engine
    (`describe`); everything else stays gradcheck's."""

    name: str          # as given to --engine, e.g. "engine", "ggml"
    isolated: bool     # run cases in worker processes (the engine may abort the process)

    def describe(self) -> str:
        """The engine and its version, for the report's metadata, e.g. 'ggml 0.20.2'."""

    def unsupported(self, case) -> str | None:
        """Why this engine cannot run `case` (no such op, no backward, a parameter it
        lacks), or None when it can."""

    # optional: def declined(self, case) -> dict[str, str]  (see the module docstring)

    def vjp(self, case, arrays: list[np.ndarray], weights: np.ndarray) -> VJP:
        """Run `case` forward on `arrays` (the case's input values, in its dtypes) and
        backward for the loss sum(output * weights)."""
