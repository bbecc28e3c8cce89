"""The registry's elementwise, shape, reduction, loss and GLU ops in jax.numpy and jax.nn.

Each entry of `OPS` takes the case's inputs (jax arrays, in the order of the case's input
specs) and its parameters, as the op's torch equivalent in the registry does, and returns
the op's output. The semantics are the registry's (engine.elementwise, engine.ops): softplus
with torch's threshold, step as sign clamped at 0, sums and means over `axis` with
`keepdims`, `cross_entropy_loss` the mean over rows of -sum(labels * log_softmax(logits)).
The other ops (convolutions, pooling, columns, norms, softmax, attention, rope, the decoder
blocks) are gradcheck.adapters.jax.nn's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from engine.backends.cpu.dropout import keep_mask
from engine.elementwise import GELU_QUICK_COEF, SOFTPLUS_THRESHOLD
from engine.ops.block import block_slices
from engine.ops.diag_mask import FILL
from engine.ops.glu import glu_halves
from engine.ops.repeat import repeats
from engine.ops.win_part import windows
from engine.tensor import DTYPES


def softplus(x):
    """log(1 + e^x), and x itself above torch's threshold (20), as the registry's."""
    return jnp.where(x > SOFTPLUS_THRESHOLD, x, jax.nn.softplus(x))


def gelu_quick(x):
    return x * jax.nn.sigmoid(GELU_QUICK_COEF * x)


def clamp(x, min=None, max=None):     # noqa: A002  (the registry's parameter names)
    return jnp.clip(x, min, max)


# unary ops and activations: name -> f(x, **params)
UNARY = {
    "neg": lambda x: -x,
    "scale": lambda x, scale: x * scale,
    "sqr": lambda x: x * x,
    "sqrt": jnp.sqrt,
    "log": jnp.log,
    "exp": jnp.exp,
    "expm1": jnp.expm1,
    "abs": jnp.abs,
    "sgn": jnp.sign,
    "step": lambda x: jnp.maximum(jnp.sign(x), 0),
    "relu": jax.nn.relu,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "gelu": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_erf": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_quick": gelu_quick,
    "silu": jax.nn.silu,
    "elu": lambda x, alpha=1.0: jax.nn.elu(x, alpha),
    "leaky_relu": lambda x, negative_slope=0.01: jax.nn.leaky_relu(x, negative_slope),
    "softplus": softplus,
    "hardswish": jax.nn.hard_swish,
    "clamp": clamp,
}

# the GLU family: op -> its activation (act(a) * b)
GLU = {"swiglu": "silu", "geglu": "gelu", "geglu_erf": "gelu_erf",
       "geglu_quick": "gelu_quick", "reglu": "relu"}


def glu(act):
    """act(a) * b, a and b the halves of x along its last axis (exchanged when swapped) or
    two inputs of their own."""
    f = UNARY[act]

    def fn(*xs, swapped=False):
        a, b = glu_halves(xs, swapped)
        return f(a) * b
    return fn


def matmul(a, b):
    """a @ b over the last two axes, batch axes broadcast; a mixed-precision product in
    the wider dtype, as the registry's."""
    wide = jnp.promote_types(a.dtype, b.dtype)
    return jnp.matmul(a.astype(wide), b.astype(wide))


def reduce(fn):
    def reduced(x, axis=None, keepdims=False):
        if isinstance(axis, list):
            axis = tuple(axis)
        return fn(x, axis=axis, keepdims=bool(keepdims))
    return reduced


def cross_entropy_loss(logits, labels):
    """mean over rows (every axis but the last) of -sum(labels * log_softmax(logits))."""
    per_row = -jnp.sum(labels * jax.nn.log_softmax(logits, axis=-1), axis=-1)
    return jnp.mean(per_row)


def dropout(x, p, seed):
    """x * mask / (1 - p), the registry's mask (a hash of seed and index) as a constant."""
    scaled = np.where(keep_mask(seed, tuple(x.shape), p), 1.0 / (1.0 - p), 0.0)
    return x * jnp.asarray(scaled, x.dtype)


