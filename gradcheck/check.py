"""Check one case: an engine's forward and backprop against the float64 and torch references.

The engine under test is an adapter (gradcheck.adapters): our engine on a backend by default,
or torch, ggml, a numpy forward/VJP pair, anyone's. It runs the case forward and returns the
vector-Jacobian product for a fixed random weighting of the output (gradcheck.backprop).
Everything else is gradcheck's and the same for every engine:

- the float64 reference (gradcheck.reference): the case's own definition in float64, on
  the same (rounded) inputs. Its output is what the engine's forward is checked against,
  so that a failing case says whether the forward or the backward is off; its loss is
  what finite differences differentiate into the numerical gradients (gradcheck.numeric),
  with error estimates and kinks;
- the torch reference: torch autograd on the op's torch equivalent in float64, a third
  opinion: three comparisons (backprop vs numerical, backprop vs torch, numerical vs torch)
  name the side that is off;
- determinism: the engine runs the case twice; the two must agree bit for bit;
- constant outputs: cells where the float64 reference's output is infinite by definition
  (diag_mask_inf's -inf) get loss weight 0, must hold the same infinity in every engine
  and under every perturbation, and are counted in the `constant` metric, never as passes
  (gradcheck.reference.constant_cells); any other NaN or Inf is a failure;
- tolerances by dtype, modes (gradcheck.modes: full, fast, auto) and, on a backend other
  than the CPU, `vs_cpu` (gradcheck.cross_backend).

This module runs those and makes the comparisons; the verdict on them is the pure function
gradcheck.verdict.judge.

An adapter with `isolated` set runs in a worker process (checkkit.isolated): when the
worker dies or hangs, the case is a `crash` row.

A dedicated backward op, which has no gradient of its own, is checked against the VJP of
its forward op instead (gradcheck.backward_ops, where its OpDef declares `vjp_of`; a `skip`
row where it does not); one with a backward rule gets that check too, in the same row.

An adapter may decline the gradient of some inputs (its optional `declined(case)`, see
gradcheck.adapters.base): the other inputs are checked, the row's `declined` metric and
message name the declined ones; a case with nothing left to check is `unsupported`.
"""

from __future__ import annotations

import time

import numpy as np

import engine
from checkkit.isolated import IsolatedAdapter
from checkkit.loading import AdapterError
from checkkit.raised import SignalWatch, raised_message
from checkkit.worker import RemoteError, WorkerCrash
from engine.registry import get_op
from engine.tensor import is_float
from gradcheck import precision
from gradcheck.adapters.base import Unsupported
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.backprop import (
    EngineResultError,
    declined_inputs,
    engine_vjp,
    loss_weights,
    nonzero_problems,
    zero_gradient,
)
from gradcheck.backward_ops import check_backward_op, is_backward_op_case, with_vjp_check
from gradcheck.cross_backend import compares_with_cpu, versus_cpu
from gradcheck.derivatives import AD_MODES, ORDERS, hvp_verdict, jvp_verdict, row_name
from gradcheck.modes import choose_mode, compared_gradients
from gradcheck.numeric import compare
from gradcheck.reference import (
    float64_reference,
    forward_comparison,
    settled,
    torch_reference,
)
from gradcheck.scale import check_scale_sample
from gradcheck.special_values import check_special
from gradcheck.verdict import Outcomes, judge
from reports import Result


def _error_message(exc: BaseException) -> str:
    if isinstance(exc, RemoteError):
        return f"error: {exc}"
    if not isinstance(exc, Exception):      # SystemExit, GeneratorExit, ... (adapter code)
        return f"error: {raised_message(exc)}"
    known = (engine.EngineError, AdapterError, EngineResultError)
    kind = "" if isinstance(exc, known) else "unexpected "
    return f"error: {kind}{type(exc).__name__}: {exc}"


def op_labels(op: str, engine: str) -> dict:
    """The labels every row of an op carries: op, and engine when it is not ours."""
    return {"op": op} | ({"engine": engine} if engine != EngineAdapter.name else {})


def case_labels(case, adapter, mode: str) -> dict:
    """What a case's row says was checked: op, engine (when not ours), backend, dtype, mode,
    tier (engine.samples.Sample.tier). An adapter's `backend` that cannot be read is
    "cpu" here (the check itself reads it again, and makes that an error row)."""
    return op_labels(case.op, adapter.name) | {
        "backend": _backend_label(adapter), "dtype": case.dtype, "mode": mode,
        "tier": getattr(case, "tier", "fast")}


def _backend_label(adapter) -> str:
    with SignalWatch() as watch:
        try:
            return str(getattr(adapter, "backend", "cpu"))
        except BaseException as exc:
            watch.reraise(exc)
            return "cpu"


