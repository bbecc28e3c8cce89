"""The gradient of a broadcast operand below float64: its terms made in the next wider float
(float32 for 16 bits, float64 for float32), summed, rounded once (engine.graph's wide
gradients; softmax's mask, engine.ops.softmax._mask_gradient, in float64 for every dtype).

Each case makes the terms of one broadcast operand's gradient cancel: n = 64 copies whose
loss weights have almost no sum along the broadcast axis (or, for cross_entropy, labels
that scatter around the softmax), so that the gradient is some 1-2% of the sum of its
terms' magnitudes. The truth is torch's float64 autograd on the same 16-bit values, the
operand expanded to one leaf per copy: its gradient is the terms, their sum the truth and
the sum of their magnitudes S. A result may err

    tol = one ulp of the dtype at the truth + 2^-22 S

(one rounding of the sum, and float32's rounding of each term, 2^-24 of it, with a margin
of 4; for the float64 terms of a float32 operand 2^-50 S). Terms rounded to the operand's
dtype before the sum, as before, err by about sqrt(n) of their roundings: 10 to 300 times
tol (the cases check their own power: the rounded terms' sum fails the bound by 4 times at
least, and tol is below half the truth at most elements, so a gradient off by 1.5x fails).
Every 16-bit case fails on the engine without the wide gradients (commit message of the
change), and every float32 case but softmax's (whose mask went wide in its own rule
before) on the engine whose wide gradients were 16-bit only (the message of the commit that
widened float32's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
import torch

import engine
from engine import ops
from engine.graph import Graph
from engine.registry import get_op
from engine.tensor import DTYPES

N = 64                    # copies summed
HALF = ("f16", "bf16")
SLACK = {"f32": 2.0 ** -22, "f64": 2.0 ** -50}    # per unit of S, terms made in that dtype


def rounded(values, dtype: str) -> np.ndarray:
    return np.asarray(values, np.float64).astype(DTYPES[dtype])


def cancelling(shape, axis: int, dtype: str, rng, offset: float = 4e-4) -> np.ndarray:
    """Weights in [-1, 1] less their mean along `axis`, plus `offset` times about 1: their
    sum along it is some offset * n, a small share of the n terms it weights."""
    w = rng.uniform(-1.0, 1.0, shape)
    w -= w.mean(axis=axis, keepdims=True)
    return rounded(w + offset * rng.uniform(0.5, 1.5, shape), dtype)


def tiled(row, n: int = N) -> np.ndarray:
    """n identical copies of `row` along a new first axis (one term per copy)."""
    return np.broadcast_to(row, (n,) + row.shape).copy()


def ulp(values, dtype: str) -> np.ndarray:
    info = ml_dtypes.finfo(DTYPES[dtype])
    t = np.abs(np.asarray(values, np.float64))
    with np.errstate(divide="ignore"):
        exponent = np.maximum(np.floor(np.log2(t)), info.minexp)
    return np.ldexp(1.0, (exponent - info.nmant).astype(np.int64))


def sum_to(terms: np.ndarray, shape) -> np.ndarray:
    """terms summed over the axes a broadcast of `shape` added or widened."""
    lead = terms.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                      if d == 1 and terms.shape[lead + i] != 1)
    return terms.sum(axis=axes).reshape(shape)


@dataclasses.dataclass(frozen=True)
class Case:
    """A broadcast operand `wrt` of build(*arrays) (engine) and reference(*tensors) (torch,
    float64); the operand is broadcast to `full`; `weights` of the output (None: a 0-d
    output, weight 1); `terms`: the dtype the fixed engine makes the terms in."""

    name: str
    arrays: tuple
    wrt: int
    full: tuple
    build: Callable
    reference: Callable
    weights: np.ndarray | None
    terms: str = "f32"


def engine_gradient(case: Case, backend: str = "cpu") -> np.ndarray:
    """The gradient of sum(build(*arrays) * weights) w.r.t. arrays[wrt], by the engine."""
    leaves = []
    for i, a in enumerate(case.arrays):
        make = engine.param if i == case.wrt else engine.input_tensor
        t = make(a.shape, a.dtype, name=f"x{i}")
        t.set(a)
        leaves.append(t)
    out = case.build(*leaves)
    if case.weights is None:
        loss = out
    else:
        w = engine.input_tensor(out.shape, out.dtype, name="w")
        w.set(case.weights)
        loss = ops.sum(ops.mul(out, w))
    graph = Graph([loss.set_loss()])
    grads = graph.build_backward(loss)
    graph.compute(backend)
    return grads[leaves[case.wrt]].numpy().astype(np.float64)


def reference_terms(case: Case) -> np.ndarray:
    """The operand's gradient terms, one per broadcast copy: torch in float64 with the
    operand expanded to `full` as a leaf of its own."""
    ts = [torch.tensor(np.asarray(a, np.float64)) for a in case.arrays]
    leaf = ts[case.wrt].expand(case.full).clone().requires_grad_()
    ts[case.wrt] = leaf
    out = case.reference(*ts)
    if case.weights is not None:
        out = (out * torch.tensor(np.asarray(case.weights, np.float64))).sum()
    out.backward()
    return leaf.grad.numpy()


def bound(case: Case, terms: np.ndarray):
    """(truth, tol) of the operand's gradient (module doc)."""
    shape = case.arrays[case.wrt].shape
    truth = sum_to(terms, shape)
    dtype = case.arrays[case.wrt].dtype
    name = next(k for k, v in DTYPES.items() if v == dtype)
    tol = ulp(truth, name) + SLACK[case.terms] * sum_to(np.abs(terms), shape)
    return truth, tol, name


