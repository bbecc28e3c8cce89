"""pad: zero padding, one (before, after) pair per axis (numpy's pad_width order).

    pad(x, ((b0, a0), (b1, a1), ...)) has shape (b0 + n0 + a0, b1 + n1 + a1, ...) and
    out[b + k] = x[k] for 0 <= k < n (per axis), zero everywhere else.

ggml's PAD (zeros after the data, per ggml axis) and its PAD_EXT (zeros before and after)
in numpy axis order. Every axis needs its pair, (0, 0) for an unpadded axis: no axis is
padded by default. torch: F.pad(x, (b_last, a_last, ..., b0, a0)).

pad is linear; its gradient is the interior block of g: block(g, (b0, b1, ...), x.shape).
"""

from __future__ import annotations

from engine.backends.cpu.pad import cpu_pad
from engine.errors import DTypeError, ParamError
from engine.ops.block import block
from engine.params import Params, int_rows_param, int_tuple
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import SQUARE, TRANSPOSED, bench_case, scale_case
from engine.strategies import draw_input, sample_strategy, shapes
from engine.tensor import is_float


def normalize_pads(op: str, pads, ndim: int) -> tuple[tuple[int, int], ...]:
    """pads as ((before, after), ...) of non-negative ints, exactly one pair per axis."""
    try:
        pairs = tuple(pads)
    except TypeError:
        raise ParamError(f"{op}: pads must be {ndim} (before, after) pairs, got {pads!r}") \
            from None
    if len(pairs) != ndim:
        raise ParamError(f"{op}: pads must give one (before, after) pair per axis: {ndim} "
                         f"pairs, got {len(pairs)} ({pads!r})")
    return tuple(int_tuple(op, f"pads[{i}]", p, 2) for i, p in enumerate(pairs))


def _pad_infer(x, pads):
    if not is_float(x.dtype):
        raise DTypeError(f"pad: needs a float input, got {x.dtype} of shape {list(x.shape)}")
    if len(pads) != x.ndim:
        raise ParamError(f"pad: {len(pads)} (before, after) pairs for shape {list(x.shape)}")
    return tuple(b + n + a for n, (b, a) in zip(x.shape, pads, strict=True)), x.dtype


def pad(x, pads):
    """x with zeros around it: pads = ((before, after), ...), one pair per axis."""
    return make_node("pad", (x,), pads=normalize_pads("pad", pads, x.ndim))


def _pad_backward(g, out, x, pads):
    return (block(g, tuple(b for b, _ in pads), x.shape),)


def _torch_pad(x, pads):
    import torch.nn.functional as F
    flat = [v for b, a in reversed(pads) for v in (b, a)]
    return F.pad(x, flat) if flat else x.clone()


# --- samples and registration ---------------------------------------------------------------
CASES = [((10,), ((0, 5),)), ((10,), ((4, 0),)), ((4, 6), ((1, 1), (1, 1))),
         ((4, 6), ((0, 2), (3, 0))), ((4, 6), ((0, 0), (0, 0))),
         ((2, 3, 4), ((0, 0), (2, 1), (0, 3))),
         ((2, 3, 4, 5), ((1, 1), (1, 1), (1, 1), (1, 1))),     # ggml's PAD_EXT
         ((2, 3, 4, 5), ((0, 0), (0, 0), (0, 2), (0, 1))),     # ggml's PAD
         ((1, 1, 3, 4), ((0, 1), (2, 0), (0, 0), (1, 2)))]


@both_dtypes
def _pad_samples(dtype):
    out = [Sample.make("pad", [InputSpec("x", s)], dtype, pads=p) for s, p in CASES]
    out += [Sample.make("pad", [InputSpec("x", (3, 4, 5), permute=(2, 1, 0))], dtype,
                        pads=((1, 0), (0, 2), (1, 1)))]
    return out


@sample_strategy
def _pad_strategy(draw, dtype):
    from hypothesis import strategies as st
    shape = draw(shapes(1, 4, 1, 5))
    pads = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in shape)
    return Sample.make("pad", [draw_input(draw, "x", shape)], dtype, pads=pads)


def _pad_scale():
    """Scale cases: SQUARE padded on every side, contiguous and transposed."""
    return [scale_case("pad", [InputSpec("x", SQUARE, permute=p)], pads=((1, 2), (3, 0)))
            for p in (None, TRANSPOSED)]


def _pad_bench():
    """Bench case: a convolution's input padded by one pixel, 64 images of 56 x 56 with
    32 channels."""
    return [bench_case("pad", [InputSpec("x", (64, 32, 56, 56))],
                       pads=((0, 0), (0, 0), (1, 1), (1, 1)))]


register(OpDef("pad", params=Params(dict(pads=int_rows_param(
                   2, 0, why="zeros added, none taken away"))),
               scale=_pad_scale, bench=_pad_bench, infer=_pad_infer, backward=_pad_backward,
               kernels={"cpu": cpu_pad, "cuda": "engine.backends.cuda.indexing:cuda_pad"},
               build=pad, torch=_torch_pad, samples=_pad_samples, strategy=_pad_strategy,
               doc="zero padding, one (before, after) pair per axis; gradient: the interior "
                   "block"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import kernel_replaced  # noqa: E402


def pad_border_unwritten(kernel):
    """pad copies x into the interior block but never zeroes the border (the padding):
    right only on a buffer that was zero before."""
    def mutated(out, ins, pads):
        before = out.copy()
        kernel(out, ins, pads=pads)
        interior = tuple(slice(b, b + n) for (b, _), n in zip(pads, ins[0].shape, strict=True))
        inside = out[interior].copy()
        out[...] = before
        out[interior] = inside
    return mutated


mutation.register(
    Mutant("pad_border_unwritten", ("pad",),
           "pad copies x into the interior but never zeroes the border: right on a zeroed "
           "buffer, NaN on reused memory",
           lambda: kernel_replaced("pad", pad_border_unwritten),
           where=lambda case: any(any(p) for p in case.kwargs["pads"]), kind="unwritten edge"),
)
