"""The registry's elementwise, reduction and shape ops as tinygrad Tensor code, by op name.

Each entry takes the case's input tensors (tinygrad Tensors, in the layout the op sees) and
its parameters, and returns the op's output as a tinygrad expression: gradcheck's VJP is
tinygrad's own autodiff of it (Tensor.gradient). Where tinygrad has the function, it is
called (x.gelu(), x.softplus(), x.max_pool2d(...)); where it has none, the op is written
from its definition with tinygrad ops, and the entry's comment says so.
"""

from __future__ import annotations

import math

import numpy as np

from engine.backends.cpu.dropout import keep_mask
from engine.ops.block import block_slices
from engine.ops.glu import glu_halves
from engine.ops.repeat import repeats
from engine.ops.win_part import windows


def _axes(axis, ndim: int):
    """A reduction's axes as tinygrad takes them (None: all)."""
    if axis is None:
        return None
    return tuple(a % ndim for a in axis) if isinstance(axis, (list, tuple)) else axis % ndim


def _sum(x, axis=None, keepdims=False):
    return x.sum(axis=_axes(axis, x.ndim), keepdim=keepdims)


def _mean(x, axis=None, keepdims=False):
    return x.mean(axis=_axes(axis, x.ndim), keepdim=keepdims)


def _step(x):
    """1 where x > 0 else 0: tinygrad has no step; sign(x) clipped below at 0."""
    return x.sign().relu()


def _glu(act):
    """act(a) * b, of one input split in halves (swapped: the halves exchanged) or two."""
    def glu(*tensors, swapped=False):
        a, b = glu_halves(tensors, swapped)
        return act(a) * b
    return glu


def _set_acc(name):
    """set: a with the block at `offset` replaced by b; acc: b added onto that block. The
    block is b padded with zeros to a's shape; set zeroes a's block with a constant mask."""
    def op(a, b, offset):
        pads = tuple((o, n - o - s) for o, s, n in zip(offset, b.shape, a.shape, strict=True))
        placed = b.pad(pads)
        if name == "acc":
            return a + placed
        inside = np.zeros(a.shape, np.bool_)
        inside[block_slices(offset, b.shape)] = True
        return _const(inside, a).where(placed, a)
    return op


def _const(array, like):
    """A constant tinygrad tensor of numpy `array` on `like`'s device."""
    from tinygrad import Tensor
    return Tensor(np.ascontiguousarray(array), device=like.device)


def _strided_slice(x, slices):
    return x[tuple(slice(*t) for t in slices)]


def _pad(x, pads):
    return x.pad(tuple(tuple(p) for p in pads)) if any(any(p) for p in pads) else x + 0


def _repeat(x, shape):
    r = repeats("repeat", tuple(x.shape), tuple(shape))
    return x.reshape((1,) * (len(r) - x.ndim) + tuple(x.shape)).repeat(r)


def _repeat_back(g, shape):
    """The sum of g's tiles of `shape` (repeat's gradient, written as a reshape and a sum)."""
    r = repeats("repeat_back", tuple(shape), tuple(g.shape))
    padded = (1,) * (g.ndim - len(shape)) + tuple(shape)
    tiles = g.reshape(tuple(v for pair in zip(r, padded, strict=True) for v in pair))
    return tiles.sum(axis=tuple(range(0, 2 * g.ndim, 2))).reshape(tuple(shape))


def _diag_mask(fill):
    def op(x, n_past):
        rows, cols = x.shape[-2], x.shape[-1]
        masked = np.triu(np.ones((rows, cols), np.bool_), n_past + 1)
        return _const(masked, x).where(fill, x)
    return op


def _dropout(x, p, seed):
    scaled = np.where(keep_mask(seed, tuple(x.shape), p), 1.0 / (1.0 - p), 0.0)
    return x * _const(scaled.astype(_numpy_dtype(x)), x)


def _numpy_dtype(t):
    from tinygrad.dtype import _to_np_dtype
    return _to_np_dtype(t.dtype)


def _cast(x, dtype):
    from gradcheck.adapters.tinygrad_adapter.device import tinygrad_dtype
    return x.cast(tinygrad_dtype(dtype))


