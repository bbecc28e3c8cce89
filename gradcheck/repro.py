"""Repro commands: the one line that re-runs a case in the same engine, and its way back.

A failing, erroring or crashing row carries `repro` (`with_repro`): a registry sample is
named by op and filter, `gradcheck --engine ggml --op pool_2d -k '<case>'`; any other Sample
(a generated case, a shrunk one) by its repr, `gradcheck --engine ggml --repro
"Sample(op='pool_2d', ...)"`, which `parse_case` turns back into the Sample without
evaluating anything, and refuses (a ValueError, the CLI's usage error) what it cannot run:
a parameter given twice, one the op's declaration refuses (engine.params), and a case
whose estimated memory (`memory_estimate`) exceeds what this process can still allocate
(`available_memory`), before anything is computed.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import os
import re
import resource
import shlex
import warnings

import engine
from engine import ops
from engine.errors import UnknownOpError
from engine.registry import get_op
from engine.samples import InputSpec, Sample
from engine.tensor import DTYPES as TENSOR_DTYPES
from engine.tensor import FLOAT_NAMES, input_tensor, is_float
from gradcheck.adapters import spec_of
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.cotangents import tier_cases

# adapter options that the gradcheck CLI can say, and how
OPTION_FLAGS = {"backend": "--backend", "inject": "--inject", "lib_dir": "--ggml-lib",
                "n_threads": "--ggml-threads"}
_DEFAULT_OPTIONS = {"backend": "cpu"}
FAILING = ("fail", "error", "crash")    # the statuses of rows that are not ok
FLOAT_DTYPES = FLOAT_NAMES               # the dtypes of the cases gradcheck runs


def _is_registry_sample(case) -> bool:
    try:
        op = get_op(case.op)
    except Exception:
        return False
    return str(case) in {str(s) for s in tier_cases(op, getattr(case, "tier", "fast"))}


def repro_command(case, adapter, mode: str = "auto", by_repr: bool = False,
                  ad: str = "rev", order: int = 1) -> str | None:
    """The one-line gradcheck command that re-runs exactly this case in this engine, e.g.
    `gradcheck --engine ggml --op pool_2d -k '<case>'` for a registry sample, or
    `gradcheck --engine ggml --repro 'Sample(...)'` for any other Sample (and any Sample
    when `by_repr`, as for generated cases); None for a case the CLI cannot name (a
    user's function)."""
    if isinstance(case, Sample) and not by_repr and _is_registry_sample(case):
        what = ["--op", case.op, "-k", str(case)]
        if case.tier == "scale":
            what[2:2] = ["--tier", "scale"]
    elif isinstance(case, Sample):
        what = ["--repro", repr(case)]
    else:
        return None
    spec = spec_of(adapter)
    words = ["gradcheck"] + ([] if spec.name == EngineAdapter.name else ["--engine", spec.name])
    for key, value in spec.options:
        if key in OPTION_FLAGS and value is not None and _DEFAULT_OPTIONS.get(key) != value:
            words += [OPTION_FLAGS[key], str(value)]
    words += what + ([] if mode == "auto" else ["--mode", mode])
    words += ([] if ad == "rev" else ["--ad", ad]) + ([] if order == 1 else ["--order",
                                                                            str(order)])
    return " ".join(_shell_word(w) for w in words)


def _shell_word(word: str) -> str:
    """`word` quoted for a POSIX shell: as shlex.quote does, except that a word holding
    single quotes (a case's repr) and nothing a shell expands inside double quotes goes in
    double quotes, which read better than shlex's '"'"' splices."""
    if "'" in word and not set(word) & set('"$`\\!'):
        return f'"{word}"'
    return shlex.quote(word)


def with_repro(result, case, adapter, mode: str, by_repr: bool = False,
               in_message: tuple[str, ...] = ("crash",), ad: str = "rev", order: int = 1):
    """`result` (changed in place and returned) with its repro command in metrics["repro"]
    when it failed, erred or crashed and the CLI can name the case (see repro_command);
    a row whose status is in `in_message` also ends its message with "; reproduce: CMD"."""
    if result.status not in FAILING:
        return result
    command = repro_command(case, adapter, mode, by_repr, ad, order)
    if command:
        result.metrics["repro"] = command
        if result.status in in_message:
            result.message += f"; reproduce: {command}"
    return result


# the longest case text --repro takes (the registry's longest repr is under 600 characters)
MAX_REPRO_CHARS = 10_000
# elements of a parsed case's inputs together, and of its output, at most: the registry's
# biggest case (scale tier) has some 4.5 million; more is a typo, not a case
MAX_CASE_ELEMENTS = 1 << 26
_EXPECTED = ("expected Sample(op='NAME', inputs=(InputSpec(name='x', shape=(3, 4)), ...), "
             "params=(('key', value), ...), dtype='f32'), as a failing case prints it")
# field -> (what it must be, in words; a check of a converted value)
_FIELDS = {
    Sample: {
        "op": ("a string", lambda v: isinstance(v, str)),
        "inputs": ("a tuple of InputSpec(...)",
                   lambda v: isinstance(v, tuple) and all(isinstance(i, InputSpec) for i in v)),
        "params": ("a tuple of ('name', value) pairs",
                   lambda v: isinstance(v, tuple) and all(
                       isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                       for p in v)),
        "dtype": ("a dtype name such as 'f32'", lambda v: isinstance(v, str)),
        "cotangent": ("a string", lambda v: isinstance(v, str)),
        "tier": ("a string", lambda v: isinstance(v, str)),
    },
    InputSpec: {
        "name": ("a string", lambda v: isinstance(v, str)),
        "shape": ("a tuple of whole numbers >= 0", lambda v: _ints(v, 0)),
        "kind": ("a string", lambda v: isinstance(v, str)),
        "low": ("a number", lambda v: _number(v)),
        "high": ("a number", lambda v: _number(v)),
        "dtype": ("None or a dtype name such as 'f32'", lambda v: v is None or isinstance(v, str)),
        "grad": ("True or False", lambda v: isinstance(v, bool)),
        "permute": ("None or a tuple of axes", lambda v: v is None or _ints(v, 0)),
        "slice": ("None or a tuple of (start, stop, step) triples",
                  lambda v: v is None or (isinstance(v, tuple) and all(
                      _ints(t, None) and len(t) == 3 for t in v))),
        "expand": ("None or a tuple of axes", lambda v: v is None or _ints(v, 0)),
        "show_range": ("True or False", lambda v: isinstance(v, bool)),
    },
}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ints(v, least: int | None) -> bool:
    return isinstance(v, tuple) and all(
        isinstance(d, int) and not isinstance(d, bool) and (least is None or d >= least)
        for d in v)


class _Refused(ValueError):
    """What makes a case text unusable, in words."""


def _literal(node, where: str):
    """The value of a literal node (a string, number, True/False/None, tuple or list
    of them, a negated number), or a Sample/InputSpec call; lists become tuples."""
    if isinstance(node, ast.Call):
        return _constructed(node, where)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_literal(e, where) for e in node.elts)
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool,
                                                                  type(None))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and \
            isinstance(node.operand, ast.Constant) and _number(node.operand.value):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    raise _Refused(f"{where}: {ast.unparse(node)[:60]!r} is not a literal (a string, number, "
                   "True, False, None or a tuple of them)")


