"""Dedicated backward ops checked directly against their forward op's VJP
(gradcheck.backward_ops): every one declares its forward op, its rows pass, injected bugs in
its kernel fail them, and check_sample sends it there instead of skipping it."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.mutation.kernels import as_if_contiguous as _as_if_contiguous
from engine.mutation.patches import backward_replaced, kernel_replaced, scaled_backward
from engine.registry import OpDef, VJPOf, all_ops, at_x, get_op, register, unregister
from engine.samples import InputSpec, Sample
from gradcheck.adapters.torch_adapter import TorchAdapter
from gradcheck.backward_ops import forward_point
from gradcheck.check import check_sample
from gradcheck.cotangents import registry_cases
from gradcheck.mutants import MUTANTS
from gradcheck.runner import checkable_ops, list_ops

BACKWARD_OPS = sorted(name for name, op in all_ops().items() if op.kind == "backward")
# backward ops not checked against a forward op's VJP, and why (none today)
WITHOUT_VJP_OF: dict[str, str] = {}
# upstream gradients with no layout to vary
G_WITHOUT_LAYOUTS = {"cross_entropy_loss_back": "g is the 0-d loss gradient"}
# kernels that read g in place through its strides (the others' builders copy a strided g)
STRIDED_G = ["get_rows_back", "im2col_1d_back", "im2col_back", "pool_2d_back", "relu_back",
             "repeat_back"]


def _f32_cases(op: str) -> list:
    """The float32 sample cases of `op`, in the registry's order."""
    return [c for c in get_op(op).samples() if c.dtype == "f32"]


def _scaled_kernel(real):
    def kernel(out, ins, **params):
        real(out, ins, **params)
        out *= 1.01
    return kernel


def _reads_g_as_contiguous(real):
    """The kernel reads its gradient g in memory order, ignoring a permutation's strides."""
    def kernel(out, ins, **params):
        g, *rest = ins
        real(out, [_as_if_contiguous(g), *rest], **params)
    return kernel


def _rows(cases, **kw):
    return [check_sample(case, **kw) for case in cases]


def _g(case):
    return next(spec for spec in case.inputs if spec.name == "g")


@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_every_backward_op_declares_its_forward_op_or_why_not(name):
    op = get_op(name)
    assert op.samples and op.samples(), f"{name} has no sample cases"
    if name in WITHOUT_VJP_OF:
        assert op.vjp_of is None
        return
    assert op.vjp_of is not None, f"{name}: declare vjp_of (or list it with a reason)"
    forward = get_op(op.vjp_of.op)
    assert forward.kind != "backward" and forward.differentiable and forward.torch
    if name not in G_WITHOUT_LAYOUTS:     # its own samples hand it strided upstream gradients
        gs = [_g(case) for case in op.samples()]
        assert any(g.permute for g in gs) and any(g.expand for g in gs), name


@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_every_row_passes_against_the_forward_vjp(name):
    rows = _rows(registry_cases(get_op(name)))
    failed = [f"{r.name}: {r.status}: {r.message}" for r in rows if r.status != "pass"]
    assert not failed, "\n".join(failed)
    relation = get_op(name).vjp_of.op
    checked = [r for r in rows if "cotangent=" not in r.name]
    assert all(r.metrics["vjp_of"] == relation and r.metrics["checked"] > 0 for r in checked)
    assert all(r.metrics["torch"] == "agree" and r.metrics["kinks"] == 0 for r in checked)
    if get_op(name).differentiable:        # its own check and the relation, in one row
        assert all(r.metrics["vjp"] == "agree" for r in checked)


@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_a_scaled_backward_kernel_fails_its_rows(name):
    cases = [c for c in get_op(name).samples() if c.dtype == "f32"]
    with kernel_replaced(name, _scaled_kernel):
        rows = _rows(cases)
    failed = [r for r in rows if r.status == "fail"]
    assert failed, f"{name}: no row caught its kernel scaled by 1.01"
    # its output is 0 on clamp's first bounds, where the bug changes nothing
    assert len(failed) == len(rows) or name == "clamp_back"
    assert all("is off" in r.message for r in failed)


@pytest.mark.parametrize("name", STRIDED_G)
def test_a_kernel_reading_a_permuted_g_as_contiguous_fails_exactly_the_permuted_rows(name):
    cases = [c for c in get_op(name).samples() if c.dtype == "f64"]
    with kernel_replaced(name, _reads_g_as_contiguous):
        rows = _rows(cases)
    statuses = {r.name: r.status for r in rows}
    assert statuses == {str(c): "fail" if _g(c).permute else "pass" for c in cases}


@pytest.mark.parametrize("mutant, op", [
    ("softmax_back_no_subtraction", "softmax_back"),
    ("pool_max_grad_to_neighbour", "pool_2d_back"),
    ("pool_avg_window_shifted", "pool_2d_back"),
    ("pool_back_reads_gradient_as_contiguous", "pool_2d_back"),
    ("im2col_back_ignores_dilation", "im2col_back"),
    ("cross_entropy_back_not_divided", "cross_entropy_loss_back")])
