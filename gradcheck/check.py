"""Check one case: an engine's forward and backprop against float64 references.

The engine under test is an adapter (gradcheck.adapters): our engine on a backend by default,
or torch, ggml, a numpy forward/VJP pair, anyone's. It runs the case forward and returns the
vector-Jacobian product for a fixed random weighting of the output: the gradient of
loss = sum(output * weights) (never a plain sum: sum(softmax(x)) is constant and would
test nothing). Everything else is gradcheck's and the same for every engine:

- the numerical reference (gradcheck.reference): the case's own definition in float64, on
  the same (rounded) inputs, differentiated by finite differences with error estimates;
- the forward check: the engine's output against the reference's float64 output, so that a
  failing case says whether the forward or the backward is off;
- torch autograd on the op's torch equivalent in float64, a third opinion: three
  comparisons (backprop vs numerical, backprop vs torch, numerical vs torch) name the side
  that is off;
- determinism: the engine runs the case twice; the two must agree bit for bit;
- kinks, tolerances by dtype, modes, and, on a backend other than the CPU, `vs_cpu`.

Modes: `full` differentiates along every input element; `fast` along a few random
directions (random projections of the Jacobian); `auto` picks full when the case has at most
FULL_BUDGET checked elements. `checked_fraction` reports the share of the vector-Jacobian
product's entries checked one by one: 1 in full mode, directions / elements in fast mode.

On a backend other than the CPU (an adapter whose `backend` is not "cpu" and that offers
`on_cpu()`), a fourth comparison, the `vs_cpu` column, holds the forward output and
gradients against the same engine's on the CPU (cross-backend consistency). The numerical
reference always runs on the CPU.

An adapter with `isolated` set runs in a worker process (gradcheck.worker): when the worker
dies or hangs, the case is a `crash` row.

An adapter may decline the gradient of some inputs (its optional `declined(case)`, see
gradcheck.adapters.base): the other inputs are checked, the row's `declined` metric and
message name the declined ones; a case with nothing left to check is `unsupported`.
"""

from __future__ import annotations

import contextlib
import time

import numba
import numpy as np

import engine
from engine.registry import get_op
from gradcheck.adapters.base import AdapterError
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.numeric import compare, directional_derivatives, numerical_gradient
from gradcheck.reference import float64_reference, torch_gradients
from gradcheck.worker import IsolatedAdapter, RemoteError, WorkerCrash
from reports import Result

MODES = ("auto", "full", "fast")
FULL_BUDGET = 1500       # checked elements up to which `auto` differentiates every element
DIRECTIONS = 6           # random directions in fast mode
KINK_DOMINATED = 0.5     # a case whose kinks exceed this share is itself a failure


class EngineResultError(Exception):
    """An engine returned something that is not an answer for the case (wrong shape, a
    missing gradient): an error row."""


def loss_weights(shape, seed: int) -> np.ndarray:
    """Weights in +-[0.5, 1.5] with random signs: no element's gradient is ever zero."""
    rng = np.random.default_rng(seed)
    return rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


@contextlib.contextmanager
def single_thread():
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


def _directions(case, shapes, k):
    rng = np.random.default_rng(case.seed() + 1)
    out = []
    for _ in range(k):
        v = [rng.normal(size=s) for s in shapes]
        norm = np.sqrt(sum(float(np.sum(x * x)) for x in v)) or 1.0
        out.append([x / norm for x in v])
    return out


def _project(grads, directions):
    return np.array([sum(float(np.sum(g * v)) for g, v in zip(grads, d, strict=True))
                     for d in directions])


def _same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    return np.array_equal(a, b, equal_nan=a.dtype.kind == "f" == b.dtype.kind)


def _validated(vjp, case, output_shape):
    """(output, gradients) of an engine's VJP, checked against the case's shapes."""
    out = np.asarray(vjp.output)
    if out.shape != tuple(output_shape):
        raise EngineResultError(f"the engine's output has shape {list(out.shape)}, the "
                                f"case's output {list(output_shape)}")
    grads = list(vjp.grads)
    if len(grads) != len(case.inputs):
        raise EngineResultError(f"the engine returned {len(grads)} gradients for "
                                f"{len(case.inputs)} inputs")
    for i, (spec, g) in enumerate(zip(case.inputs, grads, strict=True)):
        if g is None:
            continue
        grads[i] = g = np.asarray(g)
        if g.shape != tuple(spec.shape):
            raise EngineResultError(f"the engine's gradient of {spec.name} has shape "
                                    f"{list(g.shape)}, the input {list(spec.shape)}")
    return out, grads


