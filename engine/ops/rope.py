"""rope: rotary position embeddings with ggml's semantics (ggml_rope_ext, YaRN included),
and its dedicated backward rope_back (ggml_rope_ext_back).

x has shape (T, H, D) or (B, T, H, D) (ggml's ne = [D, H, T, B]), pos int32 of shape (T,)
(one position per token, shared by the batch), freq_factors (optional) shape (n_dims/2,).
For the pair i < n_dims/2 of token t, with (c, s) = mscale (cos theta_ti, sin theta_ti):

    theta_extrap = pos[t] * freq_base^(-2i/n_dims) / freq_factors[i]
    theta_ti     = freq_scale theta_extrap, mixed with theta_extrap by YaRN's ramp when
                   ext_factor != 0 (engine.backends.rope_math), mscale = attn_factor
                   (times 1 + 0.1 log(1/freq_scale) when ext_factor != 0)
    mode normal: pairs (x[2i], x[2i+1]);  mode neox: pairs (x[i], x[i + n_dims/2])
    rope(x)[.., j0] = x[j0] c - x[j1] s,   rope(x)[.., j1] = x[j0] s + x[j1] c
    dims j >= n_dims: unchanged.

The rotation is linear in x and its matrix is mscale R(theta): the gradient with respect to
x is the transposed matrix mscale R(-theta) applied to g, the op rope_back(g, pos, ...) with
the same parameters, whose own gradient is rope again. pos gets no gradient (integers), nor
do freq_factors: ggml asserts "gradients for freq factors not implemented", and so the
samples mark them grad=False. Defaults are llama.cpp's: freq_base 10000, freq_scale 1,
ext_factor 0, attn_factor 1, beta_fast 32, beta_slow 1, n_ctx_orig 0. The kernels compute
in float64 (16-bit inputs widened to float32 by the backends) and read views in place.
"""

from __future__ import annotations

import math

import numpy as np

from engine.backends.cpu.rope import cpu_rope, cpu_rope_back
from engine.errors import DTypeError, ParamError, ShapeError
from engine.params import (
    INT32_MAX,
    MAX_FACTOR,
    MIN_FACTOR,
    Params,
    Rule,
    choice_param,
    factor_param,
    float_param,
    int_param,
)
from engine.registry import OpDef, VJPOf, make_node, register, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case, scale_case
from engine.strategies import MAX_ELEMENTS, draw_input, sample_strategy
from engine.tensor import is_float

MODES = ("normal", "neox")
DEFAULTS = dict(mode="normal", n_ctx_orig=0, freq_base=10000.0, freq_scale=1.0,
                ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0)
def _yarn_base_ok(freq_base, n_ctx_orig, ext_factor) -> bool:
    return freq_base != 1.0 or (n_ctx_orig == 0 and ext_factor == 0.0)


# Every parameter's range keeps the kernels' arithmetic (engine.backends.rope_math) finite
# for int32 positions: |theta| <= 2^31 max(1, 1/freq_base) max(1, freq_scale) / ff stays far
# from overflow (cos(inf) is NaN); mscale's log(1 / freq_scale) needs 1/freq_scale finite;
# YaRN's correction dims (yarn_corr_dims, computed whenever n_ctx_orig > 0) take
# log(n_ctx_orig / (2 pi beta)), which needs 2 pi beta finite (beta <= 2.8e307; log(0)
# otherwise), and divide by log(freq_base), which needs freq_base != 1 (the rule).
_BETA_WHY = "YaRN's correction dims take log(n_ctx_orig / (2 pi beta)): finite and > 0"
PARAMS = Params(dict(
    n_dims=int_param(2, INT32_MAX, why="the dims rotated in pairs, at least one pair"),
    mode=choice_param(*MODES),
    n_ctx_orig=int_param(0, INT32_MAX, why="YaRN's original context (ggml's int); 0: none"),
    freq_base=float_param(MIN_FACTOR, why="theta = pos freq_base^(-2i/n_dims) is at most "
                                          "pos / freq_base"),
    freq_scale=float_param(MIN_FACTOR, MAX_FACTOR, why="YaRN's mscale takes "
                                                       "log(1 / freq_scale)"),
    ext_factor=float_param(0.0, 1.0, why="YaRN's mix weight of the extrapolated angle; "
                                         "0: none"),
    attn_factor=factor_param(),
    beta_fast=float_param(MIN_FACTOR, MAX_FACTOR, why=_BETA_WHY),
    beta_slow=float_param(MIN_FACTOR, MAX_FACTOR, why=_BETA_WHY)),
    rules=(Rule(("n_dims",), lambda n_dims: n_dims % 2 == 0,
                "n_dims must be even (the dims rotate in pairs)"),
           Rule(("freq_base", "n_ctx_orig", "ext_factor"), _yarn_base_ok,
                "freq_base must not be 1 with YaRN (n_ctx_orig > 0 or ext_factor != 0): its "
                "correction dims divide by log(freq_base)")))
