"""Op parameters from the three sides they come in (issue 31), each drawn across every op's
declared ranges (engine.params), their edges and beyond, other types, missing, unknown and
repeated ones:

- the API: make_node on a sample node's sources (the composites: their builders), in this
  process, computing only outputs of at most COMPUTE_LIMIT elements (the engine refuses
  more than 2^40): a ParamError, ShapeError or DTypeError naming the op, or a finite
  output (tests.engine.test_op_params.Subject);
- graph files: a saved graph of an op's sample whose node params are rewritten, loaded (and
  computed) in the bounded child: valid, or GraphFileError in one line naming the file;
- `gradcheck --repro` on a sample whose params are rewritten, in the bounded child: exit
  0 or 1 with no row that erred unexpectedly (a kernel raising), or exit 2 with one line,
  never a traceback, a hang or the memory bound.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.gguf_io import load_gguf
from engine.graph_format import GraphFileError, decode_params, encode_params
from engine.graph_io import save_graph
from tests.engine.test_graph_io import sample_graph
from tests.engine.test_graph_io_malformed import node_edit, rewrite
from tests.engine.test_op_params import MISSING, OPS, _drawn, _first_case, subject
from tests.fuzz.checks import _fail, _surveyed, check_cli, check_load, fuzz_settings

pytestmark = pytest.mark.fuzz

WITH_PARAMS = sorted(n for n, op in OPS.items() if op.params)
# graph files hold primitives (composites are stored as what they are made of); every op of
# a sample graph can be the one rewritten
IN_GRAPHS = sorted(n for n in WITH_PARAMS if OPS[n].kind != "composite" and OPS[n].samples)
WITH_SAMPLES = sorted(n for n in OPS if OPS[n].samples)
# values for a builder argument that is not declared (sum's axis; a name the op lacks)
ANY_VALUE = st.sampled_from([0, -1, 1, 2, 2 ** 31, 2 ** 63, 10 ** 30, 1.5, -0.0, 1e308,
                             True, None, "x", "", (0,), (1, 2), ((0, 1),), ()])


def _mutated(data, declared, current: dict) -> list[tuple[str, object]]:
    """`current` (name -> value) with some declared parameters redrawn or dropped, now and
    then an unknown one added or one given twice: (name, value) pairs in order."""
    names = sorted(set(declared) | set(current) | {"mystery"})
    pairs = dict(current)
    for name in data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3,
                                   unique=True), label="changed"):
        if name in declared:
            now = current.get(name, () if declared[name].kind in ("ints", "int_rows")
                              else MISSING)
            value = data.draw(st.one_of(st.just(MISSING), _drawn(
                declared[name], now if now is not MISSING else ())), label=name)
        else:
            value = data.draw(st.one_of(st.just(MISSING), ANY_VALUE), label=name)
        if value is MISSING:
            pairs.pop(name, None)
        else:
            pairs[name] = value
    out = list(pairs.items())
    extra = data.draw(st.sampled_from(["none", "none", "none", "unknown", "twice"]),
                      label="extra")
    if extra == "unknown":
        out.append(("mystery", data.draw(ANY_VALUE, label="mystery")))
    elif extra == "twice" and out:
        name, _ = data.draw(st.sampled_from(out), label="twice")
        out.append((name, data.draw(ANY_VALUE, label="again")))
    return out


# --- the API ------------------------------------------------------------------------------------

@fuzz_settings(short=40, long=20000)
@given(data=st.data())
def test_op_params_through_the_api(fuzz_env, data):
    name = data.draw(st.sampled_from(WITH_PARAMS), label="op")
    s = subject(name)
    params = dict(_mutated(data, OPS[name].params, s.params))   # a dict: no name twice
    fuzz_env.count("op_params")
    try:
        s.run(params)
    except (AssertionError, pytest.fail.Exception) as exc:
        _fail(fuzz_env, "op_params", str(exc).splitlines()[0][:300], (name, params))


# --- graph files ------------------------------------------------------------------------------

_GRAPHS: dict[str, bytes] = {}


def _graph_bytes(env, name: str) -> bytes:
    """A graph file of `name`'s first sample (forward and backward), saved once."""
    if name not in _GRAPHS:
        graph, _ = sample_graph(_first_case(OPS[name]))
        path = os.path.join(env.cases, f"base-{name}.gguf")
        save_graph(path, graph)
        with open(path, "rb") as f:
            _GRAPHS[name] = f.read()
    return _GRAPHS[name]


def _json_value(value) -> str:
    """`value` as graph_format writes it, or (for what it refuses: 10**30 is fine, 2**64
    is not) as a bare JSON literal that the loader must refuse."""
    try:
        return encode_params({"v": value})[len('{"v": '):-1]
    except GraphFileError:
        return json.dumps(value) if isinstance(value, (str, bool)) or value is None \
            else str(value)


@fuzz_settings(short=12, long=4000)
@given(data=st.data())
def test_op_params_in_graph_files(fuzz_env, data):
    """The first node of the op in its sample's graph file, its params rewritten."""
    name = data.draw(st.sampled_from(IN_GRAPHS), label="op")
    path = os.path.join(fuzz_env.cases, "op-params.gguf")
    with open(path, "wb") as f:
        f.write(_graph_bytes(fuzz_env, name))
    meta = load_gguf(path).metadata
    at = meta["graph.node.op"].index(name)
    current = decode_params(meta["graph.node.params"][at])
    pairs = _mutated(data, OPS[name].params, current)
    text = "{" + ", ".join(f"{json.dumps(k)}: {_json_value(v)}" for k, v in pairs) + "}"
    rewrite(path, node_edit("graph.node.params", name, text))
    with open(path, "rb") as f:
        mutated = f.read()
    fuzz_env.count("graph op params")
    check_load(fuzz_env, "graph", mutated, (name, text[:400]))


# --- gradcheck --repro ------------------------------------------------------------------------

@fuzz_settings(short=5, long=1200)
@given(data=st.data())
def test_op_params_in_repro_cases(fuzz_env, data):
    """`gradcheck --repro` on an op's first sample with its params rewritten (as builder
    arguments, which are the case's): a usage error for what the op refuses, never an error
    row from a kernel."""
    name = data.draw(st.sampled_from(WITH_SAMPLES), label="op")
    case = _first_case(OPS[name])
    pairs = _mutated(data, OPS[name].params, dict(case.params))
    text = repr(dataclasses.replace(case, params=tuple(pairs)))
    argv = ["--repro", text, "--no-progress", "--output", "{scratch}/rows.txt"]
    fuzz_env.count("cli:gradcheck --repro params")
    if check_cli(fuzz_env, "gradcheck", argv) in (0, 1):
        _no_error_row(fuzz_env, argv)


@_surveyed
def _no_error_row(env, argv) -> None:
    """A run that got past the usage checks has no row where the engine raised."""
    report = os.path.join(env.scratch, "rows.txt")
    if os.path.exists(report):
        with open(report, encoding="utf-8", errors="replace") as f:
            rows = f.read()
        if "error: unexpected" in rows:
            line = next(x for x in rows.splitlines() if "error: unexpected" in x)
            _fail(env, "cli:gradcheck", f"an error row: {line.strip()[:200]}", argv)
