"""Row normalisations along the last axis (C elements), without weight or bias, as ggml's
rms_norm and norm, each with a dedicated one-pass-per-row backward op.

    rms_norm(x, eps)[..., j] = x_j s,          s = 1 / sqrt(mean_k x_k^2 + eps)
    norm(x, eps)[..., j]     = (x_j - mu) s,   s = 1 / sqrt(var + eps)

with mu = mean_k x_k and the biased variance var = mean_k (x_k - mu)^2 (torch's layer_norm
without affine). Sums over a row are taken in float64. Backward, g the output gradient:

    rms_norm_back(g, x, eps)[..., j] = s g_j - x_j s^3 mean_k (g_k x_k)
    norm_back(g, x, eps)[..., j]     = s (g_j - mean_k g_k - xhat_j mean_k (g_k xhat_k)),
                                       xhat = (x - mu) s

Composed from engine ops, either backward would take several passes and temporaries per
row; the dedicated ops read g and x once more each. eps must be a finite number >= 0 (with
eps = 0 a row of zeros, or for norm a constant row, divides by zero). The kernels read rows
as contiguous memory, so the builders put `cont` in front of strided (permuted) inputs.
"""

from __future__ import annotations

import math

from engine.backends.cpu.norm import cpu_norm, cpu_norm_back, cpu_rms_norm, cpu_rms_norm_back
from engine.errors import ParamError
from engine.ops.shape import contiguous_inputs
from engine.params import REQUIRED, Params, check_rows, float_param, is_real, number, show_value
from engine.registry import OpDef, VJPOf, at_x, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import (
    BENCH_DTYPE,
    BENCH_HALF_DTYPES,
    BENCH_ROWS,
    SQUARE,
    TRANSPOSED,
    bench_cases,
    scale_case,
)
from engine.strategies import draw_row_input, sample_strategy


def check_eps(op: str, eps) -> float:
    """eps as a float; a bool, a non-number, NaN, inf or a negative number raise."""
    if is_real(eps) and not 0 <= eps < math.inf:   # compares big ints without overflow
        raise ParamError(f"{op}: eps must be finite and >= 0, got {show_value(eps)}")
    return number(op, "eps", eps)


def eps_param(default=REQUIRED):
    """eps, declared: a finite number >= 0 (the root of mean + eps stays real); a node's
    is required (the builders default it), a composite's defaults to `default`."""
    return float_param(0.0, default=default,
                       why="s = 1/sqrt(mean + eps) takes the root of mean + eps; with eps 0 a "
                           "row of zeros (for norm, a constant row) divides by zero")


PARAMS = Params(dict(eps=eps_param()))


def _row_infer(op):
    def infer(x, eps):
        check_rows(op, x)
        return x.shape, x.dtype
    return infer


def _back_infer(op):
    def infer(g, x, eps):
        check_rows(op, g, x)
        return x.shape, x.dtype
    return infer


def rms_norm(x, eps=1e-6):
    """x / sqrt(mean(x^2) + eps) along the last axis (no weight)."""
    (x,) = contiguous_inputs(x)
    return make_node("rms_norm", (x,), eps=check_eps("rms_norm", eps))


def rms_norm_back(g, x, eps=1e-6):
    """Gradient of rms_norm(x, eps) given the output gradient g:
    s g - x s^3 mean(g x), s = 1 / sqrt(mean(x^2) + eps), along the last axis."""
    g, x = contiguous_inputs(g, x)
    return make_node("rms_norm_back", (g, x), eps=check_eps("rms_norm_back", eps))


def norm(x, eps=1e-5):
    """(x - mean(x)) / sqrt(var(x) + eps) along the last axis (biased variance, no affine)."""
    (x,) = contiguous_inputs(x)
    return make_node("norm", (x,), eps=check_eps("norm", eps))


def norm_back(g, x, eps=1e-5):
    """Gradient of norm(x, eps) given the output gradient g:
    s (g - mean(g) - xhat mean(g xhat)), xhat = norm(x, eps), s = 1 / sqrt(var(x) + eps)."""
    g, x = contiguous_inputs(g, x)
    return make_node("norm_back", (g, x), eps=check_eps("norm_back", eps))


