"""Modes: which derivatives of a case are compared, and their numerical gradients.

- `full` differentiates the float64 reference's loss along every checked input element
  (gradcheck.numeric.numerical_gradient): each input's gradient is compared element by
  element;
- `fast` along DIRECTIONS random unit directions v over all checked inputs at once
  (directional derivatives, gradcheck.numeric.directional_derivatives): what is compared
  is the projections sum_i <g_i, v> of backprop's and torch's gradients g_i, one number
  per direction (random projections of the Jacobian);
- `auto` is full when the case has at most FULL_BUDGET checked elements, fast otherwise.

`checked_fraction` is the share of the vector-Jacobian product's entries checked one by
one: 1 in full mode, directions / elements in fast mode.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numba
import numpy as np

from gradcheck.numeric import (
    Derivative,
    best_of,
    compare,
    directional_derivatives,
    numerical_gradient,
    power_against,
    steps_for,
    tolerated,
)
from gradcheck.verdict import GradientOutcome

MODES = ("auto", "full", "fast")
FULL_BUDGET = 1500       # checked elements up to which `auto` differentiates every element
DIRECTIONS = 6           # random directions in fast mode


def choose_mode(mode: str, checked_elements: int) -> str:
    """`mode`, with auto resolved by the number of checked input elements."""
    if mode == "auto":
        return "full" if checked_elements <= FULL_BUDGET else "fast"
    return mode


def random_directions(case, shapes, k: int) -> list[list[np.ndarray]]:
    """`k` random directions over inputs of `shapes`, each of unit norm over all of them,
    seeded by the case (the same case, the same directions)."""
    rng = np.random.default_rng(case.seed() + 1)
    out = []
    for _ in range(k):
        v = [rng.normal(size=s) for s in shapes]
        norm = np.sqrt(sum(float(np.sum(x * x)) for x in v)) or 1.0
        out.append([x / norm for x in v])
    return out


def project(grads, directions) -> np.ndarray:
    """Per direction v, sum_i <grads[i], v[i]>."""
    return np.array([sum(float(np.sum(g * v)) for g, v in zip(grads, d, strict=True))
                     for d in directions])


@contextlib.contextmanager
def single_thread():
    """numba's thread count held to 1 within the block (restored after).

    The numerical gradients evaluate one small float64 graph thousands of times, where
    starting threads would cost more than the work. The engine's own threads
    (engine.backends.cpu.threads) split only kernels of about a million elements and more
    (its MIN_ELEMENTS), far above a case's size, so they need no holding; numba's threads
    still run the prange kernels' parallel compilations (with GRADVERIFY_PARALLEL=1) and
    size get_rows_back's column bands, hence this block. The engine under test runs
    outside it, with its threads as configured (a race there shows in the determinism
    check)."""
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


@dataclasses.dataclass
class Compared:
    """What a mode compares, gradient by gradient: `names` (an input's name, or
    "directions" in fast mode), backprop's values, the numerical gradients and torch's
    values (None without torch), aligned; `fraction`: the checked_fraction."""

    names: list[str]
    backprop: list[np.ndarray]
    numerical: list[Derivative]
    torch: list[np.ndarray] | None
    fraction: float
    parts: dict[str, np.ndarray] | None = None   # fast mode: per input, its share of each
    #                                              projection (torch's, else backprop's)

    def dtype_of(self, name: str, precision, dtypes: dict | None) -> str:
        """The dtype judging gradient `name` ("directions": the coarsest of the inputs')."""
        return precision if dtypes is None else dtypes.get(name, precision)

    def powers(self, precision: str, dtypes: dict | None = None,
               outcomes=None) -> dict[str, float]:
        """Per checked input, the smallest relative error of its gradient alone that the
        comparisons flag (gradcheck.verdict: power). Full mode: its own comparisons'.
        Fast mode: an error in one input moves each projection by its share of it, judged
        against what that projection is allowed (against the numerical and torch's).
        `outcomes`: this object's outcomes(precision, dtypes), where the caller has them
        (full mode reads its powers from them instead of comparing again)."""
        if self.parts is None:
            if outcomes is None:
                outcomes = self.outcomes(precision, dtypes)
            return {o.name: o.power for o in outcomes}
        num = self.numerical[0]
        bounds = [tolerated(num.value, precision, num.error, num.kink)]
        if self.torch is not None:
            bounds.append(tolerated(self.torch[0], precision, None, num.kink))
        return {name: min(power_against(allowed, judged, part) for allowed, judged in bounds)
                for name, part in self.parts.items()}

    def outcomes(self, precision: str, dtypes: dict | None = None,
                 ) -> tuple[GradientOutcome, ...]:
        """The comparisons of each compared gradient: backprop in the case's `precision`
        (or, per input name, in `dtypes`: gradcheck.precision.judged_dtypes) against the
        numerical gradient (widened by its error estimate) and against torch; the numerical
        gradient against torch in float64. Kinks are not judged in any of them."""
        outcomes = []
        for k, (name, bp, num) in enumerate(zip(self.names, self.backprop, self.numerical,
                                                strict=True)):
            precision_k = self.dtype_of(name, precision, dtypes)
            vs_torch = numerical_vs_torch = None
            if self.torch is not None:
                vs_torch = compare(bp, self.torch[k], precision_k, None, num.kink)
                numerical_vs_torch = compare(num.value, self.torch[k], "f64", num.error,
                                             num.kink)
            outcomes.append(GradientOutcome(
                name, compare(bp, num.value, precision_k, num.error, num.kink),
                bool(np.all(np.isfinite(bp))), vs_torch, numerical_vs_torch))
        return tuple(outcomes)


def compared_gradients(case, f64_ref, checked, mode: str, backprop, torch_grads) -> Compared:
    """The gradients `mode` ("full" or "fast") compares for the `checked` inputs (indices):
    `backprop` and `torch_grads` (None: no torch) hold one gradient per checked input, in
    the layout the op sees; the numerical gradients differentiate `f64_ref.loss` (a
    gradcheck.reference.Float64Reference) in its leaves' layout."""
    leaves = f64_ref.leaves
    with single_thread(), f64_ref.held():     # one BLAS hold for the thousands of runs
        magnitude = f64_ref.magnitude()
        if mode == "full":
            numerical = [best_of(*(numerical_gradient(f64_ref.loss, leaves[i], h, magnitude)
                                   for h in steps_for(leaves[i]))) for i in checked]
        else:
            dirs = random_directions(case, [case.inputs[i].shape for i in checked], DIRECTIONS)
            # each direction in the leaves' layout by the view's adjoint, so that the
            # directional derivative is the projection <g, v> of the view-layout gradient
            # (engine.samples.InputSpec.leaf_gradient: a sum along an expanded axis)
            leaf_dirs = [[case.inputs[i].leaf_gradient(v)
                          for i, v in zip(checked, d, strict=True)] for d in dirs]
            xs = [leaves[i] for i in checked]
            numerical = [best_of(*(directional_derivatives(f64_ref.loss, xs, leaf_dirs, h,
                                                           magnitude=magnitude)
                                   for h in steps_for(*xs)))]
    if mode == "full":
        numerical = [Derivative(*(case.inputs[i].from_leaf(x) for x in (d.value, d.error,
                                                                         d.kink)))
                     for i, d in zip(checked, numerical, strict=True)]
        return Compared([case.inputs[i].name for i in checked], list(backprop), numerical,
                        None if torch_grads is None else list(torch_grads), 1.0)
    total = sum(leaves[i].size for i in checked)
    shares = backprop if torch_grads is None else torch_grads
    parts = {case.inputs[i].name: project([g], [[d[k]] for d in dirs])
             for k, (i, g) in enumerate(zip(checked, shares, strict=True))}
    return Compared(["directions"], [project(backprop, dirs)], numerical,
                    None if torch_grads is None else [project(torch_grads, dirs)],
                    DIRECTIONS / total, parts)