YARN = dict(ext_factor=1.0, freq_scale=0.25, n_ctx_orig=4096)


def _check(op, x, pos, ff, *, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
           attn_factor, beta_fast, beta_slow):
    """The shape and dtype rules of rope and rope_back (x is rope_back's g), and n_dims
    against D (the parameters on their own and together: PARAMS)."""
    srcs = (x, pos, *ff)
    if not is_float(x.dtype):
        raise DTypeError(f"{op}: x must be float, got {x.dtype} (shapes {shapes_str(*srcs)})")
    if x.ndim not in (3, 4):
        raise ShapeError(f"{op}: x must have shape (T, H, D) or (B, T, H, D), got shapes "
                         f"{shapes_str(*srcs)}")
    if pos.dtype != np.dtype(np.int32):
        raise DTypeError(f"{op}: pos must be int32, got {pos.dtype} (shapes "
                         f"{shapes_str(*srcs)})")
    if pos.shape != (x.shape[-3],):
        raise ShapeError(f"{op}: pos must have shape (T,) = ({x.shape[-3]},), one position "
                         f"per token, got shapes {shapes_str(*srcs)}")
    if n_dims < 2 or n_dims % 2 or n_dims > x.shape[-1]:
        raise ParamError(f"{op}: n_dims must be even, at least 2 and at most D = "
                         f"{x.shape[-1]}, got {n_dims} (shapes {shapes_str(*srcs)})")
    if ff:
        if ff[0].dtype != x.dtype:
            raise DTypeError(f"{op}: freq_factors dtype {ff[0].dtype} differs from x's "
                             f"{x.dtype} (shapes {shapes_str(*srcs)})")
        if ff[0].shape != (n_dims // 2,):
            raise ShapeError(f"{op}: freq_factors must have shape (n_dims/2,) = "
                             f"({n_dims // 2},), got shapes {shapes_str(*srcs)}")
    return x.shape, x.dtype


def _rope_infer(x, pos, *ff, **params):
    return _check("rope", x, pos, ff, **params)


def _rope_back_infer(g, pos, *ff, **params):
    return _check("rope_back", g, pos, ff, **params)


def _srcs(x, pos, freq_factors):
    return (x, pos) if freq_factors is None else (x, pos, freq_factors)


def rope(x, pos, freq_factors=None, *, n_dims, **params):
    """Rotary position embeddings (module doc): x (T, H, D) or (B, T, H, D) rotated pair by
    pair by the angles of the int32 positions pos (T,); parameters as ggml_rope_ext
    (mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast,
    beta_slow; llama.cpp's defaults)."""
    return make_node("rope", _srcs(x, pos, freq_factors), n_dims=n_dims,
                     **{**DEFAULTS, **params})


def rope_back(g, pos, freq_factors=None, *, n_dims, **params):
    """The gradient of rope with respect to x: g rotated by -theta (same magnitude
    scale), ggml_rope_ext_back."""
    return make_node("rope_back", _srcs(g, pos, freq_factors), n_dims=n_dims,
                     **{**DEFAULTS, **params})


def _rope_backward(g, out, x, pos, *ff, **params):
    return (rope_back(g, pos, *ff, **params), None) + (None,) * len(ff)


def _rope_back_backward(g, out, gin, pos, *ff, **params):
    return (rope(g, pos, *ff, **params), None) + (None,) * len(ff)


def _torch_rope(x, pos, freq_factors=None, *, sign=1.0, n_dims, mode, n_ctx_orig,
                freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow,
                precise=True):
    """rope written from the formulas, vectorised, in float64, rounded once to x's dtype
    (precise=False: in x's dtype throughout, as a torch user would write it: the bench's)."""
    import torch
    work = torch.float64 if precise else x.dtype

    from engine.reference_math import reference_yarn_range
    half = n_dims // 2
    i = torch.arange(half, dtype=torch.float64)
    inv_freq = (freq_base ** (-2.0 * i / n_dims)).to(work)
    i = i.to(work)
    extrap = pos.to(work)[:, None] * inv_freq
    if freq_factors is not None:
        extrap = extrap / freq_factors.to(work)
    theta, mscale = freq_scale * extrap, attn_factor
    if ext_factor != 0.0:
        low, high = reference_yarn_range(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
        mix = (1.0 - ((i - low) / max(0.001, high - low)).clamp(0.0, 1.0)) * ext_factor
        theta = theta * (1.0 - mix) + extrap * mix
        mscale *= 1.0 + 0.1 * np.log(1.0 / freq_scale)
    c = (mscale * torch.cos(theta))[:, None, :]            # (T, 1, half): over the heads
    s = (sign * mscale * torch.sin(theta))[:, None, :]
    xd = x.to(work)
    rot = xd[..., :n_dims]
    if mode == "neox":
        x0, x1 = rot[..., :half], rot[..., half:]
        y = torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], -1)
    else:
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        y = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).flatten(-2)
    return torch.cat([y, xd[..., n_dims:]], -1).to(x.dtype)


