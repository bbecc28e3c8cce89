"""The precision verdict: is the engine as accurate as a good implementation at its dtype?

A fixed tolerance asks the wrong question below float64. A float32 row sum accumulated
serially over a million rows errs ten thousand times more than a pairwise one and still
passes a relative 1e-3; a float16 kernel that accumulates in float16 passes a tolerance
loose enough for float16's storage. So for a case in dtype d (f16, bf16 or f32: the least
precise it computes in), each result r (the forward output, and the VJP of each checked
input) is judged by

    err     = max |r_engine - r_f64|           (err_vs_f64)
    ref_err = max |r_ref - r_f64|              (the reference at the same precision)
    pass    when err <= PRECISION_RATIO * ref_err + floor,
            floor = FLOOR_ULPS ulps of d (2 u_d) at the case's magnitude, the largest
                    |r_f64| over its results: a result that vanishes by cancellation
                    (a softmax's mask gradient under a cotangent constant along the rows)
                    is judged at the scale of the terms that cancel

r_f64 is the float64 truth on the same rounded inputs (torch autograd in float64 where the
op has a torch equivalent, else our float64 graph in the CPU backend's plain mode). The
reference r_ref is, in order of preference:

- torch's CPU kernels in d on the same inputs ("torch f16", ...): what a kernel writer
  compares against. torch computes float16 and bfloat16 in float32 inside its kernels and
  rounds on store, as our engine does;
- where torch lacks the op in d (it raises "not implemented for 'Half'"), its result is not
  in d, or no torch: an error model ("model"). A backward-stable implementation at
  precision d computes the exact function of inputs moved by about one rounding each, and
  rounds its result once: ref_err = u_d max |r_f64| + max_s max |r_f64(x (1 + u_d s)) -
  r_f64(x)| over MODEL_DRAWS random sign patterns s (float64 evaluations). For a sum of n
  terms the second term is u_d times a norm of the terms: what an accumulation in float32
  or pairwise meets, and what a float16 or a serial one over many terms does not.

`ratio` is err over the bound, scaled so that PRECISION_RATIO is the bar (8 exactly when
err equals PRECISION_RATIO * ref_err + floor). The row reports the worst result's
err_vs_f64, ref_err, ratio and which reference it used. The bar, measured on every
fast-tier case of the registry (`gradcheck --all --dtype f16 --format json`, each row's
`ratio`): a correct kernel's worst ratio is 1.2 in float16, 2.0 in bfloat16 and 1.5 in
float32, so 8 leaves a margin of 4 and more; a float32 kernel that rounds through float16
(a relative error of 2^-11, inside float32's fixed tolerance) lands in the thousands
(tests/gradcheck/test_precision.py). Errors of an ulp or two are below this bar by design:
it is there for accuracy lost by accumulation and by computing in too narrow a type.

float64 cases have no such verdict: their truth is themselves.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from engine.tensor import TORCH_DTYPE_NAMES, UNIT_ROUNDOFF, is_float
from gradcheck.reference import plain_vjp, torch_available, torch_reference

PRECISION_RATIO = 8.0     # an engine may err this many times the reference ...
FLOOR_ULPS = 4.0          # ... plus this many of its dtype's ulps of the result's magnitude
JUDGED = ("f16", "bf16", "f32")   # the dtypes judged (float64 is the truth)
MODEL_DRAWS = 2           # random perturbations of the error model


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


@dataclasses.dataclass(frozen=True)
class Result:
    """One result judged: what it is ("output" or an input's name), its error against the
    float64 truth, the reference's error, the ratio and the reference's name."""

    what: str
    err: float
    ref_err: float
    ratio: float
    reference: str

    @property
    def ok(self) -> bool:
        return self.ratio <= PRECISION_RATIO


def judge(what: str, value, truth, ref_err: float, dtype: str, reference: str,
          size: float | None = None) -> Result:
    """Result `value` (named `what`) of dtype `dtype` against its float64 `truth`, given the
    reference's error `ref_err`; the floor at magnitude `size` (None: the truth's)."""
    err = max_abs_error(value, truth)
    size = magnitude(truth) if size is None else size
    return Result(what, err, ref_err, ratio(err, ref_err, size, dtype), reference)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The precision verdict of a case: its worst result (None: nothing judged)."""

    worst: Result | None
    dtype: str

    @property
    def ok(self) -> bool:
        return self.worst is None or self.worst.ok

    @property
    def problem(self) -> str | None:
        w = self.worst
        if w is None or w.ok:
            return None
        return (f"precision: {w.what} errs {w.err:.3g} against float64, {w.ratio:.3g} "
                f"(bar {PRECISION_RATIO:g}) times as far as {w.reference} in {self.dtype} "
                f"({w.ref_err:.3g}) allows")

    def metrics(self) -> dict:
        w = self.worst
        if w is None:
            return {}
        return {"err_vs_f64": w.err, "ref_err": w.ref_err, "ratio": round(w.ratio, 3),
                "precision_ref": w.reference}


