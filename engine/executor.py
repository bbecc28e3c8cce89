"""The executor: the step records a plan is made of, and the one interpreter that runs them.

engine.planner turns a graph into steps (where each node runs, which buffer it writes, what
it reads, which copies follow it); this module runs them. Each step becomes a zero-argument
call with every buffer resolved (`bind_step`): a kernel with a `bind`
(engine.backends.cpu.jit.bindable) lays out its operands once, any other kernel is called
with its arguments as they are, a view is taken once.

Two ways to run the same calls (`Executor.run`):
- bound once: a plan whose nodes all run on the host binds every step on its first run and
  then runs the list of calls, a tight loop over kernels with no per-node lookups, checks or
  allocations in Python. Arena views never move, and neither do the host buffers of
  persistent tensors (allocated once, written in place) while no device holds a copy, which
  is checked on every run before taking this way.
- bound as it runs: otherwise each step is bound right before it runs, so that the copies of
  persistent tensors on each backend are synchronised on demand (Tensor.device,
  Tensor.host_view) in the order the steps read and write them.

A call wrapper `wrap(label, call) -> call` (Graph.call_wrapper; bench/profile_mnist.py times
nodes with one) sees every call with its CallLabel and returns what runs instead; None runs
the calls as they are.

A kernel that raises anything but an EngineError (an IndexError from numba's bounds checks,
NUMBA_BOUNDSCHECK=1; a bug of its own) raises KernelError, naming the op, the node and the
kernel, and where in our code it was: the loops above run bare, in a try around the whole
loop, and the step is looked up only once a call has raised. An EngineError (a get_rows
index outside its table) names what it needs and goes on up as it is.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from engine.backends.calls import sequence
from engine.errors import EngineError
from engine.registry import OpDef
from engine.tensor import Tensor

Call = Callable[[], None]


# --- operands: where a step finds each of its inputs --------------------------------------
@dataclass(frozen=True, slots=True)
class FromStep:
    """The result of the step at node position `slot` (same backend)."""
    slot: int


@dataclass(frozen=True, slots=True)
class FromPersistent:
    """A persistent tensor's own buffer on the step's backend; `writes`: the step changes it
    (an optimizer step updating its param or state)."""
    tensor: Tensor
    writes: bool


@dataclass(frozen=True, slots=True)
class FromCopy:
    """The step's backend's copy of an intermediate computed on another backend (written
    by that producer's Copy)."""
    buffer: Any


Operand = FromStep | FromPersistent | FromCopy


# --- steps ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Copy:
    """After its step, the result (on `src`, any strides) copied into `buffer` (contiguous,
    on `dst`) for the readers on `dst`."""
    src: Any
    dst: Any
    buffer: Any


@dataclass(frozen=True, slots=True)
class KernelStep:
    """out = kernel(operands, **params) for node `tensor` (at position `slot`), on `backend`.
    `out` is its arena view, or None for a persistent tensor (which writes its own buffer)."""
    tensor: Tensor
    slot: int
    backend: Any
    kernel: Callable
    operands: tuple[Operand, ...]
    params: dict
    out: Any
    copies: tuple[Copy, ...]


@dataclass(frozen=True, slots=True)
class ViewStep:
    """Node `tensor` (at position `slot`) as a view `op` makes of its operands, on `backend`
    (the backend of its source); copied into the tensor's own buffer when it is persistent."""
    tensor: Tensor
    slot: int
    backend: Any
    op: OpDef
    operands: tuple[Operand, ...]
    params: dict
    copies: tuple[Copy, ...]


@dataclass(frozen=True, slots=True)
class AccumulateStep:
    """accumulator += gradient, after every node (gradient accumulation), on `backend`."""
    accumulator: Tensor
    gradient: Tensor
    backend: Any


Step = KernelStep | ViewStep | AccumulateStep


class CallLabel(NamedTuple):
    """What a call computes, for a call wrapper: its graph's name, the op ("accumulate" for
    gradient accumulation), the node's name and shape."""
    graph: str
    op: str
    node: str
    shape: tuple[int, ...]


class KernelError(EngineError, RuntimeError):
    """A kernel raised while its plan ran, or while its call was prepared; the message
    names the graph, the op, the node, the kernel and the innermost line of ours it was
    running, then what it raised (which is also its __cause__)."""


_ENGINE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_ENGINE)          # where a traceback's paths are named from
_PLUMBING = {os.path.join(_ENGINE, *p) for p in    # the interpreter, the pool, dispatch
             (("executor.py",), ("backends", "__init__.py"), ("backends", "cpu", "threads.py"),
              ("backends", "cpu", "jit.py"))}


