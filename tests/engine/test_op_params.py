"""Every op's parameters against its declaration (engine.params.Params, OpDef.params): each
op declares them, and any value, in a declared range, on its edges or far outside it,
missing, unknown or of another type, is either a clean refusal (ParamError, ShapeError,
DTypeError) when the op is built, or a node whose forward pass on the CPU backend is finite.

The ops are built on the inputs of their first sample case (float32 where they have one):
a primitive's node is rebuilt with make_node on the sample node's sources and mutated
parameters, a composite through its builder with mutated arguments. Outputs of more than
COMPUTE_LIMIT elements are built, not computed (a window of 2^20 is a valid op on a small
image; computing it is the user's call); anything past MAX_NODE_ELEMENTS is refused.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine.errors import DTypeError, EngineError, ParamError, ShapeError
from engine.params import INT32_MAX, INT64_MAX, INT64_MIN, REQUIRED, Param, Params
from engine.registry import all_ops, make_node

OPS = all_ops()
COMPUTE_LIMIT = 1 << 16
REFUSALS = (ParamError, ShapeError, DTypeError)
# ops whose outputs hold -inf by definition: diag_mask_inf's masked cells, the log-sum-exp
# of an attention row that sees no key (gradcheck counts such cells as constants)
MINUS_INF_OK = {"diag_mask_inf", "attention_fwd"}
MISSING = object()        # a mutation that drops the parameter
TINY, HUGE = 5e-324, 1.7976931348623157e308


# --- each op declares its parameters -----------------------------------------------------------

def test_every_op_has_a_declaration_a_test_can_read():
    """No op leaves its parameters undeclared: params is a Params of Params (kind, range,
    required or default) for every op, composites and ops without parameters included."""
    for name, op in OPS.items():
        assert isinstance(op.params, Params), name
        for pname, p in op.params.items():
            assert isinstance(p, Param) and p.kind != "check", (name, pname)
            assert p.low is None or p.high is None or p.low <= p.high, (name, pname)
        for rule in op.params.rules:
            assert set(rule.names) <= set(op.params) and rule.says, (name, rule)


@pytest.mark.parametrize("name", sorted(OPS))
def test_defaults_lie_in_their_ranges_and_match_the_builders(name):
    """A declared default passes its own check; a composite's builder takes every declared
    parameter (by name, or through its **keywords) with the declared default."""
    op = OPS[name]
    for pname, p in op.params.items():
        if not p.required:
            p.check(name, pname, p.default)       # no ParamError
    if op.kind != "composite":
        return
    signature = inspect.signature(op.compose).parameters
    catch_all = any(q.kind is inspect.Parameter.VAR_KEYWORD for q in signature.values())
    for pname, p in op.params.items():
        if pname not in signature:
            assert catch_all and not p.required or pname == "n_dims", (name, pname)
            continue
        default = signature[pname].default
        assert (default is inspect.Parameter.empty) == p.required, (name, pname)
        if not p.required:
            assert default == p.default, (name, pname, default, p.default)


def test_missing_and_unknown_parameters_name_the_op_and_the_parameter():
    q = engine.input_tensor((2, 3, 4), "f32")
    with pytest.raises(ParamError, match=r"^attention_fwd: .*missing required parameter 'scale'"):
        make_node("attention_fwd", (q, q, q), causal=False)
    with pytest.raises(ParamError, match=r"^attention_fwd: .*unknown parameter 'scael'"):
        make_node("attention_fwd", (q, q, q), scale=0.5, scael=0.5)
    with pytest.raises(ParamError, match=r"^conv_2d: .*unknown parameter 'strides'"):
        engine.ops.conv_2d(engine.input_tensor((1, 1, 4, 4)), engine.input_tensor((1, 1, 3, 3)),
                           strides=2)
    node = make_node("attention_fwd", (q, q, q), scale=0.5)
    assert node.params == dict(scale=0.5, causal=False, logit_softcap=0.0, max_bias=0.0)


@pytest.mark.parametrize("params, words", [
    (dict(freq_base=1.0, n_ctx_orig=4096), "freq_base must not be 1 with YaRN"),
    (dict(freq_base=1.0, ext_factor=1.0), "freq_base must not be 1 with YaRN"),
    (dict(ext_factor=1.0, n_ctx_orig=4096, beta_fast=1e308), "beta_fast must be at most 1e+06"),
    (dict(n_ctx_orig=4096, beta_slow=0.0), "beta_slow must be >= 1e-06"),
    (dict(freq_scale=0.0), "freq_scale must be >= 1e-06"),
    (dict(n_dims=7), "n_dims must be even"),
    (dict(ext_factor=2.0), "ext_factor must be at most 1"),
])
def test_rope_refuses_what_its_kernel_cannot_compute(params, words):
    """YaRN's correction dims divide by log(freq_base) (ZeroDivisionError at 1) and take
    log(n_ctx_orig / (2 pi beta)) (log(0) for beta past 2.8e307); 1/freq_scale feeds a log:
    each refused when the op is built, whatever else the parameters say."""
    x, pos = engine.input_tensor((3, 2, 8), "f32"), engine.input_tensor((3,), "i32")
    with pytest.raises(ParamError, match=r"^rope: .*" + words.replace("+", r"\+")):
        engine.ops.rope(x, pos, n_dims=8 if "n_dims" not in params else params.pop("n_dims"),
                        **params)
    base = dict(engine.ops.rope(x, pos, n_dims=8).params, n_dims=8, freq_base=1.0)
    make_node("rope", (x, pos), **base)      # freq_base 1 without YaRN: every angle is pos


# --- values on and past the edges of each declared range ----------------------------------------

def _int_edges(p: Param) -> list:
    low = p.low if p.low is not None else INT64_MIN
    high = p.high if p.high is not None else INT64_MAX
    near = [low - 1, low, low + 1, low + 2, high - 1, high, high + 1]
    return sorted({*near, -1, 0, 1, 2, 3, INT32_MAX, INT32_MAX + 1, INT64_MAX, INT64_MIN,
                   2 ** 64, -2 ** 64}) + [True, 2.0, "1", None]


def _float_edges(p: Param) -> list:
    values = [0.0, -0.0, TINY, -TINY, 1e-300, -1e-300, 1.0, -1.0, 1e30, -1e30, 1e300, -1e300,
              HUGE, -HUGE, math.inf, -math.inf, math.nan]
    for bound in (p.low, p.high):
        if bound is not None and math.isfinite(bound):
            values += [bound, math.nextafter(bound, -math.inf), math.nextafter(bound, math.inf)]
    return values + [1, True, "1.0", None, 10 ** 400]


def edges(p: Param, current) -> list:
    """Values on and around the edges of `p`'s range and of other types; `current` is a
    well-formed value (for the sequence kinds, the values are it with one int replaced)."""
    if p.kind == "int":
        return _int_edges(p)
    if p.kind == "float":
        return _float_edges(p)
    if p.kind == "bool":
        return [True, False, 0, 1, "True", None]
    if p.kind == "choice":
        return [*p.options, "", p.options[0].upper(), 1, None]
    ints = [v for v in _int_edges(p) if type(v) is int]
    if p.kind == "pair":
        return ints + [(v, 1) for v in ints] + [(1, v) for v in ints] + [(), (1, 2, 3), [2, 2]]
    if p.kind == "axes":
        return [None, 0, -1, 1, 100, (0, 0), (), (0, 1), (-100,), 1.5, True, "0"]
    rows = p.kind == "int_rows"
    flat = list(current) if not rows else [list(r) for r in current]
    out = [(), current + current[:1], "ab", None, [*current]]
    for i in range(len(flat)):
        for v in ints:
            copy = [list(r) for r in flat] if rows else list(flat)
            if rows:
                copy[i][0] = v
                out.append(tuple(tuple(r) for r in copy))
            else:
                copy[i] = v
                out.append(tuple(copy))
    return out


# --- building and computing an op on its sample's inputs ----------------------------------------

def _first_case(op):
    cases = op.samples() if op.samples else []
    return next((c for c in cases if c.dtype == "f32"), cases[0] if cases else None)


def _update_inputs(name):
    """The sources of an optimizer step (which has no samples): a (3,) float32 parameter,
    its gradient, the step count, the hyperparameters and the state."""
    def leaf(shape, dtype, value):
        t = engine.input_tensor(shape, dtype)
        t.set(np.full(shape, value, dtype=t.dtype))
        return t
    hp = [0.1, 0.9, 0.0, 0.0] if name == "sgd_step" else [0.1, 0.9, 0.999, 1e-8, 0.0]
    param, grad = leaf((3,), "f32", 0.5), leaf((3,), "f32", 0.25)
    step, hps = leaf((1,), "f64", 1.0), leaf((len(hp),), "f64", 0.0)
    hps.set(np.array(hp))
    states = [leaf((3,), "f32", 0.0) for _ in range(1 if name == "sgd_step" else 2)]
    return param, grad, step, hps, *states


class Subject:
    """An op ready to be rebuilt with other parameters: a primitive's sample node (its
    sources and parameters), or a composite's builder, inputs and arguments."""

    def __init__(self, name):
        self.name, op = name, OPS[name]
        self.composite = op.kind == "composite"
        case = _first_case(op)
        if case is None:
            self.srcs, self.params = _update_inputs(name), {}
            return
        arrays = case.generate_inputs()
        leaves = []
        for spec, a in zip(case.inputs, case.leaf_arrays(arrays), strict=True):
            t = engine.input_tensor(a.shape, a.dtype, name=spec.name)
            t.set(a)
            leaves.append(t)
        views = [spec.view(t) for spec, t in zip(case.inputs, leaves, strict=True)]
        if self.composite:
            self.srcs, self.params = views, dict(case.kwargs)
            return
        node = op.build(*views, **case.kwargs)
        assert node.op == name, (name, node.op)
        self.srcs, self.params = node.srcs, dict(node.params)

    def build(self, params):
        if self.composite:
            return OPS[self.name].build(*self.srcs, **params)
        return make_node(self.name, self.srcs, **params)

    def run(self, params) -> str:
        """'refused', 'built' (too large to compute) or 'computed', asserting what the
        module doc promises; the mutated `params` are in the failure message."""
        try:
            out = self.build(params)
        except REFUSALS as exc:
            message = str(exc)
            assert message.startswith(f"{self.name}: ") or self.composite, message
            assert "\n" not in message, message
            return "refused"
        except Exception as exc:   # noqa: BLE001  (anything else is the failure tested for)
            pytest.fail(f"{self.name}{params}: {type(exc).__name__}: {exc}")
        if out.size > COMPUTE_LIMIT:
            return "built"
        try:
            (value,) = engine.compute(out)
        except EngineError:          # a data-dependent refusal (get_rows_back's indices)
            return "refused"
        except Exception as exc:   # noqa: BLE001
            pytest.fail(f"{self.name}{params}: computing: {type(exc).__name__}: {exc}")
        value = np.asarray(value, np.float64)
        bad = np.isnan(value) | (value == math.inf) | (
            (value == -math.inf) & (self.name not in MINUS_INF_OK))
        assert not bad.any(), f"{self.name}{params}: {int(bad.sum())} non-finite outputs"
        return "computed"