# --- the cases, one family each -------------------------------------------------------------
def binary_cases(dtype, rng):
    """mul and div with b (12,) broadcast over 64 rows: terms g a and -g a / b^2, a close
    to 1 (so the terms are about g)."""
    a = rounded(1.0 + rng.uniform(0.0, 2.0 ** -6, (N, 12)), dtype)
    b = rounded(rng.uniform(0.5, 2.0, 12), dtype)
    w = cancelling((N, 12), 0, dtype, rng)
    return [Case(f"{op}-{dtype}", (a, b), 1, (N, 12), getattr(ops, op),
                 {"mul": torch.mul, "div": torch.div}[op], w) for op in ("mul", "div")]


def matmul_cases(dtype, rng):
    """b (6, 7) shared by a batch of 64 products of one a (5, 6): terms a^T g_k."""
    a = rounded(tiled(rng.uniform(-1.0, 1.0, (5, 6))), dtype)
    b = rounded(rng.uniform(-1.0, 1.0, (6, 7)), dtype)
    w = cancelling((N, 5, 7), 0, dtype, rng)
    return [Case(f"matmul-{dtype}", (a, b), 1, (N, 6, 7), ops.matmul, torch.matmul, w)]


def softmax_cases(dtype, rng):
    """A mask shared by 64 batches of one x: without ALiBi (mask (4, 9) over x (64, 4, 9)),
    with ALiBi over 4 heads (mask (4, 3, 9), a slope per head, over x (64, 4, 3, 9)) and
    with ALiBi and one mask for every head (mask (3, 9) over 64 x 4 rows of heads)."""
    ref = get_op("softmax").torch
    terms = "f64" if dtype == "f32" else "f32"
    out = []
    for tag, row, mask_shape, max_bias in [("plain", (4, 9), (4, 9), 0.0),
                                           ("alibi", (4, 3, 9), (4, 3, 9), 8.0),
                                           ("alibi-shared", (4, 3, 9), (3, 9), 2.0)]:
        x = rounded(tiled(rng.uniform(-2.0, 2.0, row)), dtype)
        mask = rounded(rng.uniform(-3.0, 0.0, mask_shape), dtype)
        w = cancelling(x.shape, 0, dtype, rng)
        params = dict(scale=0.7, max_bias=max_bias)
        out.append(Case(f"softmax-{tag}-{dtype}", (x, mask), 1, x.shape,
                        lambda x, m, p=params: ops.softmax(x, p["scale"], m,
                                                           max_bias=p["max_bias"]),
                        lambda x, m, p=params: ref(x, m, **p), w, terms))
    return out