def _kernel_name(step: Step, call) -> str:
    """The name of the kernel `step` runs: the registered kernel's, else the compiled
    function `call` is a partial of, else the op's."""
    if type(step) is AccumulateStep:
        return "accumulate"
    if type(step) is ViewStep:
        return f"{step.op.name} view"
    name = getattr(step.kernel, "__name__", "")
    if name and name != "<lambda>":
        return name
    func = getattr(getattr(call, "func", None), "py_func", None)
    return getattr(func, "__name__", None) or f"{step.tensor.op}'s kernel"


def _innermost_line(exc: BaseException) -> str:
    """`path:line in function: source` of the innermost frame of `exc`'s traceback that is
    no plumbing (this module, the thread pool, the backends' sequence): the line that
    called the compiled kernel ("" when there is none)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.path.abspath(f.filename) not in _PLUMBING]
    if not frames:
        return ""
    f = frames[-1]
    source = (f.line or linecache.getline(f.filename, f.lineno)).strip()
    path = os.path.abspath(f.filename)
    where = os.path.relpath(path, _ROOT) if path.startswith(_ROOT + os.sep) else f.filename
    return f"{where}:{f.lineno} in {f.name}" + (f": {source}" if source else "")


def kernel_error(exc: Exception, step: Step, graph_name: str, call=None) -> KernelError:
    """The KernelError of `exc`, raised by `step`'s call `call` in graph `graph_name`."""
    what = label(step, graph_name)
    line = _innermost_line(exc)
    return KernelError(f"{type(exc).__name__} in op {what.op}'s kernel "
                       f"{_kernel_name(step, call)} (node {what.node!r}, shape "
                       f"{list(what.shape)}, graph {what.graph!r})"
                       + (f" at {line}" if line else "") + f": {exc}")


# --- the interpreter -----------------------------------------------------------------------
def _operand(how: Operand, backend, results: list):
    if type(how) is FromStep:
        return results[how.slot]
    if type(how) is FromPersistent:
        return backend.persistent(how.tensor, how.writes)
    return how.buffer


def _move(copy: Copy, src) -> None:
    """Copy `src` (on copy.src, any strides) into copy.buffer (contiguous, on copy.dst)."""
    if copy.src.name == "cpu":
        copy.dst.to_device(src, copy.buffer)
    else:
        copy.src.to_host(src, copy.buffer)


def _then_copies(call: Call | None, result, copies: tuple[Copy, ...]) -> Call | None:
    if not copies:
        return call
    moves = [functools.partial(_move, c, result) for c in copies]
    return sequence(*([call, *moves] if call is not None else moves))


def bind_step(step: Step, results: list) -> Call | None:
    """`step` as a zero-argument call, every buffer resolved now; the step's result is stored
    in results[step.slot] for the steps that read it. None: nothing to run (a view that is
    neither persistent nor copied)."""
    be = step.backend
    if type(step) is AccumulateStep:
        return functools.partial(be.accumulate, be.persistent(step.accumulator),
                                 be.persistent(step.gradient, False))
    ins = [_operand(how, be, results) for how in step.operands]
    t = step.tensor
    if type(step) is ViewStep:
        result = be.device_view(step.op, ins, step.params)
        call = be.bind_copy(be.persistent(t), result) if t.persistent else None
    else:
        result = be.persistent(t) if t.persistent else step.out
        bind = getattr(step.kernel, "bind", None)
        call = (bind(result, ins, **step.params) if bind is not None else
                functools.partial(step.kernel, result, ins, **step.params))
    results[step.slot] = result
    return _then_copies(call, result, step.copies)


def label(step: Step, graph_name: str) -> CallLabel:
    if type(step) is AccumulateStep:
        acc = step.accumulator
        return CallLabel(graph_name, "accumulate", acc.name, acc.shape)
    t = step.tensor
    return CallLabel(graph_name, t.op, t.name, t.shape)


