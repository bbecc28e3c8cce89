"""cast: a tensor's values in another float dtype (ggml's CPY and DUP with a type change).

    cast(x, dtype)[i] = x[i] rounded to `dtype` (to nearest, ties to even); exact when
    `dtype` holds every value of x's (f16 or bf16 to f32 or f64, f32 to f64).

The gradient of a rounding is taken as the identity (the rounding's derivative almost
everywhere, as every autograd engine takes it): grad_x = cast(g, x's dtype).

A cast to or from a 16-bit float computes as the CPU backend's widening does
(engine.backends.cpu.half.widened): the 16-bit input widened to float32 (exact), the output
rounded from float32 on store. float64 to a 16-bit float is thus rounded twice, through
float32, which gives the correctly rounded result: float32's 24 significant bits are at
least 2p + 2 for float16's p = 11 and bfloat16's p = 8. Between a 16-bit float and float32
or float64 the CPU kernel rounds or widens in one pass (half.store, half.widen_array: the
path `half:cast`), where the widening (its plain twin, in plain mode and between two 16-bit
formats) copies into a new float32 temporary first: float32 to bfloat16 over 8M elements,
forward and backward, took 1.42-1.91 times torch's (python bench/bench_ops.py --op cast
--repeat 7 --threads 1, load 8-12). The kernel is split along axis 0 on the engine's threads
(threads.split; each chunk rounds or widens its elements alone: the same bits): on one
thread it ran 1.61 times torch's two, forward and backward (bench_ops on a quiet machine).
"""

from __future__ import annotations

import functools

import numpy as np

from engine.backends.cpu import half, paths, threads
from engine.backends.cpu.jit import bindable
from engine.backends.cpu.patterns import native_half
from engine.errors import DTypeError
from engine.params import Params, choice_param
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample
from engine.scale_cases import BENCH_ELEMENTS, SIDE, bench_case, scale_case
from engine.strategies import draw_input, sample_strategy, shapes
from engine.tensor import FLOAT_NAMES, TORCH_DTYPE_NAMES, as_dtype, dtype_name, is_float, is_half

__all__ = ["cast"]


def _cast_infer(x, dtype):
    if not is_float(x.dtype):
        raise DTypeError(f"cast: needs a float input, got {x.dtype} of shape {list(x.shape)}")
    return x.shape, as_dtype(dtype)


def cast(x, dtype):
    """x's values in float dtype `dtype` ("f16", "bf16", "f32", "f64" or a numpy dtype),
    rounded to nearest even where it holds fewer of them."""
    return make_node("cast", (x,), dtype=_dtype_param(dtype))


def _dtype_param(dtype) -> str:
    """A dtype name for the parameter (numpy dtypes as their engine names); anything else
    is left for the parameter's check to refuse: None too, which numpy would read as
    float64."""
    if dtype is None:
        return dtype
    try:
        return dtype_name(dtype)
    except DTypeError:         # not a dtype: the check names it
        return dtype


def _cast_backward(g, out, x, dtype):
    return (cast(g, x.dtype),)


def _cast_plain(out, ins, dtype):
    """out = ins[0] in out's dtype (float32 or float64: 16-bit arrays reach it widened)."""
    np.copyto(out, ins[0], casting="unsafe")


_cast_widened = half.widened(_cast_plain)


def _cast_chunk(out, ins, dtype):
    """out = ins[0] in out's dtype: between a 16-bit float and float32 or float64 in one
    pass (the path half:cast), else by numpy, 16-bit arrays widened (module doc)."""
    (x,) = ins
    if paths.PLAIN or is_half(out.dtype) == is_half(x.dtype):
        kernel = _cast_widened if is_half(out.dtype) else _cast_plain
        kernel(out, ins, dtype=dtype)
        return
    paths.taken("half:cast")
    if is_half(out.dtype):
        half.store(out, x)
        return
    bits = np.ascontiguousarray(x.view(np.uint16)).reshape(-1)
    fmt = half.F16 if x.dtype == np.float16 else half.BF16
    wide = out if out.dtype == np.float32 else np.empty(out.shape, np.float32)
    half.widen_array(bits, wide.reshape(-1), fmt)
    if wide is not out:
        np.copyto(out, wide)


def _cast_prepare(out, ins, dtype):
    """A call of _cast_chunk (which reads paths.PLAIN and looks half.store up when it runs,
    as the 16-bit mutants need)."""
    return functools.partial(_cast_chunk, out, ins, dtype)


_cast_prepare.__name__ = _cast_prepare.__qualname__ = "cpu_cast"
cpu_cast = native_half(threads.split(bindable(_cast_prepare)))     # along axis 0


def _torch_cast(x, dtype):
    import torch
    return x.to(getattr(torch, TORCH_DTYPE_NAMES[dtype]))


# --- samples and registration ---------------------------------------------------------------
def _cast_samples():
    """Every pair of float dtypes, on a plain and a permuted input, in a range that every
    one of them holds (float16 ends at 65504)."""
    out = []
    for source in FLOAT_NAMES:
        for target in FLOAT_NAMES:
            out.append(Sample.make("cast", [InputSpec("x", (3, 4), low=-3.0, high=3.0)],
                                   source, dtype=target))
            out.append(Sample.make("cast", [InputSpec("x", (2, 3, 4), permute=(2, 0, 1),
                                                      low=-300.0, high=300.0)],
                                   source, dtype=target))
    return out


@sample_strategy
def _cast_strategy(draw, dtype):
    from hypothesis import strategies as st
    target = draw(st.sampled_from(FLOAT_NAMES))
    return Sample.make("cast", [draw_input(draw, "x", draw(shapes()))], dtype, dtype=target)


def _cast_scale():
    """Scale cases: a (1031, 1031) float32 image to float16, bfloat16 and float64."""
    return [scale_case("cast", [InputSpec("x", (SIDE, SIDE))], dtype=target)
            for target in ("f16", "bf16", "f64")]


def _cast_bench():
    """Bench case: BENCH_ELEMENTS of float32 rounded to bfloat16 (a mixed-precision
    model's weights or activations)."""
    return [bench_case("cast", [InputSpec("x", BENCH_ELEMENTS)], dtype="bf16")]


register(OpDef("cast", params=Params(dict(dtype=choice_param(*FLOAT_NAMES))),
               infer=_cast_infer,
               backward=_cast_backward,
               kernels={"cpu": cpu_cast, "cuda": "engine.backends.cuda.elementwise:cuda_cast"},
               build=cast, torch=_torch_cast, samples=_cast_samples, strategy=_cast_strategy,
               scale=_cast_scale, bench=_cast_bench,
               doc="x rounded to another float dtype; gradient: g cast back"))


# --- mutants: none yet for these ops, and why (engine.mutation, tests/engine/test_mutation.py) --
from engine import mutation  # noqa: E402  (imported here, with the declarations that use it)

mutation.exempt("cast", "no mutant yet: its gradient is g cast back to x's dtype; covered only by"
                        " --inject scale")
