"""The graph file format: what engine.graph_io writes and reads, and how it encodes values.

`general.architecture` is "gradverify-graph". The file holds a table of N entries: entries
0..n-1 are the graph's nodes in its own topological order, entries n..N-1 the persistent
leaves it uses without holding them as nodes (the gradient accumulators). Keys:

    graph.format_version        int, FORMAT_VERSION
    graph.name, graph.node_count    the Graph's name; n
    graph.node.name/op/dtype/flags  N strings each; op "" for a leaf; flags "OUTPUT|PARAM"
    graph.node.ndim, .dims      each entry's rank; all the shapes, concatenated
    graph.node.nsrcs, .srcs     each entry's source count; all the sources, concatenated
    graph.node.params           N strings: each entry's op params as JSON (below)
    graph.outputs               Graph.outputs, in order
    graph.backward              bool: a backward pass was built; then also
    graph.backward.accumulate   bool; graph.backward.loss_grad: the seed leaf;
    graph.backward.loss         the LOSS-flagged node (-1 unless there is exactly one)
    graph.backward.grad_params, .grads   param grad_params[k] has gradient grads[k]
    graph.backward.acc_params, .accs     param acc_params[k] has accumulator accs[k]
    graph.role.names, .nodes    the tensors the caller named (`roles`)

References are entry indices. An entry has at most MAX_RANK axes, and all entries together
at most MAX_GRAPH_ELEMENTS elements (loading is symbolic, but computing the graph allocates
them; a training graph of ggml's MNIST CNN at batch 1000 holds under 2^28). An integer
array that would be empty is left out (a GGUF array cannot be empty) and reads back as
empty. Every leaf is persistent (input, param, accumulator,
state; constants and the loss-gradient seed are inputs); GGUF tensor `node.<i>` holds leaf i's
current value, so the imported graph computes and trains on exactly as the exported one
would. Ranks 1 to 4 keep their shape, others are stored as (size,). Keys that do not start
with "graph." are the caller's metadata.

Op params are one JSON object, name -> value, read with json.loads and nothing else (no file
here ever runs code on load; a string holding Python is just a string the op rejects):

    None, bool, int, str     as JSON (true stays a bool, 1 stays an int)
    float, finite            a JSON number, Python's repr: exact, -0.0 included
    float, NaN or +-Inf      {"float": "nan" | "inf" | "-inf"} (NaN sign and payload dropped)
    tuple / list             a JSON array, read as a tuple / {"list": [...]}

Anything else (numpy scalars too: a kernel may compute differently with np.float32 than with
float) is refused on export. So that no file can make a load recurse, loop or allocate without
bound, the params text of one node is at most MAX_PARAMS_CHARS characters, nests at most
MAX_PARAMS_DEPTH arrays and objects deep (the object itself counts; pads, a tuple of pairs,
is 3), and holds integers in [-2^63, 2^64) (int64 and uint64, GGUF's integers) and finite
bare numbers; each is checked before or while the JSON is decoded, on export too. The types
and ranges of each param are the op's checks (engine.registry's OpDef.params).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from engine.gguf_io import GGUFFormatError
from engine.tensor import Flag

ARCH = "gradverify-graph"
FORMAT_VERSION = 1
PREFIX = "graph."
FLAG_NAMES = [name for name, f in Flag.__members__.items() if f.value]
_SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
MAX_RANK = 32                    # numpy's limit on every version
MAX_GRAPH_ELEMENTS = 2 ** 32
MAX_PARAMS_CHARS = 65536
MAX_PARAMS_DEPTH = 8
INT_RANGE = (-2 ** 63, 2 ** 64)   # [low, high): int64 and uint64 (dropout's seed)
_INT_DIGITS = 20                  # 2^64 has 20 digits: a longer literal is out of range
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


class GraphFileError(GGUFFormatError):
    """A graph that cannot be written as a graph file, or a file that is not a valid one."""


# --- flags -----------------------------------------------------------------------------------

def flags_text(flag: Flag) -> str:
    """'OUTPUT|PARAM' ('' for none), the same on every Python version."""
    return "|".join(name for name in FLAG_NAMES if flag & Flag[name])


def parse_flags(text: str, at: str) -> Flag:
    """The Flag of flags_text's `text`; GraphFileError (prefixed `at`) for an unknown name."""
    flag = Flag.NONE
    for name in filter(None, text.split("|")):
        if name not in FLAG_NAMES:
            raise GraphFileError(f"{at}: unknown flag {name!r}; known: {FLAG_NAMES}")
        flag |= Flag[name]
    return flag