def engine_vjp(adapter, case, arrays, weights, output_shape):
    """(output, gradients, differs): the adapter's VJP, run twice; `differs` when the two
    runs (or the adapter's own repeat) gave different bits."""
    first = adapter.vjp(case, [a.copy() for a in arrays], weights)
    second = adapter.vjp(case, [a.copy() for a in arrays], weights)
    out, grads = _validated(first, case, output_shape)
    out2, grads2 = _validated(second, case, output_shape)
    differs = bool(first.differs or second.differs) or not _same_bits(out, out2) or \
        not all(_same_bits(a, b) for a, b in zip(grads, grads2, strict=True))
    return out, grads, differs


def _versus_cpu(case, arrays, weights, twin, out, analytic, backend, problems) -> str:
    """Cross-backend consistency: `backend`'s forward output and gradients against the same
    engine's on the CPU (`twin`), in the case's tolerance; appends to `problems`."""
    cpu_out, cpu_grads, _ = engine_vjp(twin, case, arrays, weights, out.shape)
    pairs = [("forward", out, cpu_out)] + [
        (f"grad {spec.name}", g, c) for spec, g, c in zip(case.inputs, analytic, cpu_grads,
                                                          strict=True) if g is not None]
    off = []
    for what, got, want in pairs:
        if np.asarray(got).dtype.kind != "f":
            if not np.array_equal(got, want):
                off.append(what)
            continue
        cmp = compare(np.asarray(got), np.asarray(want), case.precision)
        if not cmp.ok or cmp.nonfinite:
            off.append(f"{what} ({cmp.failures}/{cmp.checked}, max abs err {cmp.max_abs:.3g})")
    if off:
        problems.append(f"backend: {backend} differs from cpu: {', '.join(off)}")
        return "off"
    return "agree"


def _error_message(exc: Exception) -> str:
    if isinstance(exc, RemoteError):
        return f"error: {exc}"
    known = (engine.EngineError, AdapterError, EngineResultError)
    kind = "" if isinstance(exc, known) else "unexpected "
    return f"error: {kind}{type(exc).__name__}: {exc}"


def op_labels(op: str, engine: str) -> dict:
    """The labels every row of an op carries: op, and engine when it is not ours."""
    return {"op": op} | ({"engine": engine} if engine != EngineAdapter.name else {})


def case_labels(case, adapter, mode: str) -> dict:
    """What a case's row says was checked: op, engine (when not ours), backend, dtype, mode."""
    return op_labels(case.op, adapter.name) | {
        "backend": getattr(adapter, "backend", "cpu"), "dtype": case.dtype, "mode": mode}


def check_sample(case, inject: str | None = None, mode: str = "auto",
                 backend: str = "cpu", use_torch: bool = True, adapter=None) -> Result:
    """Judge the forward and backward pass of one case (a registry Sample, or any object
    with its interface, see gradcheck.api) in `adapter`'s engine; default: our engine on
    `backend`, with the mutation `inject` in place (both apply to our engine only: with an
    adapter given they must stay at their defaults, else ValueError). Never raises for a
    failing case: errors, crashes and unsupported cases are results. use_torch False leaves
    torch out (no import: start-up is faster by its import time)."""
    if adapter is None:
        adapter = EngineAdapter(backend, inject)
    elif inject or backend != "cpu":
        raise ValueError("inject and backend apply to our engine only; pass "
                         f"EngineAdapter(backend, inject) instead of engine {adapter.name!r}")
    t0 = time.perf_counter()
    name = str(case)
    labels = case_labels(case, adapter, mode)
    op = get_op(case.op) if getattr(case, "registered", True) else None
    if op is not None and not op.differentiable:
        return Result("gradcheck", name, "skip", message=f"no gradient: {op.no_grad}",
                      labels=labels)
    try:
        reason = adapter.unsupported(case)
        if reason:
            verdict = Result("gradcheck", name, "unsupported", message=reason, labels=labels)
        elif adapter.isolated and not isinstance(adapter, IsolatedAdapter):
            with IsolatedAdapter(adapter) as isolated:
                verdict = _judge(case, isolated, mode, labels, use_torch)
        else:
            verdict = _judge(case, adapter, mode, labels, use_torch)
    except WorkerCrash as exc:
        verdict = Result("gradcheck", name, "crash", message=f"crash: {exc}", labels=labels)
    except Exception as exc:  # a crashing kernel is this case's verdict, not the sweep's end
        verdict = Result("gradcheck", name, "error", labels=labels, message=_error_message(exc))
    verdict.metrics["seconds"] = round(time.perf_counter() - t0, 3)
    return verdict


