"""Drawn ranges and input views through gradcheck: repros reproduce them, every adapter hands
its engine the strided view (sliced: an offset and strides; expanded: stride 0), gradients
come back in the layout the op sees, and the strategies draw ranges and views."""

from __future__ import annotations

import shlex

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from engine.registry import get_op
from engine.samples import InputSpec, Sample
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.adapters.numpy_adapter import NumpyAdapter
from gradcheck.adapters.torch_adapter import TorchAdapter
from gradcheck.check import check_sample
from gradcheck.cli import main
from gradcheck.repro import parse_case, repro_command

SLICED = InputSpec("x", (4, 4), "uniform", -2.0, 2.0, slice=((1, 5, 1), (0, 8, 2)),
                   show_range=True)
EXPANDED = InputSpec("x", (3, 4), "uniform", -2.0, 2.0, expand=(1,), show_range=True)
BOTH = InputSpec("x", (3, 4), slice=((1, 4, 1), (2, 3, 1)), expand=(1,))
VIEWED = [Sample.make("tanh", [spec], dt) for spec in (SLICED, EXPANDED, BOTH)
          for dt in ("f32", "f64")]


@pytest.mark.parametrize("case", VIEWED, ids=str)
def test_the_repr_of_a_viewed_case_parses_back_to_it(case):
    back = parse_case(repr(case))
    assert back == case and str(back) == str(case) and back.seed() == case.seed()
    for a, b in zip(back.generate_inputs(), case.generate_inputs(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_repro_command_reruns_the_drawn_case(capsys):
    case = Sample.make("tanh", [SLICED], "f64")
    command = repro_command(case, EngineAdapter(), by_repr=True)
    words = shlex.split(command)
    assert words[:2] == ["gradcheck", "--repro"] and parse_case(words[2]) == case
    assert main(words[1:] + ["--no-progress", "--show", "all"]) == 0
    assert "x=[4,4]slice[1:5,0:8:2]range[-2,2]" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["full", "fast"])
@pytest.mark.parametrize("case", VIEWED, ids=str)
def test_viewed_cases_pass_in_our_engine_and_torchs(case, mode):
    for adapter in (EngineAdapter(), TorchAdapter()):
        result = check_sample(case, mode=mode, adapter=adapter)
        assert result.status == "pass", (adapter.name, result.message)


def _strides_seen(case, adapter_of):
    """The (element) strides and base offsets of the inputs the engine's function gets."""
    seen = []
    result = check_sample(case, adapter=adapter_of(seen))
    assert result.status == "pass", result.message
    return seen[0]


def test_torch_gets_the_strided_views():
    def adapter_of(seen):
        def fn(x):
            seen.append((x.stride(), x.storage_offset()))
            return x.tanh()
        return TorchAdapter(fn)
    # a [6, 8] leaf, from row 1, every other column; a [5, 5] one at row 1, column 2
    assert _strides_seen(Sample.make("tanh", [SLICED], "f64"), adapter_of) == ((8, 2), 8)
    assert _strides_seen(Sample.make("tanh", [BOTH], "f64"), adapter_of) == ((5, 0), 7)


def test_numpy_gets_the_strided_views_and_its_vjp_is_summed_along_expanded_axes():
    def adapter_of(seen):
        def forward(x):
            seen.append((tuple(s // x.itemsize for s in x.strides), x.flags.writeable))
            return np.tanh(x)
        return NumpyAdapter(forward, lambda w, x: [w * (1 - np.tanh(x) ** 2)])
    assert _strides_seen(Sample.make("tanh", [SLICED], "f64"), adapter_of) == ((8, 2), True)
    assert _strides_seen(Sample.make("tanh", [EXPANDED], "f64"), adapter_of) == ((1, 0), False)


class PerElement(NumpyAdapter):
    """An engine that says it returns its leaves' gradients, but returns the gradient of
    each element of an expanded view (no sum along the expanded axis)."""

    leaf_gradients = True


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_per_element_gradients_are_gathered_into_the_leaf_unless_said_otherwise(mode):
    vjp = (np.tanh, lambda w, x: [w * (1 - np.tanh(x) ** 2)])
    for spec in (SLICED, EXPANDED, BOTH):
        case = Sample.make("tanh", [spec], "f64")
        assert check_sample(case, mode=mode, adapter=NumpyAdapter(*vjp)).status == "pass"
        want = "fail" if spec.expand else "pass"
        assert check_sample(case, mode=mode, adapter=PerElement(*vjp)).status == want


# --- strategies: drawn ranges and views ---------------------------------------------------------
OPS = ["tanh", "clamp", "hardswish", "add", "div", "softmax", "norm", "matmul", "pool_2d",
       "sum", "get_rows", "conv_2d"]


@pytest.mark.parametrize("name", OPS)
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_drawn_case_prints_its_ranges_and_its_repr_reproduces_it(name, data):
    case = data.draw(get_op(name).strategy(data.draw(st.sampled_from(["f32", "f64"]))))
    for spec in case.inputs:
        if spec.kind != "int":
            assert spec.show_range and f"[{_g(spec.low)},{_g(spec.high)}]" in str(spec), case
    back = parse_case(repr(case))
    assert back == case and str(back) == str(case)
    for spec, a, b in zip(case.inputs, back.generate_inputs(), case.generate_inputs(),
                          strict=True):
        np.testing.assert_array_equal(a, b)
        if spec.kind in ("uniform", "distinct"):
            assert spec.low <= np.nanmin(a) and np.nanmax(a) <= spec.high


@pytest.mark.parametrize("view", ["permute", "slice", "expand"])
def test_the_strategies_draw_every_view(view):
    strategy = get_op("add").strategy("f32")
    found = find(strategy, lambda case: any(getattr(s, view) for s in case.inputs),
                 settings=settings(database=None, max_examples=2000))
    assert any(getattr(s, view) for s in found.inputs)


def test_the_strategies_draw_special_ranges():
    """tanh's saturation, clamp's inputs next to a bound, the norms' tiny magnitudes."""
    cases = {"tanh": lambda c: c.inputs[0].kind == "away_from_zero" and c.inputs[0].low >= 4,
             "clamp": lambda c: abs(c.inputs[0].high - c.kwargs["min"]) <= 0.1,
             "rms_norm": lambda c: max(abs(c.inputs[0].low), abs(c.inputs[0].high)) <= 1e-3}
    for name, predicate in cases.items():
        find(get_op(name).strategy("f64"), predicate,
             settings=settings(database=None, max_examples=2000))


def _g(v) -> str:
    return f"{v:g}"


@pytest.mark.parametrize("case", [
    # drawn by the sweeps: a tiny a beside a huge expanded b, whose loss terms cancel (the
    # small step drowned in rounding, and the estimate of it took the loss, not its terms)
    Sample.make("acc", [InputSpec("a", (5, 4), low=-0.001, high=0.001, show_range=True),
                        InputSpec("b", (4, 4), low=-1000.0, high=1000.0, expand=(1,),
                                  show_range=True)], "f32", offset=(1, 0)),
    # rows of 1e-3s (the fixed step straddled rms_norm's curvature: false kinks)
    Sample.make("rms_norm", [InputSpec("x", (5, 2, 5, 2), low=-0.001, high=-0.0005,
                                       show_range=True)], "f64", eps=1e-6)], ids=str)
def test_tiny_inputs_are_checked_without_false_alarms_or_kinks(case):
    result = check_sample(case)
    assert result.status == "pass" and result.metrics["kinks"] == 0, result.message
    assert result.metrics["max_rel_err"] < 1e-5


def test_a_strided_leaf_reaches_torch_contiguous():
    """torch.tensor keeps a strided array's layout, and torch's conv_transpose2d backward
    refuses a strided weight ("grad_weight needs to be contiguous"): the torch reference
    copies leaves contiguous, so the case (found by --random) is judged, not an error."""
    case = Sample(op="conv_transpose_2d", inputs=(
        InputSpec(name="x", shape=(2, 3, 4, 3), kind="uniform", low=2.0, high=4.0,
                  expand=(1,)),
        InputSpec(name="w", shape=(3, 3, 1, 3), kind="uniform", low=-1.0, high=0.5,
                  expand=(1,))), params=(("stride", (2, 1)),), dtype="f64")
    r = check_sample(case)
    assert r.status == "pass", r.message