def set_or_acc(name):
    def fn(a, b, offset):
        index = block_slices(offset, b.shape)
        a = jnp.asarray(a)             # an input not differentiated arrives as numpy's
        return a.at[index].set(b) if name == "set" else a.at[index].add(b)
    return fn


def diag_mask(fill):
    def fn(x, n_past):
        rows, cols = x.shape[-2], x.shape[-1]
        masked = np.triu(np.ones((rows, cols), bool), n_past + 1)
        return jnp.where(masked, jnp.asarray(fill, x.dtype), x)
    return fn


def get_rows_back(g, idx, nrows):
    """g's rows added into zeros of (nrows, C) at idx (repeated indices add up)."""
    c = g.shape[-1]
    return jnp.zeros((nrows, c), g.dtype).at[idx.reshape(-1)].add(g.reshape(-1, c))


def repeat_back(g, shape):
    """The sum of g's tiles of `shape`."""
    r = repeats("repeat_back", shape, tuple(g.shape))
    padded = (1,) * (g.ndim - len(shape)) + tuple(shape)
    tiles = g.reshape([v for pair in zip(r, padded, strict=True) for v in pair])
    return tiles.sum(axis=tuple(range(0, 2 * g.ndim, 2))).reshape(shape)


def win_part(x, window):
    h, w, c = x.shape
    npy, npx = windows(h, w, window)
    padded = jnp.pad(x, ((0, npy * window - h), (0, npx * window - w), (0, 0)))
    tiles = padded.reshape(npy, window, npx, window, c).transpose(0, 2, 1, 3, 4)
    return tiles.reshape(npy * npx, window, window, c)


def win_unpart(y, height, width, window):
    npy, npx = windows(height, width, window)
    c = y.shape[3]
    image = y.reshape(npy, npx, window, window, c).transpose(0, 2, 1, 3, 4)
    return image.reshape(npy * window, npx * window, c)[:height, :width]


def mse_loss(a, b):
    return jnp.mean(jnp.square(a - b))


def strided_slice(x, slices):
    return x[tuple(slice(*t) for t in slices)]


OPS = {
    **UNARY,
    **{name: glu(act) for name, act in GLU.items()},
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide,
    "add1": lambda x, c: x + c.reshape(()),
    "matmul": matmul,
    "out_prod": lambda a, b: matmul(jnp.swapaxes(b, -1, -2), a),
    "sum": reduce(jnp.sum),
    "mean": reduce(jnp.mean),
    "sum_rows": lambda x: jnp.sum(x, axis=-1, keepdims=True),
    "argmax": lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32),
    "log_softmax": lambda x: jax.nn.log_softmax(x, axis=-1),
    "cross_entropy_loss": cross_entropy_loss,
    "mse_loss": mse_loss,
    "dropout": dropout,
    "cast": lambda x, dtype: x.astype(DTYPES[dtype]),
    "cont": lambda x: x,
    "reshape": lambda x, shape: jnp.reshape(x, shape),
    "permute": lambda x, axes: jnp.transpose(x, axes),
    "transpose": lambda x, axis1=-2, axis2=-1: jnp.swapaxes(x, axis1, axis2),
    "expand": lambda x, shape: jnp.broadcast_to(x, shape),
    "broadcast_to": lambda x, shape: jnp.broadcast_to(x, shape),
    "block": lambda x, offset, shape: x[block_slices(offset, shape)],
    "strided_slice": strided_slice,
    "concat": lambda a, b, axis: jnp.concatenate([a, b], axis=axis),
    "pad": lambda x, pads: jnp.pad(x, [tuple(p) for p in pads]),
    "repeat": lambda x, shape: jnp.tile(x, repeats("repeat", tuple(x.shape), shape)),
    "repeat_back": repeat_back,
    "set": set_or_acc("set"),
    "acc": set_or_acc("acc"),
    "diag_mask_inf": diag_mask(FILL["diag_mask_inf"]),
    "diag_mask_zero": diag_mask(FILL["diag_mask_zero"]),
    "get_rows": lambda table, idx: table[idx],
    "get_rows_back": get_rows_back,
    "win_part": win_part,
    "win_unpart": win_unpart,
}
