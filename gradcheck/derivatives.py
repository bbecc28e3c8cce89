"""Forward mode and second order: the derivatives an engine offers besides its VJP, judged
with gradcheck's own numerics (`gradcheck --ad fwd|both`, `--order 2`).

Forward mode (`jvp_verdict`): the engine's Jacobian-vector products J t along TANGENTS
random tangents t (drawn per leaf element, rounded to the input's dtype) are checked

- against the float64 reference's directional derivatives of the output along t, element
  by element (gradcheck.numeric.directional_derivatives: the 4th-order stencil, its error
  estimate and kinks), and torch's float64 forward-mode JVP along the first tangent as the
  third opinion, in the same three-way verdict as the gradients (gradcheck.verdict);
- by the adjoint identity <J t, w> = <t, J^T w> against the engine's own VJP for the loss
  weights w: no numerical differentiation at all, it catches a JVP and a VJP that disagree.
  Each side may be off by what the elementwise tolerances of the case's dtype allow its
  elements (adjoint_check); where a 2x error of J t would stay within that (the inner
  product cancels), the identity is not judged and the row says so.

Second order (`hvp_verdict`): the engine's Hessian-vector products H v (the gradient of
<grad loss, v>, loss = sum(output * w)), by each of its methods (reverse over reverse,
forward over reverse), are checked against float64 finite differences of the reference's
first derivative (gradcheck.numeric.hessian_vector: the stencil nested in itself) and
torch's float64 double backward, with the 16-bit dtypes' tolerances widened
(gradcheck.numeric.TOLERANCES' "order 2" entries): per element in full mode (at most
HVP_FULL_BUDGET checked
elements under `auto`), else as projections <u, H v> on DIRECTIONS random directions. A case
whose Hessian is zero (an op linear in its inputs) is judged all the same (a second
derivative that is not zero fails), and its row says that the Hessian is zero. In full
mode, elements whose float64 second derivative lies beyond the dtype's largest value are
left out of the comparisons and counted in the row's message (a float16 engine's inf there
is right).

Both rows check the engine's forward output too and run the engine twice on one tangent or
direction (determinism).
Neither applies to the scale tier (its cases are too big for the numerics), nor to ops
without a gradient; an adapter without `jvp` or `hvp` (gradcheck.adapters.base) has no
such mode, and says so in an `unsupported` row, as does one that raises Unsupported.
"""

from __future__ import annotations

import numpy as np

from engine.tensor import as_dtype, is_float
from gradcheck.adapters.base import Unsupported
from gradcheck.backprop import (
    EngineResultError,
    declined_inputs,
    leaf_answer,
    loss_weights,
    same_bits,
    validated,
    zero_gradient,
)
from gradcheck.modes import DIRECTIONS, project, random_directions, single_thread
from gradcheck.numeric import (
    TOLERANCES,
    Comparison,
    Derivative,
    best_of,
    compare,
    directional_derivatives,
    hessian_vector,
    steps_for,
)
from gradcheck.reference import float64_reference, forward_comparison
from gradcheck.verdict import GradientOutcome, Outcomes, judge
from reports import Result

AD_MODES = ("rev", "fwd", "both")
ORDERS = (1, 2)
TANGENTS = 2              # random tangents per case in forward mode
HVP_FULL_BUDGET = 300     # checked elements up to which order 2 compares every element


def row_name(case, kind: str) -> str:
    """The row of `case` in forward mode ("fwd") or at order 2 ("order 2")."""
    return f"{case} [{kind}]"


