"""Cotangent cases: the registry's backward passes fed a permuted or a stride-0 upstream
gradient (gradcheck.cotangents), in every adapter, and the bugs only they see."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

from engine.registry import get_op
from engine.samples import InputSpec, Sample
from gradcheck.adapters.base import SLICED_BORDER, cotangent_axes, cotangent_view, sliced_weights
from gradcheck.backprop import loss_weights
from gradcheck.check import check_sample
from gradcheck.cotangents import cotangent_cases, registry_cases
from gradcheck.repro import repro_command
from gradcheck.runner import select_samples


def test_each_dtype_gets_one_case_per_layout_from_its_richest_sample():
    extra = cotangent_cases(get_op("pool_2d").samples())
    assert [(c.dtype, c.cotangent) for c in extra] == [
        (dtype, layout) for dtype in ("f16", "bf16", "f32", "f64")
        for layout in ("permuted", "expanded", "sliced")]
    base = dataclasses.replace(extra[0], cotangent="contiguous")
    assert base in get_op("pool_2d").samples()
    assert str(extra[0]) == str(base)[:-1] + ",cotangent=permuted)"
    assert all(sum(d > 1 for d in s.inputs[0].shape) >= 2 for s in extra)


def test_ops_without_a_two_axis_float_output_get_none():
    assert cotangent_cases(get_op("cross_entropy_loss").samples()) == []   # a scalar
    assert cotangent_cases(get_op("argmax").samples()) == []               # int32


def test_select_samples_and_filters_see_them():
    cases = select_samples(["relu"], "f32", "cotangent=expanded")
    assert len(cases) == 1 and cases[0].cotangent == "expanded"
    assert registry_cases(get_op("relu"))[-1].cotangent == "sliced"


def test_a_bad_layout_is_refused():
    with pytest.raises(ValueError, match="cotangent must be one of"):
        Sample.make("relu", [InputSpec("x", (2, 3))]).__class__(
            "relu", (InputSpec("x", (2, 3)),), cotangent="transposed")


def test_weights_and_views():
    w = loss_weights((2, 3, 4), 7, "expanded")
    assert np.array_equal(w, np.broadcast_to(w[..., :1], w.shape)) and w.flags.c_contiguous
    assert loss_weights((), 7, "expanded").shape == ()
    plain = loss_weights((2, 3, 4), 7)
    permuted = cotangent_view(plain, "permuted")
    assert np.array_equal(permuted, plain) and not permuted.flags.c_contiguous
    assert permuted.strides == tuple(reversed(np.ascontiguousarray(
        plain.transpose(cotangent_axes(3))).strides))
    expanded = cotangent_view(w, "expanded")
    assert np.array_equal(expanded, w) and expanded.strides[-1] == 0
    sliced = cotangent_view(plain, "sliced")
    assert np.array_equal(sliced, plain) and not sliced.flags.c_contiguous
    assert sliced.base is not None and sliced.base.size == 4 * 5 * 6      # one larger each side
    border = sliced_weights(plain)
    assert border[0, 0, 0] == SLICED_BORDER and border[-1, -1, -1] == SLICED_BORDER


def _case(op, layout, dtype="f32"):
    return next(c for c in registry_cases(get_op(op)) if c.cotangent == layout and
                c.dtype == dtype)


@pytest.mark.parametrize("op", ["sum", "sum_rows"])
def test_our_sum_backward_takes_a_strided_gradient(op):
    """sum's backward reshaped the incoming gradient, which reshape refuses for a strided
    view: the permuted cotangent case was an error row before the fix."""
    for dtype in ("f32", "f64"):
        result = check_sample(_case(op, "permuted", dtype), use_torch=False)
        assert result.status == "pass", result.message


class _ReadsAsContiguous:
    """A torch custom Function whose backward reads grad_output's storage as if it were
    contiguous (what ggml's pool_2d backward does): right whenever the gradient is."""

    @staticmethod
    def make():
        import torch

        class Neg(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return -x

            @staticmethod
            def backward(ctx, g):
                flat = g.as_strided((g.numel(),), (1,), g.storage_offset())
                return -flat.reshape(g.shape)

        return Neg.apply


@pytest.mark.parametrize("layout, statuses", [
    ("contiguous", {"pass"}),
    ("permuted", {"fail"}),              # wrong values
    ("expanded", {"error"}),             # reads past the one-column storage: torch refuses
    ("sliced", {"fail"}),                # reads the buffer's border (1000s) and next rows
])
def test_a_backward_that_reads_its_gradient_as_contiguous_is_caught(layout, statuses):
    pytest.importorskip("torch")
    from gradcheck.adapters.torch_adapter import TorchAdapter
    case = dataclasses.replace(_case("neg", "permuted"), cotangent=layout)
    result = check_sample(case, adapter=TorchAdapter(_ReadsAsContiguous.make()),
                          use_torch=False)
    assert result.status in statuses, result.message


def test_torch_and_numpy_adapters_hand_the_view_to_backward():
    torch = pytest.importorskip("torch")
    from gradcheck.adapters.numpy_adapter import NumpyAdapter
    from gradcheck.adapters.torch_adapter import upstream_gradient
    w = loss_weights((3, 4), 1)
    assert not upstream_gradient(torch, w, "permuted", torch.float32).is_contiguous()
    assert upstream_gradient(torch, w, "expanded", torch.float32).stride()[-1] == 0
    seen = []

    def vjp(cotangent, x):
        seen.append(cotangent.strides)
        return [cotangent]

    case = _case("neg", "expanded")
    NumpyAdapter(lambda x: x, vjp).vjp(case, case.generate_inputs(),
                                       loss_weights((2, 3, 4, 5), 1, "expanded"))
    assert seen[0][-1] == 0


ggml = pytest.mark.skipif(importlib.util.find_spec("libggml") is None,
                          reason="the libggml-python wheel is not installed")


@ggml
def test_ggml_pool_2d_backward_on_a_permuted_gradient_is_caught():
    """The bug that broke ggml's MNIST CNN training (docs/guides/mnist.md), now a gradcheck row:
    the contiguous case passes, the permuted one fails."""
    from gradcheck.adapters import get_adapter
    adapter = get_adapter("ggml")
    permuted = _case("pool_2d", "permuted")
    plain = dataclasses.replace(permuted, cotangent="contiguous")
    assert check_sample(plain, adapter=adapter, use_torch=False).status == "pass"
    result = check_sample(permuted, adapter=adapter, use_torch=False)
    assert result.status == "fail" and "x 105/180 off vs numerical" in result.message
    assert repro_command(permuted, adapter) == (f"gradcheck --engine ggml --op pool_2d -k "
                                                f"'{permuted}'")


# --- your own functions (gradcheck.api) ------------------------------------------------------

def test_check_torch_feeds_a_custom_function_every_layout():
    pytest.importorskip("torch")
    from gradcheck.api import check_torch
    x = np.random.default_rng(0).normal(size=(3, 4))
    bad = _ReadsAsContiguous.make()
    result = check_torch(bad, [x], name="neg")
    assert result.status in ("fail", "error")
    assert "cotangent=permuted: " in result.message and result.name == "neg(x=[3,4])"
    assert result.labels["cotangents"] == "contiguous,permuted,expanded,sliced"
    only_plain = check_torch(bad, [x], name="neg", cotangents=("contiguous",))
    assert only_plain.status == "pass", only_plain.message
    assert check_torch(lambda t: -t, [x]).status == "pass"


def test_check_torch_catches_a_backward_that_views_its_gradient():
    torch = pytest.importorskip("torch")
    from gradcheck.api import check_torch

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g.view(-1).view(g.shape)     # view() needs a contiguous gradient

    result = check_torch(Double.apply, [np.ones((2, 3))])
    assert result.status == "error" and "cotangent=permuted: " in result.message


def test_check_numpy_hands_the_vjp_a_read_only_expanded_cotangent():
    from gradcheck.api import check_numpy

    def vjp(w, x):
        w *= 2.0                                   # writes into its cotangent
        return [w]

    result = check_numpy(lambda x: 2.0 * x, vjp, [np.ones((2, 3))])
    assert result.status == "error" and "cotangent=expanded: " in result.message
    assert "read-only" in result.message


def test_a_scalar_output_is_checked_contiguous_only():
    from gradcheck.api import check_numpy
    result = check_numpy(lambda x: np.sum(x), lambda w, x: [np.full_like(x, w)],
                         [np.ones((2, 3))])
    assert result.status == "pass" and result.labels["cotangents"] == "contiguous"
    with pytest.raises(ValueError, match="cotangents must name"):
        check_numpy(np.tanh, lambda w, x: [w], [np.ones(3)], cotangents=("diagonal",))


def test_torch_autograd_gradcheck_passes_what_the_cotangent_checks_catch():
    """docs/findings/torch.md: torch's gradcheck feeds backward contiguous gradients only."""
    torch = pytest.importorskip("torch")
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_ReadsAsContiguous.make(), (x,))


@ggml
def test_ggml_threads_option_reaches_the_adapter_and_its_repro(capsys):
    from gradcheck.adapters import get_adapter
    from gradcheck.cli import main
    assert main(["--engine", "ggml", "--ggml-threads", "1", "--op", "relu", "--dtype", "f32",
                 "--no-progress"]) == 0
    assert "1 threads" in capsys.readouterr().err
    adapter = get_adapter("ggml", n_threads=3)
    assert adapter.n_threads == 3
    assert "--ggml-threads 3 --op pool_2d" in repro_command(_case("pool_2d", "permuted"),
                                                            adapter)
    for argv, message in ((["--engine", "ggml", "--ggml-threads", "0"], "must lie in [1, 512]"),
                          (["--ggml-threads", "2"], "applies to --engine ggml")):
        with pytest.raises(SystemExit) as stop:          # argparse's usage error
            main([*argv, "--op", "relu", "--no-progress"])
        assert stop.value.code == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_a_16bit_cases_weights_are_exact_in_both_16bit_formats(precision):
    # the engine receives its cotangent in the output's dtype: every weight must be a value
    # that dtype holds, or the float64 reference differentiates another loss
    import ml_dtypes
    w = loss_weights((64, 33), 5, "contiguous", precision)
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32):
        assert np.array_equal(w.astype(dtype).astype(np.float64), w)
    assert np.all((np.abs(w) >= 0.5) & (np.abs(w) <= 1.5))
    assert np.array_equal(np.sign(w), np.sign(loss_weights((64, 33), 5)))    # same draws
    assert not np.array_equal(loss_weights((64, 33), 5, precision="f32").astype(np.float16)
                              .astype(np.float64), loss_weights((64, 33), 5, precision="f32"))


def test_a_cotangent_rounded_by_the_engine_is_not_blamed_on_it():
    # norm's gradient is 1/sigma ~ 96 times its cotangent's deviation from a constant here:
    # with float64 weights the float16 cotangent's rounding alone was 0.024 of a gradient of
    # 0.4, and the row failed (gradcheck --all --random 200 --seed 3), the engine's answer
    # being the float64 gradient of its float16 weights to 5e-5
    from gradcheck.repro import parse_case
    case = parse_case(
        "Sample(op='norm', inputs=(InputSpec(name='x', shape=(6,), kind='uniform', "
        "low=-0.0625, high=-0.020833333333333332, dtype=None, grad=True, permute=None, "
        "slice=None, expand=None, show_range=True),), params=(('eps', 1e-06),), "
        "dtype='f16', cotangent='contiguous', tier='fast')")
    assert str(case) == "norm(type=f16,x=[6]range[-0.0625,-0.0208333],eps=1e-06)"
    row = check_sample(case)
    assert row.status == "pass", row.message
    assert row.metrics["max_abs_err"] < 1e-3
