"""Forward-only checks: an engine's op that computes a case's output but has no backward
(ggml's flash attention), checked on its forward pass alone, in rows that say so.

An adapter lists such variants through its optional `forward_only_checks(case) -> dict`:
variant name -> None when the variant can run the case, else why not (the row is then
`unsupported`); an empty dict (or no method) means none. `forward_only_output(variant,
case, arrays) -> (output, inputs)` runs the variant forward and returns its output, in the
case's shape, and the input values it computed on (the case's, or as the engine had to
round them: ggml's flash attention takes its mask in F16). An isolated adapter runs it in
its worker (checkkit.isolated), where an abort is a `crash` row.

The row, named `<case> [<variant>: forward only]`, is judged as a case's forward is
(gradcheck.check): the output against the float64 reference's on the same inputs, under the
case's dtype's tolerance, constant cells (infinities of the definition) held; NaN or Inf
anywhere else fails. Its labels say `check: forward only` and the variant; no gradient is
checked, and its message says so. Whatever either method raises (SystemExit and other
BaseExceptions included; only the user's Ctrl-C goes on up, checkkit.raised) is
an error row: the variant's, or `<case> [forward_only_checks: forward only]` for the list.
"""

from __future__ import annotations

import time

from checkkit.raised import SignalWatch, described, raised_message
from checkkit.worker import RemoteError, WorkerCrash
from gradcheck.backprop import loss_weights
from gradcheck.numeric import compare
from gradcheck.reference import float64_reference, settled
from gradcheck.verdict import forward_problem
from reports import Result

FORWARD_ONLY = "forward only"
LISTING = "forward_only_checks"     # the variant named by the row of a listing that raised


def forward_only_variants(adapter, case) -> dict[str, str | None]:
    """The adapter's forward-only variants of `case` (see the module doc)."""
    method = getattr(adapter, "forward_only_checks", None)
    return dict(method(case)) if method is not None else {}


def forward_only_rows(case, adapter, labels: dict) -> list[Result]:
    """The rows of `adapter`'s forward-only variants of `case` (check_forward_only), in
    its order; when listing them raises (anything but the user's Ctrl-C), one error row
    for the listing, named for the variant `forward_only_checks`."""
    with SignalWatch() as watch:
        try:
            variants = {str(v): None if why is None else str(why)
                        for v, why in forward_only_variants(adapter, case).items()}
        except BaseException as exc:
            watch.reraise(exc)
            row_labels = dict(labels) | {"check": FORWARD_ONLY, "variant": LISTING}
            return [Result("gradcheck", row_name(case, LISTING), "error",
                           message=f"error: {LISTING}() raised {described(exc)}",
                           labels=row_labels)]
    return [check_forward_only(case, adapter, variant, why, labels)
            for variant, why in variants.items()]


def row_name(case, variant: str) -> str:
    return f"{case} [{variant}: {FORWARD_ONLY}]"


def check_forward_only(case, adapter, variant: str, why_not: str | None,
                       labels: dict) -> Result:
    """One forward-only row: `variant` of `adapter` on `case` against the float64
    reference's output (`labels`: the case's row labels, to which the check's are added)."""
    t0 = time.perf_counter()
    name = row_name(case, variant)
    labels = dict(labels) | {"check": FORWARD_ONLY, "variant": variant}
    if why_not:
        row = Result("gradcheck", name, "unsupported", message=str(why_not), labels=labels)
    else:
        with SignalWatch() as watch:
            try:
                row = _judged(case, adapter, variant, name, labels)
            except WorkerCrash as exc:
                row = Result("gradcheck", name, "crash", message=f"crash: {exc}",
                             labels=labels)
            except BaseException as exc:   # this variant's row, not the sweep's end
                watch.reraise(exc)         # but the user's Ctrl-C
                if isinstance(exc, RemoteError):
                    message = f"error: {exc}"
                elif isinstance(exc, Exception):
                    message = f"error: {type(exc).__name__}: {exc}"
                else:
                    message = f"error: {raised_message(exc)}"
                row = Result("gradcheck", name, "error", message=message, labels=labels)
    row.metrics["seconds"] = round(time.perf_counter() - t0, 3)
    return row


def _judged(case, adapter, variant, name, labels) -> Result:
    out, seen = adapter.forward_only_output(variant, case, case.generate_inputs())
    ref = float64_reference(case, seen)
    _, f64_out, constant = ref.weigh(loss_weights(ref.output_shape, case.seed(),
                                                  precision=case.precision))
    forward = compare(settled(out, f64_out, constant), settled(f64_out, f64_out, constant),
                      case.precision)
    problem = forward_problem(forward)
    note = f"{FORWARD_ONLY}: the gradients are not checked"
    metrics = {"checked": forward.checked, "max_abs_err": forward.max_abs,
               "max_rel_err": forward.max_rel, "forward": "off" if problem else "agree"}
    if constant is not None:
        metrics["constant"] = int(constant.sum())
    return Result("gradcheck", name, "fail" if problem else "pass", metrics,
                  f"{problem}; {note}" if problem else note, labels=labels)
