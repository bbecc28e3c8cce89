"""CUDA kernels of attention_fwd and attention_back against a float64 numpy reference.

The reference (`reference_fwd`, `reference_back`) is written here from the formulas of
engine.backends.cuda.attention's doc: repeat_interleave'd K/V heads for grouped-query
attention, softcap, ALiBi slopes times the mask, the bottom-right causal mask; its backward
is checked against central differences of its forward (`test_reference_backward_is_its_
forward_derivative`), so the kernels are judged against the math, not against the CPU
kernels. Cases are small (the simulator runs each thread as a Python thread) but reach
GQA, causal with Tq < Tk and Tq > Tk, softcap, ALiBi with a mask, broadcast masks, a 3-D
(batchless) case, strided q, k, v and g, Dv != D, head sizes past the kernels' CHUNK, fully
masked rows, and the same bits on every run and with any grid. The backward's two numerical
cares (the module doc: p renormalised where the saved lse is off by its storage rounding,
D_i = sum_j p_ij dP_ij) are checked on rows that see one key (dS = g_lse to the last bit),
on a rounded lse far from 0 (float32, float16 and bfloat16 through the backends' kernels:
the CPU kernel's gradients within a few ulps) and on an lse off by more (used as it is).
Every registry sample of attention is also replayed (kernel_harness.replay): its
attention_fwd and attention_back nodes on the device against the CPU kernels, on the inputs
the real graphs give them.
"""

from __future__ import annotations

import dataclasses
import zlib

import ml_dtypes
import numpy as np
import pytest

from engine.backends.alibi_math import alibi_slopes
from engine.backends.cpu import CPU
from engine.registry import OPS
from engine.tensor import DTYPES
from tests.engine.backends.cuda.kernel_harness import (
    cuda,
    cuda_cases,
    device_array,
    needs_cuda,
    replay,
    to_device,
    to_host,
)

pytestmark = [pytest.mark.cudasim]
needs_cuda()

from engine.backends.cuda import attention as kernels  # noqa: E402
from engine.backends.cuda import get_cuda_backend  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Case:
    """One attention call: shapes (b = 0: 3-D, no batch axis), parameters, mask shape
    (None: no mask; a mask gets some -inf entries), layout and special rows."""
    hq: int = 2
    hkv: int = 2
    tq: int = 3
    tk: int = 4
    d: int = 5
    dv: int = 3
    b: int = 2
    causal: bool = False
    softcap: float = 0.0
    max_bias: float = 0.0
    mask: tuple | None = None
    strided: bool = False          # q, k, v, g permuted views of (B, T, H, D) arrays
    masked_row: bool = False       # row (0, 0, 1) of a full mask all -inf
    scale: float | None = None

    def __str__(self):
        fields = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                  if getattr(self, f.name) != f.default]
        return "attn(" + ",".join(fields) + ")"

    def lead(self):
        return (self.b,) if self.b else ()


CASES = [
    Case(),
    Case(hq=4, hkv=2, causal=True, tq=3, tk=5, softcap=2.0),           # GQA, causal Tq < Tk
    Case(hq=3, hkv=1, max_bias=8.0, mask=(2, 3, 3, 4)),                # ALiBi, a full mask
    Case(hq=4, hkv=2, mask=(4, 3), b=0, causal=True, tq=4, tk=3),      # broadcast, Tq > Tk
    Case(hq=2, hkv=1, mask=(2, 1, 3, 4), max_bias=2.0, strided=True, d=4, dv=6, softcap=1.5),
    Case(mask=(2, 2, 3, 4), masked_row=True, scale=0.7),
    Case(hq=1, hkv=1, b=1, tq=2, tk=3, d=130, dv=131),                 # columns past CHUNK
]


def _array(rng, shape, dtype, strided):
    """Random values of `shape` (.., H, T, D); strided: a permuted view of (.., T, H, D)."""
    if not strided:
        return rng.standard_normal(shape).astype(dtype)
    *lead, h, t, d = shape
    base = rng.standard_normal((*lead, t, h, d)).astype(dtype)
    return np.swapaxes(base, -2, -3)