def _constructed(node: ast.Call, where: str):
    """Sample(...) or InputSpec(...) from a call node, every field checked by name."""
    cls = {"Sample": Sample, "InputSpec": InputSpec}.get(
        node.func.id if isinstance(node.func, ast.Name) else None)
    if cls is None:
        raise _Refused(f"{where}: only Sample(...) and InputSpec(...) may be called, not "
                       f"{ast.unparse(node.func)[:60]}(...)")
    fields = _FIELDS[cls]
    names = list(fields)
    if len(node.args) > len(names):
        raise _Refused(f"{cls.__name__} takes at most {len(names)} fields, got "
                       f"{len(node.args)} positional values")
    given = dict(zip(names, node.args, strict=False))
    for keyword in node.keywords:
        if keyword.arg is None:
            raise _Refused(f"{cls.__name__}: **arguments are not taken; name each field")
        if keyword.arg not in fields:
            raise _Refused(f"{cls.__name__} has no field {keyword.arg!r} (its fields: "
                           f"{', '.join(names)})")
        if keyword.arg in given:
            raise _Refused(f"{cls.__name__}: field {keyword.arg!r} is given twice")
        given[keyword.arg] = keyword.value
    values = {}
    for name, value_node in given.items():
        value = _literal(value_node, f"{cls.__name__} field {name!r}")
        what, ok = fields[name]
        if not ok(value):
            raise _Refused(f"{cls.__name__} field {name!r} must be {what}, got "
                           f"{ast.unparse(value_node)[:60]}")
        values[name] = value
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.init]
    missing = [n for n in required if n not in values]
    if missing:
        raise _Refused(f"{cls.__name__} needs {' and '.join(missing)}")
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:       # InputSpec's messages name the input
        raise _Refused(str(exc) if cls is InputSpec else f"{values['op']}: {exc}") from None