def _forward_check(case, out, reference_out, problems) -> str:
    if out.dtype.kind != "f":
        same = np.array_equal(out, reference_out)
        if not same:
            problems.append("forward: output differs from the float64 reference")
        return "agree" if same else "off"
    fwd = compare(out, reference_out, case.precision)
    if fwd.ok:
        return "agree"
    what = "has NaN/Inf" if fwd.nonfinite else "differs from the float64 reference"
    problems.append(f"forward: output {what} ({fwd.failures}/{fwd.checked} elements, max abs "
                    f"err {fwd.max_abs:.3g}, worst {list(fwd.worst_index or ())}: reference "
                    f"{fwd.worst_reference:.6g}, engine {fwd.worst_value:.6g})")
    return "off"


def declined_inputs(adapter, case, checked) -> dict[int, str]:
    """Of the checked inputs (indices), those whose gradient `adapter` declines (its
    optional `declined(case)`, see gradcheck.adapters.base), with the reason. Raises
    EngineResultError when it names something that is not an input of the case."""
    declined = getattr(adapter, "declined", None)
    reasons = (declined(case) if declined is not None else None) or {}
    names = [spec.name for spec in case.inputs]
    unknown = [repr(n) for n in reasons if n not in names]
    if unknown:
        raise EngineResultError(f"the engine declined the gradient of {', '.join(unknown)}, "
                                f"not an input of the case (inputs: {', '.join(names)})")
    return {i: str(reasons[names[i]]) for i in checked if names[i] in reasons}


