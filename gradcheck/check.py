"""Check one case: backprop against float64 numerical gradients and torch autograd.

The op's output is reduced to a scalar by a fixed random weighting (never a plain sum:
sum(softmax(x)) is constant and would test nothing). Backprop runs in the case's dtype, twice
(the two must agree bit for bit). The numerical reference differentiates the same graph with
every float dtype promoted to float64, on the same (rounded) inputs. torch autograd runs the
op's torch equivalent in float64. Three comparisons: backprop vs numerical, backprop vs
torch, numerical vs torch; a disagreement names the side that is off.

Modes: `full` differentiates along every input element; `fast` along a few random
directions (random projections of the Jacobian); `auto` picks full when the case has at most
FULL_BUDGET checked elements. `checked_fraction` reports the share of the vector-Jacobian
product's entries checked one by one: 1 in full mode, directions / elements in fast mode.

On a backend other than the CPU, backprop runs on that backend and a fourth comparison,
the `vs_cpu` column, holds its forward output and gradients against the CPU backend's on the
same inputs (cross-backend consistency). The numerical reference then runs on the CPU: it
takes thousands of evaluations, which the CUDA simulator cannot afford, and the function it
differentiates is the one the forward comparison has just shown to be the same.
"""

from __future__ import annotations

import contextlib
import time

import numba
import numpy as np

import engine
from engine import ops
from engine.registry import get_op
from engine.tensor import as_dtype
from gradcheck.mutations import injected
from gradcheck.numeric import compare, directional_derivatives, numerical_gradient
from gradcheck.reference import torch_gradients
from reports import Result

MODES = ("auto", "full", "fast")
FULL_BUDGET = 1500       # checked elements up to which `auto` differentiates every element
DIRECTIONS = 6           # random directions in fast mode
KINK_DOMINATED = 0.5     # a case whose kinks exceed this share is itself a failure


def loss_weights(shape, seed: int) -> np.ndarray:
    """Weights in +-[0.5, 1.5] with random signs: no element's gradient is ever zero."""
    rng = np.random.default_rng(seed)
    return rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


def _weighted_case(case, arrays, as_params: bool):
    """Leaves (params where checked, else inputs), the op's output and the scalar loss."""
    leaves = []
    for spec, a in zip(case.inputs, case.leaf_arrays(arrays), strict=True):
        if a.dtype.kind == "f":
            a = a.astype(as_dtype(spec.dtype or case.dtype))
        checked = spec.grad and a.dtype.kind == "f"
        t = (engine.param if as_params and checked else engine.input_tensor)(
            a.shape, a.dtype, name=spec.name)
        t.set(a)
        leaves.append(t)
    out = case.build(*leaves)
    if out.dtype.kind != "f":
        return leaves, out, None
    out.set_output()
    w = engine.input_tensor(out.shape, out.dtype, name="loss_weights")
    w.set(loss_weights(out.shape, case.seed()).astype(out.dtype))
    loss = ops.sum(ops.mul(out, w)).set_loss()
    return leaves, out, loss


def analytic_gradients(case, arrays, inject=None, backend="cpu"):
    """(output, gradients per input in the op's layout (None if unchecked), bits differ?)
    from backprop in the case's dtype, run twice."""
    leaves, out, loss = _weighted_case(case, arrays, as_params=True)
    case_ops = {t.op for t in engine.Graph([out]).nodes if not t.is_leaf}
    graph = engine.Graph([loss], name=str(case))

    def run():
        graph.compute(backend)
        return [grads[t].numpy() if t in grads else
                (np.zeros(t.shape, t.dtype) if t.is_param else None) for t in leaves]
    # a mutation may patch backward rules (used while building) or kernels (taken when
    # the plan is made): both happen inside the block
    with injected(inject, case_ops):
        grads = graph.build_backward(loss)
        first, second = run(), run()
    differs = any(a is not None and not np.array_equal(a, b, equal_nan=True)
                  for a, b in zip(first, second, strict=True))
    views = [None if g is None else spec.from_leaf(g)
             for spec, g in zip(case.inputs, first, strict=True)]
    return out.numpy(), views, differs


