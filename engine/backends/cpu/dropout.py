"""CPU kernel of dropout, and the keep-mask hash it shares with numpy.

Element i (C order) of an output survives when the i-th output of the splitmix64 stream
seeded with `seed`,

    z = seed + (i + 1) * 0x9E3779B97F4A7C15        (mod 2^64)
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z =  z ^ (z >> 31)

has its top 53 bits, z >> 11, at least `threshold` = round(p * 2^53): it survives with
probability 1 - p. The mask is a function of (seed, i) only: no generator state, no
allocation, the same bits for any thread count and any order of evaluation.

`keep` is plain Python on numpy uint64 values: numpy evaluates it on arrays of indices
(`keep_mask`, the torch reference's mask) and numba compiles the very same function for
the kernel, so the two cannot drift apart. Every constant is a np.uint64, so numba never
mixes signed and unsigned integers (which it would promote to float64).
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.jit import kernel, parallel_kernel, prange

ONE = np.uint64(1)
GAMMA = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
S11, S27, S30, S31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)


def keep(seed, index, threshold):
    """True where element `index` survives (seed, index, threshold: np.uint64 scalars or
    arrays; arithmetic wraps mod 2^64)."""
    z = seed + (index + ONE) * GAMMA
    z = (z ^ (z >> S30)) * MIX1
    z = (z ^ (z >> S27)) * MIX2
    z = z ^ (z >> S31)
    return (z >> S11) >= threshold


_keep = kernel(keep)


def threshold(p: float) -> np.uint64:
    """The keep threshold of drop probability p in [0, 1) on the top 53 bits of the hash."""
    return np.uint64(round(p * 2.0 ** 53))


def keep_mask(seed: int, shape, p: float) -> np.ndarray:
    """The keep-mask (bool, of `shape`) of dropout(x, p, seed) for x of `shape`, in numpy."""
    n = int(np.prod(shape, dtype=np.int64))
    idx = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return keep(np.uint64(seed), idx, threshold(p)).reshape(shape)


@parallel_kernel
def _dropout_flat(x, out, seed, thresh, scale):
    """out[i] = x[i] * (scale if element i survives else 0), 1-D arrays (out may be x)."""
    s = out.dtype.type(scale)
    zero = out.dtype.type(0)
    for i in prange(out.size):
        out[i] = x[i] * (s if _keep(seed, np.uint64(i), thresh) else zero)


def cpu_dropout(out, ins, p, seed):
    """Dispatcher of dropout: kernel(out, [x], p, seed)."""
    (x,) = ins
    flat = out.reshape(-1)
    if not x.flags.c_contiguous:      # a strided view: gather into out, then work in place
        np.copyto(out, x)
        x = out
    _dropout_flat(x.reshape(-1), flat, np.uint64(seed), threshold(p), 1.0 / (1.0 - p))
