"""The precision rule that gradcheck and optcheck share: a result computed in a dtype below
float64 may err PRECISION_RATIO times what a good implementation at that dtype errs (the
reference's error), plus a floor of FLOOR_ULPS ulps of the dtype at the result's magnitude.

    ratio(err, ref_err, size, dtype) <= PRECISION_RATIO   # the pass condition

`ratio` is err over that bound, scaled so that PRECISION_RATIO is the bar (8 exactly when
err equals PRECISION_RATIO * ref_err + floor). What the reference is, and why the bar is 8,
each checker says for its own results (gradcheck.precision: torch's kernels in the dtype or
an error model; optcheck.precision: torch.optim with float32 state).
"""

from __future__ import annotations

import numpy as np

from engine.tensor import UNIT_ROUNDOFF

PRECISION_RATIO = 8.0     # an engine may err this many times the reference ...
FLOOR_ULPS = 4.0          # ... plus this many of its dtype's ulps of the result's magnitude


def ulp(dtype: str) -> float:
    """The spacing of dtype `dtype`'s values at 1 (twice its unit roundoff)."""
    return 2.0 * UNIT_ROUNDOFF[dtype]


def max_abs_error(value, truth) -> float:
    """max |value - truth| in float64 (inf where either holds a NaN or an infinity that the
    other does not)."""
    a = np.asarray(value, np.float64)
    t = np.asarray(truth, np.float64)
    if a.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - t)
    same = (a == t) | (np.isnan(a) & np.isnan(t))
    diff = np.where(same, 0.0, diff)
    return float(np.max(np.where(np.isnan(diff), np.inf, diff)))


def magnitude(*truths) -> float:
    """The largest finite |value| of arrays `truths` (0 for none)."""
    best = 0.0
    for t in truths:
        t = np.asarray(t, np.float64)
        finite = t[np.isfinite(t)]
        if finite.size:
            best = max(best, float(np.max(np.abs(finite))))
    return best


def bound(ref_err: float, size: float, dtype: str) -> float:
    """What a result of `dtype` may err: PRECISION_RATIO * ref_err plus the floor, FLOOR_ULPS
    ulps of magnitude `size`."""
    floor = FLOOR_ULPS * ulp(dtype) * size
    return max(PRECISION_RATIO * ref_err + floor, np.finfo(np.float64).tiny)


def ratio(err: float, ref_err: float, size: float, dtype: str) -> float:
    """err over the bound (of magnitude `size`), scaled so that PRECISION_RATIO is the bar
    (inf for a non-finite error)."""
    if not np.isfinite(err):
        return float("inf")
    return err / bound(ref_err, size, dtype) * PRECISION_RATIO
