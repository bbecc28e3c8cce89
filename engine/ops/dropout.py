"""dropout: seeded, reproducible inverted dropout.

    dropout(x, p, seed) = x * mask / (1 - p),   mask[i] in {0, 1}

for drop probability p in [0, 1) and an integer seed in [0, 2^64). mask[i], for element i
of x in C order, is a counter-based hash of (seed, i) (see engine.backends.cpu.dropout):
a deterministic function of the seed and the shape, the same on every run, thread count
and backend, computed inside the kernel without any buffer. An element survives with
probability 1 - p; p = 0 is the identity.

dropout is linear in x with the same mask for every input of the shape, so its gradient
is the same op on g: dropout(g, p, seed) = g * mask / (1 - p). torch reference: x times the
same mask computed by numpy from the same hash function.
"""

from __future__ import annotations

import numbers

import numpy as np

from engine.backends.cpu.dropout import cpu_dropout, keep_mask
from engine.errors import DTypeError, ParamError
from engine.params import Params, float_param, int_param, is_real, show_value
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import BENCH_ELEMENTS, SQUARE, TRANSPOSED, bench_case, scale_case
from engine.strategies import draw_input, sample_strategy, shapes
from engine.tensor import is_float

MAX_SEED = 2 ** 64


def _dropout_infer(x, p, seed):
    if not is_float(x.dtype):
        raise DTypeError(f"dropout: needs a float input, got {x.dtype} of shape "
                         f"{list(x.shape)}")
    return x.shape, x.dtype


def _check_params(x, p, seed) -> None:
    if not is_real(p) or not 0.0 <= p < 1.0:   # NaN, inf and big ints fail the comparison
        raise ParamError(f"dropout: p must be a number in [0, 1), got {show_value(p)} (input "
                         f"of shape {list(x.shape)})")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) \
            or not 0 <= seed < MAX_SEED:
        raise ParamError(f"dropout: seed must be an int in [0, 2^64), got {show_value(seed)}")


def dropout(x, p, seed):
    """x * mask / (1 - p): each element kept with probability 1 - p by a hash of
    (seed, its C-order index); p in [0, 1), seed an int in [0, 2^64)."""
    _check_params(x, p, seed)
    return make_node("dropout", (x,), p=float(p), seed=int(seed))


def _torch_dropout(x, p, seed):
    import torch
    scaled = np.where(keep_mask(seed, tuple(x.shape), p), 1.0 / (1.0 - p), 0.0)
    return x * torch.from_numpy(scaled).to(x.dtype)


# --- samples and registration ---------------------------------------------------------------
CASES = [((10,), 0.5, 0), ((3, 4), 0.0, 7), ((3, 4), 0.25, 1), ((2, 3, 4, 5), 0.5, 42),
         ((2, 3, 4, 5), 0.9, 3), ((7, 11), 0.1, 2 ** 63 + 5)]


@both_dtypes
def _dropout_samples(dtype):
    out = [Sample.make("dropout", [InputSpec("x", s)], dtype, p=p, seed=seed)
           for s, p, seed in CASES]
    out.append(Sample.make("dropout", [InputSpec("x", (3, 4, 5), permute=(2, 0, 1))], dtype,
                           p=0.3, seed=11))
    return out


@sample_strategy
def _dropout_strategy(draw, dtype):
    from hypothesis import strategies as st
    shape = draw(shapes(1, 4, 1, 6))
    return Sample.make("dropout", [draw_input(draw, "x", shape)], dtype,
                       p=draw(st.sampled_from([0.0, 0.1, 0.5, 0.8])),
                       seed=draw(st.integers(0, MAX_SEED - 1)))


def _dropout_scale():
    """Scale cases: SQUARE with p = 0.3 (its mask from the element's index, whatever the
    chunk), contiguous and transposed."""
    return [scale_case("dropout", [InputSpec("x", SQUARE, permute=p)], p=0.3, seed=5)
            for p in (None, TRANSPOSED)]


PARAMS = Params(dict(
    p=float_param(0.0, 1.0, high_open=True, why="the kept elements are scaled by 1 / (1 - p)"),
    seed=int_param(0, MAX_SEED - 1, why="the hash's uint64 seed")))


def _dropout_bench():
    """Bench case: BENCH_ELEMENTS at p = 0.1."""
    return [bench_case("dropout", [InputSpec("x", BENCH_ELEMENTS)], p=0.1, seed=5)]


def _bench_torch_dropout(x, p, seed):
    """torch's own dropout (its mask from torch's generator, not the engine's hash: the
    same work, other bits), for the bench: the reference computes the engine's mask in
    numpy."""
    import torch.nn.functional as F
    return F.dropout(x, p, training=True)


register(OpDef("dropout", params=PARAMS,
               scale=_dropout_scale, bench=_dropout_bench, infer=_dropout_infer,
               backward=lambda g, out, x, p, seed: (dropout(g, p, seed),),
               kernels={"cpu": cpu_dropout,
                        "cuda": "engine.backends.cuda.dropout:cuda_dropout"},
               build=dropout, torch=_torch_dropout, bench_torch=_bench_torch_dropout,
               samples=_dropout_samples, strategy=_dropout_strategy,
               doc="x * mask / (1 - p), mask a hash of (seed, index); gradient: the same "
                   "mask on g"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import kernel_replaced  # noqa: E402


def dropout_mask_in_memory_order(kernel):
    """dropout of a strided (permuted) x: the mask taken by each element's position in x's
    memory instead of its index in the output (C order); right on contiguous inputs."""
    def mutated(out, ins, p, seed):
        (x,) = ins
        order = np.argsort([-s for s in x.strides], kind="stable")
        stored = x.transpose(order)                  # x in its memory's axis order
        if x.flags.c_contiguous or not stored.flags.c_contiguous:
            return kernel(out, ins, p=p, seed=seed)
        masked = np.empty(stored.shape, out.dtype)
        kernel(masked, [stored], p=p, seed=seed)
        out[...] = masked.transpose(np.argsort(order))
    return mutated


mutation.register(
    Mutant("dropout_mask_in_memory_order", ("dropout",),
           "dropout of a permuted input takes each element's mask by its place in memory "
           "instead of its index: only the one permuted dropout case shows it",
           lambda: kernel_replaced("dropout", dropout_mask_in_memory_order),
           where=mutation.permuted, kind="permuted stride"),
)
