"""Sample cases: the inputs and parameters on which an op is checked.

A `Sample` is a frozen dataclass. Its string form, the op's name, then `type=` the dtype,
each input's name and shape (a permuted input adds its axis order: `x=[3,4,5]perm[2,0,1]`)
and the parameters sorted by name, e.g.

    pool_2d(type=f32,x=[2,3,8,8],kernel=[3,3],mode=max,padding=[1,1],stride=[2,2])

is the pytest id, the CLI filter key (`gradcheck -k mode=max`) and the report row.

A sample's `cotangent` says how the engine under test receives the upstream gradient of the
op's output (the loss weights): "contiguous" (the default, not printed), "permuted" (a
view with its axes reversed, as the backward of cont(permute(y)) hands it), "expanded"
(stride 0 along the last axis, as the backward of a sum over that axis hands it: the weights
are then constant along it) or "sliced" (a view at offset 1 into a buffer one larger on
each side of every axis, as the backward of acc or pad hands it). It is printed last, e.g.
`...,stride=[2,2],cotangent=permuted`.

A sample's `tier` is "fast" (the registry's `samples`: small, every element checked) or
"scale" (the registry's `scale` cases: sizes that take every threaded, chunked, tiled and
zero-skipping kernel path, judged by gradcheck.scale). It is not printed: scale cases are
told apart by their sizes, and selected with `gradcheck --tier scale`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from engine.registry import get_op
from engine.tensor import as_dtype, dtype_name

GENERATORS = ("uniform", "away_from_zero", "distinct", "probs", "int")
COTANGENTS = ("contiguous", "permuted", "expanded", "sliced")
TIERS = ("fast", "scale")


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """How one input of a sample is made.

    kind: uniform in [low, high]; away_from_zero: |x| in [low, high] with a random sign
    (keeps relu/abs/sgn off their kink); distinct: a shuffled evenly spaced grid over
    [low, high] (no ties, so max-pool and argmax are differentiable); probs: rows on the
    probability simplex along the last axis; int: integers in [low, high).
    dtype None means the sample's dtype. grad False marks inputs that are not checked
    (labels, indices). permute: the op receives a non-contiguous view, permute(leaf,
    permute), of a leaf that stores the data in another axis order; `shape` is the view's.
    """

    name: str
    shape: tuple[int, ...]
    kind: str = "uniform"
    low: float = -1.0
    high: float = 1.0
    dtype: str | None = None
    grad: bool = True
    permute: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.kind not in GENERATORS:
            raise ValueError(f"input {self.name}: kind must be one of {GENERATORS}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.permute is not None:
            p = tuple(int(a) for a in self.permute)
            if sorted(p) != list(range(len(self.shape))):
                raise ValueError(f"input {self.name}: permute {p} is not a permutation of "
                                 f"the axes of {self.shape}")
            object.__setattr__(self, "permute", p)

    def __str__(self) -> str:
        text = f"{self.name}={_fmt(list(self.shape))}"
        return text + (f"perm{_fmt(list(self.permute))}" if self.permute else "")

    def to_leaf(self, value: np.ndarray) -> np.ndarray:
        """The leaf's data for an input whose (view) value is `value`."""
        if self.permute is None:
            return value
        return np.ascontiguousarray(value.transpose(np.argsort(self.permute)))

    def from_leaf(self, leaf_value: np.ndarray) -> np.ndarray:
        """A leaf-layout array (data, gradient) in the layout the op sees."""
        return leaf_value if self.permute is None else leaf_value.transpose(self.permute)

    def generate(self, rng: np.random.Generator, dtype) -> np.ndarray:
        dt = as_dtype(self.dtype or dtype)
        shape, lo, hi = self.shape, self.low, self.high
        if self.kind == "uniform":
            x = rng.uniform(lo, hi, shape)
        elif self.kind == "away_from_zero":
            x = rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape)
        elif self.kind == "distinct":
            n = int(np.prod(shape))
            x = (lo + (hi - lo) * rng.permutation(n) / max(n - 1, 1)).reshape(shape)
        elif self.kind == "probs":
            z = rng.uniform(lo, hi, shape)
            z = np.exp(z - z.max(axis=-1, keepdims=True))
            x = z / z.sum(axis=-1, keepdims=True)
        else:
            x = rng.integers(int(lo), int(hi), shape)
        return np.asarray(x).astype(dt)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One case of an op: its inputs, its parameters (as sorted pairs) and its dtype."""

    op: str
    inputs: tuple[InputSpec, ...]
    params: tuple[tuple[str, Any], ...] = ()
    dtype: str = "f32"
    cotangent: str = "contiguous"
    tier: str = "fast"

    def __post_init__(self):
        if self.cotangent not in COTANGENTS:
            raise ValueError(f"cotangent must be one of {COTANGENTS}, got {self.cotangent!r}")
        if self.tier not in TIERS:
            raise ValueError(f"tier must be one of {TIERS}, got {self.tier!r}")

    @classmethod
    def make(cls, op: str, inputs, dtype="f32", /, **params) -> Sample:
        """A sample of `op`; `dtype` is positional so that an op param may be named dtype."""
        return cls(op, tuple(inputs), tuple(sorted(params.items())), dtype_name(dtype))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    def __str__(self) -> str:
        parts = [f"type={self.dtype}"]
        parts += [str(i) for i in self.inputs]
        parts += [f"{k}={_fmt(v)}" for k, v in self.params]
        if self.cotangent != "contiguous":
            parts.append(f"cotangent={self.cotangent}")
        return f"{self.op}({','.join(parts)})"

    @property
    def float_dtypes(self) -> set[str]:
        """Every float dtype the case computes in: its own, its inputs', a `dtype` param's."""
        names = {self.dtype} | {i.dtype for i in self.inputs if i.dtype}
        if isinstance(self.kwargs.get("dtype"), str):
            names.add(self.kwargs["dtype"])
        return names & {"f32", "f64"}

    @property
    def precision(self) -> str:
        """The least precise float dtype the case computes in: its tolerances follow it."""
        return "f32" if "f32" in self.float_dtypes else "f64"

    def promoted(self, dtype: str = "f64") -> Sample:
        """The same case with every float dtype replaced by `dtype` (the float64 reference
        of a float32 case). The string form, and so the seed, stay the original's."""
        inputs = tuple(dataclasses.replace(i, dtype=dtype) if i.dtype in ("f32", "f64")
                       else i for i in self.inputs)
        params = tuple((k, dtype if k == "dtype" and v in ("f32", "f64") else v)
                       for k, v in self.params)
        return _Promoted(self.op, inputs, params, dtype, self.cotangent, self.tier,
                         original=str(self))

    def seed(self) -> int:
        """A seed derived from the case itself, so its data never depends on run order."""
        return int.from_bytes(hashlib.sha256(str(self).encode()).digest()[:8], "little")

    def generate_inputs(self) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed())
        return [spec.generate(rng, self.dtype) for spec in self.inputs]

    @property
    def torch_fn(self):
        """The op's torch equivalent (None if it has none)."""
        return get_op(self.op).torch

    @property
    def torch_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for torch_fn, float dtypes promoted to float64."""
        return self.promoted("f64").kwargs

    def leaf_arrays(self, arrays) -> list[np.ndarray]:
        """The leaves' data for input values `arrays` (see InputSpec.permute)."""
        return [spec.to_leaf(a) for spec, a in zip(self.inputs, arrays, strict=True)]

    def build(self, *leaves):
        """Build the op on `leaves` (one per input spec; permuted specs are viewed)."""
        permute = get_op("permute").build
        tensors = [permute(t, spec.permute) if spec.permute else t
                   for spec, t in zip(self.inputs, leaves, strict=True)]
        return get_op(self.op).build(*tensors, **self.kwargs)


@dataclasses.dataclass(frozen=True)
class _Promoted(Sample):
    original: str = ""

    def __str__(self) -> str:
        return self.original


def _fmt(v) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def both_dtypes(make_samples):
    """Decorator: a samples() function written for one dtype yields f32 and f64 cases."""
    def samples():
        out = []
        for dt in ("f32", "f64"):
            out.extend(make_samples(dt))
        return out
    samples.__doc__ = make_samples.__doc__
    return samples
