"""The op registry: every op declared once, read by the engine, gradcheck, tests and docs.

An op module defines one `OpDef` per op and registers it (`register`): the modules of
engine/ops when `import engine` loads them, any other module when it is imported. An OpDef
says:

- `infer(*srcs, **params) -> (shape, dtype)` or `(shape, dtype, contiguous)`: validates
  shapes, dtypes and parameters when the op is built, raising ShapeError/DTypeError that
  name the op and the shapes, or ParamError for a malformed parameter (engine.params holds
  the shared checks);
- `params`: the op's parameters declared as data, an engine.params.Params: per parameter
  its kind, its range (open or closed ends), whether it is required or its default, and the
  rules between parameters (rope's freq_base != 1 under YaRN). make_node checks a node's
  parameters against it before `infer` (strict: an int is never a bool or 500.0), so a
  user's call and a graph file being loaded (engine.graph_io) meet the same checks: an
  unknown, missing, malformed or out-of-range parameter is a ParamError naming the op and
  the parameter, and a node holds every declared parameter (defaults filled in). A
  composite op's builder checks its arguments against its declaration. A plain dict of
  Param values is taken as Params(dict); an op without parameters declares none (the
  default: an empty Params, never None);
- `backward(g, out, *srcs, **params) -> tuple` aligned with `srcs` (None = no gradient),
  built from registered ops so gradients are graph nodes; or `backward=None` together with
  `no_grad`, the reason it has none;
- `kernels`: backend name -> `kernel(out, ins, **params)` computing into `out`;
  view ops instead give `view(ins, **params) -> array` that aliases `ins[0]`;
- `torch(*tensors, **params)`: the torch equivalent, forward and autograd reference;
- `samples() -> list[Sample]`: gradcheck's sample cases (its fast tier);
- `scale() -> list[Sample]`: its scale cases (Samples with tier "scale"): sizes that take
  every threaded, chunked, tiled and zero-skipping path of its kernels (gradcheck.scale);
- `bench() -> list[Sample]`: its bench cases (Samples with tier "bench"): one or a few
  realistic sizes (an activation on 8M elements, a norm over (4096, 4096) rows, a
  convolution of a CIFAR-like batch), in float32 and in float16 and bfloat16 where the op
  runs in them, that bench/bench_ops.py times forward and forward + backward against
  torch (engine.scale_cases.bench_case);
- `bench_torch(*tensors, **params)`: torch's own fast way to compute the op in the case's
  dtype, where `torch` trades speed for accuracy (float64 inside: the norms, the masked
  softmax, rope) or takes a slower route than torch's own op: the bench times this one,
  else `torch`;
- `strategy(dtype) -> hypothesis strategy of Sample`: generated cases (shapes, parameters,
  input ranges) for `gradcheck --random N` and the property tests; it imports hypothesis
  itself, so that importing the engine does not;
- `vjp_of` (dedicated backward ops): a `VJPOf` naming the forward op whose vector-Jacobian
  product the op computes and mapping the op's inputs to where that product is taken
  (gradcheck.backward_ops checks the one against the other);
- composite ops (`kind="composite"`) give `compose(*srcs, **params) -> Tensor` and are
  differentiated through the ops they are made of;
- `build(*srcs, **params) -> Tensor`: the user-facing function (defaults to making the node,
  or to `compose`); op modules give their own where arguments need normalising;
- update ops (`kind="update"`, the optimizer steps) write their first source, a persistent
  tensor, in place (and other persistent sources, their state): the node shares that
  buffer and is itself persistent, so no plan ever places it in an arena.

`get_op(name)` and `all_ops()` read the registry; `registered.<name>(...)` builds an op by
name (see _Registered); `make_node` makes a node after checking its parameters and its
op's infer, and refuses an output of more than MAX_NODE_ELEMENTS elements.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable

from engine.errors import ParamError, ShapeError, UnknownOpError
from engine.params import Param, Params, check_param, shapes_str
from engine.tensor import Flag, Tensor

KINDS = ("primitive", "view", "composite", "backward", "update")
# the most elements a node may hold: 2^40 (4 TiB of float32) is beyond any machine the
# engine runs on, so a larger output is a parameter or shape gone wrong (a window of 2^31)
MAX_NODE_ELEMENTS = 2 ** 40

__all__ = ["KINDS", "MAX_NODE_ELEMENTS", "OPS", "OpDef", "VJPOf", "all_ops", "at_x", "get_op",
           "make_node", "register", "registered", "shapes_str", "unregister"]


@dataclasses.dataclass(frozen=True)
class VJPOf:
    """A dedicated backward op B as the vector-Jacobian product of its forward op F:

        B(*arrays, **params) = J_F(inputs)^T g = d<F(inputs, **fparams), g> / d inputs[wrt]

    `primals(*arrays, **params) -> (inputs, g, fparams)` maps B's input values (float64
    numpy arrays, integer ones as they are, in the layout B sees) and parameters to F's
    inputs (a dict, name -> array, in the order of F's sources; the point where the product
    is taken), the upstream gradient g (shaped as F's output) and F's parameters. For
    softmax_back(g, y, scale), F is softmax at x = log(y) / scale, where softmax(scale x) = y.
    `wrt` names the input of F whose gradient B is, or is a tuple of names: then B's output
    is 1-D, those inputs' gradients each raveled in C order and concatenated in that order
    (attention_back's dq, dk, dv)."""

    op: str
    primals: Callable
    wrt: str | tuple[str, ...] = "x"

    @property
    def wrt_names(self) -> tuple[str, ...]:
        """`wrt` as a tuple of names."""
        return (self.wrt,) if isinstance(self.wrt, str) else tuple(self.wrt)


def at_x(g, x, **params):
    """The `primals` of a backward op B(g, x, **params) whose forward op is F(x, **params)
    (the activations' `<name>_back`, norm_back): F's input x, the upstream gradient g."""
    return {"x": x}, g, params


@dataclasses.dataclass
class OpDef:
    name: str
    kind: str = "primitive"
    infer: Callable | None = None
    backward: Callable | None = None
    no_grad: str | None = None
    kernels: dict[str, Callable] = dataclasses.field(default_factory=dict)
    view: Callable | None = None
    compose: Callable | None = None
    build: Callable | None = None
    torch: Callable | None = None
    samples: Callable | None = None
    scale: Callable | None = None
    bench: Callable | None = None
    bench_torch: Callable | None = None
    strategy: Callable | None = None
    vjp_of: VJPOf | None = None
    params: Params | dict | None = None
    doc: str = ""
    zero_gradient: str = ""   # why its derivative is 0 wherever it is defined (sgn, step):
    #                           gradcheck then checks that its gradient is exactly 0
    null_cotangents: tuple[str, ...] = ()   # cotangent layouts (engine.samples) in whose
    #                           weights its VJP vanishes: "expanded", constant along the
    #                           last axis, for an op that normalises along it (softmax);
    #                           gradcheck's cotangent cases expand along the first instead
    adds_up: bool = False     # its output adds up elements of its first input over the
    #                           axes of a broadcast (sum; repeat_back, over repeat's tiles):
    #                           a 16-bit backward that builds one on terms made from its
    #                           gradient makes those terms in float32 (engine.graph)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"op {self.name}: kind must be one of {KINDS}")
        if self.kind == "composite":
            if self.compose is None:
                raise ValueError(f"composite op {self.name} needs compose")
        elif self.infer is None:
            raise ValueError(f"op {self.name} needs an infer rule")
        if self.kind == "view" and self.view is None:
            raise ValueError(f"view op {self.name} needs a view function")
        if self.vjp_of is not None and self.kind != "backward":
            raise ValueError(f"op {self.name}: only a backward op is the VJP of another op "
                             "(vjp_of)")
        if self.kind != "composite" and self.backward is None and not self.no_grad:
            raise ValueError(f"op {self.name}: give a backward rule or say why it has none "
                             "(no_grad=...)")
        self.params = _declared(self.params)
        if self.build is None:
            self.build = _checked_compose(self) if self.kind == "composite" else self._make

    def check_params(self, params: dict) -> dict:
        """Every declared parameter checked and in canonical form, defaults filled in (see
        `params` above); ParamError for an unknown, missing or out-of-range one."""
        return self.params.check(self.name, params)

    def _make(self, *srcs, **params) -> Tensor:
        return make_node(self.name, srcs, **params)

    @property
    def differentiable(self) -> bool:
        return self.kind == "composite" or self.backward is not None


def _declared(params) -> Params:
    """`params` as a Params: None is no parameters; a dict's values are Params, or checks
    check(op, name, value) of an op written before declarations (check_param)."""
    if isinstance(params, Params):
        return params
    return Params({k: p if isinstance(p, Param) else check_param(p)
                   for k, p in (params or {}).items()})


def _checked_compose(op: OpDef) -> Callable:
    """A composite op's builder: its compose function, called with its declared parameters
    checked (by position or name; a **keywords catch-all takes declared names only): an
    unknown, missing, malformed or out-of-range one is a ParamError naming the op. The other
    arguments (the tensors) go through as they are."""
    compose = op.compose
    signature = inspect.signature(compose)
    catch_all = next((p.name for p in signature.parameters.values()
                      if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    named = set(signature.parameters) - {catch_all}

    @functools.wraps(compose)
    def build(*args, **kwargs):
        declared = op.params
        unknown = [k for k in kwargs if k not in declared and k not in named]
        if unknown:
            raise ParamError(f"{op.name}: takes parameters {list(declared)}, got unknown "
                             f"parameter {unknown[0]!r}")
        bound = signature.bind_partial(*args, **kwargs)
        given = bound.arguments
        extra = given.get(catch_all, {}) if catch_all else {}
        values = {k: v for k, v in (*given.items(), *extra.items()) if k in declared}
        checked = declared.check(op.name, values)
        for k in values:
            (extra if k in extra else given)[k] = checked[k]
        return compose(*bound.args, **bound.kwargs)
    return build


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    """Add `op` to the registry, where the engine, gradcheck, the tests and the docs find it.
    The op modules of engine/ops register theirs when `import engine` loads them; a module
    elsewhere (a plugin, a test's toy op) registers the same way when it is imported."""
    if op.name in OPS:
        raise ValueError(f"op {op.name} registered twice")
    OPS[op.name] = op
    return op


def unregister(name: str) -> OpDef:
    """Remove the op called `name` (registered by a plugin or a test) and return it."""
    try:
        return OPS.pop(name)
    except KeyError:
        raise UnknownOpError(f"unknown op {name!r}") from None


def get_op(name: str) -> OpDef:
    """The OpDef called `name`; an unknown name raises an error listing the known ones."""
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOpError(f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}") \
            from None


def all_ops() -> dict[str, OpDef]:
    """Every registered op, by name, sorted."""
    return dict(sorted(OPS.items()))


class _Registered:
    """`registered.mul(a, b)` builds the registered op `mul`: OPS["mul"].build(a, b), looked
    up when called. An op module reaches the ops of other op modules this way where a
    module-level import would close a cycle (a backward rule needing an op whose module
    imports this one). Parameters go by keyword, as in the op's sample cases."""

    def __getattr__(self, name: str) -> Callable:
        if name.startswith("__"):
            raise AttributeError(name)
        return get_op(name).build


registered = _Registered()


def make_node(name: str, srcs, **params) -> Tensor:
    """Build a node of op `name` on `srcs`, checking its params (OpDef.params), shapes and
    dtypes now."""
    op = OPS[name]
    srcs = tuple(srcs)
    for s in srcs:
        if not isinstance(s, Tensor):
            raise TypeError(f"{name}: expected Tensor inputs, got {type(s).__name__}")
    params = op.check_params(params)
    inferred = op.infer(*srcs, **params)
    shape, dtype = inferred[0], inferred[1]
    contiguous = inferred[2] if len(inferred) > 2 else True
    if any(int(d) < 0 for d in shape):
        raise ShapeError(f"{name}: inferred a negative dimension {list(shape)} from "
                         f"{[list(s.shape) for s in srcs]}")
    if math.prod(shape) > MAX_NODE_ELEMENTS:
        raise ShapeError(f"{name}: the output of shape {list(shape)} would hold "
                         f"{math.prod(shape)} elements; a node holds at most 2^40 "
                         f"(from {[list(s.shape) for s in srcs]})")
    view_of = srcs[0] if op.kind == "view" else None
    if op.kind == "update":
        return Tensor(shape, dtype, op=name, srcs=srcs, params=params, flags=Flag.OUTPUT,
                      shares=srcs[0])
    return Tensor(shape, dtype, op=name, srcs=srcs, params=params, view_of=view_of,
                  contiguous=contiguous)
