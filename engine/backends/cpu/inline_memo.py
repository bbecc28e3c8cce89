"""numba's inlining of `inline="always"` functions (jit.scalar_math) with each function's
untyped IR made once per process, not once per call site.

To inline a call of a scalar_math function, numba translates the callee's bytecode and
runs its untyped passes (InlineWorker.inline_function, numba 0.68.1), nested callees
inlined likewise, at every call site of every kernel it compiles, and then inlines a copy
of that IR (InlineWorker.inline_ir copies it before renaming and relabelling anything).
vector_math.exp is translated 46 times in a cold `gradcheck --op geglu --op swiglu --op
gelu`: there 402 translations of 31 functions took 8.7 s of the run's 46 s of CPU time
(a timer around run_untyped_passes, helpers off, one process; with this module 47
translations, 0.8 s). So a translation is kept, and each call site gets a copy of it as if
just made:

- keyed by everything the untyped passes read: the function, the caller's flags (their
  repr: the pipeline depends on no_rewrites, enable_ssa, auto_parallel), its locals, its
  typing context, its target context's class (CPU or CUDA: each compilation has a target
  context of its own, made from the flags, numba.core.compiler._make_subtarget) and its
  compiler class;
- valid while the values the IR froze are the same objects: the globals its code names,
  its closure cells and defaults, and the same of every function inlined into it
  (a test's monkeypatch, or a planted bug, is translated afresh);
- each copy gets a new FunctionIdentity, whose unique name prefixes the inlined
  variables' names, as a fresh translation's does; labels keep their order (inline_ir
  offsets them past the caller's), so the caller's IR is the fresh one up to the numbers
  in names and labels, which already depend on what the process compiled before;
- the side effect a fresh translation has on the caller's flags (enable_ssa set to the
  call's) is kept.

The machine code is the same: tests/engine/backends/cpu/test_inline_memo.py compares a
kernel's assembly with and without, and a cold `gradcheck --op geglu --op gelu --op
sigmoid` gave the same assembly for all 161 overloads it compiled (unique numbers in
symbol names aside) and the same 192 rows, with and without. Only compile time changes.
"""

from __future__ import annotations

import functools
import inspect

from numba.core import bytecode
from numba.core import inline_closurecall as icc

_MEMO: dict = {}         # key -> ([(function, its bindings), ...], untyped IR)
_COLLECTING: list = []   # one list per translation under way: the functions it inlines


def bindings(func) -> tuple:
    """What `func`'s untyped IR froze: its code, the globals its code names, its closure
    cells' contents and its defaults (compared by identity)."""
    code, found = func.__code__, func.__globals__
    names = tuple(n for n in code.co_names if n in found)
    cells = []
    for cell in func.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:          # an empty cell
            cells.append(_EMPTY)
    return (code, names, tuple(found[n] for n in names), tuple(cells), func.__defaults__)


_EMPTY = object()


def _same(a: tuple, b: tuple) -> bool:
    code_a, names_a, values_a, cells_a, defaults_a = a
    code_b, names_b, values_b, cells_b, defaults_b = b
    return (code_a is code_b and names_a == names_b and defaults_a is defaults_b
            and len(values_a) == len(values_b) and len(cells_a) == len(cells_b)
            and all(x is y for x, y in zip(values_a, values_b, strict=True))
            and all(x is y for x, y in zip(cells_a, cells_b, strict=True)))


def _valid(entry) -> bool:
    """Whether every function an entry's IR froze still binds the same objects."""
    dependencies, _ = entry
    return all(_same(snapshot, bindings(func)) for func, snapshot in dependencies)


def _key(worker, func, enable_ssa: bool):
    return (func, enable_ssa, repr(worker.flags), repr(sorted(worker.locals.items())),
            id(worker.typingctx), type(worker.targetctx), type(worker.pipeline))


def _memoised(run_untyped_passes):
    @functools.wraps(run_untyped_passes)
    def translated(self, func, enable_ssa=False):
        self.flags.enable_ssa = enable_ssa       # as the fresh translation sets it
        key = _key(self, func, enable_ssa)
        entry = _MEMO.get(key)
        if entry is None or not _valid(entry):
            _COLLECTING.append([])
            try:
                func_ir = run_untyped_passes(self, func, enable_ssa)
            finally:
                inlined = _COLLECTING.pop()
            entry = _MEMO[key] = ([(func, bindings(func)), *inlined], func_ir)
        if _COLLECTING:
            _COLLECTING[-1].extend(entry[0])
        copy = entry[1].copy()
        copy.func_id = bytecode.FunctionIdentity.from_function(func)
        return copy
    translated._gradverify_memo = True
    return translated


def _inline_function(self, caller_ir, block, i, function, arg_typs=None):
    """InlineWorker.inline_function as numba's, its translation memoised."""
    callee_ir = _translated(self, function)
    freevars = function.__code__.co_freevars
    return self.inline_ir(caller_ir, block, i, callee_ir, freevars, arg_typs=arg_typs)


_translated = None


# the InlineWorker methods this module relies on, as numba 0.68 has them
_EXPECTED = {"run_untyped_passes": ("self", "func", "enable_ssa"),
             "inline_ir": ("self", "caller_ir", "block", "i", "callee_ir", "callee_freevars",
                           "arg_typs"),
             "inline_function": ("self", "caller_ir", "block", "i", "function", "arg_typs")}


def supported() -> bool:
    """Whether this numba's InlineWorker has the methods, with the parameters, that
    _inline_function stands in for (another numba keeps its own inlining: slower to
    compile, the same code)."""
    worker = getattr(icc, "InlineWorker", None)
    try:
        return worker is not None and all(
            tuple(inspect.signature(getattr(worker, name)).parameters) == params
            for name, params in _EXPECTED.items())
    except (AttributeError, TypeError, ValueError):
        return False


def install() -> None:
    """Memoise the translations of InlineWorker.inline_function, once per process (the
    other callers of run_untyped_passes, numba's overload inliner among them, keep
    numba's own); nothing where this numba's inliner is not the one it was written for
    (supported)."""
    global _translated
    worker = icc.InlineWorker
    if getattr(worker.inline_function, "_gradverify_memo", False) or not supported():
        return
    _translated = _memoised(worker.run_untyped_passes)
    _inline_function._gradverify_memo = True
    _inline_function.__wrapped__ = worker.inline_function
    worker.inline_function = _inline_function


def uninstall() -> None:
    """numba's own inline_function again (for a test that compares the two)."""
    worker = icc.InlineWorker
    if getattr(worker.inline_function, "_gradverify_memo", False):
        worker.inline_function = worker.inline_function.__wrapped__
    _MEMO.clear()
