"""Symbolic tensors: the nodes of a static graph.

A tensor holds no data until a graph that reaches it is computed, except for persistent
tensors (inputs, params, outputs, gradient accumulators), whose buffers live on the tensor
itself and survive across evaluations and across plans.
"""

from __future__ import annotations

import enum
import itertools
import math

import numpy as np

from engine.errors import DTypeError, EngineError

DTYPES = {"f32": np.dtype(np.float32), "f64": np.dtype(np.float64), "i32": np.dtype(np.int32)}
FLOAT_DTYPES = (DTYPES["f32"], DTYPES["f64"])
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_ids = itertools.count()
HOST, DEVICE, BOTH = 1, 2, 3   # where the current copy of a persistent tensor's data is


def as_dtype(dtype) -> np.dtype:
    """Normalise 'f32', np.float32, 'float32', ... to one of the engine's numpy dtypes."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise DTypeError(f"unknown dtype {dtype!r}; the engine has {sorted(DTYPES)}") from exc
    if dt not in _DTYPE_NAMES:
        raise DTypeError(f"unsupported dtype {dt}; the engine has float32, float64 and int32")
    return dt


def dtype_name(dtype) -> str:
    """Short name of a dtype: 'f32', 'f64' or 'i32'."""
    return _DTYPE_NAMES[as_dtype(dtype)]


class Flag(enum.Flag):
    NONE = 0
    INPUT = enum.auto()
    OUTPUT = enum.auto()
    PARAM = enum.auto()
    LOSS = enum.auto()
    GRAD_ACC = enum.auto()   # persistent gradient accumulator of a param
    STATE = enum.auto()      # optimizer state (step count, moments), updated in place

    @property
    def persistent(self) -> bool:
        return bool(self & (Flag.INPUT | Flag.OUTPUT | Flag.PARAM | Flag.GRAD_ACC | Flag.STATE))


class Tensor:
    """A node: shape (numpy order), dtype, the op that makes it, its sources and op params.

    Leaves (op None) are inputs or params; their data is set with `set` and read with
    `numpy`. Operators (+, -, *, /, @, unary -) build the registry's ops.
    """

    __slots__ = ("id", "shape", "dtype", "op", "srcs", "params", "name", "flags",
                 "view_of", "contiguous", "shares", "_data", "device", "_fresh",
                 "__weakref__")

    def __init__(self, shape, dtype, op=None, srcs=(), params=None, name=None,
                 flags=Flag.NONE, view_of=None, contiguous=True, shares=None):
        self.id = next(_ids)
        self.shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in self.shape):
            raise EngineError(f"negative dimension in shape {self.shape}")
        self.dtype = as_dtype(dtype)
        self.op = op
        self.srcs = tuple(srcs)
        self.params = dict(params or {})
        self.name = name or (f"{op}_{self.id}" if op else f"leaf_{self.id}")
        self.flags = flags
        self.view_of = view_of        # the tensor whose buffer this one aliases, for view ops
        self.contiguous = contiguous  # False for strided views (permute)
        # the persistent tensor whose buffer this persistent one uses as its own: a leaf
        # reading another graph's gradient, an optimizer step writing its param in place
        self.shares = shares
        if shares is not None and (shares.shape != self.shape or shares.dtype != self.dtype):
            raise EngineError(f"tensor {self.name!r} of shape {list(self.shape)} ({self.dtype}) "
                              f"cannot share the buffer of {shares.name!r} of shape "
                              f"{list(shares.shape)} ({shares.dtype})")
        self._data = None
        # a device backend's copy of the data (set by that backend) and which copy is
        # current: HOST, DEVICE or BOTH (see buffer, host_view)
        self.device = None
        self._fresh = HOST

    # --- properties -------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_leaf(self) -> bool:
        return self.op is None

    @property
    def is_param(self) -> bool:
        return bool(self.flags & Flag.PARAM)

    @property
    def persistent(self) -> bool:
        return self.flags.persistent

    def base(self) -> Tensor:
        """The tensor that owns the buffer this one reads (itself unless a view)."""
        t = self
        while t.view_of is not None:
            t = t.view_of
        return t

    # --- flags --------------------------------------------------------------------------
    def set_flag(self, flag: Flag) -> Tensor:
        self.flags |= flag
        return self

    def set_output(self) -> Tensor:
        return self.set_flag(Flag.OUTPUT)

    def set_loss(self) -> Tensor:
        return self.set_flag(Flag.LOSS | Flag.OUTPUT)

    # --- data of persistent tensors ----------------------------------------------------
    def set(self, value) -> Tensor:
        """Write `value` (anything numpy can broadcast to the shape) into this tensor."""
        if not self.persistent:
            raise EngineError(f"tensor {self.name!r} is an intermediate; only inputs, params, "
                              "outputs and gradient accumulators hold data")
        value = np.asarray(value)
        try:
            np.broadcast_to(value, self.shape)
        except ValueError:
            raise EngineError(f"cannot set tensor {self.name!r} of shape {list(self.shape)} "
                              f"from an array of shape {list(value.shape)}") from None
        self.buffer()[...] = value
        return self

    def owner(self) -> Tensor:
        """The tensor that holds this one's persistent data (itself unless sharing)."""
        t = self
        while t.shares is not None:
            t = t.shares
        return t

    def host_view(self) -> np.ndarray:
        """The host buffer, current (copied back from the device if a device backend wrote
        it last), for reading: the device copy stays valid."""
        o = self.owner()
        if o._data is None:
            o._data = np.zeros(o.shape, o.dtype)
        if o._fresh == DEVICE:
            o.device.copy_to_host(o._data)
            o._fresh = BOTH
        return o._data

    def buffer(self) -> np.ndarray:
        """The persistent host buffer (zeros on first use; the shared tensor's when sharing),
        for reading or writing on the host: a device copy becomes stale."""
        data = self.host_view()
        self.owner()._fresh = HOST
        return data

    def fill(self, value: float) -> Tensor:
        """Set every element to `value` where the current copy lives: on the device when a
        device backend holds it (no transfer), else on the host."""
        o = self.owner()
        if o.device is not None and o._fresh != HOST:
            from engine.backends.cuda.transfer import fill
            fill(o.device, value)
            o._fresh = DEVICE
        else:
            self.buffer()[...] = value
        return self

    def numpy(self) -> np.ndarray:
        """A copy of the data of a persistent tensor, as computed by the last evaluation."""
        if not self.persistent:
            raise EngineError(f"tensor {self.name!r} is an intermediate; flag it as an output "
                              "(set_output) to read it after compute")
        return self.host_view().copy()

    def item(self) -> float:
        return self.numpy().reshape(-1)[0].item()

    # --- printing -----------------------------------------------------------------------
    def __repr__(self) -> str:
        flags = "" if self.flags == Flag.NONE else f", flags={self.flags.name}"
        return (f"Tensor({self.name!r}, op={self.op}, shape={list(self.shape)}, "
                f"dtype={dtype_name(self.dtype)}{flags})")

    # --- operators: thin sugar over the registry's ops -----------------------------------
    def __add__(self, other):
        from engine import ops
        return ops.add(self, other)

    def __radd__(self, other):
        from engine import ops
        return ops.add(other, self)

    def __sub__(self, other):
        from engine import ops
        return ops.sub(self, other)

    def __rsub__(self, other):
        from engine import ops
        return ops.sub(other, self)

    def __mul__(self, other):
        from engine import ops
        return ops.mul(self, other)

    def __rmul__(self, other):
        from engine import ops
        return ops.mul(other, self)

    def __truediv__(self, other):
        from engine import ops
        return ops.div(self, other)

    def __rtruediv__(self, other):
        from engine import ops
        return ops.div(other, self)

    def __matmul__(self, other):
        from engine import ops
        return ops.matmul(self, other)

    def __neg__(self):
        from engine import ops
        return ops.neg(self)

    @property
    def T(self):
        from engine import ops
        return ops.transpose(self)