def _bench_torch_rope(x, pos, freq_factors=None, **params):
    """rope in x's dtype, for the bench (the reference computes in float64)."""
    return _torch_rope(x, pos, freq_factors, precise=False, **params)


def _torch_rope_back(g, pos, freq_factors=None, **params):
    return _torch_rope(g, pos, freq_factors, sign=-1.0, **params)


def _rope_back_primals(g, pos, *ff, **params):
    """rope_back(g, pos, ...) is rope's VJP with respect to x (rope is linear in x: any x,
    here zeros)."""
    inputs = {"x": np.zeros(g.shape), "pos": pos}
    if ff:
        inputs["freq_factors"] = ff[0]
    return inputs, g, params


# --- samples ------------------------------------------------------------------------------------
def _pos(t, low=0, high=64):
    return InputSpec("pos", (t,), "int", low, high, dtype="i32", grad=False)


def _ff(n_dims):
    return InputSpec("freq_factors", (n_dims // 2,), "uniform", 0.5, 4.0, grad=False)


# (x spec keywords, n_dims, pos range, freq factors, parameters besides the defaults)
CASES = [
    (dict(shape=(4, 2, 8)), 8, (0, 64), False, {}),
    (dict(shape=(3, 2, 10)), 6, (0, 64), False, {}),                   # partial n_dims
    (dict(shape=(3, 1, 7)), 4, (0, 64), False, dict(freq_base=500000.0)),  # odd D
    (dict(shape=(3, 2, 8)), 8, (0, 64), True, {}),                     # freq factors
    (dict(shape=(3, 2, 16)), 16, (1000, 8000), False, YARN),           # YaRN
    (dict(shape=(3, 2, 12)), 8, (0, 20000), True, dict(YARN, attn_factor=0.8, beta_fast=16.0,
                                                      beta_slow=2.0)),
    (dict(shape=(4, 2, 8)), 8, (-40, 0), False, dict(freq_scale=0.5, attn_factor=2.0)),
    (dict(shape=(3, 1, 8)), 8, (100000, 1000000), False, {}),          # large positions
    (dict(shape=(2, 3, 2, 8)), 8, (0, 64), False, {}),                 # a batch
    (dict(shape=(2, 3, 2, 10)), 6, (-10, 3000), True, YARN),
    (dict(shape=(3, 2, 8), permute=(1, 0, 2)), 8, (0, 64), False, {}),  # permuted views
    (dict(shape=(2, 3, 2, 8), permute=(3, 1, 0, 2)), 6, (0, 64), True, {}),
    (dict(shape=(3, 2, 8), slice=((1, 4, 1), (0, 4, 2), (1, 9, 1))), 8, (0, 64), False, {}),
    (dict(shape=(3, 4, 8), expand=(1,)), 8, (0, 64), False, {}),       # heads broadcast
]


def _case(op, name, spec, n_dims, prange_, ff, extra, mode, dtype):
    shape = spec["shape"]
    inputs = [InputSpec(name, **spec), _pos(shape[-3], *prange_)]
    if ff:
        inputs.append(_ff(n_dims))
    return Sample.make(op, inputs, dtype, n_dims=n_dims, **{**DEFAULTS, **extra, "mode": mode})


@both_dtypes
def _rope_samples(dtype):
    return [_case("rope", "x", *c, mode, dtype) for c in CASES for mode in MODES]


@both_dtypes
def _rope_back_samples(dtype):
    """g in each layout of rope's cases, both modes: checked against rope's VJP."""
    return [_case("rope_back", "g", *c, mode, dtype)
            for c in CASES[::2] + CASES[11::2] for mode in MODES]


def draw_yarn(draw, n_dims) -> dict:
    """YaRN's parameters drawn across their ranges: a context of 16 to 32768 positions,
    betas from 0.25 to 64, a base from 100 to 10^6, a scale from 1/64 to 1, an
    extrapolation weight from 1/8 to 1; most draws put the correction range's ends (ggml's
    floor and ceil of non-integers, yarn_corr_dims) inside [0, n_dims), where rounding
    them the wrong way moves the ramp."""
    from hypothesis import strategies as st
    slow = draw(st.sampled_from((0.25, 0.5, 1.0, 2.0)))
    return dict(n_ctx_orig=draw(st.integers(16, 32768)),
                freq_base=float(draw(st.sampled_from((100.0, 500.0, 10000.0, 1e6)))),
                freq_scale=1.0 / draw(st.integers(1, 64)),
                ext_factor=draw(st.integers(1, 8)) / 8.0,
                attn_factor=draw(st.sampled_from((0.5, 1.0, 1.5))),
                beta_fast=float(draw(st.integers(2, 64))), beta_slow=slow)


def _strategy(op, name):
    @sample_strategy
    def strategy(draw, dtype):
        from hypothesis import strategies as st
        lead = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=1)))
        t, h = draw(st.integers(1, 5)), draw(st.integers(1, 3))
        d = draw(st.integers(2, min(10, MAX_ELEMENTS // (math.prod(lead) * t * h))))
        n_dims = 2 * draw(st.integers(1, d // 2))
        shape = lead + (t, h, d)
        lo = draw(st.integers(-1000, 1000))
        inputs = [draw_input(draw, name, shape),
                  InputSpec("pos", (t,), "int", lo, lo + draw(st.integers(1, 50000)),
                            dtype="i32", grad=False, show_range=True)]
        if draw(st.booleans()):
            inputs.append(_ff(n_dims))
        extra = draw(st.sampled_from([{}, {}, dict(freq_scale=0.5, attn_factor=1.5)]))
        if draw(st.booleans()):
            extra = draw_yarn(draw, n_dims)
        return Sample.make(op, inputs, dtype, n_dims=n_dims,
                           **{**DEFAULTS, **extra, "mode": draw(st.sampled_from(MODES))})
    strategy.__name__ = f"_{op}_strategy"
    return strategy


def _scale(op, name):
    """Scale cases: 1031 tokens (prime: ragged token ranges for every thread count) of
    4 x 128 dims, 527,872 elements: the token split on the engine's threads (split:cpu_rope,
    split:cpu_rope_back); a batch of 2 in neox mode with YaRN and freq factors."""
    def cases():
        pos = InputSpec("pos", (1031,), "int", 0, 4096, dtype="i32", grad=False)
        return [scale_case(op, [InputSpec(name, (1031, 4, 128)), pos], n_dims=128, **DEFAULTS),
                scale_case(op, [InputSpec(name, (2, 1031, 2, 128)), pos, _ff(96)], n_dims=96,
                           **{**DEFAULTS, **YARN, "mode": "neox"})]
    return cases


def _bench():
    """Bench case: a llama-like layer's queries, 2048 tokens of 32 heads of 128 (8.4M
    elements), mode normal."""
    return [bench_case("rope", [InputSpec("x", (2048, 32, 128)),
                                InputSpec("pos", (2048,), "int", 0, 4096, dtype="i32",
                                          grad=False)], n_dims=128, **DEFAULTS)]


register(OpDef("rope", params=PARAMS, infer=_rope_infer, backward=_rope_backward,
               kernels={"cpu": cpu_rope, "cuda": "engine.backends.cuda.rope:cuda_rope"},
               build=rope, torch=_torch_rope, bench_torch=_bench_torch_rope,
               samples=_rope_samples, scale=_scale("rope", "x"), bench=_bench,
               strategy=_strategy("rope", "x"),
               doc="rotary position embeddings (ggml_rope_ext, YaRN); gradient: rope_back"))
register(OpDef("rope_back", params=PARAMS, kind="backward", infer=_rope_back_infer,
               backward=_rope_back_backward,
               kernels={"cpu": cpu_rope_back,
                        "cuda": "engine.backends.cuda.rope:cuda_rope_back"},
               build=rope_back, torch=_torch_rope_back, samples=_rope_back_samples,
               scale=_scale("rope_back", "g"), strategy=_strategy("rope_back", "g"),
               vjp_of=VJPOf("rope", _rope_back_primals),
               doc="g rotated by -theta: the gradient of rope; its own gradient is rope"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.backends.cpu import rope as cpu_rope_module  # noqa: E402
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import (  # noqa: E402
    backward_replaced,
    function_replaced,
    kernel_replaced,
)
from engine.registry import get_op  # noqa: E402


def _rope_other_pairing(real):
    def backward(g, out, x, pos, *ff, mode, **params):
        other = {"neox": "normal", "normal": "neox"}[mode]
        return real(g, out, x, pos, *ff, mode=other, **params)
    return backward


def _yarn_range_rounded_outward(real):
    """yarn_corr_dims with its ends rounded the wrong way: ceil of the low end, floor of the
    high one (ggml floors the low end and ceils the high one), clamped as before."""
    def corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow):
        def dim(beta):
            return n_dims * math.log(n_ctx_orig / (beta * 2.0 * math.pi)) / \
                (2.0 * math.log(freq_base))
        low, high = dim(beta_fast), dim(beta_slow)
        low = math.ceil(low) if math.isfinite(low) else low
        high = math.floor(high) if math.isfinite(high) else high
        return float(max(0.0, low)), float(min(n_dims - 1.0, high))
    return corr_dims


def _yarn(case) -> bool:
    return case.kwargs.get("ext_factor", 0.0) != 0.0 and case.kwargs.get("n_ctx_orig", 0) > 0


mutation.register(
    Mutant("rope_yarn_range_rounded_wrong", ("rope",),
           "YaRN's correction range (yarn_corr_dims) rounded the wrong way: the low end "
           "up and the high end down, so the ramp between extrapolated and interpolated "
           "angles moves by one pair at each end (forward and backward alike: torch's "
           "reference, derived from ggml's formula, sees it)",
           lambda: function_replaced(cpu_rope_module, "yarn_corr_dims",
                                     _yarn_range_rounded_outward),
           where=_yarn, kind="parameter rule"),
    Mutant("rope_back_rotates_forward", ("rope",),
           "rope_back rotates g by +theta (rope's own kernel) instead of -theta: the "
           "transpose of a rotation taken as the rotation itself",
           lambda: kernel_replaced("rope_back", lambda real: get_op("rope").kernels["cpu"]),
           kind="transposed gradient"),
    Mutant("rope_grad_pairs_swapped", ("rope",),
           "rope's backward rotates neox's pairs (i, i + n_dims/2) where the forward rotated "
           "adjacent ones (2i, 2i + 1), and the other way round",
           lambda: backward_replaced("rope", _rope_other_pairing), kind="transposed gradient"),
)