SUBJECTS: dict[str, Subject] = {}


def subject(name) -> Subject:
    if name not in SUBJECTS:
        SUBJECTS[name] = Subject(name)
    return SUBJECTS[name]


def _well_formed(p: Param, name, current):
    """A value for parameter `name` when the sample does not give one (a composite's
    optional argument): its default."""
    return current.get(name, p.default if not p.required else MISSING)


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_edge_of_every_parameter_is_refused_or_computes_finite(name):
    """Each declared parameter in turn set to each of its edges (the others as the sample
    has them), then dropped, and an unknown one added: a clean refusal or a finite output."""
    s = subject(name)
    declared = OPS[name].params
    outcomes = set()
    for pname, p in declared.items():
        current = _well_formed(p, pname, s.params)
        shape = current if current is not MISSING and p.kind in ("ints", "int_rows") else ()
        for value in edges(p, shape):
            outcomes.add(s.run({**s.params, pname: value}))
        missing = {k: v for k, v in s.params.items() if k != pname}
        outcome = s.run(missing)
        assert outcome != "refused" or p.required or pname == "axis", (name, pname)
        if p.required and not s.composite:
            with pytest.raises(ParamError, match=f"missing required parameter '{pname}'"):
                s.build(missing)
    with pytest.raises(ParamError, match="unknown parameter 'no_such_param'"):
        s.build({**s.params, "no_such_param": 1})
    assert s.run(dict(s.params)) == "computed", name      # the sample itself
    assert not declared or "refused" in outcomes, name


