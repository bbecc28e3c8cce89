"""Propagation cases: inputs that hold NaNs and infinities (engine.samples, kind "special"),
checked on their forward pass.

An engine must give NaN where the float64 truth is NaN and the same infinity where it is
infinite: a kernel that compares its way past a NaN (`x > 0 ? x : 0` gives 0), or stores
a NaN without its quiet bit (an infinity), turns a diverging training run into one that
looks fine. The truth is torch's forward in float64 where the op has a torch equivalent
(an implementation independent of ours), else our float64 graph in the CPU backend's plain
mode. The row checks, against it:
- the classes: NaN where NaN, +inf where +inf, -inf where -inf, finite elsewhere (cell by
  cell, the first difference named);
- the finite cells, under the case's dtype's tolerance (gradcheck.numeric.compare);
- for a 16-bit case of an op that rounds once (gradcheck.precision.ONE_ROUNDING), correct
  rounding of every cell (precision.correctly_rounded).
The gradients are not checked, and the row says so: at a NaN the derivative is no number
to compare (backprop's 0 * NaN is NaN, a finite difference there 0).
"""

from __future__ import annotations

import numpy as np

from gradcheck import precision
from gradcheck.backprop import validated
from gradcheck.numeric import compare
from gradcheck.reference import plain_forward, torch_available, torch_reference
from reports import Result

NOTE = "propagation case (NaN and infinite inputs): the forward alone is checked"


def classes(a) -> np.ndarray:
    """Each cell's class: 0 finite, 1 NaN, 2 +inf, 3 -inf."""
    a = np.asarray(a, np.float64)
    return np.select([np.isnan(a), np.isposinf(a), np.isneginf(a)], [1, 2, 3], 0)


NAMES = ("finite", "NaN", "+inf", "-inf")


def check_special(case, adapter, labels: dict, use_torch: bool = True) -> Result:
    """The row of propagation case `case` in `adapter`'s engine (see the module doc).
    Raises for an engine error (check_sample makes it a row)."""
    name = str(case)
    arrays = case.generate_inputs()
    truth, truth_name = plain_forward(case, arrays), "plain f64"
    # the gradients are not looked at: zero weights keep backprop's arithmetic finite
    weights = np.zeros(truth.shape)
    if use_torch and case.torch_fn is not None and torch_available():
        truth = np.asarray(torch_reference(case, arrays, weights).output, np.float64)
        truth_name = "torch f64"
    out, _ = validated(adapter.vjp(case, arrays, weights), case, truth.shape)
    got, want = classes(out), classes(truth)
    problems = []
    if not np.array_equal(got, want):
        wrong = got != want
        i = tuple(int(k) for k in np.argwhere(wrong)[0])
        problems.append(f"propagation: {int(wrong.sum())}/{wrong.size} cells of another "
                        f"class than {truth_name}'s, first out{list(i)}: "
                        f"{NAMES[got[i]]} where {NAMES[want[i]]}")
    finite = (got == 0) & (want == 0)
    forward = compare(np.where(finite, np.asarray(out, np.float64), 0.0),
                      np.where(finite, truth, 0.0), case.precision)
    if not forward.ok:
        problems.append(f"forward: {forward.failures}/{int(finite.sum())} finite cells off "
                        f"vs {truth_name}, worst out{list(forward.worst_index or ())}: ref "
                        f"{forward.worst_expected:.6g}, got {forward.worst_value:.6g}")
    rounded = None
    if precision.rounds_once(case):
        rounded = precision.correctly_rounded("output", out, truth, case.precision)
        if rounded.problem:
            problems.append(rounded.problem)
    metrics = {"checked": int(got.size), "reference": truth_name,
               "special": ", ".join(f"{NAMES[c]} {int(np.sum(want == c))}"
                                    for c in (1, 2, 3)),
               "max_abs_err": forward.max_abs, "max_rel_err": forward.max_rel}
    if rounded is not None:
        metrics["rounded"] = f"{rounded.checked - rounded.wrong}/{rounded.checked} correct"
    message = "; ".join(problems + [NOTE]) if problems else NOTE
    return Result("gradcheck", name, "fail" if problems else "pass", metrics, message,
                  labels=labels | {"check": "propagation"})
