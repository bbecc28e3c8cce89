"""Op parameter checks (engine.params, OpDef.params): strict on types, the same for a user's
call and a graph file, declared by every op."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine
from engine import ops
from engine.errors import EngineError, ParamError
from engine.params import (
    INT64_MAX,
    INT64_MIN,
    boolean,
    choice,
    int_rows,
    int_tuple,
    integer,
    ints,
    number,
    pair,
)
from engine.registry import all_ops, make_node
from tests.engine.test_graph_io import SAMPLES, sample_graph

OPS = all_ops()


def repr_short(value) -> str:
    return f"int of {len(str(value // 10 ** 4000)) + 4000} digits" \
        if isinstance(value, int) and abs(value) > 10 ** 30 else repr(value)


# --- the helpers -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", [True, False, np.True_, 500.0, 2.5, "3", None, (3,),
                                   INT64_MAX + 1, INT64_MIN - 1, 10 ** 5000], ids=repr_short)
def test_integer_refuses_bools_floats_strings_and_beyond_int64(value):
    with pytest.raises(ParamError, match=r"^op: k must be an int"):
        integer("op", "k", value)


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3), np.int32(3)])
def test_integer_takes_numpy_integers_as_ints(value):
    out = integer("op", "k", value)
    assert out == 3 and type(out) is int


@pytest.mark.parametrize("value", [0, 1, "True", None, 1.0])
def test_boolean_refuses_what_is_not_a_bool(value):
    with pytest.raises(ParamError, match="op: flag must be True or False"):
        boolean("op", "flag", value)


def test_boolean_takes_numpy_bools():
    assert boolean("op", "flag", np.True_) is True


@pytest.mark.parametrize("value", [True, "1.0", None, math.nan, math.inf, 10 ** 400, (1.0,)],
                         ids=repr_short)
def test_number_refuses_non_numbers_nan_inf_and_overflow(value):
    with pytest.raises(ParamError, match="op: eps "):
        number("op", "eps", value)


def test_number_gives_floats_and_takes_inf_when_told():
    assert [number("op", "x", v) for v in (2, np.float32(0.5), np.int64(3))] == [2.0, 0.5, 3.0]
    assert number("op", "x", -math.inf, finite=False) == -math.inf


@pytest.mark.parametrize("check, value", [
    (pair, (1, 2.0)), (pair, (True, 1)), (pair, 2.0), (pair, (1, 2, 3)),
    (ints, (500.0,)), (ints, (True, False)), (ints, "12"), (ints, 3), (ints, (2 ** 63,)),
    (int_rows(2), ((0, 1), (0.0, 1))), (int_rows(2), ((0, 1, 2),)), (int_rows(3), "abc"),
    (choice("max", "avg"), "min"), (choice("max", "avg"), 1),
])
def test_sequence_and_choice_checks_are_strict(check, value):
    with pytest.raises(ParamError, match="^op: p"):
        check("op", "p", value)


def test_sequence_checks_give_canonical_tuples():
    assert pair("op", "p", np.int64(2)) == (2, 2)
    assert ints("op", "p", (np.int32(-1), 4)) == (-1, 4)
    assert int_rows(2)("op", "p", ((0, 1), (2, np.int64(3)))) == ((0, 1), (2, 3))
    assert int_tuple("op", "p", [1, np.int64(2)], 2) == (1, 2)
    assert int_tuple("op", "p", np.array([2, 3])) == (2, 3)


@pytest.mark.parametrize("check, value", [(ints, [1, 2]), (int_rows(2), [(0, 1)]),
                                          (int_rows(2), ([0, 1],))])
def test_node_params_are_tuples_not_lists(check, value):
    """What make_node checks is the form a node stores: a builder turns lists into tuples."""
    with pytest.raises(ParamError, match="op: p must be a tuple of"):
        check("op", "p", value)


# --- every op declares its params, strictly ---------------------------------------------------

def test_every_op_declares_its_params():
    """make_node checks what an op declares; an op that builds nodes declares its params,
    and every sample node's params are declared."""
    from engine.params import Params
    assert [n for n, op in OPS.items() if not isinstance(op.params, Params)] == []
    undeclared = set()
    for sample in FIRST_SAMPLES:
        graph, _ = sample_graph(sample)
        undeclared |= {(t.op, k) for t in graph.nodes if t.op for k in t.params
                       if k not in OPS[t.op].params}
    assert undeclared == set()