class Executor:
    """Runs one plan's steps (module doc): bound once when every backend is the host and no
    persistent tensor has a device copy, else bound as they run; inside each backend's
    `running()` context (the CPU's holds BLAS to one thread while the engine's own threads
    run its kernels)."""

    def __init__(self, steps: tuple[Step, ...], n_slots: int, backends: tuple,
                 owners: list[Tensor], graph_name: str):
        self.steps = steps
        self.n_slots = n_slots
        self.backends = backends
        self.graph_name = graph_name
        self._host_only = all(be.name == "cpu" for be in backends)
        self._owners = owners            # buffer owners of the persistent tensors
        self._calls: list[Call] | None = None
        self._call_steps: list[Step] = []   # the step of each of self._calls
        self._calls_wrap = None          # the wrapper self._calls were bound with
        # the ops each backend's running() context is told of (the CPU's skips holding BLAS
        # for a plan without a product)
        self._ops = frozenset(getattr(getattr(s, "tensor", None), "op", None) for s in steps)
        self._running = (functools.partial(backends[0].running, self._ops)
                         if len(backends) == 1 else self._all_running)
        self._held = 0                   # depth of held() blocks: run() enters no context
        self._held_host = False          # within held(): every owner on the host (read once)

    @contextlib.contextmanager
    def _all_running(self):
        with contextlib.ExitStack() as stack:
            for be in self.backends:
                stack.enter_context(be.running(self._ops))
            yield

    def run(self, wrap: Callable[[CallLabel, Call], Call] | None = None) -> None:
        """Run every step once, each call passed through `wrap` when given. KernelError
        when a kernel raises (module doc)."""
        if self._held:
            self._run(wrap, self._held_host)
            return
        with self._running():
            self._run(wrap, self._on_host())

    def _on_host(self) -> bool:
        return self._host_only and not any(o.device is not None for o in self._owners)

    @contextlib.contextmanager
    def held(self):
        """The backends' running() context entered once for every run() within the block,
        instead of once per run: for a caller that runs the same plan thousands of times in
        a row (gradcheck's numerical differences). The CPU's context holds BLAS to one
        thread for a plan with a product, two calls into each BLAS library on the way in
        and two on the way out: 5 s of a warm `gradcheck --random 60` on six ops' 93 s of
        CPU (cProfile), where each run of a case's float64 graph is tens of microseconds.
        Where the persistent tensors live is read once, on entry (a tensor moved to a
        device within the block is not seen: the block is for runs alone)."""
        with self._running():
            held_host = self._held_host
            self._held += 1
            self._held_host = self._on_host()
            try:
                yield
            finally:
                self._held -= 1
                self._held_host = held_host

    def _run(self, wrap, on_host: bool) -> None:
        if on_host:
            if self._calls is None or wrap is not self._calls_wrap:
                bound = list(self._bound(wrap))
                self._calls = [c for _, c in bound]
                self._call_steps = [s for s, _ in bound]
                self._calls_wrap = wrap
            c = None
            try:
                for c in self._calls:
                    c()
            except EngineError:
                raise
            except Exception as exc:
                at = next(i for i, bound in enumerate(self._calls) if bound is c)
                raise kernel_error(exc, self._call_steps[at], self.graph_name,
                                   c) from exc
        else:
            step = c = None
            try:
                for step, c in self._bound(wrap):  # noqa: B007 (the except reads it)
                    c()
            except EngineError:
                raise
            except Exception as exc:
                raise kernel_error(exc, step, self.graph_name, c) from exc

    def calls(self, wrap=None) -> Iterator[Call]:
        """The steps' calls in order, passed through `wrap` when given. A generator: each
        step is bound (bind_step) when its call is asked for, so a loop that runs each call
        before asking for the next binds every step right before it runs."""
        return (c for _, c in self._bound(wrap))

    def _bound(self, wrap=None) -> Iterator[tuple[Step, Call]]:
        """(step, call) for each step with a call, as `calls` binds them; a step whose
        binding raises anything but an EngineError raises KernelError."""
        results: list = [None] * self.n_slots
        for step in self.steps:
            try:
                call = bind_step(step, results)
            except EngineError:
                raise
            except Exception as exc:
                raise kernel_error(exc, step, self.graph_name) from exc
            if call is not None:
                yield step, (call if wrap is None else wrap(label(step, self.graph_name),
                                                            call))
