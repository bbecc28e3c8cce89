"""A ggml context for one case: tensors in and out of numpy, permuted views, the graph.

Shapes: numpy's shape (d_0, ..., d_{k-1}) (last axis fastest) is ggml's ne reversed,
ne = (d_{k-1}, ..., d_0), padded with 1s to four dimensions; a 0-d array is ne (1, 1, 1, 1).
Strides likewise: numpy's strides are nb reversed.

Strides of a contiguous tensor of s-byte elements (4 for F32 and I32, 2 for F16 and BF16):
nb = (s, s ne_0, s ne_0 ne_1, s ne_0 ne_1 ne_2), and the element at numpy index
(o_0, ..., o_{k-1}) lies sum_m o_m nb[k-1-m] bytes from its start.

Types: GGML_TYPE_F32, F16 and BF16 hold numpy's float32, float16 and ml_dtypes' bfloat16
arrays bit for bit (ggml_fp16_t is IEEE binary16, ggml_bf16_t the upper half of a float32,
as ml_dtypes' bfloat16); I32 holds int32.

Permutes: the view v = x.transpose(p) (numpy axis m of v is axis p[m] of x) is, in ggml,
ggml_permute(x, axis_0, ..., axis_3), where ggml dimension i of x becomes dimension axis_i
of the result. ggml dimension i is numpy axis k-1-i, which goes to numpy axis p^-1[k-1-i]
of v, that is ggml dimension k-1-p^-1[k-1-i]; padding dimensions i >= k stay put.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np

from checkkit.ggml import (
    GGML_STATUS_SUCCESS,
    GGML_TYPE_BF16,
    GGML_TYPE_F16,
    GGML_TYPE_F32,
    GGML_TYPE_I32,
    MAX_DIMS,
    GgmlLib,
    InitParams,
)

GRAPH_SIZE = 4096          # nodes per graph: forward, backward and gradient accumulation
NUMPY_TYPES = {GGML_TYPE_F32: np.dtype(np.float32), GGML_TYPE_F16: np.dtype(np.float16),
               GGML_TYPE_BF16: np.dtype(ml_dtypes.bfloat16), GGML_TYPE_I32: np.dtype(np.int32)}
GGML_TYPES = {dtype: t for t, dtype in NUMPY_TYPES.items()}   # numpy dtype -> ggml type
TYPE_NAMES = {GGML_TYPE_F32: "f32", GGML_TYPE_F16: "f16", GGML_TYPE_BF16: "bf16",
              GGML_TYPE_I32: "i32"}


def ggml_type(dtype) -> int:
    """The ggml type holding numpy dtype `dtype` bit for bit (KeyError for float64)."""
    return GGML_TYPES[np.dtype(dtype)]


def ne_of(shape) -> tuple[int, int, int, int]:
    """ggml's ne for a numpy shape of at most 4 axes."""
    if len(shape) > MAX_DIMS:
        raise ValueError(f"ggml tensors have at most {MAX_DIMS} dimensions, got shape "
                         f"{list(shape)}")
    ne = tuple(int(d) for d in reversed(shape))
    return ne + (1,) * (MAX_DIMS - len(ne))


def permute_axes(p) -> tuple[int, int, int, int]:
    """ggml_permute's (axis_0, ..., axis_3) for numpy's x.transpose(p), see the module doc."""
    k = len(p)
    inverse = np.argsort(p)
    return tuple(k - 1 - int(inverse[k - 1 - i]) if i < k else i for i in range(MAX_DIMS))


def contiguous_nb(shape, itemsize: int = 4) -> tuple[int, int, int]:
    """(nb1, nb2, nb3) of a contiguous tensor of numpy `shape` and `itemsize`-byte elements
    (4: f32)."""
    ne = ne_of(shape)
    return tuple(itemsize * int(np.prod(ne[:i])) for i in range(1, 4))


def byte_offset(strides_nb, shape, offset) -> int:
    """Bytes from the start of a tensor of numpy `shape` and ggml strides nb to the
    element at numpy index `offset`."""
    k = len(shape)
    return sum(int(o) * int(strides_nb[k - 1 - i]) for i, o in enumerate(offset))


def same_layout(ne, shape) -> bool:
    """Whether a ggml tensor of `ne` read in ggml order holds a numpy array of `shape` in C
    order: the same sides once sides of 1 are dropped."""
    return ([d for d in reversed(ne) if d != 1] == [int(d) for d in shape if d != 1])