def _judge(case, adapter, mode, labels, use_torch=True) -> Result:
    arrays = case.generate_inputs()
    ref = float64_reference(case, arrays)
    leaves = ref.leaves
    checked_inputs = [i for i, leaf in enumerate(leaves) if leaf is not None]
    declined = declined_inputs(adapter, case, checked_inputs)
    declined_note = "; ".join(f"{case.inputs[i].name}: {why}" for i, why in declined.items())
    idx = [i for i in checked_inputs if i not in declined]
    if not idx:
        return Result("gradcheck", str(case), "unsupported", {"declined": declined_note},
                      f"the engine declines the gradient of every checked input: "
                      f"{declined_note}", labels=labels)
    weights = loss_weights(ref.output_shape, case.seed())
    ref.set_weights(weights)
    out, analytic, differs = engine_vjp(adapter, case, arrays, weights, ref.output_shape)
    analytic = [None if i in declined else g for i, g in enumerate(analytic)]
    for i in idx:
        if analytic[i] is None:
            raise EngineResultError(f"the engine returned no gradient of "
                                    f"{case.inputs[i].name}")
    total = sum(leaves[i].size for i in idx)
    if mode == "auto":
        mode = "full" if total <= FULL_BUDGET else "fast"
    labels["mode"] = mode
    problems: list[str] = []
    forward_state = _forward_check(case, out, ref.output(), problems)
    tref = torch_gradients(case, arrays, weights) if use_torch else None

    a_list = [analytic[i] for i in idx]
    t_list = None if tref is None else [tref.grads[i] for i in idx]
    # thousands of evaluations of a tiny graph: parallel launches would cost more than the
    # work (the engine above runs on every thread, races included)
    with single_thread():
        if mode == "full":
            nums = [numerical_gradient(ref.loss, leaves[i]) for i in idx]
        else:
            dirs = _directions(case, [case.inputs[i].shape for i in idx], DIRECTIONS)
            leaf_dirs = [[case.inputs[i].to_leaf(v) for i, v in zip(idx, d, strict=True)]
                         for d in dirs]
            nums = [directional_derivatives(ref.loss, [leaves[i] for i in idx], leaf_dirs)]
    if mode == "full":
        nums = [type(d)(*(case.inputs[i].from_leaf(x) for x in (d.value, d.error, d.kink)))
                for i, d in zip(idx, nums, strict=True)]
        names = [case.inputs[i].name for i in idx]
        fraction = 1.0
    else:
        a_list = [_project(a_list, dirs)]
        t_list = None if t_list is None else [_project(t_list, dirs)]
        names = ["directions"]
        fraction = DIRECTIONS / total

    checked, kinks = 0, 0
    max_abs = max_rel = 0.0
    worst = ""
    torch_state = "n/a" if tref is None else "agree"
    for k, (nm, a, d) in enumerate(zip(names, a_list, nums, strict=True)):
        bn = compare(a, d.value, case.precision, d.error, d.kink)
        checked += bn.checked
        kinks += bn.kinks
        if bn.max_abs >= max_abs:
            max_abs, max_rel = bn.max_abs, max(max_rel, bn.max_rel)
            worst = (f"{nm}{list(bn.worst_index or ())}: num {bn.worst_reference:.6g}, "
                     f"bp {bn.worst_value:.6g}")
        max_rel = max(max_rel, bn.max_rel)
        if bn.nonfinite or not np.all(np.isfinite(a)):
            problems.append(f"NaN/Inf: {nm} has {bn.nonfinite} non-finite values")
            continue
        if t_list is None:
            if not bn.ok:
                problems.append(f"numerical: {nm} {bn.failures}/{bn.checked} off vs "
                                f"numerical, worst {worst}")
            continue
        bt = compare(a, t_list[k], case.precision, None, d.kink)
        nt = compare(d.value, t_list[k], "f64", d.error, d.kink)
        if bn.ok and bt.ok and nt.ok:
            continue
        torch_state = "off"
        if not bn.ok and not bt.ok and nt.ok:
            problems.append(f"numerical: backprop of {nm} is off ({bn.failures}/{bn.checked} "
                            f"elements), numerical and torch agree, worst {worst}")
        elif not bn.ok and bt.ok:
            problems.append(f"numerical: {nm}: numerical gradient disagrees with backprop and "
                            "torch (the float64 reference's forward does not match the "
                            "backward of the engine and torch)")
        elif bn.ok and not nt.ok:
            problems.append(f"torch: {nm}: torch disagrees with backprop and numerical "
                            f"({nt.failures}/{nt.checked} elements; forward differs from "
                            "torch's, or the torch reference is wrong)")
        else:
            problems.append(f"numerical: {nm}: backprop, numerical and torch all disagree")
    if tref is not None and out.dtype.kind == "f":
        fwd = compare(out, tref.output, case.precision)
        if not fwd.ok:
            problems.append(f"torch: forward output differs from torch's ({fwd.failures}/"
                            f"{fwd.checked} elements, max abs err {fwd.max_abs:.3g})")
            torch_state = "off"
    total_judged = checked + kinks
    if total_judged and kinks > KINK_DOMINATED * total_judged:
        problems.append(f"kinks: {kinks} of {total_judged} checked points are kinks "
                        "(non-differentiable); the sample generator needs fixing")
    if differs:
        problems.append("determinism: two backward runs gave different bits")
    metrics = {"checked": checked, "checked_fraction": fraction, "kinks": kinks,
               "max_abs_err": max_abs, "max_rel_err": max_rel, "worst": worst,
               "forward": forward_state, "torch": torch_state}
    backend = getattr(adapter, "backend", "cpu")
    if backend != "cpu" and hasattr(adapter, "on_cpu"):
        metrics["vs_cpu"] = _versus_cpu(case, arrays, weights, adapter.on_cpu(), out,
                                        analytic, backend, problems)
    status = "fail" if problems else "pass"
    if declined:
        metrics["declined"] = declined_note
        problems.append(f"declined (not checked): {declined_note}")
    return Result("gradcheck", str(case), status, metrics, "; ".join(problems), labels=labels)