def _drawn(p: Param, current):
    """A strategy of values for p: inside its range (ints near the low end: sizes stay
    small), on its edges, or of another type."""
    pool = st.sampled_from(edges(p, current if p.kind in ("ints", "int_rows") else ()))
    if p.kind == "float":
        lo = -1e6 if p.low is None or p.low == -math.inf else p.low
        hi = 1e6 if p.high is None or p.high == math.inf else p.high
        return st.one_of(pool, st.floats(lo, hi, allow_nan=False))
    if p.kind == "int":
        lo = p.low if p.low is not None else -8
        return st.one_of(pool, st.integers(lo, min(p.high if p.high is not None else lo + 16,
                                                   lo + 16)))
    return pool


@pytest.mark.parametrize("name", sorted(n for n in OPS if OPS[n].params))
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
          deadline=None)
@given(data=st.data())
def test_any_mix_of_parameters_is_refused_or_computes_finite(name, data):
    """Several parameters changed at once (a rule between them broken or not), some
    dropped, an unknown one added now and then."""
    s = subject(name)
    declared = OPS[name].params
    params = dict(s.params)
    for pname in data.draw(st.lists(st.sampled_from(list(declared)), min_size=1,
                                    max_size=len(declared), unique=True), label="changed"):
        p = declared[pname]
        current = _well_formed(p, pname, s.params)
        value = data.draw(st.one_of(st.just(MISSING), _drawn(p, current if current is not
                                                             MISSING else ())), label=pname)
        if value is MISSING:
            params.pop(pname, None)
        else:
            params[pname] = value
    if data.draw(st.integers(0, 9), label="unknown") == 0:
        params["mystery"] = 1.0
    s.run(params)


