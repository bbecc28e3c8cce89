"""Sample cases: the inputs and parameters on which an op is checked.

A `Sample` is a frozen dataclass. Its string form, the op's name, then `type=` the dtype,
each input's name and shape (the shape the op sees; a view of its leaf adds how:
`x=[3,4,5]perm[2,0,1]`, `x=[4,4]slice[1:5,0:8:2]`, `g=[3,4]expand[1]`; a drawn range adds
itself: `x=[3,4]range[-8,8]`, see InputSpec) and the parameters sorted by name, e.g.

    pool_2d(type=f32,x=[2,3,8,8],kernel=[3,3],mode=max,padding=[1,1],stride=[2,2])

is the pytest id, the CLI filter key (`gradcheck -k mode=max`) and the report row.

A sample's `cotangent` says how the engine under test receives the upstream gradient of the
op's output (the loss weights): "contiguous" (the default, not printed), "permuted" (a
view with its axes reversed, as the backward of cont(permute(y)) hands it), "expanded"
(stride 0 along the last axis, as the backward of a sum over that axis hands it: the weights
are then constant along it), "expanded_first" (the same along the first axis, for an op
whose VJP vanishes for a cotangent constant along the last axis: softmax, layer norm; see
OpDef.null_cotangents) or "sliced" (a view at offset 1 into a buffer one larger on each
side of every axis, as the backward of acc or pad hands it). It is printed last, e.g.
`...,stride=[2,2],cotangent=permuted`.

A sample's `tier` is "fast" (the registry's `samples`: small, every element checked),
"scale" (the registry's `scale` cases: sizes that take every threaded, chunked, tiled and
zero-skipping kernel path, judged by gradcheck.scale) or "bench" (the registry's `bench`
cases: the realistic sizes that bench/bench_ops.py times against torch). It is not
printed: scale cases are told apart by their sizes, and selected with `gradcheck --tier
scale`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import ml_dtypes
import numpy as np

from engine.registry import get_op
from engine.tensor import FLOAT_NAMES, HALF_DTYPES, UNIT_ROUNDOFF, as_dtype, dtype_name, is_float

GENERATORS = ("uniform", "away_from_zero", "distinct", "probs", "int", "sparse", "sparse_cols",
              "special")
SPECIAL_SHARE = 0.25       # "special": the share of NaN, +inf and -inf (a third each, at
#                            least one of each)
SPARSE_DENSITY = 0.1       # the share of non-zeros of a "sparse" input
SPARSE_COLUMNS = 0.25      # "sparse_cols": the share of columns that hold non-zeros ...
SPARSE_COLUMN_DENSITY = 0.6    # ... and the share of non-zeros within them
COTANGENTS = ("contiguous", "permuted", "expanded", "expanded_first", "sliced")
VIEW_BORDER = np.nan       # the border of a sliced input's leaf, outside the op's view
TIERS = ("fast", "scale", "bench")


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """How one input of a sample is made.

    kind: uniform in [low, high]; away_from_zero: |x| in [low, high] with a random sign
    (keeps relu/abs/sgn off their kink), in each half of a row as many of one sign as of
    the other, shuffled (a relu of negatives only has a zero gradient: its check could not
    fail); distinct: a shuffled evenly spaced grid over [low, high] (no ties, so max-pool
    and argmax are differentiable); probs: rows on the probability simplex along the last
    axis; int: integers in [low, high); sparse:
    uniform in [low, high] where a random SPARSE_DENSITY of the elements are, exact zeros
    elsewhere (the zero-skipping matmul takes such an operand; MNIST's images are 19%
    non-zero); sparse_cols: as an image's borders, non-zeros (a share
    SPARSE_COLUMN_DENSITY, uniform in [low, high]) only in a random SPARSE_COLUMNS of the
    columns (the last axis), the rest exact zeros (the zero-skipping matmul then drops
    whole columns: its column split); special: uniform in [low, high] but a share
    SPECIAL_SHARE of the elements, NaN, +inf or -inf (a case with such an input is a
    propagation case, `Sample.special`: its forward checked for the reference's NaNs and
    infinities, gradcheck.special_values).
    dtype None means the sample's dtype. grad False marks inputs that are not checked
    (labels, indices).

    The op may receive a view of a leaf that stores the data otherwise; `shape` is always
    the view's, the shape the op sees (`leaf_shape` is the leaf's):
    - permute: permute(leaf, permute), a leaf in another axis order (`x=[3,4,5]perm[2,0,1]`);
    - slice: one (start, stop, step) per axis, stop exclusive, step >= 1: the op sees
      strided_slice(leaf, ...), leaf[start:stop:step] on each axis, of a leaf that reaches
      as far past `stop` as `start` lies before it (side start + stop), so that the view
      has an offset, strides and a border on both sides: `x=[4,4]slice[1:5,0:8:2]` is
      x[1:5, 0:8:2] of a [6, 8] leaf. The border holds NaN (VIEW_BORDER; `low` for
      integers), which a kernel reading outside its view turns into a failure;
    - expand: axes on which the leaf has side 1 and the op sees a stride-0 broadcast of
      it, expand(leaf, shape) (`g=[3,4]expand[1]`: a [3, 1] leaf). The values are drawn
      per leaf element, so they repeat along those axes.
    slice and expand combine (an expanded axis is sliced to one element); permute goes
    alone. Gradients are compared in the layout the op sees (`from_leaf` of the leaf's
    gradient): along an expanded axis every element shows its leaf element's gradient.

    show_range: the range is part of the string (`x=[3,4]range[-8,8]`, or the kind for
    another generator, `away_from_zero[0.1,3]`), and so of the seed: set where the range
    is drawn (the strategies); registry samples keep their fixed ranges unprinted.
    """

    name: str
    shape: tuple[int, ...]
    kind: str = "uniform"
    low: float = -1.0
    high: float = 1.0
    dtype: str | None = None
    grad: bool = True
    permute: tuple[int, ...] | None = None
    slice: tuple[tuple[int, int, int], ...] | None = None
    expand: tuple[int, ...] | None = None
    show_range: bool = False

    def __post_init__(self):
        if self.kind not in GENERATORS:
            raise ValueError(f"input {self.name}: kind must be one of {GENERATORS}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "low", _plain_number(self.low))
        object.__setattr__(self, "high", _plain_number(self.high))
        if self.permute is not None:
            p = tuple(int(a) for a in self.permute)
            if sorted(p) != list(range(len(self.shape))):
                raise ValueError(f"input {self.name}: permute {p} is not a permutation of "
                                 f"the axes of {self.shape}")
            object.__setattr__(self, "permute", p)
        if self.expand is not None:
            object.__setattr__(self, "expand", _checked_expand(self))
        if self.slice is not None:
            object.__setattr__(self, "slice", _checked_slice(self))
        if self.permute is not None and (self.slice or self.expand):
            raise ValueError(f"input {self.name}: permute goes alone, not with slice or "
                             "expand")

    def __str__(self) -> str:
        text = f"{self.name}={_fmt(list(self.shape))}"
        if self.permute:
            text += f"perm{_fmt(list(self.permute))}"
        if self.slice:
            text += "slice[" + ",".join(
                f"{a}:{b}" + (f":{c}" if c != 1 else "") for a, b, c in self.slice) + "]"
        if self.expand:
            text += f"expand{_fmt(list(self.expand))}"
        if self.show_range:
            name = "range" if self.kind == "uniform" else self.kind
            text += f"{name}[{_fmt(self.low)},{_fmt(self.high)}]"
        return text

    @property
    def is_view(self) -> bool:
        """Whether the op sees a view of its leaf rather than the leaf itself."""
        return bool(self.permute or self.slice or self.expand)

    @property
    def leaf_shape(self) -> tuple[int, ...]:
        """The shape of the leaf that stores the input (`shape` where the op sees it)."""
        if self.permute:
            return tuple(self.shape[a] for a in np.argsort(self.permute))
        if self.slice:
            return tuple(start + stop for start, stop, _ in self.slice)
        if self.expand:
            return tuple(1 if i in self.expand else d for i, d in enumerate(self.shape))
        return self.shape

    def view(self, leaf):
        """The engine tensor the op receives for `leaf` (of leaf_shape): the leaf, or its
        view by the view ops permute, strided_slice and expand (no copy)."""
        if self.permute:
            return get_op("permute").build(leaf, self.permute)
        if self.slice:
            leaf = get_op("strided_slice").build(leaf, slices=self.slice)
        if self.expand:
            leaf = get_op("expand").build(leaf, shape=self.shape)
        return leaf

    def _slices(self) -> tuple:
        return tuple(slice(a, b, c) for a, b, c in self.slice)

    def _unexpanded(self, value: np.ndarray) -> np.ndarray:
        """`value` (of `shape`) with its expanded axes cut to their first element."""
        if not self.expand:
            return value
        return value[tuple(slice(0, 1) if i in self.expand else slice(None)
                           for i in range(value.ndim))]

    def to_leaf(self, value: np.ndarray) -> np.ndarray:
        """The leaf's data for an input whose (view) value is `value` (constant along the
        expanded axes, as `generate` makes it); a sliced leaf's border holds VIEW_BORDER."""
        if self.permute is not None:
            return np.ascontiguousarray(value.transpose(np.argsort(self.permute)))
        if not self.is_view:
            return value
        value = np.asarray(value)
        if self.slice is None:
            return np.ascontiguousarray(self._unexpanded(value))
        border = VIEW_BORDER if is_float(value.dtype) else int(self.low)
        leaf = np.full(self.leaf_shape, border, value.dtype)
        leaf[self._slices()] = self._unexpanded(value)
        return leaf

    def from_leaf(self, leaf_value: np.ndarray) -> np.ndarray:
        """A leaf-layout array (data, gradient) in the layout the op sees: the same view
        of it that the op gets of its leaf (read-only where expanded)."""
        if self.permute is not None:
            return leaf_value.transpose(self.permute)
        if self.slice is not None:
            leaf_value = leaf_value[self._slices()]
        if self.expand:
            leaf_value = np.broadcast_to(leaf_value, self.shape)
        return leaf_value

    def leaf_gradient(self, grad: np.ndarray) -> np.ndarray:
        """The adjoint of from_leaf: the leaf-layout gradient of a loss whose gradient
        with respect to the view's elements, taken as independent, is `grad` (summed over
        the expanded axes, zero on a slice's border)."""
        grad = np.asarray(grad)
        if self.permute is not None:
            return np.ascontiguousarray(grad.transpose(np.argsort(self.permute)))
        if self.expand:
            grad = grad.sum(axis=self.expand, keepdims=True)
        if self.slice is not None:
            leaf = np.zeros(self.leaf_shape, grad.dtype)
            leaf[self._slices()] = grad
            return leaf
        return grad

    def view_gradient(self, grad: np.ndarray) -> np.ndarray:
        """`grad`, the gradient with respect to the view's elements taken as independent
        (torch's on a contiguous copy), as the leaf's gradient in the layout the op sees:
        from_leaf(leaf_gradient(grad)), i.e. `grad` itself unless expanded."""
        if not self.expand:
            return grad
        return np.array(self.from_leaf(self.leaf_gradient(grad)))

    def generate(self, rng: np.random.Generator, dtype) -> np.ndarray:
        dt = as_dtype(self.dtype or dtype)
        if self.expand:     # drawn per leaf element, repeated along the expanded axes
            leaf = dataclasses.replace(self, shape=self._unexpanded(
                np.empty(self.shape, bool)).shape, slice=None, expand=None)
            return np.array(np.broadcast_to(leaf.generate(rng, dt), self.shape))
        shape, lo, hi = self.shape, self.low, self.high
        if self.kind == "uniform":
            x = rng.uniform(lo, hi, shape)
        elif self.kind == "away_from_zero":
            x = rng.uniform(lo, hi, shape) * _balanced_signs(rng, shape)
        elif self.kind == "distinct":
            n = int(np.prod(shape))
            x = (lo + (hi - lo) * rng.permutation(n) / max(n - 1, 1)).reshape(shape)
            if dt in HALF_DTYPES:
                x = _distinct_in(dt, x, lo, hi)
        elif self.kind == "sparse":
            x = rng.uniform(lo, hi, shape) * (rng.random(shape) < SPARSE_DENSITY)
        elif self.kind == "sparse_cols":
            cols = rng.random(shape[-1]) < SPARSE_COLUMNS
            x = rng.uniform(lo, hi, shape) * (rng.random(shape) < SPARSE_COLUMN_DENSITY) * cols
        elif self.kind == "special":     # at least one NaN, +inf and -inf each
            x = rng.uniform(lo, hi, shape)
            n = x.size
            cells = rng.permutation(n)[:min(n, max(3, round(SPECIAL_SHARE * n)))]
            x.reshape(-1)[cells] = np.resize([np.nan, np.inf, -np.inf], cells.size)
        elif self.kind == "probs":
            z = rng.uniform(lo, hi, shape)
            z = np.exp(z - z.max(axis=-1, keepdims=True))
            x = z / z.sum(axis=-1, keepdims=True)
        else:
            x = rng.integers(int(lo), int(hi), shape)
        return np.asarray(x).astype(dt)


