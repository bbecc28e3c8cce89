"""Symbolic tensors: the nodes of a static graph.

A tensor holds no data until a graph that reaches it is computed, except for persistent
tensors (inputs, params, outputs, gradient accumulators), whose buffers live on the tensor
itself and survive across evaluations and across plans.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Callable

import ml_dtypes
import numpy as np

from engine.errors import DTypeError, EngineError

# The engine's dtypes. The 16-bit floats are stored in 16 bits and computed in float32
# inside kernels, accumulated in float32 or better (engine.backends.cpu.half and
# .patterns: widened on load, rounded to nearest even on store). bfloat16 arrays are
# ml_dtypes' (the package JAX uses): numpy arrays that print, convert (astype) and
# compute as numbers, where plain uint16 patterns would need a wrapper at every place a
# user or a reference reads a value. Their numpy kind is "V", not "f": ask `is_float`,
# never `dtype.kind == "f"`.
DTYPES = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16),
          "f32": np.dtype(np.float32), "f64": np.dtype(np.float64), "i32": np.dtype(np.int32)}
FLOAT_DTYPES = (DTYPES["f16"], DTYPES["bf16"], DTYPES["f32"], DTYPES["f64"])
HALF_DTYPES = (DTYPES["f16"], DTYPES["bf16"])     # stored in 16 bits, computed in float32
FLOAT_NAMES = ("f16", "bf16", "f32", "f64")       # the 16-bit ones first, then by width
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# torch's names of the float dtypes (torch is optional: its dtypes are looked up by name)
TORCH_DTYPE_NAMES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}
# unit roundoff (half an ulp of 1: the largest relative error of one rounding) per dtype
UNIT_ROUNDOFF = {name: float(ml_dtypes.finfo(DTYPES[name]).eps) / 2 for name in FLOAT_NAMES}
_ids = itertools.count()
HOST, DEVICE, BOTH = 1, 2, 3   # where the current copy of a persistent tensor's data is

# The ops behind Tensor's operators (+, -, *, /, @, unary -, .T), by op name. The tensor sits
# below the ops and never imports them: engine.ops fills this table with its builders when
# it is imported, which `import engine` does before any tensor exists.
OPERATOR_OPS = ("add", "sub", "mul", "div", "matmul", "neg", "transpose")
OPERATORS: dict[str, Callable] = {}


def _binary_operator(op: str, reflected: bool = False) -> Callable:
    """Tensor's operator method for the binary op OPERATORS[op] (looked up at each call, as
    engine.ops fills OPERATORS in): a.op(b), or b.op(a) when `reflected` (__radd__, ...)."""
    def method(self, other):
        return OPERATORS[op](other, self) if reflected else OPERATORS[op](self, other)
    method.__name__ = f"__{'r' if reflected else ''}{'truediv' if op == 'div' else op}__"
    return method

# How a device backend fills its copy of a persistent tensor in place (Tensor.fill):
# (accepts(device_copy) -> bool, fill(device_copy, value)) pairs, registered by each device
# backend when its module is loaded, which happens before it makes any device copy.
_DEVICE_FILLERS: list[tuple[Callable, Callable]] = []


def register_device_filler(accepts: Callable, fill: Callable) -> None:
    """Let Tensor.fill set device copies for which `accepts(copy)` holds with
    `fill(copy, value)`, on the device (no transfer)."""
    _DEVICE_FILLERS.append((accepts, fill))


def _device_filler(device_copy) -> Callable:
    for accepts, fill in _DEVICE_FILLERS:
        if accepts(device_copy):
            return fill
    raise EngineError(f"no device backend registered a filler for {type(device_copy).__name__}")


def as_dtype(dtype) -> np.dtype:
    """Normalise 'f32', np.float32, 'float32', ... to one of the engine's numpy dtypes."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise DTypeError(f"unknown dtype {dtype!r}; the engine has {sorted(DTYPES)}") from exc
    if dt not in _DTYPE_NAMES:
        raise DTypeError(f"unsupported dtype {dt}; the engine has float16, bfloat16, "
                         "float32, float64 and int32")
    return dt


def dtype_name(dtype) -> str:
    """Short name of a dtype: 'f16', 'bf16', 'f32', 'f64' or 'i32'."""
    return _DTYPE_NAMES[as_dtype(dtype)]