class Context:
    """A ggml context (no_alloc false: every tensor owns memory in it) and the case's graph.

    Use as a context manager; ggml_free runs on exit. `mem_size` must hold every tensor
    of the forward and backward graphs and the compute work buffer (ggml aborts when it
    does not).
    """

    def __init__(self, lib: GgmlLib, mem_size: int):
        self.lib = lib
        self.mem_size = int(mem_size)
        self.ctx = None
        self.graph = None

    def __enter__(self) -> Context:
        self.ctx = self.lib.ggml_init(InitParams(self.mem_size, None, False))
        if not self.ctx:
            raise MemoryError(f"ggml_init could not allocate a {self.mem_size}-byte context")
        return self

    def __exit__(self, *exc) -> None:
        self.lib.ggml_free(self.ctx)
        self.ctx = None

    def __getattr__(self, name):
        """`g.add(a, b)` calls ggml_add(ctx, a, b)."""
        fn = getattr(self.lib, f"ggml_{name}")
        return lambda *args: fn(self.ctx, *args)

    # --- tensors ------------------------------------------------------------------------
    def new(self, shape, ggml_type: int = GGML_TYPE_F32):
        ne = (ctypes.c_int64 * MAX_DIMS)(*ne_of(shape))
        return self.lib.ggml_new_tensor(self.ctx, ggml_type, MAX_DIMS, ne)

    def from_numpy(self, array: np.ndarray, ggml_type: int = GGML_TYPE_F32):
        """A new tensor holding `array` (converted to the tensor's type), in its shape."""
        t = self.new(array.shape, ggml_type)
        data = np.ascontiguousarray(array, NUMPY_TYPES[ggml_type])
        if data.nbytes != self.lib.ggml_nbytes(t):
            raise AssertionError("tensor size differs from the array's")
        ctypes.memmove(self.lib.ggml_get_data(t), data.ctypes.data, data.nbytes)
        return t

    def to_numpy(self, t, shape) -> np.ndarray:
        """A copy of tensor t (any strides) as a numpy array of `shape`, which must have the
        tensor's layout (see same_layout)."""
        s = self.lib.tensor(t)
        ne, nb = list(s.ne), list(s.nb)
        if not same_layout(ne, shape):
            raise ValueError(f"ggml tensor of ne {ne} cannot be read as shape {list(shape)}")
        dtype = NUMPY_TYPES[s.type]
        span = sum((n - 1) * b for n, b in zip(ne, nb, strict=True)) + dtype.itemsize
        raw = (ctypes.c_char * span).from_address(s.data)
        view = np.lib.stride_tricks.as_strided(np.frombuffer(raw, dtype),
                                               shape=tuple(reversed(ne)),
                                               strides=tuple(reversed(nb)))
        return np.array(view).reshape(shape)

    def ne(self, t) -> tuple[int, ...]:
        return tuple(self.lib.tensor(t).ne)

    def type(self, t) -> int:
        """Tensor t's ggml type."""
        return self.lib.tensor(t).type

    def itemsize(self, t) -> int:
        """Bytes per element of tensor t."""
        return NUMPY_TYPES[self.type(t)].itemsize

    def as_f32(self, t):
        """t itself if of type F32, else ggml_cast(t, F32) (exact from F16 and BF16); the
        cast's backward hands t the F32 gradient unchanged (ggml.c, GGML_OP_CPY)."""
        return t if self.type(t) == GGML_TYPE_F32 else self.lib.ggml_cast(self.ctx, t,
                                                                           GGML_TYPE_F32)

    def permuted(self, t, p):
        """The view x.transpose(p) of tensor t (numpy's axes order p)."""
        return self.lib.ggml_permute(self.ctx, t, *permute_axes(p))

    # --- ggml_cont where ggml's API asserts a layout (see ops.py) ------------------------
    def contiguous(self, t):
        """t itself if contiguous, else ggml_cont(t)."""
        return t if self.lib.ggml_is_contiguous(t) else self.lib.ggml_cont(self.ctx, t)

    def rows_contiguous(self, t):
        """t, or ggml_cont(t) when its rows are strided (ggml_unary_impl asserts
        ggml_is_contiguous_rows)."""
        s = self.lib.tensor(t)
        strided = s.ne[0] != 1 and s.nb[0] != self.itemsize(t)
        return self.lib.ggml_cont(self.ctx, t) if strided else t

    def padded_1d(self, t):
        """t, or ggml_cont(t) unless ggml_is_padded_1d(t) (asserted by ggml_scale)."""
        s = self.lib.tensor(t)
        ok = (s.nb[0] == self.itemsize(t) and s.nb[2] == s.nb[1] * s.ne[1]
              and s.nb[3] == s.nb[2] * s.ne[2])
        return t if ok else self.lib.ggml_cont(self.ctx, t)

    def not_transposed(self, t):
        """t, or ggml_cont(t) if ggml_is_transposed(t) (nb[0] > nb[1]; ggml_mul_mat's first
        operand must not be)."""
        s = self.lib.tensor(t)
        return self.lib.ggml_cont(self.ctx, t) if s.nb[0] > s.nb[1] else t

    # --- the graph ----------------------------------------------------------------------
    def build(self, loss) -> None:
        """Forward graph of `loss` (flagged as the loss), then its backward graph."""
        self.lib.ggml_set_loss(loss)
        self.graph = self.lib.ggml_new_graph_custom(self.ctx, GRAPH_SIZE, True)
        self.lib.ggml_build_forward_expand(self.graph, loss)
        self.lib.ggml_build_backward_expand(self.ctx, self.graph, None)

    def grad(self, t):
        """The gradient tensor of t in the built graph, or None (no gradient reaches t)."""
        return self.lib.ggml_graph_get_grad(self.graph, t) or None

    def compute(self, n_threads: int) -> None:
        """Reset the gradients (the loss's to 1) and compute the whole graph on the CPU."""
        self.lib.ggml_graph_reset(self.graph)
        status = self.lib.ggml_graph_compute_with_ctx(self.ctx, self.graph, n_threads)
        if status != GGML_STATUS_SUCCESS:
            raise RuntimeError(f"ggml_graph_compute_with_ctx returned status {status}")
