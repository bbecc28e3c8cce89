"""Allocation plans: one arena per graph, intermediates reused by liveness.

A plan is made for one graph at one version. Asking it to run any other graph, or the same
graph after it grew (build_backward, expand), raises StalePlanError: a stale plan never runs
silently (ggml's scheduler once evaluated the training graph when asked for the validation
graph). `Graph.compute` replans instead.

Persistent tensors (inputs, params, outputs, gradients of params, accumulators, optimizer
state) keep buffers of their own on the tensor and are never placed in the arena. An
intermediate gets an arena block when its op runs and frees it once its last reader (or the
last reader of any view of it) has run; blocks are placed first-fit.

A plan that runs on the host only binds each node once to a call with its buffers, views
and operand layouts resolved, so that a run is a tight loop over kernels (Plan._bind).
"""

from __future__ import annotations

import functools
import time

from engine.backends import get_backend
from engine.backends.cpu.threads import engine_threads
from engine.errors import StalePlanError
from engine.registry import OPS
from engine.tensor import Flag

ALIGN = 64

# Per-node timing (bench/profile_mnist.py): while this is a dict, host-only plans bound from
# then on add each call's seconds to NODE_TIMES[(graph, op, node name, shape)] = [seconds,
# calls], an entry each plan holds from binding on (zero entries in place, do not clear the
# dict). Plans bound while it is None run their calls as they are, untimed.
NODE_TIMES: dict | None = None