def _win_part(x, window):
    h, w, c = x.shape
    npy, npx = windows(h, w, window)
    padded = x.pad(((0, npy * window - h), (0, npx * window - w), (0, 0)))
    tiles = padded.reshape(npy, window, npx, window, c).permute(0, 2, 1, 3, 4)
    return tiles.reshape(npy * npx, window, window, c)


def _win_unpart(y, height, width, window):
    npy, npx = windows(height, width, window)
    c = y.shape[3]
    image = y.reshape(npy, npx, window, window, c).permute(0, 2, 1, 3, 4)
    return image.reshape(npy * window, npx * window, c)[:height, :width]


def _concat(a, b, axis):
    return a.cat(b, dim=axis)


def _transpose(x, axis1=-2, axis2=-1):
    return x.transpose(axis1, axis2)


def _cross_entropy(logits, labels):
    """tinygrad's cross_entropy with class probabilities as targets, rows flattened."""
    c = logits.shape[-1]
    return logits.reshape(-1, c).cross_entropy(labels.reshape(-1, c))


def _mse_loss(a, b):
    return (a - b).square().mean()


# name -> tinygrad function of (*tensors, **params)
ELEMENTWISE = {
    "neg": lambda x: -x,
    "scale": lambda x, scale: x * scale,
    "sqr": lambda x: x * x,
    "sqrt": lambda x: x.sqrt(),
    "log": lambda x: x.log(),
    "exp": lambda x: x.exp(),
    "abs": lambda x: x.abs(),
    "sgn": lambda x: x.sign(),
    "step": _step,
    "relu": lambda x: x.relu(),
    "sin": lambda x: x.sin(),
    "cos": lambda x: x.cos(),
    "tanh": lambda x: x.tanh(),
    "sigmoid": lambda x: x.sigmoid(),
    "gelu": lambda x: x.gelu(),                              # tinygrad's: the tanh form
    "gelu_erf": lambda x: x.gelu(approximate="none"),       # tinygrad's, with its erf
    "silu": lambda x: x.silu(),
    "gelu_quick": lambda x: x.quick_gelu(),
    "expm1": lambda x: x.exp() - 1.0,                        # tinygrad has no expm1
    "elu": lambda x, alpha=1.0: x.elu(alpha),
    "leaky_relu": lambda x, negative_slope=0.01: x.leaky_relu(negative_slope),
    "softplus": lambda x: x.softplus(),
    "hardswish": lambda x: x.hardswish(),
    "clamp": lambda x, **bounds: x.clamp(bounds["min"], bounds["max"]),
    "cast": _cast,
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "add1": lambda x, c: x + c.reshape(()),
}

SHAPES = {
    "sum": _sum,
    "mean": _mean,
    "sum_rows": lambda x: x.sum(axis=-1, keepdim=True),
    "reshape": lambda x, shape: x.reshape(tuple(shape)),
    "permute": lambda x, axes: x.permute(tuple(axes)),
    "transpose": _transpose,
    "cont": lambda x: x.contiguous(),
    "expand": lambda x, shape: x.expand(tuple(shape)),
    "broadcast_to": lambda x, shape: x.expand(tuple(shape)).contiguous(),
    "block": lambda x, offset, shape: x[block_slices(offset, shape)],
    "strided_slice": _strided_slice,
    "pad": _pad,
    "concat": _concat,
    "set": _set_acc("set"),
    "acc": _set_acc("acc"),
    "repeat": _repeat,
    "repeat_back": _repeat_back,
    "diag_mask_inf": _diag_mask(-math.inf),
    "diag_mask_zero": _diag_mask(0.0),
    "dropout": _dropout,
    "win_part": _win_part,
    "win_unpart": _win_unpart,
    "cross_entropy_loss": _cross_entropy,
    "mse_loss": _mse_loss,
}

for _name in ("swiglu", "geglu", "geglu_erf", "geglu_quick", "reglu"):
    ELEMENTWISE[_name] = _glu(ELEMENTWISE[{"swiglu": "silu", "reglu": "relu"}.get(
        _name, _name.replace("geglu", "gelu"))])
