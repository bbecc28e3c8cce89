"""Generated cases: every registry op's hypothesis strategy, checked as its samples are.

For each op with a `strategy`, hypothesis draws cases of both float dtypes, and each case
must (a) be a small, well-formed case of that op that builds, with its inputs off the op's
kinks, (b) agree with the op's torch reference, forward and (where the op is
differentiable) backward, and (c) pass gradcheck against float64 finite differences, with
no kinks. The slow test draws 10 cases per op, the fast one 3, both checking (a)-(c);
`test_generated_cases_match_torch` checks (a) and (b) on as many cases as the hypothesis
profile gives (tests/conftest.py; derandomized under CI).
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.registry import all_ops
from engine.samples import Sample
from engine.strategies import MAX_ELEMENTS, broadcast_pair, shapes, window_axis
from gradcheck.check import check_sample
from tests.engine.ops.op_harness import TOL, run_engine, run_torch
from tests.engine.ops.test_unary import NAMES as UNARY_NAMES
from tests.engine.ops.test_unary import _assert_off_kinks

OPS = {name: op for name, op in all_ops().items() if op.strategy}
DTYPES = ("f32", "f64")


@pytest.fixture(autouse=True)
def _one_numba_thread():
    """The finite-difference loop runs thousands of tiny graphs; numba's thread pool costs
    more than it saves on them (and xdist workers already share the cores)."""
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)


def _tolerance(precision, *arrays) -> dict:
    """TOL of `precision`, its atol times the largest magnitude among the float `arrays`
    (at least 1): the drawn ranges reach 1e3, and a result computed from values that large
    is good to ulps of them, not of 1 (gradcheck scales its own tolerances alike)."""
    floats = [np.abs(np.asarray(a, np.float64)) for a in arrays
              if a is not None and np.asarray(a).dtype.kind == "f" and np.size(a)]
    # finite magnitudes only: an output's infinities (diag_mask_inf's) would make atol inf
    scale = max([1.0] + [float(np.max(a[np.isfinite(a)], initial=0.0)) for a in floats])
    return dict(TOL[precision], atol=TOL[precision]["atol"] * scale)


def _check_against_torch(name, dtype, sample):
    op = OPS[name]
    # (a) a small, well-formed case of this op, its inputs off the op's kinks
    assert isinstance(sample, Sample) and sample.op == name and sample.dtype == dtype
    assert str(sample).startswith(f"{name}(type={dtype}")
    checked = sum(math.prod(s.shape) for s in sample.inputs if s.grad and s.kind != "int")
    assert checked <= MAX_ELEMENTS, f"{sample}: {checked} checked input elements"
    arrays = sample.generate_inputs()
    if name in UNARY_NAMES:
        (x,) = arrays
        assert x.size <= MAX_ELEMENTS
        _assert_off_kinks(sample, x)
    # (b) forward, and backward where there is one, against torch
    differentiable = op.differentiable
    got, got_grads = run_engine(sample, arrays, with_grad=differentiable)
    if op.torch is not None:
        want, want_grads = run_torch(sample, arrays, with_grad=differentiable)

        @functools.cache
        def widened():         # torch on the inputs widened to float64, when first asked
            return run_torch(sample, arrays, with_grad=differentiable, float64=True)

        def exact(i=None):     # None for a float64 sample: torch's own result is that one
            if sample.dtype == "f64":
                return None
            return lambda: widened()[0] if i is None else widened()[1][i]
        tol = _tolerance(sample.precision, want, *arrays)
        assert got.shape == want.shape and got.dtype == want.dtype, str(sample)
        _assert_agrees(got, want, exact(), tol, f"{sample}: forward")
        for i, (spec, g, w) in enumerate(zip(sample.inputs, got_grads, want_grads,
                                             strict=True)):
            if w is not None:
                assert g is not None, f"{sample}: no gradient for input {spec.name}"
                _assert_agrees(g, w, exact(i), _tolerance(sample.precision, w, *arrays),
                               f"{sample}: d/d{spec.name}")


def _assert_agrees(got, want, exact, tol, message):
    """`got` within `tol` of torch's `want`; where it is not, within `tol` plus twice torch's
    own error of the float64 result `exact()` (if `exact` is given). torch in float32 rounds
    too: where a result cancels to near 0 its rounding is the whole answer (attention's
    gradient for q with a single key is exactly 0, torch's float32 about -3e-3 from terms of
    750), and an engine is held to what a good implementation gets there, not to torch's
    error. A factor-of-2 mistake still fails wherever the result does not cancel."""
    try:
        np.testing.assert_allclose(got, want, **tol, err_msg=message)
    except AssertionError:
        if exact is None:
            raise
        reference = np.asarray(exact(), np.float64)
        torch_error = np.abs(np.asarray(want, np.float64) - reference)
        bound = tol["atol"] + tol["rtol"] * np.abs(reference) + 2 * torch_error
        error = np.abs(np.asarray(got, np.float64) - reference)
        off = ~((error <= bound) | (np.asarray(got) == reference)
                | (np.isnan(got) & np.isnan(reference)))
        worst = int(np.argmax(np.where(off, error - bound, -np.inf)))
        assert not off.any(), (
            f"{message}: {int(off.sum())} of {off.size} elements off the float64 result by "
            f"more than TOL plus twice torch's float32 error there; the worst, at "
            f"{np.unravel_index(worst, off.shape)}: engine {np.ravel(got)[worst]!r}, float64 "
            f"{reference.flat[worst]!r}, torch {np.ravel(want)[worst]!r}")


def _check_case(name, dtype, sample):
    _check_against_torch(name, dtype, sample)
    checked = OPS[name].differentiable or OPS[name].vjp_of is not None
    # (c) backprop (a backward op: its output, against its forward op's VJP) against float64
    # finite differences, off every kink
    result = check_sample(sample)
    # a drawn case may be vacuous (a softmax of one element, a sigmoid saturated at 150):
    # honest, and reported as such; the registry's samples never are (test_registry)
    assert result.status in (("pass", "vacuous") if checked else ("skip",)), \
        f"{sample}: {result.status}: {result.message}"
    assert not result.metrics.get("kinks"), f"{sample}: {result.metrics['kinks']} kinks"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OPS))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_generated_cases(name, data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    _check_case(name, dtype, data.draw(OPS[name].strategy(dtype), label="case"))


@pytest.mark.parametrize("name", sorted(OPS))
@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_generated_cases_fast(name, data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    _check_case(name, dtype, data.draw(OPS[name].strategy(dtype), label="case"))


@pytest.mark.parametrize("name", sorted(OPS))
@settings(deadline=None)
@given(data=st.data())
def test_generated_cases_match_torch(name, data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    _check_against_torch(name, dtype, data.draw(OPS[name].strategy(dtype), label="case"))


def test_a_result_torch_rounds_away_is_held_to_the_float64_result():
    """Where torch's float32 result is off by more than TOL (a cancelling sum), the engine
    passes near the float64 result and fails away from it: twice it, or torch's error
    three times over."""
    tol = dict(rtol=2e-5, atol=1e-6)
    reference = np.array([0.0, 1.0, -2.5])
    want = np.array([3e-3, 1.0, -2.5], np.float32)       # torch: rounding noise at [0]
    _assert_agrees(np.float32([0.0, 1.0, -2.5]), want, lambda: reference, tol, "exact")
    _assert_agrees(np.float32([-5e-3, 1.0, -2.5]), want, lambda: reference, tol, "noisy")
    for got in ([0.0, 2.0, -2.5], [0.0, 1.0, -1.25], [7e-3, 1.0, -2.5], [np.nan, 1, -2.5]):
        with pytest.raises(AssertionError, match="off the float64 result"):
            _assert_agrees(np.float32(got), want, lambda: reference, tol, "wrong")
    with pytest.raises(AssertionError, match="Not equal"):    # a float64 case: no second look
        _assert_agrees(np.zeros(3), want.astype(np.float64), None, tol, "f64")


# --- the shared helpers ---------------------------------------------------------------------
@settings(deadline=None)
@given(shape=shapes(min_dims=0, max_dims=4, max_side=9, max_size=40))
def test_shapes_keep_to_the_budget(shape):
    assert len(shape) <= 4 and all(1 <= d <= 9 for d in shape) and math.prod(shape) <= 40


@settings(deadline=None)
@given(pair=broadcast_pair(max_dims=3, max_side=4, max_size=30))
def test_broadcast_pairs_broadcast(pair):
    out = np.broadcast_shapes(*pair)
    assert math.prod(out) <= 30 and len(out) <= 3


@settings(deadline=None)
@given(axis=window_axis(kernel=(1, 3), stride=(1, 2), padding=(0, 1), dilation=(1, 2),
                        max_side=8))
def test_window_axis_fits_a_window(axis):
    extent = axis.dilation * (axis.kernel - 1) + 1
    assert axis.side <= 8 and (axis.side + 2 * axis.padding - extent) // axis.stride + 1 >= 1


def test_strategy_rejects_a_non_float_dtype():
    with pytest.raises(ValueError, match="dtype must be one of"):
        OPS["add"].strategy("i32")