def _timed(call, entry):
    """`call`, adding its seconds and one call to entry = [seconds, calls]."""
    def run():
        t0 = time.perf_counter()
        call()
        entry[0] += time.perf_counter() - t0
        entry[1] += 1
    return run


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _FreeList:
    """First-fit allocator over [0, top) with coalescing of freed blocks."""

    def __init__(self):
        self.free: list[tuple[int, int]] = []   # sorted (offset, size)
        self.top = 0

    def alloc(self, size: int) -> int:
        for i, (off, sz) in enumerate(self.free):
            if sz >= size:
                if sz == size:
                    del self.free[i]
                else:
                    self.free[i] = (off + size, sz - size)
                return off
        if self.free and self.free[-1][0] + self.free[-1][1] == self.top:
            off, _ = self.free.pop()    # grow the last free block at the top
        else:
            off = self.top
        self.top = off + size
        return off

    def release(self, off: int, size: int) -> None:
        self.free.append((off, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged


class Plan:
    """Buffers, kernels and backend placement for one graph, at one version.

    Each node runs on the plan's backend when that backend has a kernel for its op, else on
    the CPU (`fallbacks` lists those ops); a view runs where its source lives. Each backend
    has its own arena. A tensor computed on one backend and read on another is copied into a
    buffer of the reader's backend right after it is computed; persistent tensors instead
    keep one copy per backend, synchronised on demand (Tensor.device, Tensor.host_view).

    A plan whose nodes all run on the CPU binds every node once, on its first run, to a
    zero-argument call with its buffers and layouts resolved (`_bind`): a run is then a loop
    over those calls, with no per-node lookups, checks or allocations in Python.
    """

    def __init__(self, graph, backend="cpu"):
        self.graph = graph
        self.version = graph.version
        self.n_nodes = len(graph.nodes)
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        cpu = get_backend("cpu")
        nodes = graph.nodes

        self.placement = {}
        self.fallbacks: list[str] = []
        for t in nodes:
            if t.is_leaf:
                continue
            op = OPS[t.op]
            if op.kind == "view":
                self.placement[t.id] = self.placement.get(t.srcs[0].id, self.backend)
            elif self.backend.has_kernel(op):
                self.placement[t.id] = self.backend
            else:
                self.placement[t.id] = cpu
                self.fallbacks.append(op.name)
        self.kernels = {t.id: self.placement[t.id].kernel(OPS[t.op]) for t in nodes
                        if not t.is_leaf and OPS[t.op].kind != "view"}

        # last reader of every buffer owner (a view's readers count for its base)
        last: dict[int, int] = {}
        for i, t in enumerate(nodes):
            for s in t.srcs:
                b = s.base()
                last[b.id] = max(last.get(b.id, -1), i)
            if t.view_of is not None:
                b = t.base()
                last[b.id] = max(last.get(b.id, -1), i)

        self.offsets: dict[int, int] = {}
        frees_after: dict[int, list[tuple[str, int, int]]] = {}
        heaps: dict[str, _FreeList] = {}
        no_reuse = 0
        for i, t in enumerate(nodes):
            if not (t.is_leaf or t.persistent or t.view_of is not None):
                size = _aligned(t.nbytes)
                no_reuse += size
                heap = heaps.setdefault(self.placement[t.id].name, _FreeList())
                off = heap.alloc(size)
                self.offsets[t.id] = off
                frees_after.setdefault(max(last.get(t.id, i), i), []).append(
                    (self.placement[t.id].name, off, size))
            # a block is free once its last reader ran (never before this node's output
            # is placed, so an output never overlaps its own inputs)
            for name, off_, size_ in frees_after.pop(i, ()):
                heaps[name].release(off_, size_)
        self.arena_bytes = sum(h.top for h in heaps.values())
        self.no_reuse_bytes = no_reuse
        self.persistent_bytes = sum(t.nbytes for t in nodes if t.persistent)
        self._arenas = {name: be.alloc(heaps[name].top if name in heaps else 0)
                        for name, be in self._backends().items()}
        # flags decide where buffers live: a flag changed after planning makes it stale
        self.flags = self._flags(graph)
        self._steps = self._schedule(nodes)
        # host-only plans run as a list of bound calls (see _bind), made on the first run
        self._host_only = all(be.name == "cpu" for be in self._backends().values())
        persistent = [t for t in nodes if t.persistent] + list(graph.grad_accs.values())
        self._owners = list({id(o): o for o in (t.owner() for t in persistent)}.values())
        self._calls = None

    def _backends(self) -> dict:
        out = {self.backend.name: self.backend}
        for be in self.placement.values():
            out.setdefault(be.name, be)
        return out

    @property
    def arena(self):
        return self._arenas[self.backend.name]

    def _schedule(self, nodes):
        """One step per node, everything a run needs resolved now: (kind, tensor, function,
        source getters, params, backend, output buffer or None, transfers after it)."""
        position = {t.id: i for i, t in enumerate(nodes)}
        readers: dict[int, set] = {}
        for t in nodes:
            for s in t.srcs:
                if not s.persistent and not t.is_leaf:
                    readers.setdefault(s.id, set()).add(self.placement[t.id].name)
        self._transfer_bufs = {}
        steps = []
        for t in nodes:
            if t.is_leaf:
                steps.append(("leaf", t, None, (), None, None, None, ()))
                continue
            be = self.placement[t.id]
            op = OPS[t.op]
            getters = []
            for s in t.srcs:
                if s.persistent:
                    writes = op.kind == "update" and bool(s.flags & (Flag.PARAM | Flag.STATE))
                    getters.append(("persistent", s, writes))
                elif self.placement[s.id] is be:
                    getters.append(("array", position[s.id], None))
                else:
                    getters.append(("transfer", (s.id, be.name), None))
            out = None
            if op.kind != "view" and not t.persistent:
                out = be.view(self._arenas[be.name], self.offsets[t.id], t.shape, t.dtype)
            transfers = []
            if not t.persistent:
                for name in sorted(readers.get(t.id, ()) - {be.name}):
                    dst_be = self._backends()[name]
                    buf = dst_be.view(dst_be.alloc(_aligned(t.nbytes)), 0, t.shape, t.dtype)
                    self._transfer_bufs[(t.id, name)] = buf
                    transfers.append((be, dst_be, buf))
            fn = op.view if op.kind == "view" else self.kernels[t.id]
            steps.append(("view" if op.kind == "view" else "kernel", t, fn, tuple(getters),
                          t.params, be, out, tuple(transfers)))
        return steps

    @staticmethod
    def _flags(graph) -> tuple[int, ...]:
        return tuple(t.flags._value_ for t in graph.nodes)   # _value_: no enum lookup

    def matches(self, graph) -> bool:
        return (graph is self.graph and graph.version == self.version
                and len(graph.nodes) == self.n_nodes
                and self._flags(graph) == self.flags)

    def run(self, graph) -> None:
        """Evaluate `graph`, which must be the graph this plan was made for."""
        if not self.matches(graph):
            raise StalePlanError(
                f"plan made for graph {self.graph.name!r} (version {self.version}, "
                f"{self.n_nodes} nodes) was asked to run graph {graph.name!r} "
                f"(version {graph.version}, {len(graph.nodes)} nodes, flags as now); make a "
                "new Plan or use Graph.compute, which replans")
        self.execute(graph)

    def execute(self, graph) -> None:
        """Evaluate `graph` without checking that the plan matches it (Graph.compute has
        just checked)."""
        with engine_threads():
            if self._host_only and not any(o.device is not None for o in self._owners):
                if self._calls is None:
                    self._calls = self._bind()
                for c in self._calls:
                    c()
                return
            self._run_steps(graph)

    def _run_steps(self, graph) -> None:
        """The general evaluation: buffers looked up per node (device copies synchronised
        on demand), transfers between backends."""
        arrays: list = []
        bufs = self._transfer_bufs
        for kind, t, fn, getters, params, be, out, transfers in self._steps:
            if kind == "leaf":
                arrays.append(None)
                continue
            ins = [arrays[key] if how == "array" else
                   be.persistent(key, writes) if how == "persistent" else bufs[key]
                   for how, key, writes in getters]
            if kind == "view":
                result = be.device_view(OPS[t.op], ins, params)
                if t.persistent:
                    be.copy(be.persistent(t), result)
            else:
                result = be.persistent(t) if t.persistent else out
                fn(result, ins, **params)
            arrays.append(result)
            for src_be, dst_be, buf in transfers:
                _move(src_be, dst_be, result, buf)
        if graph.grad_accs:
            be = self.backend
            for p, acc in graph.grad_accs.items():
                grad = graph.grads.get(p)
                if grad is not None:
                    be.accumulate(be.persistent(acc), be.persistent(grad, False))

    def _bind(self) -> list:
        """The run of a host-only plan as a list of zero-argument calls, every buffer bound.

        Arena views never move, and neither do the host buffers of persistent tensors (their
        arrays are allocated once and written in place) while no device holds a copy, which
        `execute` checks on every run before taking this path. Views are taken once; a
        kernel with a `bind` (engine.backends.cpu.jit.bindable) lays out its operands once;
        any other kernel is called with its arguments as they are.
        """
        be = self.backend
        arrays: list = []
        calls, labels = [], []
        for kind, t, fn, getters, params, _be, out, _transfers in self._steps:
            if kind == "leaf":
                arrays.append(None)
                continue
            ins = [arrays[key] if how == "array" else be.persistent(key, writes)
                   for how, key, writes in getters]
            if kind == "view":
                result = be.device_view(OPS[t.op], ins, params)
                if t.persistent:
                    calls.append(functools.partial(be.copy, be.persistent(t), result))
                    labels.append((t.op, t.name, t.shape))
            else:
                result = be.persistent(t) if t.persistent else out
                bind = getattr(fn, "bind", None)
                calls.append(bind(result, ins, **params) if bind is not None else
                             functools.partial(fn, result, ins, **params))
                labels.append((t.op, t.name, t.shape))
            arrays.append(result)
        graph = self.graph
        for p, acc in graph.grad_accs.items():
            grad = graph.grads.get(p)
            if grad is not None:
                calls.append(functools.partial(be.accumulate, be.persistent(acc),
                                               be.persistent(grad, False)))
                labels.append(("accumulate", acc.name, acc.shape))
        if NODE_TIMES is not None:
            calls = [_timed(c, NODE_TIMES.setdefault((graph.name, *label), [0.0, 0]))
                     for c, label in zip(calls, labels, strict=True)]
        return calls

    def summary(self) -> dict:
        return {"graph": self.graph.name, "nodes": self.n_nodes, "backend": self.backend.name,
                "arena_bytes": self.arena_bytes, "no_reuse_bytes": self.no_reuse_bytes,
                "persistent_bytes": self.persistent_bytes,
                "fallbacks": sorted(set(self.fallbacks))}

    def __repr__(self) -> str:
        fb = f", CPU fallback for {sorted(set(self.fallbacks))}" if self.fallbacks else ""
        return (f"Plan({self.graph.name!r} on {self.backend.name}, arena {self.arena_bytes} B "
                f"vs {self.no_reuse_bytes} B without reuse{fb})")


def _move(src_be, dst_be, src, dst) -> None:
    """Copy `src` (on src_be, any strides) into `dst` (contiguous, on dst_be)."""
    if src_be.name == "cpu":
        dst_be.to_device(src, dst)
    else:
        src_be.to_host(src, dst)
