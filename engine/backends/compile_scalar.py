"""Scalar math written once, compiled for each backend: the functions of the elementwise
table (engine.elementwise) become numba.njit functions for the CPU kernels and numba.cuda
device functions for the CUDA kernels (engine.backends.cpu.elementwise and
engine.backends.cuda.elementwise), each backend passing its own `jit`.

`compile_scalar` compiles the plain Python functions that a function calls along with it
(numba calls compiled functions only). `source_digest` keys the CPU kernels' disk cache on
the files the math comes from: numba notices edits of a kernel's own file only.
"""

from __future__ import annotations

import functools
import hashlib
import types


def _callees(fn) -> dict[str, types.FunctionType]:
    """The plain Python functions that `fn` calls by global name."""
    return {name: g for name in fn.__code__.co_names
            if isinstance(g := fn.__globals__.get(name), types.FunctionType)}


def compile_scalar(fn, jit, compiled: dict):
    """`jit(fn)` with each plain function that fn calls replaced by `jit` of it, recursively
    (numba calls compiled functions only). `compiled` memoises fn -> result for one jit."""
    if fn not in compiled:
        own = {name: compile_scalar(g, jit, compiled) for name, g in _callees(fn).items()}
        rebuilt = types.FunctionType(fn.__code__, {**fn.__globals__, **own}, fn.__name__,
                                     fn.__defaults__, fn.__closure__)
        rebuilt.__qualname__, rebuilt.__module__ = fn.__qualname__, fn.__module__
        compiled[fn] = jit(rebuilt)
    return compiled[fn]


@functools.cache
def _file_digest(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def source_digest(*fns) -> str:
    """A digest of the source files of `fns` and of the functions they call: numba's disk
    cache notices edits of a kernel's own file only, so a kernel made from the table keys
    its cache on this too, and recompiles when a row's math changes."""
    seen, todo, parts = set(), [f for f in fns if f is not None], set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        code = f.__code__
        parts.add(_file_digest(code.co_filename) or repr((code.co_code, code.co_consts)))
        todo += _callees(f).values()
    return hashlib.sha256("".join(sorted(parts)).encode()).hexdigest()[:12]