def inputs(case: Case, dtype):
    """(q, k, v, mask or None, g) as numpy arrays of `dtype`."""
    rng = np.random.default_rng(zlib.crc32(str(case).encode()))
    lead = case.lead()
    q = _array(rng, (*lead, case.hq, case.tq, case.d), dtype, case.strided)
    k = _array(rng, (*lead, case.hkv, case.tk, case.d), dtype, case.strided)
    v = _array(rng, (*lead, case.hkv, case.tk, case.dv), dtype, case.strided)
    g = _array(rng, (*lead, case.hq, case.tq, case.dv + 1), dtype, case.strided)
    mask = None
    if case.mask is not None:
        mask = rng.standard_normal(case.mask).astype(dtype)
        mask[rng.random(case.mask) < 0.2] = -np.inf
        if case.masked_row:
            mask[0, 0, 1, :] = -np.inf
    return q, k, v, mask, g


def params(case: Case) -> dict:
    scale = 1.0 / np.sqrt(case.d) if case.scale is None else case.scale
    return {"scale": float(scale), "causal": case.causal, "logit_softcap": case.softcap,
            "max_bias": case.max_bias}


def _logits(q, k, mask, scale, causal, logit_softcap, max_bias):
    """(s, chain): the logits (.., Hq, Tq, Tk) and the softcap's chain factor, float64."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    hq, tq, tk = q.shape[-3], q.shape[-2], k.shape[-2]
    kk = np.repeat(k, hq // k.shape[-3], axis=-3)
    s = scale * q @ np.swapaxes(kk, -1, -2)
    chain = np.ones_like(s)
    if logit_softcap > 0:
        t = np.tanh(s / logit_softcap)
        s, chain = logit_softcap * t, 1.0 - t * t
    if mask is not None:
        slopes = alibi_slopes(hq, max_bias)[:, None, None]
        s = s + slopes * np.asarray(mask, np.float64)
    if causal:
        i, j = np.arange(tq)[:, None], np.arange(tk)[None, :]
        s = np.where(j > i + (tk - tq), -np.inf, s)
    return s, chain


def reference_fwd(q, k, v, mask, **p):
    """The packed (.., Hq, Tq, Dv + 1) = out | lse in float64."""
    s, _ = _logits(q, k, mask, **p)
    m = s.max(axis=-1, keepdims=True)
    dead = m == -np.inf
    m = np.where(dead, 0.0, m)
    with np.errstate(divide="ignore"):           # dead rows: log 0, replaced below
        lse = np.log(np.exp(s - m).sum(axis=-1, keepdims=True)) + m
    lse = np.where(dead, -np.inf, lse)
    prob = np.where(dead, 0.0, np.exp(s - np.where(dead, 0.0, lse)))
    vv = np.repeat(np.asarray(v, np.float64), q.shape[-3] // v.shape[-3], axis=-3)
    return np.concatenate([prob @ vv, lse], axis=-1)


def _group_sum(x, hkv):
    """(.., Hq, T, D) summed over each kv head's group of query heads: (.., Hkv, T, D)."""
    *lead, hq, t, d = x.shape
    return x.reshape(*lead, hkv, hq // hkv, t, d).sum(axis=-3)


def unit_roundoff(dtype) -> float:
    """u of a float dtype (numpy's or ml_dtypes' bfloat16): half its machine epsilon."""
    return float(ml_dtypes.finfo(dtype).eps) / 2


def reference_back(g, q, k, v, mask, fwd, unit=None, **p):
    """(dq, dk, dv) in float64, from the packed gradient g and the packed forward fwd: p
    from fwd's lse, each row divided by its sum Z where |log Z| <= 2 unit max(|lse|, 1)
    (`unit`: that of fwd's dtype unless given), D_i = sum_j p_ij dP_ij."""
    unit = unit_roundoff(np.asarray(fwd).dtype) if unit is None else unit
    g, fwd = np.asarray(g, np.float64), np.asarray(fwd, np.float64)
    s, chain = _logits(q, k, mask, **p)
    nv = v.shape[-1]
    lse = fwd[..., nv:]
    dead = lse == -np.inf
    prob = np.where(dead, 0.0, np.exp(s - np.where(dead, 0.0, lse)))
    z = prob.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):           # z = 0: log 0, not near
        near = ~dead & (np.abs(np.log(z)) <= 2 * unit * np.maximum(np.abs(lse), 1.0))
    prob = prob / np.where(near, z, 1.0)
    group = q.shape[-3] // k.shape[-3]
    kk = np.repeat(np.asarray(k, np.float64), group, axis=-3)
    vv = np.repeat(np.asarray(v, np.float64), group, axis=-3)
    d_o, g_lse = g[..., :nv], g[..., nv:]
    d_p = d_o @ np.swapaxes(vv, -1, -2)
    d_i = (prob * d_p).sum(axis=-1, keepdims=True)
    du = prob * (d_p - d_i + g_lse) * chain
    dq = p["scale"] * du @ kk
    dk = _group_sum(p["scale"] * np.swapaxes(du, -1, -2) @ np.asarray(q, np.float64),
                    k.shape[-3])
    dv = _group_sum(np.swapaxes(prob, -1, -2) @ d_o, k.shape[-3])
    return dq, dk, dv