class _Prepared:
    """What both checks start from: the inputs, the float64 reference, its loss weights
    (constant cells weighted 0), the checked inputs and the declined ones."""

    def __init__(self, case, adapter):
        self.case = case
        self.arrays = case.generate_inputs()
        self.ref = float64_reference(case, self.arrays)
        leaves = self.ref.leaves
        differentiable = [i for i, leaf in enumerate(leaves) if leaf is not None]
        declined = declined_inputs(adapter, case, differentiable)
        self.declined_note = "; ".join(f"{case.inputs[i].name}: {why}"
                                       for i, why in declined.items())
        self.checked = [i for i in differentiable if i not in declined]
        weights = loss_weights(self.ref.output_shape, case.seed(),
                               getattr(case, "cotangent", "contiguous"), case.precision)
        self.weights, self.f64_out, self.constant = self.ref.weigh(weights)

    def unsupported_row(self, name, labels) -> Result:
        """The row of a case whose every checked input the engine declines."""
        return Result("gradcheck", name, "unsupported", {"declined": self.declined_note},
                      f"the engine declines the gradient of every checked input: "
                      f"{self.declined_note}", labels=labels)

    def leaf_directions(self, salt: int) -> list[np.ndarray]:
        """One random direction per checked input, in its leaf layout: standard normal
        about a mean of +1 or -1 (one sign per input: a mean over many elements of a
        direction of mean 0 shrinks toward 0, below the tolerances' floor, and its check
        could not fail) on the elements its view reads (zero on a slice's border), rounded
        to the input's dtype, so that the engine and the float64 reference move along the
        same one."""
        rng = np.random.default_rng(self.case.seed() + salt)
        out = []
        for i in self.checked:
            spec, leaf = self.case.inputs[i], self.ref.leaves[i]
            read = spec.leaf_gradient(np.ones(spec.shape)) != 0 if spec.is_view else 1.0
            u = (rng.normal(size=leaf.shape) + rng.choice([-1.0, 1.0])) * read
            out.append(u.astype(self.arrays[i].dtype).astype(np.float64))
        return out

    def as_given(self, leaf_dirs) -> list[np.ndarray | None]:
        """Leaf-layout directions of the checked inputs as the engine gets them: per input,
        the view's values in its dtype, None where not checked."""
        given: list[np.ndarray | None] = [None] * len(self.arrays)
        for i, u in zip(self.checked, leaf_dirs, strict=True):
            given[i] = np.array(self.case.inputs[i].from_leaf(u), self.arrays[i].dtype)
        return given

    def copies(self):
        return [a.copy() for a in self.arrays]

    def forward(self, out) -> Comparison | bool:
        return forward_comparison(out, self.f64_out, self.constant, self.case.precision)

    def check_shape(self, what: str, a) -> np.ndarray:
        a = np.asarray(a)
        if a.shape != tuple(self.ref.output_shape):
            raise EngineResultError(f"the engine's {what} has shape {list(a.shape)}, the "
                                    f"case's output {list(self.ref.output_shape)}")
        return a

    def finish(self, name, outcomes: Outcomes, fraction: float, labels, **metrics):
        v = judge(outcomes)
        row = v.metrics(fraction) | metrics
        if self.declined_note:
            row["declined"] = self.declined_note
        if self.constant is not None:
            row["constant"] = int(np.count_nonzero(self.constant))
        return Result("gradcheck", name, v.status, row, v.message, labels=labels)


def _torch_f64(case, use_torch: bool):
    """The torch adapter that computes the float64 third opinion, or None (no torch, or
    no torch equivalent of the case)."""
    if not use_torch or getattr(case, "torch_fn", None) is None:
        return None
    from gradcheck.reference import torch_available
    if not torch_available():
        return None
    from gradcheck.adapters.torch_adapter import TorchAdapter
    return TorchAdapter()


def _f64(arrays):
    return [np.asarray(a, np.float64) if is_float(a.dtype) else a for a in arrays]


def _f64s(given):
    return [None if g is None else np.asarray(g, np.float64) for g in given]


def _third_opinion(compute, case):
    """torch's float64 answer, or None where torch cannot give it (Unsupported, or an
    error of the torch equivalent at this order: the row is then judged without it);
    torch on one thread for a small case (gradcheck.reference.torch_threads)."""
    from gradcheck.reference import torch_threads
    try:
        with torch_threads(case):
            return compute()
    except (Unsupported, NotImplementedError, RuntimeError, TypeError):
        return None


# --- forward mode ---------------------------------------------------------------------------