def test_the_self_tests_kernel_mutants_fail_the_backward_ops_own_rows(mutant, op):
    """gradcheck.mutants' bugs in a backward kernel, caught by the backward op's own cases
    (not only through its forward op's)."""
    with MUTANTS[mutant].patch():
        rows = _rows(get_op(op).samples())
    assert any(r.status == "fail" for r in rows)
    assert all(r.status in ("pass", "fail") for r in rows)
    assert any("numerical and torch agree" in r.message for r in rows)


def test_inject_names_a_kernel_mutant_of_a_backward_op():
    case = _f32_cases("softmax_back")[0]
    assert check_sample(case).status == "pass"
    r = check_sample(case, inject="softmax_back_no_subtraction")
    assert r.status == "fail" and r.metrics["forward"] == "off"


def test_check_sample_checks_a_backward_op_instead_of_skipping_it():
    case = _f32_cases("softmax_back")[2]
    r = check_sample(case)
    assert r.status == "pass", r.message
    assert r.metrics["vjp_of"] == "softmax" and r.metrics["checked_fraction"] == 1.0
    assert r.labels["op"] == "softmax_back" and r.labels["mode"] == "full"
    assert r.metrics["worst"].startswith("x[")
    fast = check_sample(case, mode="fast")
    assert fast.status == "pass" and fast.metrics["checked_fraction"] < 1.0
    assert fast.metrics["worst"].startswith("directions")
    without_torch = check_sample(case, use_torch=False)
    assert without_torch.status == "pass" and without_torch.metrics["torch"] == "n/a"


def test_a_scaled_kernel_fails_in_fast_mode_too():
    case = _f32_cases("norm_back")[3]
    with kernel_replaced("norm_back", _scaled_kernel):
        r = check_sample(case, mode="fast")
    assert r.status == "fail" and "directions" in r.message


@contextlib.contextmanager
def _toy_backward_op():
    """A backward op that declares no vjp_of."""
    def kernel(out, ins):
        out[...] = ins[0]
    register(OpDef("toy_back", kind="backward", infer=lambda g: (g.shape, g.dtype),
                   no_grad="a toy", kernels={"cpu": kernel},
                   samples=lambda: [Sample.make("toy_back", [InputSpec("g", (3,))])]))
    try:
        yield get_op("toy_back")
    finally:
        unregister("toy_back")


def test_a_backward_op_without_vjp_of_stays_a_skip_and_out_of_all():
    with _toy_backward_op() as toy:
        r = check_sample(toy.samples()[0])
        assert r.status == "skip" and "no gradient: a toy" in r.message
        assert "toy_back" not in checkable_ops()
        listed = next(line for line in list_ops().splitlines() if line.startswith("toy_back"))
        assert "not in --all" in listed
    assert {"softmax_back", "pool_2d_back", "relu_back", "repeat_back"} <= set(checkable_ops())
    listed = next(line for line in list_ops().splitlines() if line.startswith("softmax_back"))
    assert "softmax's VJP" in listed


def test_only_a_backward_op_declares_vjp_of():
    with pytest.raises(ValueError, match="only a backward op"):
        OpDef("toy", infer=lambda x: (x.shape, x.dtype), backward=lambda g, out, x: (g,),
              vjp_of=VJPOf("relu", at_x))


def test_softmax_back_is_softmax_vjp_where_softmax_gives_y():
    case = _f32_cases("softmax_back")[1]          # scale -0.5
    arrays = case.generate_inputs()
    point = forward_point(case, arrays)
    assert point.case.op == "softmax" and point.case.kwargs == {"scale": -0.5}
    (x,) = point.arrays
    z = -0.5 * x
    y = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(y / y.sum(-1, keepdims=True), arrays[1], rtol=1e-6)
    np.testing.assert_array_equal(point.g, arrays[0].astype(np.float64))


def _without_renormalize(real):
    """softmax_back's kernel ignoring renormalize: y as stored, undivided."""
    def kernel(out, ins, **params):
        real(out, ins, **{**params, "renormalize": False})
    return kernel


def test_softmax_back_renormalized_is_softmax_vjp_for_rows_off_the_simplex():
    """With renormalize, y's rows may sum to anything positive: softmax at log(y) / scale
    is y / sum(y), whose VJP the renormalized kernel gives; the kernel without the division
    fails the same rows (against the VJP and against torch)."""
    cases = [c for c in _f32_cases("softmax_back") if c.kwargs.get("renormalize")]
    assert cases
    for case in cases:
        y = case.generate_inputs()[1]
        assert np.all(np.abs(y.sum(-1) - 1.0) > 0.1), case     # off the simplex
    rows = _rows(cases)
    assert all(r.status == "pass" and r.metrics["vjp_of"] == "softmax" for r in rows), rows
    with kernel_replaced("softmax_back", _without_renormalize):
        rows = _rows(cases)
    assert all(r.status == "fail" for r in rows), [r.message for r in rows]