def new_tensor(shape, dtype="f32", name=None, flags=Flag.INPUT) -> Tensor:
    """A leaf tensor; by default an input."""
    return Tensor(shape, dtype, name=name, flags=flags)


def input_tensor(shape, dtype="f32", name=None) -> Tensor:
    return Tensor(shape, dtype, name=name, flags=Flag.INPUT)


def param(shape, dtype="f32", name=None) -> Tensor:
    """A trainable leaf: gradients are computed for params only."""
    return Tensor(shape, dtype, name=name, flags=Flag.PARAM)


def shared_leaf(t: Tensor, name=None) -> Tensor:
    """An input leaf that reads the buffer of the persistent tensor `t`, so that another graph
    (an optimizer step) takes `t` as a leaf instead of pulling in the graph that computes it."""
    if not t.persistent:
        raise EngineError(f"tensor {t.name!r} is an intermediate: its buffer does not outlive "
                          "its graph's evaluation, so no other graph can read it (flag it as "
                          "an output, or accumulate gradients)")
    return Tensor(t.shape, t.dtype, name=name or t.name, flags=Flag.INPUT, shares=t)


def constant(value, dtype=None, name=None) -> Tensor:
    """An input leaf holding `value` (used for python scalars in binary ops)."""
    value = np.asarray(value)
    dt = as_dtype(dtype if dtype is not None else
                  ("f32" if value.dtype.kind == "f" and value.dtype.itemsize <= 4 else
                   "f64" if value.dtype.kind == "f" else "i32"))
    t = Tensor(value.shape, dt, name=name, flags=Flag.INPUT)
    t.set(value)
    return t