def run_fwd(q, k, v, mask, **p):
    out = cuda.device_array((*q.shape[:-1], v.shape[-1] + 1), q.dtype)
    ins = [to_device(a) for a in (q, k, v)] + ([to_device(mask)] if mask is not None else [])
    kernels.cuda_attention_fwd(out, ins, **p)
    return out.copy_to_host()


def run_back(g, q, k, v, mask, fwd, **p):
    out = cuda.device_array(q.size + k.size + v.size, q.dtype)
    ins = [to_device(a) for a in (g, q, k, v)]
    ins += ([to_device(mask)] if mask is not None else []) + [to_device(fwd)]
    kernels.cuda_attention_back(out, ins, **p)
    flat = out.copy_to_host()
    return (flat[:q.size].reshape(q.shape), flat[q.size:q.size + k.size].reshape(k.shape),
            flat[q.size + k.size:].reshape(v.shape))


TOLS = {np.float64: {"rtol": 1e-10, "atol": 1e-12}, np.float32: {"rtol": 2e-5, "atol": 2e-6}}


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernels_match_the_reference(case, dtype):
    q, k, v, mask, g = inputs(case, dtype)
    p = params(case)
    ref = reference_fwd(q, k, v, mask, **p)
    got = run_fwd(q, k, v, mask, **p)
    np.testing.assert_allclose(got, ref, **TOLS[dtype])
    fwd = ref.astype(dtype)         # the backward reads the saved forward, rounded
    for got_d, ref_d in zip(run_back(g, q, k, v, mask, fwd, **p),
                            reference_back(g, q, k, v, mask, fwd, **p), strict=True):
        np.testing.assert_allclose(got_d, ref_d, **TOLS[dtype])


def test_fully_masked_rows_give_zero_out_minus_inf_lse_and_no_gradient():
    case = CASES[5]                 # row (0, 0, 1) masked; and causal rows with no key
    for c in (case, Case(causal=True, tq=4, tk=2, b=1)):
        q, k, v, mask, g = inputs(c, np.float64)
        p = params(c)
        got = run_fwd(q, k, v, mask, **p)
        dead = (0, 0, 1) if c.masked_row else (0, 0, 0)
        assert np.all(got[dead][:-1] == 0) and got[dead][-1] == -np.inf
        dq, _, _ = run_back(g, q, k, v, mask, got, **p)
        assert np.all(dq[dead] == 0) and np.all(np.isfinite(dq))