def worst_of(results, dtype: str) -> Verdict:
    """The verdict of results `results` (Result records): the one of the largest ratio."""
    results = list(results)
    return Verdict(max(results, key=lambda r: r.ratio) if results else None, dtype)


def perturbed(arrays, dtype: str, seed: int) -> list[list[np.ndarray]]:
    """MODEL_DRAWS copies of the float arrays of `arrays` in float64, each element moved by
    one unit roundoff of `dtype` up or down (random signs); integer arrays as they are."""
    rng = np.random.default_rng(seed)
    u = UNIT_ROUNDOFF[dtype]
    draws = []
    for _ in range(MODEL_DRAWS):
        moved = []
        for a in arrays:
            a = np.asarray(a)
            if a.dtype.kind in "iub":
                moved.append(a)
                continue
            x = np.asarray(a, np.float64)
            moved.append(x * (1.0 + u * rng.choice([-1.0, 1.0], x.shape)))
        draws.append(moved)
    return draws


def model_errors(truths, perturbed_truths, dtype: str) -> list[float]:
    """The error model's ref_err of each result (module doc): one rounding of its
    magnitude, plus the largest move of the float64 result under the input perturbations.
    `truths`: the results at the inputs; `perturbed_truths`: per draw, the same results at
    the perturbed inputs."""
    u = UNIT_ROUNDOFF[dtype]
    errs = []
    for i, t in enumerate(truths):
        t = np.asarray(t, np.float64)
        finite = t[np.isfinite(t)]
        rounding = u * (float(np.max(np.abs(finite))) if finite.size else 0.0)
        moves = [max_abs_error(draw[i], t) for draw in perturbed_truths]
        errs.append(rounding + max(moves, default=0.0))
    return errs


def native_reference(case, arrays, weights):
    """torch in the case's own dtypes (gradcheck.reference.torch_reference, native), or
    None where torch lacks the op in them (it raises), returns another dtype than the
    case's precision, or is not installed."""
    if case.torch_fn is None or not torch_available():
        return None
    try:
        ref = torch_reference(case, arrays, weights, native=True)
    except Exception:        # "... not implemented for 'Half'", and the like: a function
        return None          # that cannot run in the dtype is no reference in it
    if ref is None or ref.dtype != TORCH_DTYPE_NAMES[case.precision]:
        return None
    return ref


def _ours(case) -> bool:
    """Whether `case` is built from engine ops (a registry case): our float64 graph of it
    can stand in for torch (a user's numpy or torch function has none)."""
    return getattr(case, "registered", True) and getattr(case, "reference_forward",
                                                         None) is None


def check_case(case, arrays, weights, out, grads, checked, truth_out, truth_grads=None,
               use_torch: bool = True) -> Verdict | None:
    """The precision verdict of a case (module doc): its engine output `out` and gradients
    `grads` (per input; `checked` the indices judged) against the float64 truths
    `truth_out` and `truth_grads` (None: our float64 graph's, in plain mode); None for a
    float64 case, an integer output, or a user's function that torch cannot run in the
    case's dtype (no error model without our graph of it)."""
    dtype = case.precision
    if dtype not in JUDGED or not is_float(np.asarray(out).dtype):
        return None
    native = native_reference(case, arrays, weights) if use_torch else None
    if native is None and not _ours(case):
        return None

    def results(at_x):
        """The output and the checked gradients of our float64 graph at inputs `at_x`."""
        o, g = plain_vjp(case, at_x, weights)
        return [o] + [g[i] for i in checked]
    # our float64 results at the inputs: the gradients' truth when none is given, the error
    # model's base without torch; computed once for both
    ours = results(arrays) if truth_grads is None or native is None else None
    names = ["output"] + [case.inputs[i].name for i in checked]
    values = [out] + [grads[i] for i in checked]
    truths = [truth_out] + (ours[1:] if truth_grads is None
                            else [truth_grads[i] for i in checked])
    if native is not None:
        refs = [native.output] + [native.grads[i] for i in checked]
        ref_errs = [max_abs_error(r, t) for r, t in zip(refs, truths, strict=True)]
        reference = f"torch {dtype}"
    else:
        draws = [results(d) for d in perturbed(arrays, dtype, case.seed())]
        ref_errs = model_errors(ours, draws, dtype)
        reference = "model"
    size = magnitude(*truths)
    return worst_of([judge(n, v, t, e, dtype, reference, size) for n, v, t, e
                     in zip(names, values, truths, ref_errs, strict=True)], dtype)