def _adapter_for(adapter, inject, backend):
    if adapter is None:
        return EngineAdapter(backend, inject)
    if inject or backend != "cpu":
        raise ValueError("inject and backend apply to our engine only; pass "
                         f"EngineAdapter(backend, inject) instead of engine {adapter.name!r}")
    return adapter


def check_sample(case, inject: str | None = None, mode: str = "auto",
                 backend: str = "cpu", use_torch: bool = True, adapter=None) -> Result:
    """Judge the forward and backward pass of one case (a registry Sample, or any object
    with its interface, see gradcheck.api) in `adapter`'s engine; default: our engine on
    `backend`, with the mutation `inject` in place (both apply to our engine only: with an
    adapter given they must stay at their defaults, else ValueError). Never raises for a
    failing case: errors, crashes and unsupported cases are results; whatever the adapter
    raises (SystemExit, KeyboardInterrupt and BaseExceptions of its own included) is an
    error row, and only the user's Ctrl-C (checkkit.raised) goes on up.
    use_torch False leaves the torch reference out (no import: start-up is faster by its
    import time)."""
    adapter = _adapter_for(adapter, inject, backend)
    labels = case_labels(case, adapter, mode)
    return _guarded(case, str(case), adapter, labels,
                    lambda a: _compare_and_judge(case, a, mode, labels, use_torch))


def check_derivative(case, kind: str, inject: str | None = None, mode: str = "auto",
                     backend: str = "cpu", use_torch: bool = True, adapter=None) -> Result:
    """The forward-mode ("fwd") or second-order ("order 2") row of one case
    (gradcheck.derivatives), with check_sample's arguments and guarantees. `unsupported`
    where the engine has no such mode (no `jvp` or `hvp`) or refuses the case; `skip` for
    an op without a gradient, and for the scale tier (too big for the numerics)."""
    adapter = _adapter_for(adapter, inject, backend)
    labels = case_labels(case, adapter, mode) | (
        {"ad": "fwd"} if kind == "fwd" else {"order": "2"})
    name = row_name(case, kind)
    op = get_op(case.op) if getattr(case, "registered", True) else None
    if op is not None and not op.differentiable:
        return Result("gradcheck", name, "skip", message=f"no gradient: {op.no_grad}",
                      labels=labels)
    if getattr(case, "tier", "fast") == "scale":
        return Result("gradcheck", name, "skip", message="forward mode and second order "
                      "are checked on the fast tier's cases (a scale case is too big for "
                      "their numerics)", labels=labels)
    if getattr(case, "special", False):
        return Result("gradcheck", name, "skip", message="a propagation case (NaN and "
                      "infinite inputs) has no derivative to compare: its forward is "
                      "checked in its reverse-mode row", labels=labels)
    method = "jvp" if kind == "fwd" else "hvp"
    if not callable(getattr(adapter, method, None)):
        what = "forward mode (jvp)" if kind == "fwd" else "second order (hvp)"
        return Result("gradcheck", name, "unsupported", labels=labels,
                      message=f"engine {adapter.name} offers no {what} to gradcheck")
    if kind == "fwd":
        def body(a):
            return jvp_verdict(case, a, use_torch, labels)
    else:
        def body(a):
            return hvp_verdict(case, a, mode, use_torch, labels)
    return _guarded(case, name, adapter, labels, body)


def check_case(case, ad: str = "rev", order: int = 1, **check) -> list[Result]:
    """The rows of one case: its reverse-mode row (check_sample) unless `ad` is "fwd", its
    forward-mode row when `ad` is "fwd" or "both", its second-order row when `order` is 2
    (check_derivative); `check`: check_sample's keyword arguments."""
    if ad not in AD_MODES or order not in ORDERS:
        raise ValueError(f"ad must be one of {', '.join(AD_MODES)} and order one of "
                         f"{', '.join(map(str, ORDERS))}; got {ad!r}, {order!r}")
    rows = [check_sample(case, **check)] if ad != "fwd" else []
    if ad != "rev":
        rows.append(check_derivative(case, "fwd", **check))
    if order == 2:
        rows.append(check_derivative(case, "order 2", **check))
    return rows


def _guarded(case, name, adapter, labels, body) -> Result:
    """`body(adapter)`'s row, run as check_sample promises: unsupported where the adapter
    says so, in a worker for an isolated adapter, a crash row for a dead worker, an error
    row for whatever else is raised (the user's Ctrl-C goes on up); its seconds timed."""
    t0 = time.perf_counter()
    op = get_op(case.op) if getattr(case, "registered", True) else None
    if name == str(case) and op is not None and not op.differentiable:
        if op.vjp_of is None:         # else checked against its forward op's VJP
            return Result("gradcheck", name, "skip", message=f"no gradient: {op.no_grad}",
                          labels=labels)
    with SignalWatch() as watch:
        try:
            reason = adapter.unsupported(case)
            if reason:
                verdict = Result("gradcheck", name, "unsupported", message=str(reason),
                                 labels=labels)
            elif adapter.isolated and not isinstance(adapter, IsolatedAdapter):
                with IsolatedAdapter(adapter) as isolated:
                    verdict = body(isolated)
            else:
                verdict = body(adapter)
        except Unsupported as exc:
            verdict = Result("gradcheck", name, "unsupported", message=str(exc),
                             labels=labels)
        except WorkerCrash as exc:
            verdict = Result("gradcheck", name, "crash", message=f"crash: {exc}",
                             labels=labels)
        except BaseException as exc:  # a crashing kernel is this case's verdict, not the end
            watch.reraise(exc)        # the user's Ctrl-C is
            verdict = Result("gradcheck", name, "error", labels=labels,
                             message=_error_message(exc))
    verdict.metrics["seconds"] = round(time.perf_counter() - t0, 3)
    return verdict


