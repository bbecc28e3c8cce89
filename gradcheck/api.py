"""gradcheck for your own code: functions built from engine ops, numpy forward/VJP pairs and
torch callables (custom torch.autograd.Function included), under the same checks.

    import numpy as np
    from engine import ops
    from gradcheck import assert_gradients, check_function, check_numpy, check_torch

    def swish(x, beta):
        return ops.mul(x, ops.sigmoid(ops.mul(x, beta)))

    x = np.random.default_rng(0).normal(size=(4, 5))
    beta = np.full((5,), 1.5)
    result = check_function(swish, [x, beta], torch_fn=lambda x, b: x * (x * b).sigmoid())
    print(result.status, result.metrics["max_abs_err"])

    # a hand-written VJP: vjp(cotangent, *inputs) -> J^T cotangent, one per input
    check_numpy(np.tanh, lambda w, x: [w * (1 - np.tanh(x) ** 2)], [x])

    # any torch callable; its gradient comes from torch's backward (your Function's)
    check_torch(lambda x, b: x * (x * b).sigmoid(), [x, beta])

    def test_swish():                        # in your own pytest suite
        assert_gradients(swish, [x, beta])

The result is the same record `gradcheck --op` produces (float64 reference and its
numerical gradients, forward check, kinks, tolerances by dtype, optional torch reference,
modes). The float64 reference is the function's own forward in float64 (check_function: the
engine graph of `build`; check_numpy and check_torch: `forward`/`fn` on float64 inputs, or
the reference forward you give as `reference=`): the numerical gradients differentiate it,
and the forward is checked against its output.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import sys
from collections.abc import Callable, Sequence

import numpy as np

from engine.errors import DTypeError
from engine.samples import InputSpec
from engine.tensor import dtype_name, is_float
from gradcheck.adapters.numpy_adapter import NumpyAdapter
from gradcheck.adapters.torch_adapter import TorchAdapter
from gradcheck.check import check_derivative, check_sample
from gradcheck.derivatives import AD_MODES, ORDERS
from reports import Result


@dataclasses.dataclass(frozen=True)
class FunctionCase:
    """A case made of a user's function and fixed input arrays (Sample's interface).

    build_fn: an engine expression of the inputs (None for numpy and torch functions);
    torch_fn: the torch reference's function, of float64 tensors (None: no torch
    reference); reference_forward: the forward of the float64 reference, a function of
    float64 numpy arrays (None: the engine graph of build_fn)."""

    name: str
    build_fn: Callable | None
    arrays: tuple
    inputs: tuple
    dtype: str
    torch_fn: Callable | None = None
    reference_forward: Callable | None = None
    cotangent: str = "contiguous"           # how the engine receives the upstream gradient
    registered = False

    @property
    def op(self) -> str:
        return self.name.split("(", 1)[0]

    @property
    def builds_engine_graph(self) -> bool:
        return self.build_fn is not None

    @property
    def precision(self) -> str:
        return "f32" if any(i.dtype == "f32" for i in self.inputs) or self.dtype == "f32" \
            else "f64"

    @property
    def torch_kwargs(self) -> dict:
        return {}

    def promoted(self, dtype="f64") -> FunctionCase:
        inputs = tuple(dataclasses.replace(i, dtype=dtype) if i.dtype in ("f32", "f64") else i
                       for i in self.inputs)
        return dataclasses.replace(self, inputs=inputs, dtype=dtype)

    def seed(self) -> int:
        return int.from_bytes(hashlib.sha256(str(self).encode()).digest()[:8], "little")

    def generate_inputs(self) -> list[np.ndarray]:
        return [np.array(a, copy=True) for a in self.arrays]

    def leaf_arrays(self, arrays):
        return list(arrays)

    def build(self, *leaves):
        if self.build_fn is None:
            raise TypeError(f"{self.name} is not built from engine ops")
        return self.build_fn(*leaves)

    def __str__(self) -> str:
        if self.cotangent == "contiguous":
            return self.name
        return f"{self.name[:-1]},cotangent={self.cotangent})"


def _output_ndim(case: FunctionCase) -> int:
    """The number of axes of the function's output (its forward run once, or its engine
    graph built)."""
    if case.reference_forward is not None:
        return np.ndim(case.reference_forward(*case.generate_inputs()))
    from gradcheck.adapters.engine_adapter import weighted_graph
    return len(weighted_graph(case, case.generate_inputs(), as_params=False)[1].shape)


SEVERITY = ("crash", "error", "fail", "vacuous")
COTANGENTS = ("contiguous", "permuted", "expanded", "sliced")


def _check_layouts(case: FunctionCase, cotangents, **check) -> Result:
    """check_sample of `case` once per cotangent layout of `cotangents` that its output
    has axes for (engine.samples: "permuted" needs two, "expanded" one; an "expanded" one
    that is vacuous, a cotangent in the VJP's null space, is made "expanded_first"), as
    one Result: the
    contiguous case's verdict when it fails (the other failing layouts named after it),
    else the worst failing layout's with each failing layout's message, else the pass; its
    `cotangents` label lists the layouts checked."""
    unknown = set(cotangents) - set(COTANGENTS)
    if unknown or not cotangents:
        raise ValueError(f"cotangents must name some of {', '.join(COTANGENTS)}; got "
                         f"{list(cotangents)}")
    ndim = _output_ndim(case)
    layouts = [c for c in dict.fromkeys(cotangents) if c == "contiguous"
               or (c == "permuted" and ndim >= 2) or (c != "permuted" and ndim >= 1)]
    results = {c: check_sample(dataclasses.replace(case, cotangent=c), **check)
               for c in layouts}
    if results.get("expanded") is not None and results["expanded"].status == "vacuous":
        # a cotangent constant along the last axis can lie in the VJP's null space (a
        # softmax, a layer norm along it): the stride-0 check is made along the first
        del results["expanded"]
        results["expanded_first"] = check_sample(
            dataclasses.replace(case, cotangent="expanded_first"), **check)
        layouts = list(results)
    failing = [(c, r) for c, r in results.items() if r.status in SEVERITY]
    plain = results.get("contiguous")
    if plain is not None and plain.status in SEVERITY:
        # the function is wrong whatever the layout: its own verdict, the others named
        worst, message = plain, plain.message
        others = [c for c, _ in failing if c != "contiguous"]
        if others:
            message += f" (also with cotangent={', '.join(others)})"
    elif failing:
        worst = min(failing, key=lambda cr: SEVERITY.index(cr[1].status))[1]
        message = "; ".join(f"cotangent={c}: {r.message}" for c, r in failing)
    else:
        worst = next(iter(results.values()))
        message = worst.message
    return dataclasses.replace(worst, name=case.name, message=message,
                               labels={**worst.labels, "cotangents": ",".join(layouts)})


PARTS_SEVERITY = ("crash", "error", "fail", "vacuous", "unsupported", "skip", "pass")


def _check_modes(case: FunctionCase, cotangents, ad: str, order: int, **check) -> Result:
    """The verdict on `case` in the modes asked for, as one Result: reverse mode in every
    layout of `cotangents` (_check_layouts) unless `ad` is "fwd", forward mode when `ad` is
    "fwd" or "both", second order when `order` is 2 (gradcheck.derivatives). With one part
    it is that part's Result; with several, the worst part's (crash, error, fail,
    unsupported, skip, pass), its message naming each part that is not a pass, its
    `parts` metric each part's status, labelled with `ad` and `order`."""
    if ad not in AD_MODES or order not in ORDERS:
        raise ValueError(f"ad must be one of {', '.join(AD_MODES)} and order one of "
                         f"{', '.join(map(str, ORDERS))}; got {ad!r}, {order!r}")
    parts = {}
    if ad != "fwd":
        parts["rev"] = _check_layouts(case, cotangents, **check)
    if ad != "rev":
        parts["fwd"] = check_derivative(case, "fwd", **check)
    if order == 2:
        parts["order 2"] = check_derivative(case, "order 2", **check)
    if len(parts) == 1:
        return next(iter(parts.values()))
    worst = min(parts.values(), key=lambda r: PARTS_SEVERITY.index(r.status))
    message = "; ".join(f"{part}: {r.message}" for part, r in parts.items()
                        if r.status != "pass")
    metrics = {**worst.metrics, "parts": ", ".join(f"{part} {r.status}"
                                                   for part, r in parts.items())}
    return dataclasses.replace(worst, name=case.name, message=message, metrics=metrics,
                               labels={**worst.labels, "ad": ad, "order": str(order)})


def _dtype_label(dt) -> str:
    try:
        return dtype_name(dt)
    except DTypeError:
        return np.dtype(dt).name


def _autograd_function(fn) -> type | None:
    """The torch.autograd.Function subclass whose `apply` `fn` is (None for anything else)."""
    owner = getattr(fn, "__self__", None)
    if not isinstance(owner, type) or getattr(fn, "__name__", None) != "apply":
        return None
    torch = sys.modules.get("torch")
    if torch is None or not issubclass(owner, torch.autograd.Function):
        return None
    return owner


def function_name(fn) -> str:
    """What a case of `fn` is called: its name (`lambda` for a lambda, `function` without
    one); for a torch.autograd.Function's `F.apply`, the class's name F."""
    function_class = _autograd_function(fn)
    if function_class is not None:
        return function_class.__name__
    name = getattr(fn, "__name__", None) or "function"
    return "lambda" if name == "<lambda>" else name


def input_names(fn, count: int) -> list[str]:
    """The names of `fn`'s first `count` inputs: its positional parameters (for a
    torch.autograd.Function's `F.apply`, F.forward's after `ctx`), `x<i>` for an input
    no positional parameter names (past them, under *args, or a function without a
    signature, as numpy's ufuncs)."""
    function_class = _autograd_function(fn)
    target = fn if function_class is None else function_class.forward
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    positional = [p.name for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    torch = sys.modules.get("torch")
    if (function_class is not None and positional and torch is not None
            and function_class.setup_context is torch.autograd.Function.setup_context):
        positional = positional[1:]          # forward(ctx, ...): no separate setup_context
    names = positional[:count]
    for i in range(len(names), count):
        name = f"x{i}"
        while name in names:
            name = f"_{name}"
        names.append(name)
    return names


def _function_case(fn, arrays, grad, name, what: str, engine_dtypes: bool,
                   **fields) -> FunctionCase:
    """The FunctionCase of `fn` at `arrays`, named `NAME(a=[shape],...)` after the function
    and its parameters (function_name, input_names)."""
    arrays = tuple(np.asarray(a) for a in arrays)
    if not arrays:
        raise ValueError(f"{what} needs at least one input array")
    floats = [a for a in arrays if is_float(a.dtype)]
    if not floats:
        raise ValueError(f"{what} needs a float input to differentiate")
    odd = sorted({str(a.dtype) for a in floats} - {"float32", "float64"})
    if odd:
        raise ValueError(f"{what}: float inputs must be float32 or float64, got {odd}")
    grad = [is_float(a.dtype) for a in arrays] if grad is None else list(grad)
    if len(grad) != len(arrays):
        raise ValueError(f"grad has {len(grad)} flags for {len(arrays)} inputs")
    label = dtype_name if engine_dtypes else _dtype_label
    inputs = tuple(InputSpec(n, a.shape, dtype=label(a.dtype), grad=bool(g))
                   for n, a, g in zip(input_names(fn, len(arrays)), arrays, grad, strict=True))
    fn_name = name or function_name(fn)
    shapes = ",".join(f"{i.name}=[{','.join(map(str, i.shape))}]" for i in inputs)
    return FunctionCase(f"{fn_name}({shapes})", fields.pop("build_fn", None), arrays, inputs,
                        dtype_name(floats[0].dtype), **fields)



def check_function(build: Callable, arrays: Sequence, *, grad: Sequence[bool] | None = None,
                   torch_fn: Callable | None = None, name: str | None = None,
                   mode: str = "auto", backend: str = "cpu",
                   cotangents: Sequence[str] = COTANGENTS, ad: str = "rev",
                   order: int = 1) -> Result:
    """Check the backward pass of `build(*tensors)`, an engine expression of its inputs,
    at the given input arrays (float32 or float64; integer arrays are constants).

    grad: which inputs to differentiate (default: every float input). torch_fn: the same
    function written in torch, taking float64 torch tensors, for the torch reference
    (three-way agreement). cotangents: the layouts in which the backward receives its
    upstream gradient (engine.samples; default all four, each one check); the result is
    the worst of them, every failing layout named. ad: "rev" (reverse mode, the
    default), "fwd" (forward mode: the JVP against directional derivatives and the adjoint
    identity) or "both"; order 2 adds the Hessian-vector product's check (see
    gradcheck.derivatives: our engine takes both by differentiating its backward graph,
    where its ops' backward rules allow). With several, the result is the worst part's,
    its `parts` metric naming each part's status."""
    case = _function_case(build, arrays, grad, name, "check_function", True, build_fn=build,
                          torch_fn=torch_fn)
    return _check_modes(case, cotangents, ad, order, mode=mode, backend=backend)


def check_numpy(forward: Callable, vjp: Callable, arrays: Sequence, *,
                grad: Sequence[bool] | None = None, reference: Callable | None = None,
                torch_fn: Callable | None = None, name: str | None = None,
                mode: str = "auto", cotangents: Sequence[str] = COTANGENTS,
                jvp: Callable | None = None, ad: str = "rev") -> Result:
    """Check a hand-written vector-Jacobian product against its forward.

    forward(*arrays) -> output (numpy); vjp(cotangent, *arrays) -> one gradient per input
    (J^T cotangent, i.e. the gradient of sum(forward(*arrays) * cotangent); None for an
    input not checked), computed in the inputs' dtypes. reference: the reference forward
    (default: `forward` itself), the float64 reference's function, called on float64
    inputs: the numerical gradients differentiate it and the forward is checked against
    its output. torch_fn: the same function in torch, for the torch reference (a third
    opinion). cotangents: as check_function's; `vjp` gets a transposed view, a read-only
    stride-0 view and an offset view of the cotangent in the permuted, expanded and sliced
    checks. jvp(tangents, *arrays) -> J t: a hand-written Jacobian-vector product (one
    tangent per input, None for one held constant), checked with ad="fwd" or "both"
    (check_function's `ad`; a numpy pair has no second order)."""
    if ad != "rev" and jvp is None:
        raise ValueError(f"check_numpy(ad={ad!r}) checks a hand-written JVP: pass jvp=")
    case = _function_case(forward, arrays, grad, name, "check_numpy", False,
                          torch_fn=torch_fn, reference_forward=reference or forward)
    return _check_modes(case, cotangents, ad, 1, mode=mode,
                        adapter=NumpyAdapter(forward, vjp, jvp))


def _torch_forward(fn: Callable) -> Callable:
    """`fn` of torch tensors as a function of numpy arrays (no autograd)."""
    def forward(*arrays):
        import torch
        with torch.no_grad():
            out = fn(*(torch.from_numpy(np.asarray(a)) for a in arrays))
        return out.detach().numpy()
    return forward


def check_torch(fn: Callable, arrays: Sequence, *, grad: Sequence[bool] | None = None,
                reference: Callable | None = None, name: str | None = None,
                mode: str = "auto", cotangents: Sequence[str] = COTANGENTS,
                ad: str = "rev", order: int = 1) -> Result:
    """Check torch's gradient of `fn(*tensors)` (any torch callable, custom
    torch.autograd.Function included) at `arrays` (numpy arrays or tensors, float32 or
    float64), run in the inputs' dtypes.

    reference: the reference forward (a torch callable; default: `fn` itself, so a
    Function's forward defines what its backward must be), the float64 reference's
    function, called on float64 inputs: the numerical gradients differentiate it and the
    forward is checked against its output. cotangents: as check_function's; backward gets
    grad_output as a permuted view, a stride-0 expansion and an offset slice of a larger
    tensor in those checks (a backward that calls grad_output.view(...) or reads its
    storage as contiguous fails them). ad and order: as check_function's; forward mode is
    torch.func.jvp (a Function's `jvp` rule), order 2 both double backward and forward
    over reverse (a Function whose backward detaches what it saved fails it)."""
    arrays = [a.detach().cpu().numpy() if hasattr(a, "detach") else a for a in arrays]
    case = _function_case(fn, arrays, grad, name, "check_torch", False,
                          reference_forward=_torch_forward(reference or fn))
    return _check_modes(case, cotangents, ad, order, mode=mode, adapter=TorchAdapter(fn))


def _passed(result: Result) -> Result:
    if result.status != "pass":
        raise AssertionError(f"gradcheck {result.status}: {result.name}: {result.message}")
    return result


def assert_gradients(build: Callable, arrays: Sequence, **kwargs) -> Result:
    """check_function, raising AssertionError with gradcheck's verdict unless it passes
    (for use in your own pytest suites)."""
    return _passed(check_function(build, arrays, **kwargs))


def assert_numpy(forward: Callable, vjp: Callable, arrays: Sequence, **kwargs) -> Result:
    """check_numpy, raising AssertionError unless it passes."""
    return _passed(check_numpy(forward, vjp, arrays, **kwargs))


def assert_torch(fn: Callable, arrays: Sequence, **kwargs) -> Result:
    """check_torch, raising AssertionError unless it passes."""
    return _passed(check_torch(fn, arrays, **kwargs))
