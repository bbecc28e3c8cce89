"""The table of elementwise ops (engine.elementwise): adding an activation is one row, and
a row refuses what would make its checks meaningless."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine
from engine import elementwise, ops
from engine.backends.compile_scalar import compile_scalar, source_digest
from engine.elementwise import Binary, Unary
from engine.ops.unary import VIEW_SHAPES, define_unary, undefine_unary
from engine.registry import OPS


def softsign(v, k):
    """v / (k + |v|): smooth, no kink (its slope k / (k + |v|)^2 is continuous at 0)."""
    return v / (k + abs(v))


def softsign_gradient(g, v, k):
    d = k + abs(v)
    return g * (k / (d * d))


TOY = Unary("toy_softsign", softsign, softsign_gradient,
            lambda x, k: x / (k + x.abs()), params=("k",), defaults=(("k", 1.0),),
            domain=("uniform", -3.0, 3.0), sample_params=({"k": 1.0}, {"k": 0.5}),
            doc="x / (k + |x|): a toy activation, one row")


@pytest.fixture
def toy():
    define_unary(TOY)                       # the function every row of the table goes through
    try:
        yield TOY
    finally:
        undefine_unary(TOY.name)
    assert TOY.name not in OPS and f"{TOY.name}_back" not in OPS
    assert TOY.name not in elementwise.UNARY


@pytest.mark.parametrize("dtype, tol", [("f64", dict(rtol=1e-12, atol=1e-14)),
                                        ("f32", dict(rtol=2e-6, atol=1e-7))])
def test_a_toy_activation_is_one_row(toy, dtype, tol):
    """One row gives the op, its one-pass gradient op, CPU kernels, samples and a builder
    taking the parameter by position, name or default; forward and backward on the CPU
    match the row's torch reference."""
    assert OPS[toy.name].kind == "primitive" and OPS[f"{toy.name}_back"].kind == "backward"
    # four dtypes of: two parameter sets on four shapes, the input views on the first set
    assert len(OPS[toy.name].samples()) == 4 * (2 * 4 + len(VIEW_SHAPES))
    assert OPS[toy.name].strategy
    rng = np.random.default_rng(0)
    a = rng.uniform(-3, 3, (4, 5)).astype(np.float32 if dtype == "f32" else np.float64)
    w = rng.uniform(-1, 1, a.shape).astype(a.dtype)
    build = getattr(ops, toy.name)
    for args, kw, k in [((), {}, 1.0), ((0.5,), {}, 0.5), ((), {"k": 2.0}, 2.0)]:
        x = engine.param(a.shape, dtype, name="x")
        y = build(x, *args, **kw)
        loss = ops.sum(ops.mul(y, engine.constant(w, dtype))).set_loss()
        graph = engine.Graph([y.set_output(), loss])
        grads = graph.build_backward(loss)
        assert grads[x].op == f"{toy.name}_back" and grads[x].params == {"k": k}
        x.set(a)
        graph.compute()
        t = torch.tensor(a.astype(np.float64), requires_grad=True)
        want = toy.torch(t, k=k)
        (want * torch.tensor(w.astype(np.float64))).sum().backward()
        np.testing.assert_allclose(y.numpy(), want.detach().numpy(), **tol)
        np.testing.assert_allclose(grads[x].numpy(), t.grad.numpy(), **tol)


def test_a_toy_row_with_a_taken_name_is_refused(toy):
    with pytest.raises(ValueError, match="in the table already"):
        elementwise.add_unary(Unary(toy.name, softsign, softsign_gradient, toy.torch,
                                    params=("k",), sample_params=({"k": 1.0},)))


def test_every_op_of_the_table_is_registered_with_its_kernels():
    names = {*elementwise.UNARY, *elementwise.BINARY,
             *(u.back_name for u in elementwise.UNARY.values() if u.back_name)}
    for name in names:
        assert callable(OPS[name].kernels["cpu"]), name
        assert OPS[name].kernels["cuda"] == f"engine.backends.cuda.elementwise:cuda_{name}"


@pytest.mark.parametrize("make, match", [
    (lambda: Unary("bad", abs, torch=abs), "one of the two"),
    (lambda: Unary("bad", abs, lambda g, v: g, abs, backward=lambda g, y, x: g),
     "one of the two"),
    (lambda: Unary("bad", abs, lambda g, v: g), "torch reference"),
    (lambda: Unary("bad", abs, lambda g, v: g, abs, kinks=(0.0,)), "kink at 0.0 lies in"),
    (lambda: Unary("bad", abs, lambda g, v: g, abs, domain=("away_from_zero", 0.1, 2.0),
                   wide=("uniform", -9.0, 9.0), kinks=(0.0,)), "kink at 0.0 lies in"),
    (lambda: Unary("bad", abs, lambda g, v, lo: g, abs, params=("lo",), kinks=("lo",),
                   domain=("away_from_zero", 0.5, 2.0), sample_params=({"lo": 1.0},)),
     "kink at 1.0 lies in"),
    (lambda: Unary("bad", abs, lambda g, v, lo: g, abs, params=("lo",)),
     "sample parameters"),
    (lambda: Binary("bad", lambda a, b: a, lambda a, b: a), "no_grad"),
])
def test_a_row_refuses_what_its_checks_could_not_check(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_compile_scalar_compiles_the_functions_a_function_calls():
    """The plain functions a row's math calls are compiled with it (numba calls compiled
    functions only), once each."""
    compiled = {}
    jit = lambda fn: ("jit", fn)  # noqa: E731
    got = compile_scalar(elementwise.silu_gradient, jit, compiled)
    assert got[0] == "jit" and set(compiled) == {elementwise.silu_gradient,
                                                 elementwise.sigmoid}
    assert got[1].__globals__["sigmoid"] == compiled[elementwise.sigmoid]


def test_source_digest_follows_the_sources():
    d = source_digest(elementwise.gelu)
    assert d == source_digest(elementwise.gelu, elementwise.sigmoid)  # one file
    assert d != source_digest(softsign)
    assert len(d) == 12