def _checked(case: Sample) -> Sample:
    """`case` if our engine can build it and this machine can hold it: its op is
    registered, no parameter is given twice or left out (one its op's cases all give), its
    dtypes are known, its inputs' and output's
    sizes are bounded, building the op on symbolic inputs (shapes and dtypes only, nothing
    computed) accepts its inputs and params (the op's declared ranges and rules included),
    and its estimated memory fits (memory_estimate, available_memory)."""
    try:
        get_op(case.op)
    except UnknownOpError as exc:
        raise _Refused(str(exc)) from None
    names = [k for k, _ in case.params]
    twice = next((k for i, k in enumerate(names) if k in names[:i]), None)
    if twice is not None:
        raise _Refused(f"{case.op}: parameter {twice!r} is given twice")
    missing = _missing_param(case)
    if missing:
        raise _Refused(missing)
    if case.dtype not in FLOAT_DTYPES:
        raise _Refused(f"{case.op}: dtype {case.dtype!r} is not one gradcheck runs; known: "
                       f"{', '.join(FLOAT_DTYPES)}")
    for spec in case.inputs:
        if spec.dtype is not None and spec.dtype not in TENSOR_DTYPES:
            raise _Refused(f"{case.op}: input {spec.name!r}: dtype {spec.dtype!r} is unknown; "
                           f"known: "
                           f"{', '.join(TENSOR_DTYPES)}")
    elements = sum(math.prod(spec.leaf_shape) for spec in case.inputs)
    if elements > MAX_CASE_ELEMENTS:
        raise _Refused(f"{case.op}: the inputs hold {elements} elements; at most "
                       f"{MAX_CASE_ELEMENTS} are checked")
    leaves = [input_tensor(spec.leaf_shape, spec.dtype or case.dtype, name=spec.name)
              for spec in case.inputs]
    try:
        out = case.build(*leaves)
    except Exception as exc:  # noqa: BLE001  (an op's own check: ShapeError, TypeError, ...)
        raise _Refused(_inputs_problem(case) or f"{case.op} refuses this case: {exc}") \
            from None
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    size = sum(math.prod(t.shape) for t in outputs if hasattr(t, "shape"))
    if size > MAX_CASE_ELEMENTS:
        raise _Refused(f"{case.op}: the output would hold {size} elements; at most "
                       f"{MAX_CASE_ELEMENTS} are checked")
    need, have = memory_estimate(case, leaves, outputs), available_memory()
    if have is not None and need > have:
        raise _Refused(f"{case.op}: checking this case needs about {_gib(need)}, this "
                       f"machine has {_gib(have)} available")
    return case


# --- memory -------------------------------------------------------------------------------------
# What checking a case holds at its peak, in bytes, from the elements of its forward graph
# F (the op's nodes and the weighted loss's, views not counted) and of its inputs I:
#
#     need = MEMORY_BASE + MEMORY_PER_NODE_ELEMENT F + MEMORY_PER_INPUT_ELEMENT I
#
# whatever the dtype: the float64 reference, torch's float64 autograd, the precision check
# and the numerical check (fast mode: DIRECTIONS random directions over the inputs, each
# also in the leaves' layout, for each step size) dominate; the backward graph is about the
# forward's size again plus the inputs' gradients. An upper bound of the address space that
# `gradcheck --repro` added after parsing (what RLIMIT_AS counts; resident memory grew by
# less) on cases of 0.5 to 8 million elements (relu, sum, matmul, softmax, conv_2d,
# repeat, attention_fwd; float16 to float64; the scale tier): the estimate is 1.4 to 2.4
# times what they took. MEMORY_BASE is what the rest of the run adds to a process that has
# parsed its case (torch, the kernels, BLAS's and the engine's threads): 565 MiB for the
# smallest case, 880 MiB with a matrix product.
MEMORY_BASE = 1 << 30
MEMORY_PER_NODE_ELEMENT = 96
MEMORY_PER_INPUT_ELEMENT = 348