def adjoint_check(jvps, weights, tangents, grads, precision: str):
    """The adjoint identity per tangent k: <jvps[k], weights> against sum_i <tangents[k][i],
    grads[i]> (leaf layouts). Each side may be off by what the elementwise tolerances of
    `precision` allow its elements (gradcheck.numeric.TOLERANCES: atol * max(1, max|x|) +
    rtol * |x| per element x of J t or of a gradient), summed with the weights' or the
    tangents' magnitudes. (problem or None, note or None, worst ratio of the discrepancy
    to its allowance over the judged tangents)."""
    atol, rtol = TOLERANCES[precision]
    gscale = max([1.0] + [float(np.max(np.abs(g))) for g in grads if g.size])
    worst, judged, bad = 0.0, 0, []
    for k, (jt, ts) in enumerate(zip(jvps, tangents, strict=True)):
        a = float(np.sum(jt * weights))
        terms = [t * g for t, g in zip(ts, grads, strict=True)]
        b = float(sum(np.sum(x) for x in terms))
        if not (np.isfinite(a) and np.isfinite(b)):
            bad.append(f"t{k}: <Jt, w> = {a:.6g}, <t, J^T w> = {b:.6g}")
            worst = float("inf")
            continue
        jscale = max(1.0, float(np.max(np.abs(jt))) if jt.size else 0.0)
        allowed = (atol * jscale * float(np.sum(np.abs(weights)))
                   + rtol * float(np.sum(np.abs(jt * weights)))
                   + atol * gscale * float(sum(np.sum(np.abs(t)) for t in ts))
                   + rtol * float(sum(np.sum(np.abs(x)) for x in terms)))
        if max(abs(a), abs(b)) <= allowed:      # a 2x error of either side would pass
            continue
        judged += 1
        ratio = abs(a - b) / allowed
        worst = max(worst, ratio)
        if ratio > 1:
            bad.append(f"t{k}: <Jt, w> = {a:.9g}, <t, J^T w> = {b:.9g} (allowed "
                       f"{allowed:.3g})")
    problem = (f"adjoint: the JVP and the VJP disagree ({'; '.join(bad)})" if bad else None)
    note = (None if judged or bad else "adjoint identity not judged: <Jt, w> is within "
            "its tolerance of 0 for every tangent (a 2x error would pass)")
    return problem, note, worst


def jvp_verdict(case, adapter, use_torch: bool, labels: dict) -> Result:
    """The forward-mode row of `case` in `adapter` (see the module doc). Raises for an
    engine error (the caller makes it an error row), Unsupported where the engine cannot
    take the case's forward-mode derivative."""
    name = row_name(case, "fwd")
    p = _Prepared(case, adapter)
    if not p.checked:
        return p.unsupported_row(name, labels)
    tangents = [p.leaf_directions(11 + k) for k in range(TANGENTS)]
    runs = [adapter.jvp(case, p.copies(), p.as_given(t)) for t in tangents]
    again = adapter.jvp(case, p.copies(), p.as_given(tangents[0]))    # determinism
    out = p.check_shape("output", runs[0].output)
    jvps = [p.check_shape("JVP", r.tangent).astype(np.float64) for r in runs]
    differs = not (same_bits(runs[0].tangent, again.tangent) and
                   same_bits(runs[0].output, again.output))
    xs = [p.ref.leaves[i] for i in p.checked]
    constant = p.constant

    def output():
        y = p.ref.output()
        return y if constant is None else np.where(constant, 0.0, y)
    with single_thread():
        numerical = best_of(*(directional_derivatives(output, xs, tangents, h)
                              for h in steps_for(*xs)))
    jvp = np.stack(jvps)
    torch_jvp = None
    torch = _torch_f64(case, use_torch)
    if torch is not None:
        f64 = case.promoted("f64")
        # the first tangent's (a second would cost as much as the rest of the row)
        got = _third_opinion(lambda: torch.jvp(f64, _f64(p.arrays),
                                               _f64s(p.as_given(tangents[0]))), case)
        if got is not None:
            torch_jvp = np.asarray(got.tangent, np.float64)[None]
    num = numerical
    if constant is not None:    # the output's constant cells: not compared, not counted
        keep = ~constant

        def judged(a):
            return None if a is None else a[:, keep]
        jvp, torch_jvp = judged(jvp), judged(torch_jvp)
        num = Derivative(judged(num.value), judged(num.error), judged(num.kink))
    first = Derivative(num.value[:1], num.error[:1], num.kink[:1])
    outcome = GradientOutcome(
        "jvp", compare(jvp, num.value, case.precision, num.error, num.kink),
        bool(np.all(np.isfinite(jvp))),
        None if torch_jvp is None else compare(jvp[:1], torch_jvp, case.precision, None,
                                               first.kink),
        None if torch_jvp is None else compare(first.value, torch_jvp, "f64", first.error,
                                               first.kink), "the JVP")
    # the adjoint identity, against the engine's own VJP of the same weights
    # (one run: the reverse-mode row checks the VJP's determinism)
    _, backprop = leaf_answer(adapter, case, *validated(
        adapter.vjp(case, p.copies(), p.weights), case, p.ref.output_shape))
    grads = []
    for i in p.checked:
        if backprop[i] is None:
            raise EngineResultError(f"the engine returned no gradient of "
                                    f"{case.inputs[i].name}")
        spec = case.inputs[i]
        grads.append(_on_read(spec, spec.to_leaf(np.asarray(backprop[i], np.float64))))
    problem, note, worst = adjoint_check(jvps, p.weights, tangents, grads, case.precision)
    zero = zero_gradient(case)
    if zero and problem is None and np.any(np.stack(jvps) != 0):
        problem = (f"zero by definition: the JVP has {int(np.count_nonzero(np.stack(jvps)))} "
                   f"elements that are not exactly 0 ({zero})")
    total = sum(x.size for x in xs)
    return p.finish(name, Outcomes(p.forward(out), (outcome,), torch_jvp is not None, None,
                                   differs, getattr(adapter, "backend", "cpu"),
                                   None, p.declined_note, None,
                                   (problem,) if problem else (),
                                   (note,) if note else (), dtype=case.precision,
                                   cotangent=getattr(case, "cotangent", "contiguous"),
                                   zero_by_definition=zero_gradient(case)),
                    min(1.0, TANGENTS / total), labels, adjoint=float(f"{worst:.3g}"))