def _one_key_inputs(dtype):
    """(q, k, v, g) of B = 2, two query heads of one kv head, Tq = 3 rows that each see the
    one key (Tk = 1), scores near 30 (|lse| ~ 30: its storage rounding moves exp(s - lse)
    by up to 30 u), and dO about 1000 times g_lse (a leak of dP - D_i would show)."""
    rng = np.random.default_rng(7)
    q = (3.0 + 0.1 * rng.standard_normal((2, 2, 3, 4))).astype(dtype)
    k = (3.3 + 0.1 * rng.standard_normal((2, 1, 1, 4))).astype(dtype)
    v = rng.standard_normal((2, 1, 1, 5)).astype(dtype)
    g = (1000.0 * rng.standard_normal((2, 2, 3, 6))).astype(dtype)
    g[..., -1] = rng.standard_normal((2, 2, 3))
    return q, k, v, g


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_a_row_that_sees_one_key_passes_exactly_g_lse(dtype):
    """p = 1 on every row (one key), whatever the rounding of the saved lse: dS = g_lse to
    the last bit, so dq_i = scale g_lse_i k exactly, dk = scale sum_{h, i} g_lse_hi q_hi
    (in the kernel's order: heads, then rows) and dv = sum_{h, i} dO_hi within the
    rounding of their sums."""
    q, k, v, g = _one_key_inputs(dtype)
    p = {"scale": 0.75, "causal": False, "logit_softcap": 0.0, "max_bias": 0.0}
    fwd = run_fwd(q, k, v, None, **p)
    assert np.all(np.abs(fwd[..., -1]) > 20)
    dq, dk, dv = run_back(g, q, k, v, None, fwd, **p)
    g64, q64, k64 = (a.astype(np.float64) for a in (g, q, k))
    acc_k, acc_v = np.zeros((2, 4)), np.zeros((2, 5))
    for h in range(2):
        for i in range(3):
            acc_k += g64[:, h, i, -1:] * q64[:, h, i]
            acc_v += g64[:, h, i, :-1]
    np.testing.assert_array_equal(dq, (p["scale"] * (g64[..., -1:] * k64)).astype(dtype))
    # dk and dv are sums: a GPU's compiler fuses their multiply-adds (rounded once, not
    # twice), the simulator does not; a leak of dP's rounding errs by 8 ulps and more
    assert _ulps(dk[:, 0, 0], (p["scale"] * acc_k).astype(dtype), dtype) <= 2
    assert _ulps(dv[:, 0, 0], acc_v.astype(dtype), dtype) <= 2


ULPS = {"f32": 4, "f16": 2, "bf16": 2}       # the CUDA and CPU kernels' gradients apart