def is_float(dtype) -> bool:
    """Whether `dtype` (a numpy dtype, or anything np.dtype takes) is a floating-point one,
    bfloat16 included (numpy's kind for it is "V")."""
    dt = np.dtype(dtype)
    return dt.kind == "f" or dt == DTYPES["bf16"]


LINE_BYTES = 64      # a cache line: where host buffers start (line_aligned)


def line_aligned(nbytes: int) -> np.ndarray:
    """An uninitialised 1-D uint8 buffer of `nbytes` that starts on a 64-byte boundary.
    numpy starts a large array 16 bytes past a page, so a kernel's 512-bit loads from it
    each spanned two cache lines: the float32 tanh forward over 8M elements took 2.65-3.07
    ns per element from such an array against 1.58-1.81 from an aligned one (one thread's
    CPU time, the serial kernel). torch aligns its tensors the same way. The planner's
    offsets are multiples of 64 (engine.planner.ALIGN), so every buffer in an arena from
    this starts on a line too."""
    raw = np.empty(nbytes + LINE_BYTES, np.uint8)
    start = -raw.ctypes.data % LINE_BYTES
    return raw[start:start + nbytes]


def aligned_zeros(shape, dtype) -> np.ndarray:
    """np.zeros(shape, dtype) starting on a 64-byte boundary (line_aligned)."""
    dtype = np.dtype(dtype)
    buf = line_aligned(math.prod(shape) * dtype.itemsize)
    buf.fill(0)
    return buf.view(dtype).reshape(shape)


def is_half(dtype) -> bool:
    """Whether `dtype` is one of the 16-bit floats (HALF_DTYPES)."""
    return np.dtype(dtype) in HALF_DTYPES


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
        # on the plain int: enum's | and & make new Flag objects, and planning asks this
        # of every node several times (a fifth of a small case's planning time)
        return bool(self._value_ & _PERSISTENT)


_PERSISTENT = (Flag.INPUT | Flag.OUTPUT | Flag.PARAM | Flag.GRAD_ACC | Flag.STATE)._value_


class Tensor:
    """A node: shape (numpy order), dtype, the op that makes it, its sources and op params.

    Leaves (op None) are inputs or params; their data is set with `set` and read with
    `numpy`. Operators (+, -, *, /, @, unary -, .T) build the ops of OPERATORS.
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

    def view_base(self) -> Tensor:
        """The tensor whose buffer this view reads: `view_of` followed to its end (itself
        unless a view). Compare `owner`, which follows `shares` between persistent tensors."""
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
        buf = self.buffer()
        if value is not buf:            # a caller that wrote into buffer() sets no copy
            buf[...] = value
        return self

    def owner(self) -> Tensor:
        """The persistent tensor whose buffer holds this one's data: `shares` followed to its
        end (itself unless sharing). Compare `view_base`, which follows `view_of`."""
        t = self
        while t.shares is not None:
            t = t.shares
        return t

    def host_view(self) -> np.ndarray:
        """The host buffer, current (copied back from the device if a device backend wrote
        it last), for reading: the device copy stays valid."""
        o = self.owner()
        if o._data is None:
            o._data = aligned_zeros(o.shape, o.dtype)
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
            _device_filler(o.device)(o.device, value)
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

    # --- operators: thin sugar over the ops (see OPERATORS) -----------------------------
    __add__, __radd__ = _binary_operator("add"), _binary_operator("add", reflected=True)
    __sub__, __rsub__ = _binary_operator("sub"), _binary_operator("sub", reflected=True)
    __mul__, __rmul__ = _binary_operator("mul"), _binary_operator("mul", reflected=True)
    __truediv__ = _binary_operator("div")
    __rtruediv__ = _binary_operator("div", reflected=True)
    __matmul__ = _binary_operator("matmul")

    def __neg__(self):
        return OPERATORS["neg"](self)

    @property
    def T(self):
        return OPERATORS["transpose"](self)


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
    floating = is_float(value.dtype)
    dt = as_dtype(dtype if dtype is not None else
                  dtype_name(value.dtype) if value.dtype in HALF_DTYPES else
                  ("f32" if floating and value.dtype.itemsize <= 4 else
                   "f64" if floating else "i32"))
    t = Tensor(value.shape, dt, name=name, flags=Flag.INPUT)
    t.set(value)
    return t