def _on_read(spec, leaf_grad):
    """A leaf-layout gradient with zeros where the view does not read the leaf (a slice's
    border, which to_leaf fills with a marker)."""
    if not spec.is_view or not spec.slice:
        return leaf_grad
    read = spec.leaf_gradient(np.ones(spec.shape)) != 0
    return np.where(read, leaf_grad, 0.0)


# --- second order ---------------------------------------------------------------------------

def _beyond_dtype(case, numerical, full: bool):
    """(count, masks): per element of the numerical second derivatives (full mode only),
    whether its float64 value lies beyond the largest finite value of the case's dtype (a
    float16 engine answers inf there, rightly): such elements are left out of the
    comparisons, counted apart. masks: one per checked input, or None where there is none."""
    if not full or not is_float(as_dtype(case.dtype)):
        return 0, None
    biggest = float(np.finfo(as_dtype(case.dtype)).max)
    masks = [np.abs(d.value) - d.error > biggest for d in numerical]
    count = sum(int(np.count_nonzero(m)) for m in masks)
    return count, (masks if count else None)


def _kept(a, mask):
    """`a` without the elements `mask` flags (flattened), or `a` itself without a mask."""
    return a if mask is None or a is None else np.asarray(a)[~mask]


def hvp_verdict(case, adapter, mode: str, use_torch: bool, labels: dict) -> Result:
    """The order-2 row of `case` in `adapter` (see the module doc); `mode`: auto, full or
    fast. Raises as jvp_verdict does."""
    name = row_name(case, "order 2")
    p = _Prepared(case, adapter)
    if not p.checked:
        return p.unsupported_row(name, labels)
    direction = p.leaf_directions(23)
    given = p.as_given(direction)
    answers, refused, differs, out = {}, {}, False, None
    for method in tuple(adapter.hvp_methods):
        try:
            first = adapter.hvp(case, p.copies(), p.weights, given, method)
        except Unsupported as exc:      # the other methods are judged all the same
            refused[method] = str(exc)
            continue
        o, hv = leaf_answer(adapter, case, *validated(first, case, p.ref.output_shape))
        if out is None:
            second = adapter.hvp(case, p.copies(), p.weights, given, method)
            o2, hv2 = leaf_answer(adapter, case, *validated(second, case,
                                                            p.ref.output_shape))
            differs = not same_bits(o, o2) or not all(
                same_bits(a, b) for a, b in zip(hv, hv2, strict=True))
            out = o
        for i in p.checked:
            if hv[i] is None:
                raise EngineResultError(f"the engine returned no second derivative of "
                                        f"{case.inputs[i].name} ({method})")
        answers[method] = [np.asarray(hv[i], np.float64) for i in p.checked]
    if not answers:
        raise Unsupported("; ".join(refused.values()))
    methods = tuple(answers)
    xs = [p.ref.leaves[i] for i in p.checked]
    total = sum(x.size for x in xs)
    full = mode == "full" or (mode == "auto" and total <= HVP_FULL_BUDGET)
    torch = _torch_f64(case, use_torch)
    torch_hv = None
    if torch is not None:
        got = _third_opinion(lambda: torch.hvp(
            case.promoted("f64"), _f64(p.arrays), p.weights, _f64s(given), "rev-rev"), case)
        if got is not None:
            torch_hv = [np.asarray(got.grads[i], np.float64) for i in p.checked]
    with single_thread():
        magnitude = p.ref.magnitude()
        if full:
            numerical = hessian_vector(p.ref.loss, xs, direction, magnitude=magnitude)
            numerical = [Derivative(*(case.inputs[i].from_leaf(x) for x in
                                      (d.value, d.error, d.kink)))
                         for i, d in zip(p.checked, numerical, strict=True)]
        else:
            dirs = random_directions(case, [case.inputs[i].shape for i in p.checked],
                                     DIRECTIONS)
            leaf_dirs = [[case.inputs[i].leaf_gradient(v)
                          for i, v in zip(p.checked, d, strict=True)] for d in dirs]
            numerical = [hessian_vector(p.ref.loss, xs, direction, outer=leaf_dirs,
                                        magnitude=magnitude)]
    out_of_range, beyond = _beyond_dtype(case, numerical, full)
    precision = (f"{case.precision} order 2" if f"{case.precision} order 2" in TOLERANCES
                 else case.precision)
    outcomes = []
    for method in methods:
        got = answers[method]
        if full:
            names = [f"{case.inputs[i].name} ({method})" for i in p.checked]
            values, thirds = got, torch_hv
        else:
            names = [f"directions ({method})"]
            values = [project(got, dirs)]
            thirds = None if torch_hv is None else [project(torch_hv, dirs)]
        for k, (label, value, num) in enumerate(zip(names, values, numerical, strict=True)):
            third = None if thirds is None else thirds[k]
            mask = None if beyond is None else beyond[k]
            value, third = _kept(value, mask), _kept(third, mask)
            num = Derivative(*(_kept(x, mask) for x in (num.value, num.error, num.kink)))
            outcomes.append(GradientOutcome(
                label, compare(value, num.value, precision, num.error, num.kink),
                bool(np.all(np.isfinite(value))),
                None if third is None else compare(value, third, precision, None,
                                                   num.kink),
                None if third is None else compare(num.value, third, "f64", num.error,
                                                   num.kink),
                f"the second derivative of {label}"))
    zero = all(np.all(np.abs(d.value) <= d.error + 1e-12 * max(1.0, magnitude))
               for d in numerical)
    notes = ("the Hessian is zero here ((piecewise) linear in the checked inputs): a "
             "second derivative that is not zero fails, a dropped term cannot show",
             ) if zero else ()
    notes += tuple(f"{method} not checked: {why}" for method, why in refused.items())
    if out_of_range:
        notes += (f"{out_of_range} elements beyond {case.dtype}'s range in float64 (not "
                  "judged: the dtype cannot hold them)",)
    labels["mode"] = "full" if full else "fast"
    return p.finish(name, Outcomes(p.forward(out), tuple(outcomes), torch_hv is not None,
                                   None, differs, getattr(adapter, "backend", "cpu"), None,
                                   p.declined_note, None, (), notes),
                    1.0 if full else DIRECTIONS / total, labels,
                    methods=",".join(methods), hessian="zero" if zero else "nonzero")