def _balanced_signs(rng: np.random.Generator, shape) -> np.ndarray:
    """Signs of `shape`, in each half of every row (along the last axis; a GLU's gate and
    value halves) as many -1 as +1 (one more +1 for an odd count), in a random order: no
    half-row of one sign only, whose relu would have a zero gradient."""
    shape = tuple(shape)
    if not shape or 0 in shape:
        return rng.choice([-1.0, 1.0], shape)
    n = shape[-1]
    rows = np.empty((int(np.prod(shape[:-1])), n))
    for start, stop in ((0, n // 2), (n // 2, n)):
        m = stop - start
        half = np.where(np.arange(m) < m // 2, -1.0, 1.0)
        rows[:, start:stop] = rng.permuted(np.broadcast_to(half, (rows.shape[0], m)), axis=1)
    return rows.reshape(shape)


def _distinct_in(dt, x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Grid values `x` in [lo, hi] moved onto an evenly spaced grid of values of 16-bit
    dtype `dt`, in the same order, where the range holds enough of them; else `x`. A grid
    of 200 points over [-1, 1] rounds to ties in bfloat16 (2^-8 steps below 1); multiples
    of the dtype's spacing at the range's largest magnitude are all exact in it."""
    top = max(abs(lo), abs(hi))
    if x.size < 2 or top == 0:
        return x
    # the spacing of values in [2^e, 2^(e+1)), the binade of the largest magnitude: 2^e
    # over the dtype's fraction bits (10 in float16, 7 in bfloat16)
    spacing = 2.0 ** (np.floor(np.log2(top)) - ml_dtypes.finfo(dt).nmant)
    first, last = np.ceil(lo / spacing), np.floor(hi / spacing)
    count = int(last - first) + 1
    if count < x.size:
        return x
    picks = first + np.round(np.linspace(0, count - 1, x.size))
    order = np.argsort(np.argsort(x.reshape(-1), kind="stable"), kind="stable")
    return (picks * spacing)[order].reshape(x.shape)


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
        parts += [str(i).replace("=", f":{i.dtype}=", 1) if i.dtype in FLOAT_NAMES and
                  i.dtype != self.dtype else str(i) for i in self.inputs]
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
        return names & set(FLOAT_NAMES)

    @property
    def special(self) -> bool:
        """Whether an input holds NaNs and infinities (kind "special"): a propagation
        case, judged on its forward alone (gradcheck.special_values)."""
        return any(spec.kind == "special" for spec in self.inputs)

    @property
    def precision(self) -> str:
        """The least precise float dtype the case computes in: its tolerances follow it
        (of f16 and bf16 together, bf16: 8 significant bits against 11)."""
        return least_precise(self.float_dtypes)

    def promoted(self, dtype: str = "f64") -> Sample:
        """The same case with every float dtype replaced by `dtype` (the float64 reference
        of a float32 case). The string form, and so the seed, stay the original's."""
        inputs = tuple(dataclasses.replace(i, dtype=dtype) if i.dtype in FLOAT_NAMES
                       else i for i in self.inputs)
        params = tuple((k, dtype if k == "dtype" and v in FLOAT_NAMES else v)
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
        """Build the op on `leaves` (one per input spec, each viewed as its spec says)."""
        tensors = [spec.view(t) for spec, t in zip(self.inputs, leaves, strict=True)]
        return get_op(self.op).build(*tensors, **self.kwargs)


@dataclasses.dataclass(frozen=True)
class _Promoted(Sample):
    original: str = ""

    def __str__(self) -> str:
        return self.original


def _plain_number(v):
    """A python int or float of `v` (a drawn numpy scalar would not survive a repr)."""
    return int(v) if isinstance(v, (int, np.integer)) else float(v)


def _checked_expand(spec: InputSpec) -> tuple[int, ...]:
    axes = tuple(sorted({int(a) for a in spec.expand}))
    if not axes or any(not 0 <= a < len(spec.shape) for a in axes):
        raise ValueError(f"input {spec.name}: expand {list(spec.expand)} names no axes or "
                         f"axes outside the {len(spec.shape)} of {list(spec.shape)}")
    return axes


def _checked_slice(spec: InputSpec) -> tuple[tuple[int, int, int], ...]:
    """The slice as int triples, one per axis, each giving the view's side (1 on an
    expanded axis), with 0 <= start < stop and step >= 1."""
    triples = tuple(tuple(int(v) for v in t) for t in spec.slice)
    if len(triples) != len(spec.shape) or any(len(t) != 3 for t in triples):
        raise ValueError(f"input {spec.name}: slice needs one (start, stop, step) per axis "
                         f"of {list(spec.shape)}, got {list(spec.slice)}")
    for axis, (start, stop, step) in enumerate(triples):
        side = 1 if spec.expand and axis in spec.expand else spec.shape[axis]
        if start < 0 or step < 1 or len(range(start, stop, step)) != side:
            raise ValueError(f"input {spec.name}: slice {start}:{stop}:{step} of axis {axis} "
                             f"does not give its side {side} (start >= 0, step >= 1)")
    return triples


def _fmt(v) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def least_precise(names) -> str:
    """The least precise of float dtype names `names`, by unit roundoff (bf16, then f16,
    f32, f64; f64 for none)."""
    return max((n for n in names if n in UNIT_ROUNDOFF), key=UNIT_ROUNDOFF.get,
               default="f64")


def both_dtypes(make_samples):
    """Decorator: a samples() function written for one dtype yields its cases in every
    float dtype: f16, bf16, f32 and f64."""
    def samples():
        out = []
        for dt in FLOAT_NAMES:
            out.extend(make_samples(dt))
        return out
    samples.__doc__ = make_samples.__doc__
    return samples