# --- samples, strategies, torch references ----------------------------------------------------
# ggml checks eps in {0, 1e-6, 1e-4, 1e-1} on contiguous and strided inputs; rows here are
# short (the finite-difference check costs 4 evaluations per element)
EPS = (0.0, 1e-6, 1e-4, 1e-1)
# (shape, permute, (low, high))
CASES = [((8,), None, (-1.0, 1.0)), ((3, 5), None, (-1.0, 1.0)),
         ((2, 3, 6), None, (-10.0, 10.0)), ((2, 2, 3, 5), None, (-1.0, 1.0)),
         ((4, 6), (1, 0), (-1.0, 1.0)), ((3, 4, 5), (2, 0, 1), (-1.0, 1.0)),
         ((3, 7), None, (2.0, 4.0)),              # a large mean against a small spread
         ((2, 3), None, (-1.0, 1.0))]             # rows of three
# the backward ops' extra cases: (shape, permute of g, stride-0 axes of g); g is broadcast
# along leading axes only (norm_back of a g constant along its rows is 0)
BACK_LAYOUTS = [((5, 6), (1, 0), None), ((2, 3, 5), (1, 2, 0), None), ((4, 6), None, (0,)),
                ((2, 3, 5), None, (1,))]


def _samples(op, default_eps):
    @both_dtypes
    def samples(dtype):
        out = []
        for i, (shape, perm, (lo, hi)) in enumerate(CASES):
            eps = EPS[i % len(EPS)]
            # eps = 0: keep rows long enough that no row is (nearly) constant
            eps = default_eps if eps == 0.0 and shape[-1] < 5 else eps
            back = op.endswith("_back")
            inputs = [InputSpec("x", shape, low=lo, high=hi, permute=perm, grad=not back)]
            if back:
                inputs.insert(0, InputSpec("g", shape, grad=False))
            out.append(Sample.make(op, inputs, dtype, eps=eps))
        if op.endswith("_back"):     # a permuted or stride-0 upstream gradient, x contiguous
            out += [Sample.make(op, [InputSpec("g", shape, grad=False, permute=perm,
                                               expand=axes),
                                     InputSpec("x", shape, grad=False)], dtype, eps=1e-4)
                    for shape, perm, axes in BACK_LAYOUTS]
        return out
    return samples


def _strategy(op):
    def draw_case(draw, dtype):
        """x of 1-4 axes, rows in a range of MAGNITUDES (tiny 1e-3 to huge 1e3, and a
        shifted one), possibly a view; eps from ggml's values or drawn. Rows have >= 2
        elements for rms_norm and >= 3 for norm: shorter rows have a gradient of order eps
        made by cancellation, which torch's float32 reference cannot resolve."""
        from hypothesis import strategies as st
        back = op.endswith("_back")
        min_cols = 2 if op.startswith("rms") else 3
        x = draw_row_input(draw, "x", min_cols=min_cols, grad=not back)
        eps = draw(st.sampled_from(EPS[1:]) | st.floats(1e-6, 1.0).map(lambda v: float(f"{v:.3g}")))
        inputs = [InputSpec("g", x.shape, grad=False), x] if back else [x]
        return Sample.make(op, inputs, dtype, eps=eps)
    draw_case.__qualname__ = f"{op}_strategy"
    return sample_strategy(draw_case)