def _wrong(v):
    """Values of the wrong type (or beyond int64 and uint64) in place of a well-formed `v`."""
    if type(v) is bool:
        return [0, 1, "True", None]
    if type(v) is int:
        return [float(v), True, str(v), None, 2 ** 64]
    if type(v) is float:
        return [True, str(v), None, math.nan, 10 ** 400]
    if type(v) is str:
        return [v + "x", 1, None]
    if type(v) is tuple and v:
        head = v[0]
        inner = [(w,) + head[1:] for w in (float(head[0]), True)] \
            if type(head) is tuple and head else _wrong(head)
        return ["ab", None] + [(w,) + v[1:] for w in inner]
    return []


# the first sample of every op (with dtype f32 where it has one)
FIRST_SAMPLES = [next(run) for _, run in itertools.groupby(SAMPLES, lambda s: s.op)]


@pytest.mark.parametrize("sample", FIRST_SAMPLES, ids=lambda s: s.op)
def test_malformed_params_raise_param_errors_for_every_node(sample):
    """Every forward and backward node of the op's first sample, rebuilt with one param of a
    wrong type: make_node raises an EngineError (a ParamError, or a ShapeError for a value
    that does not fit), never accepts it, never a TypeError from deeper down."""
    graph, _ = sample_graph(sample)
    for t in graph.nodes:
        for k, v in t.params.items() if t.op else ():
            for bad in _wrong(v):
                with pytest.raises(EngineError):
                    make_node(t.op, t.srcs, **{**t.params, k: bad})
                    pytest.fail(f"{t.op} accepted {k}={bad!r}")


@given(st.one_of(st.floats(), st.booleans(), st.text(max_size=3), st.none()))
def test_shape_params_take_only_ints(bad):
    x = engine.param((2, 3), name="x")
    for build in (lambda: ops.reshape(x, (6, bad)), lambda: ops.broadcast_to(x, (bad, 2, 3)),
                  lambda: ops.permute(x, (bad, 0)), lambda: ops.sum(x, (bad,)),
                  lambda: ops.pad(x, ((0, bad), (0, 0))), lambda: ops.concat(x, x, bad)):
        with pytest.raises(ParamError):
            build()


def test_builders_no_longer_truncate_or_coerce():
    x = engine.param((2, 3), name="x")
    with pytest.raises(ParamError, match=r"reshape: shape must be a sequence of ints.*6\.5"):
        ops.reshape(x, (6.5,))
    with pytest.raises(ParamError, match="sum: keepdims must be True or False, got 'False'"):
        ops.sum(x, keepdims="False")
    with pytest.raises(ParamError, match="sgd_step: nesterov must be True or False, got 1"):
        make_node("sgd_step", (x, x, engine.input_tensor((), "f64"),
                               engine.input_tensor((5,), "f64"), x), nesterov=1)
    with pytest.raises(ParamError, match="scale: parameter scale is too large"):
        ops.scale(x, 10 ** 400)


def test_builders_take_numpy_integers_and_well_formed_values():
    x = engine.param((2, 3), name="x")
    assert ops.reshape(x, (np.int64(3), 2)).params == {"shape": (3, 2)}
    assert ops.permute(x, (np.int32(1), 0)).params == {"axes": (1, 0)}
    assert ops.sum(x, np.int64(1), keepdims=np.True_).params == {"axes": (1,), "keepdims": True}
    assert type(ops.concat(x, x, np.int64(0)).params["axis"]) is int