def _numeric_graph(case, arrays, backend):
    leaves, out, loss = _weighted_case(case.promoted("f64"), arrays, as_params=False)
    graph = engine.Graph([loss], name=f"{case}.numeric")

    def f() -> float:
        graph.compute(backend)
        return float(loss.buffer().reshape(-1)[0])
    checked = [t if spec.grad and t.dtype.kind == "f" else None
               for spec, t in zip(case.inputs, leaves, strict=True)]
    return f, checked


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


def _versus_cpu(case, arrays, inject, out, analytic, backend, problems) -> str:
    """Cross-backend consistency: `backend`'s forward output and gradients against the CPU
    backend's on the same inputs, in the case's tolerance; appends to `problems`."""
    cpu_out, cpu_grads, _ = analytic_gradients(case, arrays, inject, "cpu")
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


def check_sample(case, inject: str | None = None, mode: str = "auto",
                 backend: str = "cpu", use_torch: bool = True) -> Result:
    """Judge the backward pass of one case (a registry Sample, or any object with its
    interface, see gradcheck.api). Never raises for a failing case: errors are results.
    use_torch False leaves torch out (no import: start-up is faster by its import time)."""
    t0 = time.perf_counter()
    name = str(case)
    labels = {"op": case.op, "backend": backend, "dtype": case.dtype, "mode": mode}
    op = get_op(case.op) if getattr(case, "registered", True) else None
    if op is not None and not op.differentiable:
        return Result("gradcheck", name, "skip", message=f"no gradient: {op.no_grad}",
                      labels=labels)
    try:
        verdict = _judge(case, inject, mode, backend, labels, use_torch)
    except Exception as exc:  # a crashing kernel is this case's verdict, not the sweep's end
        kind = "" if isinstance(exc, engine.EngineError) else "unexpected "
        verdict = Result("gradcheck", name, "error", labels=labels,
                         message=f"error: {kind}{type(exc).__name__}: {exc}")
    verdict.metrics["seconds"] = round(time.perf_counter() - t0, 3)
    return verdict


def _judge(case, inject, mode, backend, labels, use_torch=True) -> Result:
    arrays = case.generate_inputs()
    out, analytic, differs = analytic_gradients(case, arrays, inject, backend)
    f, leaves = _numeric_graph(case, arrays, "cpu")
    idx = [i for i, t in enumerate(leaves) if t is not None]
    total = sum(leaves[i].size for i in idx)
    if mode == "auto":
        mode = "full" if total <= FULL_BUDGET else "fast"
    labels["mode"] = mode
    weights = loss_weights(out.shape, case.seed())
    ref = torch_gradients(case, arrays, weights) if use_torch else None

    a_list = [analytic[i] for i in idx]
    t_list = None if ref is None else [ref.grads[i] for i in idx]
    # thousands of evaluations of a tiny graph: parallel launches would cost more than the
    # work (backprop above runs on every thread, races included)
    with single_thread():
        if mode == "full":
            nums = [numerical_gradient(f, leaves[i].buffer()) for i in idx]
        else:
            dirs = _directions(case, [case.inputs[i].shape for i in idx], DIRECTIONS)
            leaf_dirs = [[case.inputs[i].to_leaf(v) for i, v in zip(idx, d, strict=True)]
                         for d in dirs]
            nums = [directional_derivatives(f, [leaves[i].buffer() for i in idx], leaf_dirs)]
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

    problems, checked, kinks = [], 0, 0
    max_abs = max_rel = 0.0
    worst = ""
    torch_state = "n/a" if ref is None else "agree"
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
                            "torch (the engine's forward does not match its backward)")
        elif bn.ok and not nt.ok:
            problems.append(f"torch: {nm}: torch disagrees with backprop and numerical "
                            f"({nt.failures}/{nt.checked} elements; forward differs from "
                            "torch's, or the torch reference is wrong)")
        else:
            problems.append(f"numerical: {nm}: backprop, numerical and torch all disagree")
    if ref is not None and out.dtype.kind == "f":
        fwd = compare(out, ref.output, case.precision)
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
               "torch": torch_state}
    if backend != "cpu":
        metrics["vs_cpu"] = _versus_cpu(case, arrays, inject, out, analytic, backend, problems)
    return Result("gradcheck", str(case), "fail" if problems else "pass", metrics,
                  "; ".join(problems), labels=labels)