def test_the_node_cap_refuses_absurd_outputs():
    x = engine.input_tensor((5, 7, 3), "f32")
    with pytest.raises(ShapeError, match=r"win_part: the output .* at most 2\^40"):
        engine.ops.win_part(x, 2 ** 20)
    assert engine.ops.win_part(x, 2 ** 10).shape == (1, 1024, 1024, 3)


def test_declarations_say_themselves():
    rope = OPS["rope"].params
    assert rope["freq_base"].describe() == "number in [1e-06, inf), required"
    assert rope["ext_factor"].describe() == "number in [0, 1], required"
    assert OPS["dropout"].params["p"].describe() == "number in [0, 1), required"
    assert OPS["attention"].params["scale"].describe() == \
        "number in [-1e+06, 1e+06] or None, default None"
    assert OPS["clamp"].params["min"].contains(-math.inf)
    assert not OPS["clamp"].params["min"].contains(math.inf)
    assert REQUIRED is OPS["rope"].params["n_dims"].default


# --- graph files: the same declarations when a file is loaded -----------------------------------

def _saved(tmp_path, op_name):
    """A graph file holding the first sample of `op_name` (forward and backward)."""
    from engine.graph_io import save_graph
    from tests.engine.test_graph_io import sample_graph
    graph, _ = sample_graph(_first_case(OPS[op_name]))
    path = tmp_path / f"{op_name}.gguf"
    save_graph(path, graph)
    return path


@pytest.mark.parametrize("op_name, params, words", [
    # the file that loaded and then failed in the kernel with a TypeError
    ("attention_fwd", '{"causal": false, "logit_softcap": 0.0, "max_bias": 0.0}',
     "attention_fwd: takes parameters .*missing required parameter 'scale'"),
    ("attention_fwd", '{"scale": 0.5, "scale": 0.6}', "param 'scale' is given twice"),
    ("rope", '{"n_dims": 8, "mode": "normal", "n_ctx_orig": 4096, "freq_base": 1.0, '
             '"freq_scale": 1.0, "ext_factor": 0.0, "attn_factor": 1.0, "beta_fast": 32.0, '
             '"beta_slow": 1.0}', "rope: freq_base must not be 1 with YaRN"),
    ("rope", '{"n_dims": 8, "mode": "normal", "n_ctx_orig": 4096, "freq_base": 10000.0, '
             '"freq_scale": 1.0, "ext_factor": 1.0, "attn_factor": 1.0, "beta_fast": 1e308, '
             '"beta_slow": 1.0}', "rope: beta_fast must be at most 1e\\+06"),
    ("softmax", '{"scale": 1.0, "max_bias": 5000.0}', "softmax: max_bias must be at most 1022"),
    ("diag_mask_inf", '{"n_past": 9223372036854775807}', "n_past must be at most 2147483647"),
])
def test_a_graph_file_meets_the_same_declarations(tmp_path, op_name, params, words):
    from engine.graph_format import GraphFileError
    from engine.graph_io import load_graph
    from tests.engine.test_graph_io_malformed import node_edit, rewrite
    path = _saved(tmp_path, op_name)
    load_graph(path)                                  # as saved: loads
    rewrite(path, node_edit("graph.node.params", op_name, params))
    with pytest.raises(GraphFileError, match=words) as info:
        load_graph(path)
    assert "\n" not in str(info.value)