def cross_entropy_cases(dtype, rng):
    """One row of logits (1, 6) expanded to 64 rows (a view: its gradient is the sum over
    them) against labels scattered around its softmax p: terms (p t_r - labels_r) / N, t_r
    the row's label sum (1 within the roundings of a 16-bit row: the fixed backward's
    t_r, not 1, is what makes the truth's terms)."""
    logits = rounded(rng.uniform(-2.0, 2.0, (1, 6)), dtype)
    p = np.exp(logits.astype(np.float64))
    p /= p.sum()
    noise = rng.uniform(-0.5, 0.5, (N, 6))
    noise -= noise.mean(axis=0, keepdims=True)
    labels = rounded(p * (1.0 + noise + 2e-3 * rng.uniform(0.5, 1.5, (N, 6))), dtype)
    ref = get_op("cross_entropy_loss").torch
    return [Case(f"cross_entropy-{dtype}", (logits, labels), 0, (N, 6),
                 lambda lg, lb: ops.cross_entropy_loss(ops.expand(lg, shape=(N, 6)), lb),
                 ref, None)]


GLU = ("reglu", "swiglu", "geglu", "geglu_erf", "geglu_quick")


def glu_cases(dtype, rng):
    """Every GLU op, fused, on one row x (1, 10) expanded to 64 rows (a view)."""
    out = []
    for op in GLU:
        x = rng.uniform(0.2, 2.0, (1, 10)) * rng.choice([-1.0, 1.0], (1, 10))
        x = rounded(x, dtype)
        w = cancelling((N, 5), 0, dtype, rng)
        ref = get_op(op).torch
        out.append(Case(f"{op}-{dtype}", (x,), 0, (N, 10),
                        lambda x, op=op: getattr(ops, op)(ops.expand(x, shape=(N, 10))),
                        ref, w))
    return out


def norm_cases(dtype, rng):
    """rms_norm and norm of 64 equal rows times a weight (16,) shared by the rows: the
    weight's terms g y, y the stored 16-bit normalised rows (the truth takes them as they
    are: the mul's inputs, whose rounding no backward undoes)."""
    out = []
    for op in ("rms_norm", "norm"):
        x = rounded(tiled(rng.uniform(-2.0, 2.0, 16)), dtype)
        leaf = engine.input_tensor(x.shape, x.dtype)
        leaf.set(x)
        stored = torch.tensor(engine.compute(getattr(ops, op)(leaf, eps=1e-5))[0]
                              .astype(np.float64))
        weight = rounded(rng.uniform(0.5, 1.5, 16), dtype)
        w = cancelling(x.shape, 0, dtype, rng)
        out.append(Case(f"{op}-weight-{dtype}", (x, weight), 1, x.shape,
                        lambda x, wt, op=op: ops.mul(getattr(ops, op)(x, eps=1e-5), wt),
                        lambda x, wt, y=stored: y * wt, w))
    return out


def view_cases(dtype, rng):
    """Elementwise ops on an operand broadcast as a node (broadcast_to, repeat): their rules
    know nothing of the sum that follows (a new op gets it from the autodiff)."""
    x = rounded(rng.uniform(-1.0, 1.0, (1, 8)), dtype)
    w = cancelling((N, 8), 0, dtype, rng)
    return [Case(f"broadcast_to-exp-{dtype}", (x,), 0, (N, 8),
                 lambda x: ops.exp(ops.broadcast_to(x, (N, 8))), torch.exp, w),
            Case(f"repeat-tanh-{dtype}", (x,), 0, (N, 8),
                 lambda x: ops.tanh(ops.repeat(x, shape=(N, 8))), torch.tanh, w)]


FAMILIES = (binary_cases, matmul_cases, softmax_cases, cross_entropy_cases, glu_cases,
            norm_cases, view_cases)