def memory_estimate(case: Sample, leaves, outputs) -> int:
    """The bytes checking `case` needs at its peak (the formula above), given the symbolic
    `leaves` it was built on and the `outputs` they gave (nothing is computed or
    allocated)."""
    loss = [ops.sum(ops.mul(t, input_tensor(t.shape, t.dtype))) for t in outputs
            if hasattr(t, "shape") and is_float(t.dtype)]
    graph = engine.Graph([*loss, *(t for t in outputs if hasattr(t, "op") and t.op)])
    nodes = sum(t.size for t in graph.nodes if t.op and t.view_of is None)
    inputs = sum(t.size for t in leaves)
    return MEMORY_BASE + MEMORY_PER_NODE_ELEMENT * nodes + MEMORY_PER_INPUT_ELEMENT * inputs


def _proc_kib(path: str, key: str) -> int | None:
    """The value in KiB of `key` in a /proc file of "Key:   123 kB" lines (None if absent)."""
    try:
        with open(path) as f:
            found = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) if found else None


def available_memory() -> int | None:
    """The bytes this process can still allocate: the machine's available memory
    (/proc/meminfo's MemAvailable, else os.sysconf's available pages), and no more than
    what RLIMIT_AS and RLIMIT_DATA leave above the process's address space and data as they
    are now; None where none of these can be read."""
    have = []
    avail = _proc_kib("/proc/meminfo", "MemAvailable")
    if avail is not None:
        have.append(avail << 10)
    else:
        try:
            have.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    for limit, key in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft = resource.getrlimit(limit)[0]
        used = _proc_kib("/proc/self/status", key)
        if soft != resource.RLIM_INFINITY and used is not None:
            have.append(max(0, soft - (used << 10)))
    return min(have) if have else None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _missing_param(case: Sample) -> str | None:
    """'rms_norm: the case gives no 'eps' ...' when `case` leaves out a parameter that every
    registry case of its op gives: the references (torch's, a backward op's primals) take
    those as the cases give them, not the builder's defaults (None when it gives them)."""
    op = get_op(case.op)
    cases = [*(op.samples() if op.samples else ()), *(op.scale() if op.scale else ())]
    if not cases:
        return None
    every = set.intersection(*(set(dict(c.params)) for c in cases))
    missing = sorted(every - set(dict(case.params)))
    if not missing:
        return None
    return (f"{case.op}: the case gives no {missing[0]!r}; its cases give every one of "
            f"{', '.join(sorted(every))}")


def _inputs_problem(case: Sample) -> str | None:
    """'relu takes 1 input (x), got 2' when the op's registry samples all take another
    number of inputs than `case` (None when they agree with it, or among themselves not)."""
    samples = get_op(case.op).samples
    names = {tuple(i.name for i in s.inputs) for s in (samples() if samples else ())}
    if len(names) != 1:
        return None
    (expected,) = names
    if len(expected) == len(case.inputs):
        return None
    return (f"{case.op} takes {len(expected)} input{'s' * (len(expected) != 1)} "
            f"({', '.join(expected)}), got {len(case.inputs)}")


def parse_case(text: str) -> Sample:
    """A Sample from its repr (as printed in a repro command), checked in full (see
    _checked); ValueError saying in words what is wrong with anything else.

    Only the constructors Sample and InputSpec with literal arguments are accepted: the text
    is parsed, never evaluated, and at most MAX_REPRO_CHARS of it."""
    text = text.strip()
    if not text:
        raise ValueError(f"empty case: {_EXPECTED}")
    if len(text) > MAX_REPRO_CHARS:
        raise ValueError(f"the case text is {len(text)} characters long; at most "
                         f"{MAX_REPRO_CHARS} are read ({_EXPECTED})")
    try:
        with warnings.catch_warnings():      # a SyntaxWarning would be a second line
            warnings.simplefilter("ignore")
            tree = ast.parse(text, mode="eval").body
        case = _literal(tree, "the case")
    except _Refused as exc:
        raise ValueError(str(exc)) from None
    except SyntaxError as exc:
        raise ValueError(f"not Python syntax ({exc.msg.split(';')[0]}, column {exc.offset}): "
                         f"{_EXPECTED}") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"the case text is nested too deeply to read: {_EXPECTED}") from None
    if not isinstance(case, Sample):
        raise ValueError(f"not a case: {_EXPECTED}")
    try:
        return _checked(case)
    except _Refused as exc:
        raise ValueError(str(exc)) from None
