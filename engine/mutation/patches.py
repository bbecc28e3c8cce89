"""Changes put into the op registry for the duration of a block, and taken out after.

A known bug (a mutant of engine.mutation, or `--inject scale`) is one of these patches:
the op's backward rule, or one of its kernels, replaced by a function made from the real
one. On leaving the block, even on error, the registry holds the very same objects as
before.

A CPU kernel can be replaced whole (`kernel_replaced`), or in one of its two parts:
- its preparation (`prepare_replaced`): a bindable kernel (engine.backends.cpu.jit.bindable)
  lays out its arrays once per plan and returns the call that computes; the new one is
  made from the real preparation, and keeps the kernel bindable;
- its chunking (`chunks_replaced`): a kernel split over the engine's threads
  (engine.backends.cpu.threads.split) is made again from the same preparation with other
  chunks, made from the real chunking function.

The 16-bit floats' machinery (engine.backends.cpu.half) is patched the same way: the kernel
an op's 16-bit nodes run (`half_kernel_replaced`: its float32 kernel widened), or one of the
conversions every widened kernel calls (`half_function_replaced`: `store`, the rounding on
store; `widened_copy`, the widening on load).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable

from engine.backends.cpu import CPU, half, threads
from engine.backends.cpu import attention as cpu_attention
from engine.backends.cpu import conv_2d as cpu_conv_2d
from engine.backends.cpu import matmul_sparse as cpu_matmul_sparse
from engine.backends.cpu import rope as cpu_rope
from engine.backends.cpu.jit import bindable
from engine.registry import get_op, registered
from engine.tensor import is_half

# How many times a patch has been put in or taken out: a cache of planned graphs (their
# kernels bound when they were planned) keys on it, so that no graph planned under a patch
# runs after it, nor one planned before it within it (gradcheck.reference's last case).
_GENERATION = [0]


def generation() -> int:
    """The patch generation: changes whenever any patch of this module starts or ends."""
    return _GENERATION[0]


@contextlib.contextmanager
def _counted():
    _GENERATION[0] += 1
    try:
        yield
    finally:
        _GENERATION[0] += 1


@contextlib.contextmanager
def backward_replaced(op_name: str, make: Callable):
    """Within the block, op `op_name`'s backward rule is `make(real_rule)`."""
    op = get_op(op_name)
    real = op.backward
    op.backward = make(real)
    with _counted():
        try:
            yield
        finally:
            op.backward = real


@contextlib.contextmanager
def kernel_replaced(op_name: str, make: Callable, backend: str = "cpu"):
    """Within the block, op `op_name`'s `backend` kernel is `make(real_kernel)` (in a new
    kernels dict: the op's own dict is put back untouched)."""
    op = get_op(op_name)
    real = op.kernels
    op.kernels = {**real, backend: make(real[backend])}
    with _counted():
        try:
            yield
        finally:
            op.kernels = real


def rebound(kernel, make: Callable):
    """A bindable CPU kernel whose preparation is `make(real_prepare)`, real_prepare being
    `kernel`'s (its `bind`): prepare(out, ins, **params) -> a zero-argument call. A split
    kernel stays split, with its own chunking (see `resplit`)."""
    if hasattr(kernel, "chunks"):
        return resplit(kernel, make_prepare=make)
    prepare = make(kernel.bind)
    prepare.__name__ = getattr(kernel, "__name__", "kernel")
    return bindable(prepare)


def resplit(kernel, make_chunks: Callable | None = None, make_prepare: Callable | None = None):
    """Split kernel `kernel` (made by threads.split) made again: split by
    `make_chunks(real_chunks)` (chunks(out, ins, parts) -> [(out_chunk, ins_chunk)] or
    None, as threads.split takes), each chunk prepared by `make_prepare(real_prepare)`;
    either part the real one where not given."""
    prepare = kernel.bind.__wrapped__          # the preparation threads.split was given
    if make_prepare is not None:
        prepare = make_prepare(prepare)
    inner = types.SimpleNamespace(bind=prepare, __name__=getattr(kernel, "__name__", "kernel"))
    chunks = kernel.chunks if make_chunks is None else make_chunks(kernel.chunks)
    return threads.split(inner, chunks=chunks)