# --- op params as JSON -----------------------------------------------------------------------

def encode_params(params: dict[str, Any], where: str = "params") -> str:
    """The JSON text of an op's params (encoding in the module docstring)."""
    bad = [k for k in params if not isinstance(k, str)]
    if bad:
        raise GraphFileError(f"{where}: param name {bad[0]!r} is not a string")
    text = json.dumps({k: _encode(v, f"{where}: param {k!r}") for k, v in params.items()},
                      allow_nan=False)
    _check_size(text, where)   # what could not be read back is not written
    return text


def _encode(v, where):
    if type(v) is int and not INT_RANGE[0] <= v < INT_RANGE[1]:
        raise GraphFileError(f"{where}: integer of {v.bit_length()} bits is outside "
                             "[-2^63, 2^64) (int64 and uint64)")
    if v is None or type(v) in (bool, int, str):
        return v
    if type(v) is float:
        return v if math.isfinite(v) else {"float": "nan" if math.isnan(v) else
                                           ("inf" if v > 0 else "-inf")}
    if type(v) is tuple:
        return [_encode(x, where) for x in v]
    if type(v) is list:
        return {"list": [_encode(x, where) for x in v]}
    raise GraphFileError(f"{where}: value {v!r} of type {type(v).__name__} cannot be stored; "
                         "op params hold None, bool, int, float, str, tuples and lists")


def decode_params(text: str, where: str = "params") -> dict[str, Any]:
    """The params dict of JSON `text` written by encode_params; GraphFileError otherwise."""
    def no_constant(name):
        raise GraphFileError(f"{where}: bare {name} in params JSON; non-finite floats are "
                             'written {"float": "nan"}')
    _check_size(text, where)
    try:
        value = json.loads(text, parse_constant=no_constant, parse_int=_parse_int,
                           parse_float=_parse_float)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise GraphFileError(f"{where}: params are not valid JSON ({exc}): {text[:200]!r}") \
            from None
    if not isinstance(value, dict):
        raise GraphFileError(f"{where}: params must be a JSON object, got {text[:200]!r}")
    return {k: _decode(v, f"{where}: param {k!r}") for k, v in value.items()}


def _check_size(text: str, where: str) -> None:
    """Refuse params text longer than MAX_PARAMS_CHARS or nested deeper than
    MAX_PARAMS_DEPTH, in one pass without recursion (brackets inside strings don't count)."""
    if len(text) > MAX_PARAMS_CHARS:
        raise GraphFileError(f"{where}: params are {len(text)} characters long, more than "
                             f"{MAX_PARAMS_CHARS}")
    depth = 0
    for bracket in _BRACKET.finditer(_STRING.sub('""', text)):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > MAX_PARAMS_DEPTH:
            raise GraphFileError(f"{where}: params nest more than {MAX_PARAMS_DEPTH} arrays "
                                 "and objects deep (no op param nests more than 3)")


class _Refused:
    """A JSON number decode_params refuses; _decode raises naming the param holding it."""

    def __init__(self, problem: str):
        self.problem = problem


def _parse_int(literal: str):
    # int() of a long literal is slow and Python refuses > 4300 digits (a ValueError)
    digits = len(literal.lstrip("-"))
    if digits <= _INT_DIGITS and INT_RANGE[0] <= int(literal) < INT_RANGE[1]:
        return int(literal)
    return _Refused(f"integer {literal[:24]}{'...' if len(literal) > 24 else ''} "
                    f"({digits} digits) is outside [-2^63, 2^64) (int64 and uint64)")


def _parse_float(literal: str):
    value = float(literal)
    if math.isfinite(value):
        return value
    return _Refused(f"number {literal[:24]} is not a finite float; non-finite floats are "
                    'written {"float": "inf"}')


def _decode(v, where):
    if isinstance(v, _Refused):
        raise GraphFileError(f"{where}: {v.problem}")
    if isinstance(v, list):
        return tuple(_decode(x, where) for x in v)
    if isinstance(v, dict):
        if list(v) == ["float"] and v["float"] in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[v["float"]]
        if list(v) == ["list"] and isinstance(v["list"], list):
            return [_decode(x, where) for x in v["list"]]
        raise GraphFileError(f"{where}: unknown tagged value {json.dumps(v)[:200]}")
    return v