def _compare_and_judge(case, adapter, mode, labels, use_torch=True) -> Result:
    """Run the case in `adapter`, the float64 and torch references, compare, and judge; a
    scale case as gradcheck.scale judges it, a backward op's as gradcheck.backward_ops
    does."""
    if getattr(case, "tier", "fast") == "scale":
        return check_scale_sample(case, adapter, labels, use_torch)
    if getattr(case, "special", False):
        return check_special(case, adapter, labels, use_torch)
    if is_backward_op_case(case, differentiable=False):
        return check_backward_op(case, adapter, mode, use_torch, labels)
    arrays = case.generate_inputs()
    f64_ref = float64_reference(case, arrays)
    leaves = f64_ref.leaves
    differentiable = [i for i, leaf in enumerate(leaves) if leaf is not None]
    declined = declined_inputs(adapter, case, differentiable)
    declined_note = "; ".join(f"{case.inputs[i].name}: {why}" for i, why in declined.items())
    checked = [i for i in differentiable if i not in declined]
    if not checked:
        return Result("gradcheck", str(case), "unsupported", {"declined": declined_note},
                      f"the engine declines the gradient of every checked input: "
                      f"{declined_note}", labels=labels)
    weights = loss_weights(f64_ref.output_shape, case.seed(),
                           getattr(case, "cotangent", "contiguous"), case.precision)
    weights, f64_out, constant = f64_ref.weigh(weights)   # infinities: constant cells
    out, backprop, differs = engine_vjp(adapter, case, arrays, weights, f64_ref.output_shape)
    backprop = [None if i in declined else g for i, g in enumerate(backprop)]
    for i in checked:
        if backprop[i] is None:
            raise EngineResultError(f"the engine returned no gradient of "
                                    f"{case.inputs[i].name}")
    mode = choose_mode(mode, sum(leaves[i].size for i in checked))
    labels["mode"] = mode
    out_dtype, dtypes = precision.judged_dtypes(case, out)
    forward = forward_comparison(out, f64_out, constant, out_dtype)
    torch_ref = torch_reference(case, arrays, weights) if use_torch else None
    compared = compared_gradients(
        case, f64_ref, checked, mode, [backprop[i] for i in checked],
        None if torch_ref is None else [torch_ref.grads[i] for i in checked])
    forward_vs_torch = None
    if torch_ref is not None and is_float(out.dtype):
        forward_vs_torch = compare(settled(out, f64_out, constant),
                                   settled(torch_ref.output, f64_out, constant), out_dtype)
    backend = getattr(adapter, "backend", "cpu")
    vs_cpu = (versus_cpu(case, arrays, weights, adapter, out, backprop,
                         lambda a: settled(a, f64_out, constant))
              if compares_with_cpu(adapter) else None)
    kinks = ({i: d.kink for i, d in zip(checked, compared.numerical, strict=True)}
             if mode == "full" else None)       # the numerical check's kinks, per input
    held = precision.check_case(case, arrays, weights, out, backprop, checked,
                                f64_out,
                                None if torch_ref is None else torch_ref.grads, use_torch,
                                kinks)
    zero = zero_gradient(case)
    outcomes = compared.outcomes(case.precision, dtypes)
    v = judge(Outcomes(forward, outcomes,
                       torch_ref is not None, forward_vs_torch, differs, backend, vs_cpu,
                       declined_note, held,
                       others=nonzero_problems(zero, case, checked, backprop),
                       dtype=case.precision,
                       powers=compared.powers(case.precision, dtypes, outcomes),
                       cotangent=getattr(case, "cotangent", "contiguous"),
                       zero_by_definition=zero))
    metrics = v.metrics(compared.fraction)
    if declined:
        metrics["declined"] = declined_note
    if constant is not None:       # constants of the op: weight 0, neither pass nor fail
        metrics["constant"] = int(np.count_nonzero(constant))
    row = Result("gradcheck", str(case), v.status, metrics, v.message, labels=labels)
    return with_vjp_check(row, case, adapter, mode, use_torch)    # a backward op's, if any