def prepare_replaced(op_name: str, make: Callable):
    """Within the block, op `op_name`'s (bindable) cpu kernel prepares with
    `make(real_prepare)` (see `rebound`)."""
    return kernel_replaced(op_name, lambda real: rebound(real, make))


def chunks_replaced(op_name: str, make_chunks: Callable):
    """Within the block, op `op_name`'s split cpu kernel is split by
    `make_chunks(real_chunks)` (see `resplit`)."""
    return kernel_replaced(op_name, lambda real: resplit(real, make_chunks))


# The backend helpers `function_replaced` may replace: each is looked up in its module
# when its callers run (so a replacement reaches them), and each is one the self-test's
# tests check is put back. (module, function name).
REPLACEABLE = ((half, "store"), (half, "widened_copy"), (half, "in_ranges"),
               (cpu_matmul_sparse, "compress_multiply_rows"),
               (cpu_rope, "yarn_corr_dims"), (cpu_attention, "alibi_slopes"),
               (cpu_conv_2d, "weight_t"))


@contextlib.contextmanager
def function_replaced(module: types.ModuleType, name: str, make: Callable):
    """Within the block, `module`'s function `name` is `make(real)`: a backend helper of
    REPLACEABLE (ValueError for another)."""
    if (module, name) not in REPLACEABLE:
        raise ValueError(f"{module.__name__}.{name} is not a replaceable helper "
                         f"(engine.mutation.patches.REPLACEABLE)")
    real = getattr(module, name)
    setattr(module, name, make(real))
    with _counted():
        try:
            yield
        finally:
            setattr(module, name, real)


def half_function_replaced(name: str, make: Callable):
    """Within the block, engine.backends.cpu.half's function `name` is `make(real)`."""
    return function_replaced(half, name, make)


@contextlib.contextmanager
def half_kernel_replaced(op_name: str, make: Callable):
    """Within the block, the kernel the CPU backend gives op `op_name`'s 16-bit nodes (its
    float32 kernel widened, half.widened, or the kernel itself where it reads 16-bit
    patterns, patterns.native_half) is `make(real_kernel)`; other ops' and other dtypes'
    kernels are the real ones. Plans bound in the block take it."""
    backend = type(CPU)
    real = backend.kernel

    def kernel(self, op, dtypes=()):
        k = real(self, op, dtypes)
        return make(k) if op.name == op_name and any(is_half(d) for d in dtypes) else k
    backend.kernel = kernel
    with _counted():
        try:
            yield
        finally:
            backend.kernel = real


@contextlib.contextmanager
def all_of(*patches: Callable[[], contextlib.AbstractContextManager]):
    """Within the block, every one of `patches` (each a zero-argument context factory) is
    in place; they are taken out in reverse order, even on error."""
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch())
        yield


def backwards_replaced(op_names, make: Callable):
    """The patch (a zero-argument context factory) that replaces the backward rule of every
    op of `op_names` with `make(real)` (backward_replaced), as one bug."""
    return lambda: all_of(*(lambda op=op: backward_replaced(op, make) for op in op_names))


def scaled_backward(backward: Callable, factor: float) -> Callable:
    """A backward rule whose every input gradient is `factor` times `backward`'s."""
    def mutated(g, out, *srcs, **params):
        return tuple(None if sg is None else registered.scale(sg, factor)
                     for sg in backward(g, out, *srcs, **params))
    return mutated


def scaled(op_name: str, factor: float) -> Callable:
    """The patch of a mutant that scales every gradient of op `op_name` by `factor`."""
    return lambda: backward_replaced(op_name, lambda real: scaled_backward(real, factor))