def _ulps(got, want, dtype) -> float:
    """The largest |got - want| in units of the dtype's spacing at |want|, that spacing at
    least eps max |want| (sums that cancel: the backends round their terms differently)."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    eps, mag = float(ml_dtypes.finfo(dtype).eps), np.abs(want)
    ulp = np.exp2(np.floor(np.log2(np.maximum(mag, np.finfo(np.float64).tiny)))) * eps
    return float(np.max(np.abs(got - want) / np.maximum(ulp, eps * mag.max())))


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
def test_a_rounded_lse_gives_the_cpu_kernels_gradients(name):
    """Scores near 30 (a mask of 30 plus noise, so |lse| ~ 30 and its storage rounding
    moves exp(s - lse) by up to 30 u: 1e-6 in float32, 1% in bfloat16): the backends'
    attention_back kernels for `name` (the 16-bit ones each widening itself, told the
    lse's unit) on the CPU's attention_fwd give the same gradients within a few ulps of
    the dtype, where p taken as exp(s - lse) would not."""
    dtype = DTYPES[name]
    case = Case(hq=4, hkv=2, tq=3, tk=5, causal=True, mask=(2, 4, 3, 5))
    q, k, v, mask, g = inputs(case, np.float64)
    ins = [a.astype(dtype) for a in (q, k, v, mask + 30.0)]
    g = g.astype(dtype)
    p = params(case)
    fwd = np.empty((*q.shape[:-1], case.dv + 1), dtype)
    CPU.kernel(OPS["attention_fwd"], [np.dtype(dtype)] * 5)(fwd, ins, **p)
    assert np.all(np.abs(fwd[..., -1].astype(np.float64)) > 25)
    back_ins, back_dtypes = [g, *ins, fwd], [np.dtype(dtype)] * 7
    want = np.empty(q.size + k.size + v.size, dtype)
    CPU.kernel(OPS["attention_back"], back_dtypes)(want, back_ins, **p)
    out = device_array(want.shape, dtype)
    get_cuda_backend().kernel(OPS["attention_back"], back_dtypes)(
        out, [to_device(a) for a in back_ins], **p)
    assert _ulps(to_host(out, dtype), want, dtype) <= ULPS[name]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_an_lse_off_by_more_than_its_rounding_is_used_as_it_is(dtype):
    """An lse 0.05 above attention_fwd's (more than its rounding: the self-test's wrong-lse
    mutants) gives p = exp(s - lse) as it is, as the reference takes it: dv about 5% off
    the right one."""
    case = CASES[1]
    q, k, v, mask, g = inputs(case, dtype)
    p = params(case)
    fwd = run_fwd(q, k, v, mask, **p)
    off = fwd.copy()
    off[..., -1] += dtype(0.05)
    got = run_back(g, q, k, v, mask, off, **p)
    for got_d, ref_d in zip(got, reference_back(g, q, k, v, mask, off, **p), strict=True):
        np.testing.assert_allclose(got_d, ref_d, **TOLS[dtype])
    right = reference_back(g, q, k, v, mask, fwd, **p)[2]
    np.testing.assert_allclose(got[2], np.exp(-0.05) * right, **TOLS[dtype])


def test_same_bits_on_every_run_and_any_grid(monkeypatch):
    case = CASES[4]
    q, k, v, mask, g = inputs(case, np.float32)
    p = params(case)
    fwd = [run_fwd(q, k, v, mask, **p) for _ in range(2)]
    back = [np.concatenate([d.ravel() for d in run_back(g, q, k, v, mask, fwd[0], **p)])
            for _ in range(2)]
    from engine.backends.cuda import launch
    monkeypatch.setattr(launch, "THREADS", 1)        # one thread does every row
    monkeypatch.setattr(launch, "MAX_BLOCKS", 1)
    fwd.append(run_fwd(q, k, v, mask, **p))
    back.append(np.concatenate([d.ravel() for d in run_back(g, q, k, v, mask, fwd[0], **p)]))
    assert all(f.tobytes() == fwd[0].tobytes() for f in fwd)
    assert all(b.tobytes() == back[0].tobytes() for b in back)


@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[5]], ids=str)
def test_reference_backward_is_its_forward_derivative(case):
    """Central differences of <g, reference_fwd> in q, k and v match reference_back."""
    q, k, v, mask, g = inputs(case, np.float64)
    q, k, v, g = (np.ascontiguousarray(a) for a in (q, k, v, g))
    p = params(case)
    fwd = reference_fwd(q, k, v, mask, **p)
    live = np.isfinite(fwd[..., -1:])              # dead rows: their lse has no derivative
    weights = np.where(live, g, 0.0)

    def loss(q_, k_, v_):
        return float(np.sum(np.where(live, reference_fwd(q_, k_, v_, mask, **p), 0.0)
                            * weights))

    grads = reference_back(weights, q, k, v, mask, fwd, **p)
    rng = np.random.default_rng(0)
    for which, grad in enumerate(grads):
        args = [q, k, v]
        for _ in range(4):
            idx = tuple(rng.integers(n) for n in args[which].shape)
            h = 1e-6
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[which][idx] += h
            minus[which][idx] -= h
            numeric = (loss(*plus) - loss(*minus)) / (2 * h)
            assert numeric == pytest.approx(grad[idx], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("sample", cuda_cases(OPS["attention"].samples()), ids=str)
def test_replay_matches_cpu(sample):
    checked = set(replay(sample, {"attention_fwd", "attention_back"}))
    assert checked == {"attention_fwd", "attention_back"}, f"{sample}: checked {checked}"
