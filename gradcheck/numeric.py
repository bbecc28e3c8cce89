"""Numerical differentiation and gradient comparison: pure functions, no printing.

The numerical gradient of a scalar function f at x, element by element, uses the fourth-
order central stencil

    f'(x) ~ [8 (f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))] / (12 h),

whose truncation error is O(h^4); the plain central difference (f(x+h) - f(x-h)) / 2h is
O(h^2), and their difference is returned as an estimate of the numerical error.
Evaluation is in float64 whatever the dtype under test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

STEP = 1e-4

# Agreement required between backprop in the dtype under test and the float64 reference:
# |analytic - numeric| <= atol * scale + rtol * |numeric|, scale = max |numeric| of that input.
TOLERANCES = {"f64": (1e-7, 1e-6), "f32": (1e-4, 1e-3)}


def numerical_gradient(f: Callable[[], float], x: np.ndarray, h: float = STEP):
    """Gradient of f() w.r.t. the float64 array x, which f reads and this function perturbs
    in place (and restores). Returns (gradient, error estimate), both of x's shape."""
    grad = np.empty(x.shape)
    err = np.empty(x.shape)
    flat = x.reshape(-1)            # a view: x must be contiguous
    g_flat, e_flat = grad.reshape(-1), err.reshape(-1)
    for i in range(flat.size):
        x0 = flat[i]
        values = []
        for d in (h, -h, 2 * h, -2 * h):
            flat[i] = x0 + d
            values.append(f())
        flat[i] = x0
        fp, fm, f2p, f2m = values
        central = (fp - fm) / (2 * h)
        g_flat[i] = (8 * (fp - fm) - (f2p - f2m)) / (12 * h)
        e_flat[i] = abs(g_flat[i] - central)
    return grad, err


@dataclasses.dataclass
class Comparison:
    """How an analytic gradient agrees with a numeric one."""

    checked: int
    max_abs: float
    max_rel: float
    failures: int
    nonfinite: int
    worst_index: tuple | None
    worst_analytic: float
    worst_numeric: float

    @property
    def ok(self) -> bool:
        return self.failures == 0 and self.nonfinite == 0


def compare(analytic: np.ndarray, numeric: np.ndarray, dtype: str) -> Comparison:
    """Elementwise agreement under the tolerances of `dtype`; NaN or Inf anywhere fails,
    and 0/0 counts as a relative error of 0."""
    a = np.asarray(analytic, np.float64)
    n = np.asarray(numeric, np.float64)
    nonfinite = int(np.count_nonzero(~np.isfinite(a) | ~np.isfinite(n)))
    with np.errstate(invalid="ignore", divide="ignore"):
        abs_err = np.abs(a - n)
        rel = np.where(abs_err == 0, 0.0, abs_err / np.abs(n))
    atol, rtol = TOLERANCES[dtype]
    finite_n = n[np.isfinite(n)]
    scale = max(1.0, float(np.max(np.abs(finite_n)))) if finite_n.size else 1.0
    bad = ~(abs_err <= atol * scale + rtol * np.abs(n))   # NaN compares False: bad
    failures = int(np.count_nonzero(bad))
    if a.size == 0:
        return Comparison(0, 0.0, 0.0, 0, 0, None, 0.0, 0.0)
    score = np.where(np.isfinite(abs_err), abs_err / (atol * scale + rtol * np.abs(n)), np.inf)
    worst = np.unravel_index(int(np.argmax(score)), a.shape)
    return Comparison(
        checked=int(a.size),
        max_abs=float(np.max(np.where(np.isfinite(abs_err), abs_err, np.inf))),
        max_rel=float(np.max(np.where(np.isfinite(rel), rel, np.inf))),
        failures=failures, nonfinite=nonfinite,
        worst_index=tuple(int(i) for i in worst),
        worst_analytic=float(a[worst]), worst_numeric=float(n[worst]))
