"""Numerical differentiation, kink detection and gradient comparison: pure functions.

For a scalar function f of one coordinate, with steps of h, the function is evaluated at
x-2h, x-h, x, x+h, x+2h and gives

    central, 4th order:  d4 = [8 (f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))] / (12 h)
    central, 2nd order:  d2 = (f(x+h) - f(x-h)) / (2 h)
    one-sided, 2nd order: right = (-3 f(x) + 4 f(x+h) - f(x+2h)) / (2 h)
                          left  = ( 3 f(x) - 4 f(x-h) + f(x-2h)) / (2 h)

d4 is the estimate (Richardson extrapolation of the central difference: truncation error
O(h^4)). Its error estimate is |d4 - d2| (the truncation error of d2, which bounds that of
d4) plus the rounding error of the stencil, 4 eps max|f| / h. Where right and left
disagree by more than their own error, f has a kink within 2h of x (relu at 0, a max-pool
tie, a clamp edge): such an element is a kink, counted apart, never a pass or a fail.
Evaluation is in float64 whatever the dtype under test.

The rounding error's max|f| is at least `magnitude`, given by the caller: a loss that sums
terms far larger than itself (huge outputs weighted to cancel) rounds as its terms do. The
step is STEP; for inputs of magnitude below 1 also a step shrunk with them (`steps_for`:
tiny inputs, tiny lengths), and each element keeps the estimate of the smaller error
(`best_of`): the small step where STEP straddles the curvature of a function of tiny
inputs, STEP where the small one would drown the difference in rounding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

STEP = 1e-4
MIN_SCALE = 1e-6     # the smallest input magnitude step_for shrinks the step to
EPS64 = np.finfo(np.float64).eps

# Agreement required between a value a computed in the dtype under test (backprop, the
# forward output) and what it is expected to be, n (the numerical gradient, the float64
# reference's output, torch's): |a - n| <= atol * scale + rtol * |n| + err,
# scale = max(1, max |n|) over that array and err the numerical error estimate of the
# element (0 where n has none). (atol, rtol) per dtype:
# the 16-bit floats' are some 20 of their units in the last place (2^-11 for float16's
# relative rounding, 2^-8 for bfloat16's): a fixed bar that only a gross error crosses; the
# precision rule (gradcheck.precision) is what holds them to a good implementation.
TOLERANCES = {"f64": (1e-7, 1e-6), "f32": (1e-4, 1e-3), "f16": (1e-2, 1e-2),
              "bf16": (8e-2, 8e-2),
              # a second derivative computed in 16 bits (gradcheck.derivatives): its terms
              # cancel in the dtype (torch's own float16 one of geglu_quick errs 7% at an
              # element of 0.69), so 4x and 2x the first order's bar, below a 2x error
              "f16 order 2": (4e-2, 4e-2), "bf16 order 2": (1.6e-1, 1.6e-1)}
# one-sided slopes further apart than this (times scale), beyond their error, mark a kink
KINK_JUMP = 1e-4
KINK_ERR_FACTOR = 50.0


def step_for(*xs) -> float:
    """STEP times the magnitude of inputs `xs` (the largest |x| of each, the smallest over
    them) where it is below 1, never more than STEP. A function of tiny inputs changes
    over lengths of their size (rms_norm of a row of 1e-3s, log near 0.01): a step of 1e-4
    would straddle its curvature (a large error estimate, even a false kink). A large
    input's function is not the smoother for it (sin at 150, a softmax near a tie): its
    step stays STEP. NaN (a sliced input's border) is ignored."""
    scales = [float(np.nanmax(np.abs(x))) for x in xs if np.size(x) and not np.isnan(x).all()]
    return STEP * min([1.0] + [max(s, MIN_SCALE) for s in scales])


def steps_for(*xs) -> tuple[float, ...]:
    """The steps to differentiate along inputs `xs` with: STEP, and step_for(*xs) too where
    it is less than half of STEP (tiny inputs); see best_of."""
    h = step_for(*xs)
    return (STEP,) if h > STEP / 2 else (STEP, h)


def best_of(*derivatives: Derivative) -> Derivative:
    """Per element, the derivative (value, error, kink) of the smallest error estimate."""
    best = derivatives[0]
    for d in derivatives[1:]:
        better = d.error < best.error
        best = Derivative(*(np.where(better, new, old) for new, old in
                            ((d.value, best.value), (d.error, best.error), (d.kink, best.kink))))
    return best


@dataclasses.dataclass
class Derivative:
    """Numerical derivatives with their error estimates and kink flags (same shapes)."""

    value: np.ndarray
    error: np.ndarray
    kink: np.ndarray


def _stencil(f0, fp, fm, f2p, f2m, h, magnitude=0.0):
    d4 = (8 * (fp - fm) - (f2p - f2m)) / (12 * h)
    d2 = (fp - fm) / (2 * h)
    right = (-3 * f0 + 4 * fp - f2p) / (2 * h)
    left = (3 * f0 - 4 * fm + f2m) / (2 * h)
    size = np.maximum(np.maximum(np.maximum(np.abs(f0), np.abs(fp)), np.maximum(np.abs(fm),
                      np.abs(f2p))), np.abs(f2m))
    err = np.abs(d4 - d2) + 4 * EPS64 * np.maximum(size, magnitude) / h
    return d4, err, np.abs(right - left), err


def _finish(values, errs, jumps, jump_errs, scale_of=None) -> Derivative:
    value = np.asarray(values, np.float64)
    err = np.asarray(errs, np.float64)
    finite = value[np.isfinite(value)]
    scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
    if scale_of is not None:
        scale = scale_of
    jump = np.asarray(jumps, np.float64)
    kink = jump > KINK_JUMP * scale + KINK_ERR_FACTOR * np.asarray(jump_errs)
    return Derivative(value, err, kink)


def numerical_gradient(f: Callable[[], float], x: np.ndarray, h: float = STEP,
                       magnitude: float = 0.0) -> Derivative:
    """Gradient of f() w.r.t. the float64 array x, which f reads and this function perturbs
    in place (and restores), element by element; `magnitude`: see the module doc."""
    flat = x.reshape(-1)             # a view: x must be contiguous
    f0 = f()
    fs = np.empty((4, flat.size))    # f at x + h, x - h, x + 2h, x - 2h along each element
    steps = (h, -h, 2 * h, -2 * h)
    for i in range(flat.size):
        x0 = flat[i]
        for k, d in enumerate(steps):
            flat[i] = x0 + d
            fs[k, i] = f()
        flat[i] = x0
    d = _finish(*_stencil(f0, fs[0], fs[1], fs[2], fs[3], h, magnitude))
    return Derivative(d.value.reshape(x.shape), d.error.reshape(x.shape),
                      d.kink.reshape(x.shape))


def _along(f, xs, base, v, h) -> list[float]:
    """f at base + d v for d = h, -h, 2h, -2h (the stencil's points along direction v),
    the arrays xs moved there in place and put back at base."""
    fs = []
    for d in (h, -h, 2 * h, -2 * h):
        for x, x0, vi in zip(xs, base, v, strict=True):
            np.copyto(x, x0 + d * vi)
        fs.append(f())
    for x, x0 in zip(xs, base, strict=True):
        np.copyto(x, x0)
    return fs


def directional_derivatives(f: Callable[[], float], xs, directions, h: float = STEP,
                            scale: float = 1.0, magnitude: float = 0.0) -> Derivative:
    """Derivatives of f() along each direction: a direction is a list of arrays shaped like
    the float64 arrays xs (which f reads; they are moved along it and restored);
    `magnitude`: see the module doc."""
    f0 = f()
    base = [x.copy() for x in xs]
    vals, errs, jumps, jerrs = [], [], [], []
    for v in directions:
        fs = _along(f, xs, base, v, h)
        val, e, j, je = _stencil(f0, *fs, h, magnitude)
        vals.append(val)
        errs.append(e)
        jumps.append(j)
        jerrs.append(je)
    return _finish(vals, errs, jumps, jerrs, scale_of=scale)


@dataclasses.dataclass
class Comparison:
    """How one array agrees with what it is expected to be, kinks excluded; the worst
    element's index, value and expected value."""

    checked: int
    kinks: int
    max_abs: float
    max_rel: float
    failures: int
    nonfinite: int
    worst_index: tuple | None
    worst_value: float
    worst_expected: float
    power: float = np.inf     # the smallest relative error of the whole of `value` (every
    #                           element off by the same factor) that fails: min over the
    #                           judged elements of allowed / |expected|; inf where every
    #                           expected value is 0 (nothing could fail)

    @property
    def ok(self) -> bool:
        return self.failures == 0 and self.nonfinite == 0


def tolerated(expected, dtype: str, error=None, kink=None) -> tuple[np.ndarray, np.ndarray]:
    """(allowed, judged): the absolute error compare allows each element of `expected` in
    `dtype` (widened by `error`, its error estimate), and which elements it judges (not
    `kink`)."""
    n = np.asarray(expected, np.float64)
    err = np.zeros(n.shape) if error is None else np.asarray(error, np.float64)
    judged = ~(np.zeros(n.shape, bool) if kink is None else np.asarray(kink, bool))
    finite_n = n[np.isfinite(n) & judged]
    scale = max(1.0, float(np.max(np.abs(finite_n)))) if finite_n.size else 1.0
    atol, rtol = TOLERANCES[dtype]
    with np.errstate(invalid="ignore", over="ignore"):
        return atol * scale + rtol * np.abs(n) + err, judged


def power_against(allowed, judged, parts) -> float:
    """The smallest relative error of a part of a compared array (`parts`: that part's
    contribution to each element, e.g. one input's share of a projection) that moves some
    judged element beyond what it is `allowed`; inf where the part is 0 wherever judged."""
    parts = np.abs(np.asarray(parts, np.float64))
    seen = judged & np.isfinite(parts) & (parts != 0) & np.isfinite(allowed)
    return float(np.min(allowed[seen] / parts[seen])) if seen.any() else np.inf


def compare(value, expected, dtype: str, error=None, kink=None) -> Comparison:
    """Elementwise agreement of `value` with `expected` under the tolerances of `dtype`,
    widened by `error`, the error estimate of `expected` (a numerical gradient's); elements
    flagged `kink` are not judged. NaN or Inf in either fails; 0/0 is a relative error of
    0."""
    a = np.asarray(value, np.float64)
    n = np.asarray(expected, np.float64)
    if a.size == 0:
        return Comparison(0, 0, 0.0, 0.0, 0, 0, None, 0.0, 0.0)   # power inf: nothing judged
    nonfinite = int(np.count_nonzero(~np.isfinite(a) | ~np.isfinite(n)))
    allowed, judged = tolerated(n, dtype, error, kink)
    kink = ~judged
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        abs_err = np.abs(a - n)
        rel = np.where(abs_err == 0, 0.0, abs_err / np.abs(n))
        bad = ~(abs_err <= allowed) & judged          # NaN compares False: bad
        score = np.where(judged, np.where(np.isfinite(abs_err), abs_err / allowed, np.inf),
                         -1.0)
        power = power_against(allowed, judged & np.isfinite(n), n)
    worst = np.unravel_index(int(np.argmax(score)), a.shape)
    shown_abs = np.where(judged, np.where(np.isfinite(abs_err), abs_err, np.inf), 0.0)
    shown_rel = np.where(judged, np.where(np.isfinite(rel), rel, np.inf), 0.0)
    return Comparison(
        checked=int(np.count_nonzero(judged)), kinks=int(np.count_nonzero(kink)),
        max_abs=float(np.max(shown_abs)), max_rel=float(np.max(shown_rel)),
        failures=int(np.count_nonzero(bad)), nonfinite=nonfinite,
        worst_index=tuple(int(i) for i in worst),
        worst_value=float(a[worst]), worst_expected=float(n[worst]), power=power)


SECOND_ORDER_STEP_FACTOR = 10.0   # second order: steps of 10 step_for (1e-3 at inputs of 1)
# second order: an element whose error estimate exceeds this share of the array's scale is
# a kink (the stencils straddle a max-pool switch, a relu's 0: the value is not resolved)
UNRESOLVED = 1e-2


def second_order_step(*xs) -> float:
    """The step of both differentiations of hessian_vector: 10 times step_for(*xs) (1e-3
    for inputs of magnitude 1 and more, shrinking with tiny inputs). Nesting divides the
    rounding of the loss by the square of the step: at 1e-4 it would be some 1e-7 of the
    loss's magnitude, at 1e-3 some 1e-9, while the truncation error (O(h^4), estimated by
    |d4 - d2|) stays far below the tolerances."""
    return SECOND_ORDER_STEP_FACTOR * step_for(*xs)


def second_order_steps(*xs) -> tuple[float, ...]:
    """The steps hessian_vector tries where its first, SECOND_ORDER_STEP_FACTOR * STEP
    (1e-3), leaves elements unresolved (kinks): second_order_step(*xs) (shrunk with tiny
    inputs), a tenth and a hundredth of the first (a function that curves over less than
    its length: a norm of a row of close values, whose spread is 2e-3), and the first
    times the largest input magnitude where that is above 2 (the rounding of a loss of
    inputs of 1e3 drowns a step of 1e-3: sqr's second difference at x = 1000 is 2e-6 of
    f)."""
    base = SECOND_ORDER_STEP_FACTOR * STEP
    scales = [float(np.nanmax(np.abs(x))) for x in xs if np.size(x) and not np.isnan(x).all()]
    big = max(scales, default=1.0)
    steps = [base, base / 10, base / 100]
    small = second_order_step(*xs)
    if small < base / 20:
        steps.append(small)
    if big > 2:
        steps.append(base * big)
    return tuple(steps)


def hessian_vector(f: Callable[[], float], xs, v, outer=None, h: float | None = None,
                   magnitude: float = 0.0) -> list[Derivative] | Derivative:
    """hessian_vector_at (see it) with a step of 1e-3 and, where that leaves an element a
    kink (unresolved, or a jump of the first derivative within reach), with each of the
    other steps of second_order_steps(*xs) too, the estimate of the smaller error kept per
    element among those that are not kinks (_best_resolved); with `h`, that step alone."""
    steps = (h,) if h is not None else second_order_steps(*xs)
    found = [hessian_vector_at(f, xs, v, outer, steps[0], magnitude)]
    flagged = found[0].kink.any() if outer is not None else any(d.kink.any()
                                                                 for d in found[0])
    if flagged:
        found += [hessian_vector_at(f, xs, v, outer, step, magnitude) for step in steps[1:]]
    if outer is not None:
        return _best_resolved(*found)
    return [_best_resolved(*per_x) for per_x in zip(*found, strict=True)]


def _best_resolved(*derivatives: Derivative) -> Derivative:
    """Per element, the estimate of the smallest error among those that are not kinks (a
    kink's error estimate can be small by chance: the stencils straddle the jump
    symmetrically), a kink only where every step gives one."""
    best = derivatives[0]
    for d in derivatives[1:]:
        better = (best.kink & ~d.kink) | ((best.kink == d.kink) & (d.error < best.error))
        best = Derivative(*(np.where(better, new, old) for new, old in
                            ((d.value, best.value), (d.error, best.error), (d.kink, best.kink))))
    return best


def hessian_vector_at(f: Callable[[], float], xs, v, outer, h: float,
                      magnitude: float = 0.0) -> list[Derivative] | Derivative:
    """Numerical Hessian-vector products of f() (a scalar of the float64 arrays `xs`, which
    it reads and which are moved and restored here) along `v` (arrays shaped like xs):
    the gradient of the directional derivative D_v f, both by the 4th-order stencil.

    With `outer` None, per element of every x (one Derivative per x, shaped like it): 5
    evaluations of f per inner derivative, 4 inner derivatives per element. With `outer`
    a list of directions (each a list of arrays like xs), the projections <u, H v> for
    each direction u instead (one Derivative of one value per direction).

    Error estimates, summed: the outer stencil's |d4 - d2|; the inner derivatives'
    truncation error as the outer stencil carries it (the outer d4 of the inner d4s against
    that of the inner d2s); 1.5 / h times the largest rounding error of the inner
    derivatives it combines (its coefficients |8|+|8|+|1|+|1| over 12 h), each 4 eps
    max(|f|, magnitude) / h. An element is a kink where the outer one-sided slopes differ
    beyond their error, where some of the inner derivatives it combines straddle a jump
    (their one-sided slopes differing beyond their rounding) and others do not, or where
    the error estimate exceeds UNRESOLVED of the array's scale: the
    stencils then straddle a point where the first derivative jumps (a max-pool switch, a
    relu's 0), and the value says nothing."""
    base = [x.copy() for x in xs]
    moved = [x.copy() for x in xs]       # the point an inner derivative is taken at

    def inner():
        """D_v f at the current point: (4th-order value, 2nd-order value, rounding error,
        kink)."""
        f0 = f()
        fs = _along(f, xs, moved, v, h)
        d4, _, jump, _ = _stencil(f0, *fs, h, magnitude)
        rounding = 4 * EPS64 * max(magnitude, *(abs(y) for y in (f0, *fs))) / h
        # one-sided slopes of a smooth D_v f differ by O(h^2): a jump far beyond that
        kink = jump > KINK_JUMP * max(1.0, abs(d4)) + KINK_ERR_FACTOR * rounding
        return float(d4), float((fs[0] - fs[1]) / (2 * h)), rounding, bool(kink)

    def outer_stencil(move):
        """The stencil of the inner derivative along one outer coordinate or direction:
        `move(d)` moves the inputs by d along it (from base)."""
        vals, lows, errs, kinks = [], [], [], []
        for d in (0.0, h, -h, 2 * h, -2 * h):
            move(d)
            for x, m in zip(xs, moved, strict=True):
                np.copyto(m, x)
            value, low, err, kink = inner()
            vals.append(value)
            lows.append(low)
            errs.append(err)
            kinks.append(kink)
        move(0.0)
        # a jump of D_v f that every inner stencil straddles alike (a tie of two max-pool
        # inputs that this coordinate does not move) cancels in the outer differences; one
        # that comes or goes as the coordinate moves does not
        kinked = any(kinks) and not all(kinks)
        d4, _, jump, _ = _stencil(*vals, h)
        inner_truncation = abs(d4 - _stencil(*lows, h)[0])
        noise = 1.5 * max(errs) / h          # the inner rounding, amplified
        err = abs(d4 - (vals[1] - vals[2]) / (2 * h)) + inner_truncation + noise
        return d4, err, jump, err, kinked

    if outer is None:
        out = []
        for x, x0 in zip(xs, base, strict=True):
            flat, flat0 = x.reshape(-1), x0.reshape(-1)
            vals, errs, jumps, jerrs, kinks = [], [], [], [], []
            for i in range(flat.size):
                def move(d, i=i, flat=flat, flat0=flat0):
                    flat[i] = flat0[i] + d
                d4, err, jump, jerr, kinked = outer_stencil(move)
                vals.append(d4)
                errs.append(err)
                jumps.append(jump)
                jerrs.append(jerr)
                kinks.append(kinked)
            d = _unresolved(_finish(vals, errs, jumps, jerrs), kinks)
            out.append(Derivative(d.value.reshape(x.shape), d.error.reshape(x.shape),
                                  d.kink.reshape(x.shape)))
        return out
    vals, errs, jumps, jerrs, kinks = [], [], [], [], []
    for u in outer:
        def move(d, u=u):
            for x, x0, ui in zip(xs, base, u, strict=True):
                np.copyto(x, x0 + d * ui)
        d4, err, jump, jerr, kinked = outer_stencil(move)
        vals.append(d4)
        errs.append(err)
        jumps.append(jump)
        jerrs.append(jerr)
        kinks.append(kinked)
    return _unresolved(_finish(vals, errs, jumps, jerrs), kinks)


def _unresolved(d: Derivative, kinks) -> Derivative:
    """`d` with its kinks, the inner derivatives' (`kinks`) and its unresolved elements
    (error beyond UNRESOLVED of its scale, see hessian_vector) flagged."""
    finite = d.value[np.isfinite(d.value)]
    scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
    return Derivative(d.value, d.error, d.kink | np.array(kinks) | (d.error > UNRESOLVED * scale))
