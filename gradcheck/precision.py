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
            floor = FLOOR_ULPS ulps of d (2 u_d) at the result's own magnitude, its
                    largest |r_f64|, but at least FLOOR_SHARE (1/32) of the case's, the
                    largest over its results: a result a little smaller than the others
                    (a softmax's gradient of 0.1 beside its output of 1) is held to its
                    own scale, else a 30% error in it would pass (gradcheck.verdict:
                    power); one far smaller is the cancellation of terms of the case's
                    size, which err as those terms do (a lucky reference can err less),
                    or lies in a tail where a float64 truth can be no better (torch's
                    own float64 GELU gradient at x = -11.5 is 0.75% off: it loses Phi(x)
                    to 1 + erf(x / sqrt 2) = 0; the truths of gelu and gelu_erf are
                    therefore forms that keep the tail, engine/reference_math.py)

r_f64 is the float64 truth on the same rounded inputs (torch autograd in float64 where the
op has a torch equivalent, else our float64 graph in the CPU backend's plain mode). The
reference r_ref is, in order of preference:

- torch's CPU kernels in d on the same inputs ("torch f16", ...): what a kernel writer
  compares against. torch computes float16 and bfloat16 in float32 inside its kernels and
  rounds on store, as our engine does. In float32, for a registry case, at least the
  error model's (below): torch's float32 error is its arithmetic's, and a result that
  cancels (a mean of values of both signs) can come out of torch's order of additions
  far more exact than of another correct one, a bar no good implementation is sure to
  meet (torch itself, on a permuted view of the same mean, erred 50 times as much);
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
fast-tier case of the registry (`gradcheck --all --format json`, each row's `ratio`): a
correct kernel's worst ratio is 1.85 in float16, 4.55 in bfloat16 (a masked softmax's mask
gradient: ours rounds between its nodes, torch's fused kernel once) and 1.07 in float32, so
8 leaves a margin of 1.7 and more; a float32 kernel that rounds through float16
(a relative error of 2^-11, inside float32's fixed tolerance) lands in the thousands
(tests/gradcheck/test_precision.py). Errors of an ulp or two are below this bar by design:
it is there for accuracy lost by accumulation and by computing in too narrow a type.

The rounding bias (float16 and bfloat16 only). Below the bar of the ratio sit errors of an
ulp or two, and one of them matters: the direction of the rounding. A kernel that truncates
on store (rounds toward zero) instead of rounding to nearest even errs at most one ulp per
element, twice a correct one, and no ratio of largest errors can tell; but its errors all
point the same way, and a sum of many such values (a finetuning run's gradient
accumulation) drifts by n/2 ulps where a correct one wanders by sqrt(n). A 16-bit kernel
computes in float32 from its (exact) 16-bit inputs and rounds once on store, so its error
against the float64 truth is that one rounding, 2^13 (float16) or 2^16 (bfloat16) times
coarser than what its float32 arithmetic adds: under rounding to nearest, uniform on
[-1/2, 1/2] ulp and unbiased. So for the forward output of a case whose op is one kernel
(not composite: a composite stores intermediates, whose shared roundings, such as one
rounded normaliser for a whole row, bias its elements alike), over the distinct pairs
(truth, value) of its inexact elements within one ulp of their truth (beyond, float32's
error has met cancellation),

    e_i  = (r_engine,i - r_f64,i) sign(r_f64,i) / ulp_d(r_f64,i)     (ulps at each element)
    bias = mean e_i                       (truncation toward zero: about -1/2)
    pass when |bias| <= BIAS_ULPS + BIAS_SIGMAS * std(e) / sqrt(n), or within twice the
         reference's own |bias| (torch's, where it ran); n >= BIAS_MIN_ELEMENTS, else none

The row reports the output's `bias` (in ulps). Measured on every fast-tier case of the
registry (`gradcheck --all --dtype f16` and bf16, each row's `bias`): a correct kernel's
largest |bias| is 0.23 in float16 and 0.16 in bfloat16, none beyond its allowance;
truncation on store gives -0.5 and fails (gradcheck --self-test). float32 results have no
bias verdict: a float32 kernel's error is its arithmetic's, not one rounding.

float64 cases have no such verdict: their truth is themselves.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from checkkit.precision import (  # noqa: F401  (the rule optcheck shares, named here too)
    FLOOR_ULPS,
    PRECISION_RATIO,
    bound,
    magnitude,
    max_abs_error,
    ratio,
    ulp,
)
from engine.registry import get_op
from engine.tensor import DTYPES, TORCH_DTYPE_NAMES, UNIT_ROUNDOFF, dtype_name, is_float
from gradcheck.reference import plain_forward, plain_vjp, torch_available, torch_reference

JUDGED = ("f16", "bf16", "f32")   # the dtypes judged (float64 is the truth)
MODEL_DRAWS = 2           # random perturbations of the error model
BIASED = ("f16", "bf16")  # the dtypes whose rounding bias is judged
BIAS_ULPS = 0.1           # a result's mean signed error may be this many ulps ...
BIAS_SIGMAS = 5.0         # ... plus this many standard errors of the mean
BIAS_MIN_ELEMENTS = 16    # fewer inexact elements than this: no bias judged
# ops whose 16-bit kernels compute each result from two 16-bit values (or one) exactly in
# float32 and round once, forward and backward: their results are held to correct rounding
# (rounding_checks)
ONE_ROUNDING = frozenset({"add", "sub", "mul", "neg", "abs"})
# and in float32, where a float32 kernel rounds its exact result once and float64 holds
# that exact result (a product of two float32 values: 48 bits; not a sum, whose exponents
# may lie 30 apart)
ONE_ROUNDING_F32 = frozenset({"mul", "neg", "abs"})
FLOOR_SHARE = 1 / 32      # a result's floor is at its own magnitude, at least this share of
#                           the case's largest (module doc)


def ulps_at(truth, dtype: str) -> np.ndarray:
    """The spacing of dtype `dtype`'s values at each |truth| (float64; the subnormals'
    spacing below the smallest normal)."""
    info = ml_dtypes.finfo(DTYPES[dtype])
    t = np.abs(np.asarray(truth, np.float64))
    with np.errstate(divide="ignore"):
        exponent = np.maximum(np.floor(np.log2(t)), info.minexp)
    return np.ldexp(1.0, (exponent - info.nmant).astype(np.int64))


def _inexact(v: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Which elements have a finite value and a finite non-zero truth that differ."""
    return np.isfinite(v) & np.isfinite(t) & (t != 0) & (v != t)


def signed_ulps(value, truth, dtype: str) -> np.ndarray:
    """The inexact elements' errors in ulps of `dtype` at each truth, positive away from
    zero (module doc: e_i): elements with a finite value and a finite non-zero truth that
    differ."""
    v = np.asarray(value, np.float64).reshape(-1)
    t = np.asarray(truth, np.float64).reshape(-1)
    keep = _inexact(v, t)
    v, t = v[keep], t[keep]
    return (v - t) * np.sign(t) / ulps_at(t, dtype)


def _distinct_pairs(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (t, v) pairs of finite t and v, by value, in lexicographic order: what
    np.unique(np.stack([t, v]), axis=1) gives, from one sort of t + v i (numpy sorts complex
    numbers by their real parts, then their imaginary parts), where np.unique's axis form
    sorts a structured view 5-60 times slower (18 ms for 1,000 pairs, 1.3 s for a million;
    a third of the registry test's time for softmax)."""
    pairs = np.empty(t.size, np.complex128)
    pairs.real, pairs.imag = t, v
    pairs.sort()
    new = np.ones(pairs.size, bool)
    new[1:] = pairs[1:] != pairs[:-1]
    return pairs.real[new], pairs.imag[new]


def bias(value, truth, dtype: str) -> tuple[float, float] | None:
    """(the mean signed error in ulps, the allowance BIAS_ULPS + BIAS_SIGMAS standard
    errors) of `value` against `truth` over the distinct inexact elements within one ulp of
    their truth (module doc); None for fewer than BIAS_MIN_ELEMENTS of them."""
    v = np.asarray(value, np.float64).reshape(-1)
    t = np.asarray(truth, np.float64).reshape(-1)
    # the pairs signed_ulps keeps that err at most an ulp, then the distinct ones (fewer to sort)
    keep = _inexact(v, t)
    keep[keep] = np.abs(signed_ulps(v[keep], t[keep], dtype)) <= 1.0
    t, v = _distinct_pairs(t[keep], v[keep])
    e = signed_ulps(v, t, dtype)
    if e.size < BIAS_MIN_ELEMENTS:
        return None
    return float(np.mean(e)), BIAS_ULPS + BIAS_SIGMAS * float(np.std(e)) / np.sqrt(e.size)


@dataclasses.dataclass(frozen=True)
class Result:
    """One result judged: what it is ("output" or an input's name), its error against the
    float64 truth, the reference's error, the ratio and the reference's name; for a 16-bit
    result, its rounding bias in ulps and the bias allowed (None, inf: not judged)."""

    what: str
    err: float
    ref_err: float
    ratio: float
    reference: str
    bias: float | None = None
    bias_bar: float = float("inf")
    dtype: str = ""                         # the dtype it was judged in ("": the case's)
    power: float = float("inf")             # the smallest relative error of the whole
    #                                         result that the ratio flags (gradcheck.verdict)
    slack: float = float("inf")             # the absolute error that would be flagged:
    #                                         the bound plus the error it already has

    @property
    def unbiased(self) -> bool:
        return self.bias is None or abs(self.bias) <= self.bias_bar

    @property
    def ok(self) -> bool:
        return self.ratio <= PRECISION_RATIO and self.unbiased


def judge(what: str, value, truth, ref_err: float, dtype: str, reference: str,
          size: float | None = None, ref_value=None, rounded_once: bool = False) -> Result:
    """Result `value` (named `what`) of dtype `dtype` against its float64 `truth`, given the
    reference's error `ref_err`; the floor at magnitude `size` (None: the truth's).
    `rounded_once`: the result is one kernel's store, whose rounding bias is judged too
    (16-bit dtypes; the reference's result `ref_value`, if given, widens the bias
    allowed by its own)."""
    err = max_abs_error(value, truth)
    own = magnitude(truth)
    size = own if size is None else size
    r = ratio(err, ref_err, size, dtype)
    # a result off by a relative d everywhere errs up to d * own more: sure to be flagged
    # once that exceeds the bound and the error it already has
    slack = bound(ref_err, size, dtype) + err if np.isfinite(err) else np.inf
    power = slack / own if own else np.inf
    held = bias(value, truth, dtype) if rounded_once and dtype in BIASED else None
    if held is None:
        return Result(what, err, ref_err, r, reference, dtype=dtype, power=power,
                      slack=slack)
    mean, bar = held
    theirs = None if ref_value is None else bias(ref_value, truth, dtype)
    if theirs is not None:
        bar = max(bar, 2.0 * abs(theirs[0]))
    return Result(what, err, ref_err, r, reference, mean, bar, dtype, power, slack)


@dataclasses.dataclass(frozen=True)
class Rounding:
    """One 16-bit result held to correct rounding (`correctly_rounded`): the cells checked,
    those that differ from the float64 result rounded to nearest even, the first of them
    (index, the engine's value, the correctly rounded one), and the power of the check."""

    what: str
    checked: int
    wrong: int
    first: tuple = ()
    power: float = float("inf")

    @property
    def problem(self) -> str | None:
        if not self.wrong:
            return None
        index, got, want = self.first
        return (f"precision: {self.what} is not correctly rounded in {self.wrong}/"
                f"{self.checked} cells that float32 computes exactly (the float64 result "
                f"rounded to nearest, ties to even), first {self.what}{list(index)}: got "
                f"{got:.6g}, want {want:.6g}")


def correctly_rounded(what: str, value, exact, dtype: str) -> Rounding:
    """16-bit (or float32) result `value` against `exact`, the float64 result on the same
    (exact) inputs: at each cell float32 holds exactly (so an engine computing in float32
    has it before its one rounding) or where it is NaN or infinite (in float32: every
    cell), `value` must be `exact` rounded to nearest even in `dtype`, bit for bit (any
    NaN for a NaN). Subnormals flushed to zero,
    ties rounded away from even, a NaN stored as an infinity all differ. The power: the
    smallest relative change of a correctly rounded cell that moves it to another value,
    half an ulp at the cell where that is smallest."""
    t = np.asarray(exact, np.float64)
    v = np.asarray(value)
    with np.errstate(invalid="ignore", over="ignore"):
        cells = np.isnan(t) | (t.astype(np.float32).astype(np.float64) == t) \
            if dtype in BIASED else np.ones(t.shape, bool)   # float32: computed in itself
        want = t.astype(DTYPES[dtype])
    got = v.astype(DTYPES[dtype])
    bits = np.dtype(f"u{got.itemsize}")
    same = (got.view(bits) == want.view(bits)) | (np.isnan(got) & np.isnan(want))
    wrong = cells & ~same
    finite = cells & np.isfinite(t) & (t != 0)
    power = float(np.min(ulps_at(t[finite], dtype) / np.abs(t[finite]))) / 2 \
        if finite.any() else float("inf")
    first = ()
    if wrong.any():
        i = tuple(int(k) for k in np.argwhere(wrong)[0])
        first = (i, float(got[i]), float(want[i]))
    return Rounding(what, int(cells.sum()), int(wrong.sum()), first, power)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The precision verdict of a case: its result of the largest ratio (`worst`, None:
    nothing judged), its most biased one, relative to the bias allowed (`biased`, None:
    no bias judged), and, for an op that rounds once, its results held to correct rounding
    (`rounded`)."""

    worst: Result | None
    dtype: str
    biased: Result | None = None
    powers: dict = dataclasses.field(default_factory=dict)   # what -> Result.power
    slacks: dict = dataclasses.field(default_factory=dict)   # what -> Result.slack
    rounded: tuple = ()                                       # Rounding records

    @property
    def ok(self) -> bool:
        return ((self.worst is None or self.worst.ratio <= PRECISION_RATIO)
                and (self.biased is None or self.biased.unbiased)
                and not any(r.wrong for r in self.rounded))

    def with_rounding(self, rounded) -> Verdict:
        """This verdict with results held to correct rounding too: their problems, and
        their powers where tighter."""
        rounded = tuple(rounded)
        powers = dict(self.powers)
        for r in rounded:
            powers[r.what] = min(powers.get(r.what, np.inf), r.power)
        return dataclasses.replace(self, powers=powers, rounded=self.rounded + rounded)

    @property
    def problem(self) -> str | None:
        wrong = next((r for r in self.rounded if r.wrong), None)
        if wrong is not None:
            return wrong.problem
        w, b = self.worst, self.biased
        if w is not None and w.ratio > PRECISION_RATIO:
            return (f"precision: {w.what} errs {w.err:.3g} against float64, {w.ratio:.3g} "
                    f"(bar {PRECISION_RATIO:g}) times as far as {w.reference} in "
                    f"{w.dtype or self.dtype} ({w.ref_err:.3g}) allows")
        if b is not None and not b.unbiased:
            way = "toward zero" if b.bias < 0 else "away from zero"
            return (f"precision: {b.what} is biased {way}: its errors average "
                    f"{b.bias:+.3g} ulps of {b.dtype or self.dtype}, beyond the {b.bias_bar:.2g} "
                    "allowed (rounding to nearest is unbiased; truncation gives -0.5)")
        return None

    def metrics(self) -> dict:
        w, b = self.worst, self.biased
        if w is None:
            return {}
        m = {"err_vs_f64": w.err, "ref_err": w.ref_err, "ratio": round(w.ratio, 3),
             "precision_ref": w.reference}
        if b is not None:
            m["bias"] = round(b.bias, 3)
        return m


def worst_of(results, dtype: str) -> Verdict:
    """The verdict of results `results` (Result records): the one of the largest ratio, and
    the one whose bias takes the largest share of its allowance."""
    results = list(results)
    judged = [r for r in results if r.bias is not None]
    return Verdict(max(results, key=lambda r: r.ratio) if results else None, dtype,
                   max(judged, key=lambda r: abs(r.bias) / r.bias_bar) if judged else None,
                   {r.what: r.power for r in results}, {r.what: r.slack for r in results})


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


def _one_kernel(case) -> bool:
    """Whether `case`'s output is one kernel's store: a registry case of an op that is not
    composite (its input views round nothing)."""
    if not _ours(case):
        return False
    try:
        return get_op(case.op).kind != "composite"
    except Exception:         # not a registered op: no claim about its kernels
        return False


def judged_dtypes(case, out) -> tuple[str, dict[str, str]]:
    """The dtype whose fixed tolerance judges each result of `case`: (the output's, {input
    name: its gradient's}). A case's results follow its least precise dtype (its
    `precision`), except in one kernel (not composite: no intermediate is stored) whose
    output is finer than that: the float32 product of float16 weights is computed in
    float32 from inputs that float32 holds exactly, so its output is judged in float32 and
    each gradient in the coarser of the output's dtype and its input's own (a float16
    input's gradient is rounded to float16 once, a float32 one's is float32's)."""
    dtype = case.precision
    names = [spec.name for spec in case.inputs]
    out_dtype = dtype_name(np.asarray(out).dtype) if is_float(np.asarray(out).dtype) else ""
    if out_dtype not in UNIT_ROUNDOFF or UNIT_ROUNDOFF[out_dtype] >= UNIT_ROUNDOFF[dtype] or \
            not _one_kernel(case):
        return dtype, dict.fromkeys(names, dtype)
    own = {spec.name: spec.dtype or case.dtype for spec in case.inputs}
    return out_dtype, {n: max((out_dtype, own[n]), key=lambda d: UNIT_ROUNDOFF.get(d, 0.0))
                       for n in names}


def check_case(case, arrays, weights, out, grads, checked, truth_out, truth_grads=None,
               use_torch: bool = True, kinks: dict | None = None) -> Verdict | None:
    """The precision verdict of a case (module doc): its engine output `out` and gradients
    `grads` (per input; `checked` the indices judged) against the float64 truths
    `truth_out` and `truth_grads` (None: our float64 graph's, in plain mode); None for a
    float64 case, an integer output, or a user's function that torch cannot run in the
    case's dtype (no error model without our graph of it). `kinks`: per checked input
    (index), the cells where the numerical check found a kink (a derivative that jumps
    there, as at hardswish's 3 when a 16-bit input rounds onto it): not judged, as the
    other checks do not judge them."""
    dtype = case.precision
    if dtype not in JUDGED or not is_float(np.asarray(out).dtype):
        return None
    native = native_reference(case, arrays, weights) if use_torch else None
    if native is None and not _ours(case):
        return None

    def results(at_x):
        """The output and the checked gradients of our float64 graph at inputs `at_x`."""
        if not checked:
            return [plain_forward(case, at_x)]
        o, g = plain_vjp(case, at_x, weights)
        return [o] + [g[i] for i in checked]
    # our float64 results at the inputs: the gradients' truth when none is given, the error
    # model's base without torch; computed once for both
    # float32: torch's error is its arithmetic's, which a sum that cancels can make small by
    # luck; the error model's (what a backward-stable float32 implementation may err) is the
    # least the bar allows. (16-bit: torch computes in float32 and rounds once, the standard
    # an engine is held to, cancellation included.)
    stable = dtype == "f32" and _ours(case)
    ours = results(arrays) if truth_grads is None or native is None or stable else None
    names = ["output"] + [case.inputs[i].name for i in checked]
    values = [out] + [grads[i] for i in checked]
    truths = [truth_out] + (ours[1:] if truth_grads is None
                            else [truth_grads[i] for i in checked])
    if native is not None:
        refs = [native.output] + [native.grads[i] for i in checked]
        ref_errs = [max_abs_error(r, t) for r, t in zip(refs, truths, strict=True)]
        reference = f"torch {dtype}"
        if stable:
            draws = [results(d) for d in perturbed(arrays, dtype, case.seed())]
            ref_errs = [max(e, m) for e, m in zip(ref_errs, model_errors(ours, draws, dtype),
                                                   strict=True)]
    else:
        refs = [None] * len(truths)
        draws = [results(d) for d in perturbed(arrays, dtype, case.seed())]
        ref_errs = model_errors(ours, draws, dtype)
        reference = "model"
    for j, i in enumerate(checked, start=1):     # kinks: the engine's value taken as right
        mask = (kinks or {}).get(i)
        if mask is not None and np.any(mask):
            values[j] = np.where(mask, truths[j], np.asarray(values[j], np.float64))
            if refs[j] is not None:
                refs[j] = np.where(mask, truths[j], np.asarray(refs[j], np.float64))
    references = [reference] * len(truths)
    dtypes = [dtype] * len(truths)
    out_dtype = dtype_name(np.asarray(out).dtype)
    if out_dtype in JUDGED and UNIT_ROUNDOFF[out_dtype] < UNIT_ROUNDOFF[dtype] and _ours(case):
        # an output finer than the case's least precise input (float32 from 16-bit weights,
        # a widening cast) is judged in its own dtype: its inputs are exact in it
        base = ours[0] if ours is not None else plain_forward(case, arrays)
        moved = [[plain_forward(case, d)] for d in perturbed(arrays, out_dtype, case.seed())]
        ref_errs[0] = model_errors([base], moved, out_dtype)[0]
        refs[0], references[0], dtypes[0] = None, "model", out_dtype
    once = _one_kernel(case)
    case_size = magnitude(*truths)
    verdict = worst_of([judge(n, v, t, e, d, ref, max(magnitude(t), FLOOR_SHARE * case_size),
                              r, once and n == "output")
                        for n, v, t, e, d, ref, r in zip(names, values, truths, ref_errs,
                                                         dtypes, references, refs,
                                                         strict=True)], dtype)
    return verdict.with_rounding(rounding_checks(case, arrays, weights, out, grads, checked))


def rounds_once(case) -> bool:
    """Whether `case` is a 16-bit case of an op that rounds once (ONE_ROUNDING), or a
    float32 one of an op whose float64 result of float32 values is exact (ONE_ROUNDING_F32),
    all of whose inputs are in its dtype: its results are held to correct rounding."""
    ops = ONE_ROUNDING if case.precision in BIASED else \
        ONE_ROUNDING_F32 if case.precision == "f32" else ()
    return (getattr(case, "op", None) in ops and _one_kernel(case)
            and case.float_dtypes == {case.precision})


def rounding_checks(case, arrays, weights, out, grads, checked) -> list[Rounding]:
    """The correct-rounding checks of a case that rounds_once: its output, and the gradient
    of each checked input of the output's shape that is not a broadcast (a broadcast
    input's gradient is a sum, rounded more than once), against our float64 graph's
    results on the same inputs and the cotangent the engine got (the weights rounded to
    the case's dtype): every product and sum of two 16-bit values is exact there."""
    if not rounds_once(case):
        return []
    dtype = case.precision
    cotangent = np.asarray(weights, np.float64).astype(DTYPES[dtype]).astype(np.float64)
    exact_out, exact_grads = plain_vjp(case, arrays, cotangent)
    shape = np.shape(out)
    found = [correctly_rounded("output", out, exact_out, dtype)]
    for i in checked:
        spec = case.inputs[i]
        if spec.shape == shape and not spec.expand and grads[i] is not None:
            found.append(correctly_rounded(spec.name, grads[i], exact_grads[i], dtype))
    return found