def test_pool_2d_back_samples_hold_the_pooled_output_of_their_input():
    """pool_2d_back's registry builder makes y = pool_2d(x), so its cases are consistent."""
    case = next(c for c in get_op("pool_2d_back").samples() if c.kwargs["mode"] == "max")
    point = forward_point(case, case.generate_inputs())
    assert point.case.op == "pool_2d" and point.case.kwargs == case.kwargs
    assert [s.name for s in point.case.inputs] == ["x"] and point.case.inputs[0].grad


def test_the_linear_backward_ops_row_also_holds_the_relation():
    """repeat_back has a backward (repeat) and is its VJP: one row says both; a bug in its
    backward rule is the row's own check's, a bug in its kernel the relation's too."""
    case = _f32_cases("repeat_back")[1]
    r = check_sample(case)
    assert r.status == "pass" and r.metrics["vjp"] == "agree"
    cotangent = next(c for c in registry_cases(get_op("repeat_back"))
                     if c.cotangent != "contiguous")
    assert "vjp" not in check_sample(cotangent).metrics
    with backward_replaced("repeat_back", lambda real: scaled_backward(real, 1.01)):
        r = check_sample(case)
    assert r.status == "fail" and r.metrics["vjp"] == "agree"
    with kernel_replaced("repeat_back", _scaled_kernel):
        r = check_sample(case)
    assert r.status == "fail" and r.metrics["vjp"] == "off" and "vjp_of repeat:" in r.message


def test_an_adapter_without_forward_runs_the_backward_op_through_its_vjp():
    """torch has no `forward`: its vjp of the case with no input checked gives the output."""
    for name in ("softmax_back", "pool_2d_back", "tanh_back"):
        case = next(c for c in get_op(name).samples() if not _g(c).expand)
        r = check_sample(case, adapter=TorchAdapter())
        assert r.status == "pass", r.message
        assert r.labels["engine"] == "torch" and r.metrics["vjp_of"] == get_op(name).vjp_of.op


def test_kinks_of_the_forward_op_are_detected_not_judged():
    case = Sample.make("relu_back", [InputSpec("g", (3, 4), grad=False),
                                     InputSpec("x", (3, 4), low=0.0, high=0.0, grad=False)],
                       "f64")
    r = check_sample(case)
    assert r.metrics["kinks"] == 12 and r.status == "fail" and "kinks" in r.message


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_generated_backward_op_cases_pass(data):
    name = data.draw(st.sampled_from([n for n in BACKWARD_OPS if get_op(n).strategy]))
    case = data.draw(get_op(name).strategy(data.draw(st.sampled_from(["f32", "f64"]))))
    r = check_sample(case)
    # a drawn case may be vacuous (softmax_back of one element): reported as such
    assert r.status in ("pass", "vacuous"), f"{case}: {r.message}"
    assert r.metrics["vjp_of"] == get_op(name).vjp_of.op


def test_a_backward_op_of_several_inputs_is_cut_into_their_gradients():
    """attention_back's vjp_of names q, k and v: its 1-D output is cut into their three
    gradients (C order, concatenated), each judged; a kernel that gets one of them wrong
    fails with that input named."""
    case = next(c for c in _f32_cases("attention_back") if "mask" in str(c))
    arrays = case.generate_inputs()
    point = forward_point(case, arrays)
    assert point.case.op == "attention_fwd" and point.wrt == (0, 1, 2)
    assert [s.grad for s in point.case.inputs] == [True, True, True, False]
    sizes = [point.arrays[i].size for i in point.wrt]
    flat = np.arange(sum(sizes), dtype=np.float64)
    pieces = point.split(flat)
    assert [p.shape for p in pieces] == [point.arrays[i].shape for i in point.wrt]
    np.testing.assert_array_equal(np.concatenate([p.reshape(-1) for p in pieces]), flat)
    r = check_sample(case)
    assert r.status == "pass" and r.metrics["vjp_of"] == "attention_fwd", r.message

    def dk_scaled(real):
        def kernel(out, ins, **params):
            real(out, ins, **params)
            out[sizes[0]:sizes[0] + sizes[1]] *= 1.01
        return kernel
    with kernel_replaced("attention_back", dk_scaled):
        bad = check_sample(case)
    assert bad.status == "fail" and "backprop of k is off" in bad.message
    assert "backprop of q" not in bad.message and "backprop of v" not in bad.message


def test_a_vjp_of_naming_an_input_its_primals_lack_is_an_error():
    case = _f32_cases("attention_back")[0]
    op = get_op("attention_back")
    real = op.vjp_of
    op.vjp_of = VJPOf("attention_fwd", real.primals, wrt=("q", "kv"))
    try:
        with pytest.raises(ValueError, match="input 'kv', which its primals do not give"):
            forward_point(case, case.generate_inputs())
    finally:
        op.vjp_of = real