# The references compute in float64 and round to the input's dtype, as the kernels do: in
# float32, torch's own row sums lose digits where the values of a row are close (norm
# subtracts their mean), by up to 50 ulp of the row's largest gradient.
def _torch_rms_norm(x, eps=1e-6):
    import torch
    z = x.double()
    return (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _torch_norm(x, eps=1e-5):
    import torch.nn.functional as F
    return F.layer_norm(x.double(), x.shape[-1:], eps=eps).to(x.dtype)


def _bench_torch_rms_norm(x, eps=1e-6):
    """torch's own rms_norm in x's dtype (the bench's: the reference computes in float64)."""
    import torch.nn.functional as F
    return F.rms_norm(x, x.shape[-1:], eps=eps)


def _bench_torch_norm(x, eps=1e-5):
    """torch's own layer norm in x's dtype (the bench's)."""
    import torch.nn.functional as F
    return F.layer_norm(x, x.shape[-1:], eps=eps)


def _vjp(forward):
    """The torch reference of a backward op: autograd's vector-Jacobian product of
    `forward` at x with the output gradient g."""
    def reference(g, x, eps):
        import torch
        with torch.enable_grad():
            xx = x.detach().requires_grad_(True)
            (dx,) = torch.autograd.grad(forward(xx, eps), xx, g.to(x.dtype))
        return dx.to(g.dtype)
    return reference


def _norm_scale(name):
    """Scale cases: SQUARE rows, contiguous and transposed."""
    def scale():
        return [scale_case(name, [InputSpec("x", SQUARE, permute=p)], eps=1e-5)
                for p in (None, TRANSPOSED)]
    return scale


def _norm_bench(name):
    """Bench cases: BENCH_ROWS rows (4096 tokens of 4096 features), in float32, float16
    and bfloat16."""
    def bench():
        return bench_cases(name, [InputSpec("x", BENCH_ROWS)], (BENCH_DTYPE, *BENCH_HALF_DTYPES),
                           eps=1e-5)
    return bench


def _backward_by(build_back):
    """The backward of a row normalisation: its dedicated backward op at x."""
    return lambda g, out, x, eps: (build_back(g, x, eps),)


# each normalisation and its backward op: (name, builders, cpu kernels, torch reference,
# the samples' eps, docs); the CUDA kernels are cuda_<name> and cuda_<name>_back
_NORMS = (
    ("rms_norm", rms_norm, rms_norm_back, cpu_rms_norm, cpu_rms_norm_back, _torch_rms_norm,
     _bench_torch_rms_norm, 1e-6, "x / sqrt(mean(x^2) + eps) along the last axis",
     "s g - x s^3 mean(g x), s = 1/sqrt(mean(x^2) + eps): the gradient of rms_norm"),
    ("norm", norm, norm_back, cpu_norm, cpu_norm_back, _torch_norm, _bench_torch_norm,
     1e-5, "(x - mean) / sqrt(var + eps) along the last axis (layer norm, no affine)",
     "s (g - mean(g) - xhat mean(g xhat)): the gradient of norm"),
)
for (_name, _build, _build_back, _kernel, _kernel_back, _torch, _bench_torch, _eps, _doc,
     _doc_back) in _NORMS:
    register(OpDef(_name, params=PARAMS, scale=_norm_scale(_name), bench=_norm_bench(_name),
                   infer=_row_infer(_name),
                   backward=_backward_by(_build_back),
                   kernels={"cpu": _kernel, "cuda": f"engine.backends.cuda.norm:cuda_{_name}"},
                   build=_build, torch=_torch, bench_torch=_bench_torch,
                   samples=_samples(_name, _eps), strategy=_strategy(_name), doc=_doc,
                   # norm's output has mean 0 along the row: a cotangent constant along
                   # it has a zero VJP (rms_norm's does not)
                   null_cotangents=("expanded",) if _name == "norm" else ()))
    register(OpDef(f"{_name}_back", params=PARAMS, kind="backward",
                   infer=_back_infer(f"{_name}_back"), no_grad="dedicated backward op",
                   kernels={"cpu": _kernel_back,
                            "cuda": f"engine.backends.cuda.norm:cuda_{_name}_back"},
                   build=_build_back, torch=_vjp(_torch), vjp_of=VJPOf(_name, at_x),
                   samples=_samples(f"{_name}_back", _eps),
                   strategy=_strategy(f"{_name}_back"), doc=_doc_back))


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("norm", "no mutant yet: its gradient is its dedicated op norm_back; covered only "
                        "by --inject scale")
mutation.exempt("norm_back", "no mutant yet: a dedicated backward op, checked against norm's VJP "
                             "by gradcheck.backward_ops; no known bug is injected into its kernel")
mutation.exempt("rms_norm", "no mutant yet: its gradient is its dedicated op rms_norm_back; "
                            "covered only by --inject scale")
mutation.exempt("rms_norm_back", "no mutant yet: a dedicated backward op, checked against "
                                 "rms_norm's VJP by gradcheck.backward_ops; no known bug is "
                                 "injected into its kernel")