def all_cases(dtypes=(*HALF, "f32")):
    """Every family's cases in every 16-bit dtype; in float32 (terms float64) the views that
    broadcast (the float32 nodes that widen: engine/graph.py, F32_WIDENS) and softmax's
    mask (widened in its own rule)."""
    rng = np.random.default_rng(37)
    out = []
    for dtype in dtypes:
        for family in FAMILIES:
            if dtype == "f32" and family not in (softmax_cases, view_cases):
                continue    # float32 widens its explicit broadcasts (graph.py) and softmax's
                            # mask in its own rule (engine.ops.softmax) only
            out += [dataclasses.replace(c, terms="f64") if dtype == "f32" else c
                    for c in family(dtype, rng)]
    return out


CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_broadcast_gradient_is_the_sum_rounded_once(case):
    terms = reference_terms(case)
    truth, tol, dtype = bound(case, terms)
    # the bound's power: half the truth is beyond it at most elements (a gradient 1.5 times
    # too large fails there), and the terms rounded to the dtype and summed (what a 16-bit
    # backward made before) are beyond it somewhere
    some = truth != 0               # (reglu: no terms where a < 0)
    assert np.median(tol[some] / np.abs(truth[some])) < 0.5, case.name
    old = sum_to(rounded(terms, dtype).astype(np.float64), truth.shape)
    assert np.max(np.abs(old - truth) / tol) > 4.0, case.name
    got = engine_gradient(case)
    err = np.abs(got - truth) / tol
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert err.max() <= 1.0, (f"{case.name}: {got[worst]} against {truth[worst]}, "
                              f"{err.max():.1f} times the bound {tol[worst]:.3g}")


def _backward_nodes(build, shapes, dtype):
    """The nodes of the graph of sum(build(*params) * w) and its backward, params of
    `shapes`."""
    leaves = [engine.param(s, DTYPES[dtype], name=f"x{i}") for i, s in enumerate(shapes)]
    out = build(*leaves)
    w = engine.input_tensor(out.shape, out.dtype, name="w")
    loss = ops.sum(ops.mul(out, w)).set_loss()
    graph = Graph([loss])
    graph.build_backward(loss)
    return graph.nodes


@pytest.mark.parametrize("dtype", ["f16", "f32", "f64"])
def test_graphs_without_a_broadcast_gradient_below_float64_are_built_as_before(dtype):
    """No cast where nothing is summed over a broadcast, nor in float64 (nothing wider), nor
    for a float32 op's own broadcasting (only its explicit broadcasts widen: F32_WIDENS)."""
    same = _backward_nodes(lambda a, b: ops.softmax(ops.mul(a, b), 0.5), [(4, 6), (4, 6)],
                           dtype)
    assert all(t.op != "cast" for t in same)
    broadcast = _backward_nodes(lambda a, b: ops.relu(ops.add(ops.mul(a, b), b)),
                                [(4, 6), (6,)], dtype)
    assert any(t.op == "cast" for t in broadcast) == (dtype == "f16")


@pytest.mark.parametrize("dtype, wide", [("f16", np.float32), ("bf16", np.float32),
                                         ("f32", np.float64)])
def test_a_wide_gradient_passes_through_views_and_copies(dtype, wide):
    """expand -> permute -> cont -> exp: the view and the copy between the broadcast and
    the op that makes the terms want the wide gradient too, so exp's rule runs in the next
    wider float and the expand's sum adds its terms, rounded once."""
    nodes = _backward_nodes(lambda x: ops.exp(ops.cont(ops.permute(
        ops.expand(x, shape=(3, 8, 5)), (0, 2, 1)))), [(1, 8, 5)], dtype)
    summed = [t for t in nodes if t.op == "sum" and t.srcs[0].size == 120 and t.size == 40]
    assert [t.dtype for t in summed] == [wide]
    back = [t for t in nodes if t.op == "exp" and t.dtype == wide]
    assert back, "exp recomputed wide for its rule (which reads its output)"
    grad = [t for t in nodes if t.name == "x0.grad"]
    assert [t.dtype for t in grad] == [DTYPES[dtype]]
