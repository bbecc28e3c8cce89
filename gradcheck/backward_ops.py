"""Dedicated backward ops checked directly: each against the VJP of its forward op.

A dedicated backward op B (softmax_back, norm_back, pool_2d_back, im2col_back,
cross_entropy_loss_back, repeat_back, get_rows_back, relu_back, every `<activation>_back`)
computes a vector-Jacobian product of its forward op F, J_F(x)^T g. Its OpDef says which F
and where (`vjp_of`, an engine.registry.VJPOf): `primals` maps B's input values and
parameters to F's inputs x, the upstream gradient g and F's parameters (softmax_back(g, y,
scale) is softmax's VJP at x = log(y) / scale). For one case of B, `check_backward_op`:

- for a `vjp_of` of several inputs (`wrt` a tuple), takes B's 1-D output as those inputs'
  gradients raveled and concatenated, cut back into one gradient per input, each judged
  as below (attention_back: dq, dk, dv of attention_fwd);
- runs B alone in the engine under test, twice (the two outputs must agree bit for bit):
  through the adapter's `forward(case, arrays)` where it has one (ours does), else as the
  output of its `vjp` (for zero loss weights; torch's, ggml's);
- judges B's output b as gradcheck.check judges backprop (gradcheck.verdict.judge, the same
  three opinions and tolerances by dtype), against
  1. the numerical VJP n: central differences in float64 (4th order, with an error estimate
     per value and kink detection, gradcheck.numeric) of <F(x), g>, F being our engine's
     float64 graph of the forward op (gradcheck.reference), along every element of x (mode
     full) or along random directions v (mode fast: <b, v> against d<F(x + t v), g>/dt at
     t = 0); the modes and their `checked_fraction` are gradcheck.modes';
  2. torch t: autograd's VJP of F's torch equivalent at x for g, in float64;
  and, as its `forward`, against B's own float64 reference (our engine's float64 graph of B
  on the same inputs), and B's own torch equivalent where it has one;
- off the CPU, B's output against the same engine's on the CPU (`vs_cpu`);
- in float16, bfloat16 and float32, B's output by gradcheck.precision's verdict: its error
  against B's float64 truth (torch's in float64 where B has a torch equivalent, else our
  float64 graph of B) at most PRECISION_RATIO times that of torch computing B in the
  case's dtype, or of the error model (the row's ratio, err_vs_f64, ref_err, precision_ref
  and, as B is one kernel, its rounding bias).

B's samples live in its module, with inputs F's VJP is taken at (rows of y on the simplex
for softmax_back; pool_2d_back's registry builder makes y = pool_2d(x) itself): g
contiguous, a permuted view and a stride-0 broadcast (and sliced, for kernels that read g in
place). Kinks (relu at 0, max-pool ties) are kept off by the samples (inputs away from 0,
distinct values) and, where one occurs, detected and not judged (gradcheck.numeric).

Its row has gradcheck.check's labels and metrics (checked, checked_fraction, kinks,
max_abs_err, max_rel_err, worst, forward, torch, vs_cpu), plus `vjp_of`: F's name. `worst`
names the element by F's input (`x[0, 3]: num ..., bp ...`: b is "bp"). gradcheck.check's
`check_sample` sends every case of a backward op without a gradient of its own here, within
its handling of errors, crashes, unsupported cases and isolated engines (an op that declares
no `vjp_of` stays a `skip` row there).

Backward ops with a backward rule of their own (repeat_back, get_rows_back, im2col_back,
im2col_1d_back: linear, and their gradient is their forward op) stay ordinary cases of
gradcheck.check, and `with_vjp_check` adds the relation to the same row: one case is one
row, one pytest item and one repro, failing when either check fails (an error in either is
the row's error); its `vjp` metric says how b agreed with F's VJP (agree or off). The
relation does not depend on how the loss weights b's own output, so a case's cotangent
variants (gradcheck.cotangents) leave it to the contiguous case. (An extra row per case
would need a case of its own, with a string, filter key and repro of its own, for a check
of the same kernel on the same inputs.)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from engine.registry import get_op
from engine.samples import InputSpec, Sample
from engine.tensor import dtype_name, is_float
from gradcheck import precision
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.backprop import EngineResultError, same_bits
from gradcheck.cross_backend import compares_with_cpu, cpu_differences
from gradcheck.modes import choose_mode, compared_gradients
from gradcheck.numeric import compare
from gradcheck.reference import float64_reference, torch_reference
from gradcheck.verdict import Outcomes, judge
from reports import Result

# how bad a status is, for the row that holds two checks (with_vjp_check)
_SEVERITY = {"pass": 0, "fail": 1, "error": 2, "crash": 3}


@dataclasses.dataclass
class ForwardPoint:
    """Where a backward op's case is a VJP of its forward op: `case`, a float64 Sample of
    the forward op whose inputs `wrt` (indices, in the order of the backward op's output)
    alone are checked; `arrays`, its input values (float64, integer ones as they are); `g`,
    the upstream gradient (float64)."""

    case: Sample
    arrays: list[np.ndarray]
    g: np.ndarray
    wrt: tuple[int, ...]

    def split(self, out: np.ndarray) -> list[np.ndarray]:
        """The backward op's output `out` as one gradient per checked input: itself for one
        input, else its 1-D concatenation cut and shaped as the inputs."""
        if len(self.wrt) == 1:
            return [out]
        shapes = [self.arrays[i].shape for i in self.wrt]
        ends = np.cumsum([int(np.prod(s)) for s in shapes])
        return [piece.reshape(s) for piece, s in
                zip(np.split(out, ends[:-1]), shapes, strict=True)]


def is_backward_op_case(case, differentiable: bool | None = None) -> bool:
    """Whether `case` is a registry case of an op that declares `vjp_of` (and, unless
    `differentiable` is None, whose op has a gradient of its own or not, as given)."""
    if not getattr(case, "registered", True):
        return False
    op = get_op(case.op)
    return op.vjp_of is not None and differentiable in (None, op.differentiable)


def _float64(a) -> np.ndarray:
    a = np.asarray(a)
    return np.array(a, np.float64) if is_float(a.dtype) else a


def forward_point(case, arrays) -> ForwardPoint:
    """The forward op's case, inputs and upstream gradient of which the backward op's case
    `case` on input values `arrays` is the VJP (its OpDef's `vjp_of`)."""
    relation = get_op(case.op).vjp_of
    inputs, g, params = relation.primals(*(_float64(a) for a in arrays), **case.kwargs)
    names = list(inputs)
    wrt = relation.wrt_names
    for name in wrt:
        if name not in names:
            raise ValueError(f"{case.op}: vjp_of is the gradient of {relation.op}'s input "
                             f"{name!r}, which its primals do not give (they give "
                             f"{', '.join(names)})")
    values = [_float64(a) for a in inputs.values()]
    specs = [InputSpec(n, a.shape, dtype="f64" if is_float(a.dtype) else dtype_name(a.dtype),
                       grad=n in wrt) for n, a in zip(names, values, strict=True)]
    return ForwardPoint(Sample.make(relation.op, specs, "f64", **params), values,
                        _float64(g), tuple(names.index(n) for n in wrt))


def _unchecked(case):
    """`case` with no input checked (every grad off): the same string, inputs and data."""
    return dataclasses.replace(case, inputs=tuple(dataclasses.replace(s, grad=False)
                                                  for s in case.inputs))


def run_backward_op(adapter, case, arrays, output_shape) -> np.ndarray:
    """The backward op's output in `adapter`'s engine: its `forward` where it has one (an
    isolated adapter offers one only where it runs in the worker: our engine's), else the
    output of its `vjp` for zero weights (on the case as it is: an engine may refuse a
    graph with nothing to differentiate, as ggml does). Raises EngineResultError for an
    output of another shape than `output_shape`."""
    arrays = [a.copy() for a in arrays]
    forward = getattr(adapter, "forward", None)
    if forward is not None:
        out = np.asarray(forward(case, arrays))
    else:
        out = np.asarray(adapter.vjp(case, arrays, np.zeros(output_shape)).output)
    if out.shape != tuple(output_shape):
        raise EngineResultError(f"the engine's output has shape {list(out.shape)}, the "
                                f"case's output {list(output_shape)}")
    return out


def check_backward_op(case, adapter=None, mode: str = "auto", use_torch: bool = True,
                      labels: dict | None = None) -> Result:
    """Judge one case of a dedicated backward op (a registry Sample of an op with `vjp_of`)
    in `adapter`'s engine (default: ours on the CPU) against its forward op's VJP (see the
    module doc). `labels`: the row's (gradcheck.check.case_labels; default: op, backend,
    dtype, mode), its mode set to the one used. Raises for an engine error or a malformed
    `vjp_of`: gradcheck.check.check_sample, which sends such cases here, makes those rows
    (error, crash, unsupported). use_torch False leaves torch out."""
    adapter = EngineAdapter() if adapter is None else adapter
    if labels is None:
        labels = {"op": case.op, "backend": getattr(adapter, "backend", "cpu"),
                  "dtype": case.dtype, "mode": mode}
    relation = get_op(case.op).vjp_of
    arrays = case.generate_inputs()
    point = forward_point(case, arrays)
    f64_forward = float64_reference(point.case, point.arrays)
    if point.g.shape != f64_forward.output_shape:
        raise ValueError(f"{case.op}: vjp_of gives an upstream gradient of shape "
                         f"{list(point.g.shape)}; {relation.op}'s output has shape "
                         f"{list(f64_forward.output_shape)}")
    f64_forward.set_weights(point.g)
    f64_own = EngineAdapter("cpu").forward(case.promoted("f64"), arrays)
    out = run_backward_op(adapter, case, arrays, f64_own.shape)
    differs = not same_bits(out, run_backward_op(adapter, case, arrays, f64_own.shape))
    xs = [point.arrays[i] for i in point.wrt]
    want = xs[0].shape if len(xs) == 1 else (sum(x.size for x in xs),)
    if out.shape != want:
        raise ValueError(f"{case.op}: its output of shape {list(out.shape)} is no gradient "
                         f"of {relation.op}'s input {' and '.join(relation.wrt_names)} of "
                         f"shape {' and '.join(str(list(x.shape)) for x in xs)} (see its "
                         "vjp_of)")
    mode = choose_mode(mode, sum(x.size for x in xs))
    labels["mode"] = mode
    torch_vjp = torch_own = None
    if use_torch:
        ref = torch_reference(point.case, point.arrays, point.g)
        torch_vjp = None if ref is None else [ref.grads[i] for i in point.wrt]
        own = torch_reference(_unchecked(case), arrays, None)
        torch_own = None if own is None else own.output
    compared = compared_gradients(point.case, f64_forward, list(point.wrt), mode,
                                  point.split(out), torch_vjp)
    vs_cpu = None
    if compares_with_cpu(adapter):
        cpu_out = run_backward_op(adapter.on_cpu(), case, arrays, out.shape)
        vs_cpu = tuple(cpu_differences(case, [("forward", out, cpu_out)]))
    held = None
    if case.precision in precision.JUDGED:
        held = precision.check_case(_unchecked(case), arrays, np.zeros(out.shape), out, [],
                                    [], f64_own if torch_own is None else torch_own, [],
                                    use_torch)
    outcomes = compared.outcomes(case.precision)
    v = judge(Outcomes(
        compare(out, f64_own, case.precision), outcomes,
        torch_vjp is not None,
        None if torch_own is None else compare(out, torch_own, case.precision), differs,
        getattr(adapter, "backend", "cpu"), vs_cpu, precision=held, dtype=case.precision,
        powers=_powers(compared.powers(case.precision, outcomes=outcomes), held,
                       dict(zip(relation.wrt_names, point.split(out), strict=True)))))
    metrics = v.metrics(compared.fraction) | {"vjp_of": relation.op}
    return Result("gradcheck", str(case), v.status, metrics, v.message, labels=labels)


def _powers(powers: dict, held, parts: dict) -> dict:
    """The powers of a backward op's row: its output is the gradients compared (`powers`,
    by the forward op's input names; `parts`, the output's share of each), which the
    precision verdict `held` judges as one "output": an error that it flags in the whole
    (its slack) is flagged in any part, so each gradient's power is also that slack over
    the part's own magnitude."""
    slack = (held.slacks if held is not None else {}).get("output", np.inf)
    out = {}
    for name, p in powers.items():
        part = np.abs(np.asarray(parts[name], np.float64))
        own = float(np.max(part[np.isfinite(part)], initial=0.0))
        out[name] = min(p, slack / own if own else np.inf)
    return out


def with_vjp_check(row: Result, case, adapter, mode: str = "auto",
                   use_torch: bool = True) -> Result:
    """gradcheck.check's `row` of `case`; for a backward op with a backward rule of its own
    and a `vjp_of`, with its relation to its forward op (check_backward_op) checked in the
    same row: metrics `vjp_of` and `vjp` (agree, off), the status the worse of the two, the
    message naming what the relation found. Any other row, one that neither passed nor
    failed, and a cotangent variant (the relation does not depend on the loss's layout) are
    returned as they are."""
    if row.status not in ("pass", "fail") or not is_backward_op_case(case, True) or \
            getattr(case, "cotangent", "contiguous") != "contiguous":
        return row
    vjp = check_backward_op(case, adapter, mode, use_torch, dict(row.labels))
    metrics = {**row.metrics, "vjp_of": vjp.metrics["vjp_of"],
               "vjp": "agree" if vjp.status == "pass" else "off"}
    status = vjp.status if _SEVERITY[vjp.status] > _SEVERITY[row.status] else row.status
    note = f"vjp_of {vjp.metrics['vjp_of']}: {vjp.message}" if vjp.message else ""
    message = "; ".join(m for m in (row.message, note) if m)
    return Result(row.tool, row.name, status, metrics, message, labels=row.labels)
