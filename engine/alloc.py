"""Allocation plans: one arena per graph, intermediates reused by liveness.

A plan is made for one graph at one version. Asking it to run any other graph, or the same
graph after it grew (build_backward, expand), raises StalePlanError: a stale plan never runs
silently (ggml's scheduler once evaluated the training graph when asked for the validation
graph). `Graph.compute` replans instead.

Persistent tensors (inputs, params, outputs, gradients of params, accumulators, optimizer
state) keep buffers of their own on the tensor and are never placed in the arena. An
intermediate gets an arena block when its op runs and frees it once its last reader (or the
last reader of any view of it) has run; blocks are placed first-fit.
"""

from __future__ import annotations

from engine.backends import get_backend
from engine.errors import StalePlanError
from engine.registry import OPS

ALIGN = 64


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
    """Buffers and kernels for one graph, at one version, on one backend."""

    def __init__(self, graph, backend="cpu"):
        self.graph = graph
        self.version = graph.version
        self.n_nodes = len(graph.nodes)
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        nodes = graph.nodes

        self.kernels = {}
        for t in nodes:
            if not t.is_leaf and OPS[t.op].kind != "view":
                self.kernels[t.id] = self.backend.kernel(OPS[t.op])

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
        frees_after: dict[int, list[tuple[int, int]]] = {}
        heap = _FreeList()
        no_reuse = 0
        for i, t in enumerate(nodes):
            if not (t.is_leaf or t.persistent or t.view_of is not None):
                size = _aligned(t.nbytes)
                no_reuse += size
                off = heap.alloc(size)
                self.offsets[t.id] = off
                frees_after.setdefault(max(last.get(t.id, i), i), []).append((off, size))
            # a block is free once its last reader ran (never before this node's output
            # is placed, so an output never overlaps its own inputs)
            for off_, size_ in frees_after.pop(i, ()):
                heap.release(off_, size_)
        self.arena_bytes = heap.top
        self.no_reuse_bytes = no_reuse
        self.persistent_bytes = sum(t.nbytes for t in nodes if t.persistent)
        self._arena = self.backend.alloc(self.arena_bytes)
        # flags decide where buffers live: a flag changed after planning makes it stale
        self.flags = self._flags(graph)
        self._steps = self._schedule(nodes)

    def _schedule(self, nodes):
        """One step per node, everything a run needs resolved now: (kind, tensor, function,
        source positions, params, persistent, arena view)."""
        position = {t.id: i for i, t in enumerate(nodes)}
        steps = []
        for t in nodes:
            if t.is_leaf:
                steps.append(("leaf", t, None, (), None, True, None))
                continue
            srcs = tuple(position[s.id] for s in t.srcs)
            op = OPS[t.op]
            if op.kind == "view":
                steps.append(("view", t, op.view, srcs, t.params, t.persistent, None))
            else:
                arena_view = None if t.persistent else self.backend.view(
                    self._arena, self.offsets[t.id], t.shape, t.dtype)
                steps.append(("kernel", t, self.kernels[t.id], srcs, t.params, t.persistent,
                              arena_view))
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
        be = self.backend
        arrays: list = []
        for kind, t, fn, srcs, params, persistent, arena_view in self._steps:
            if kind == "leaf":
                arrays.append(be.persistent(t))
                continue
            ins = [arrays[i] for i in srcs]
            if kind == "view":
                out = fn(ins, **params)
                if persistent:
                    be.copy(be.persistent(t), out)
            else:
                out = be.persistent(t) if persistent else arena_view
                fn(out, ins, **params)
            arrays.append(out)
        if graph.grad_accs:
            index = {t.id: i for i, t in enumerate(graph.nodes)}
            for p, acc in graph.grad_accs.items():
                grad = graph.grads.get(p)
                if grad is not None:
                    be.accumulate(be.persistent(acc), arrays[index[grad.id]])

    def summary(self) -> dict:
        return {"graph": self.graph.name, "nodes": self.n_nodes,
                "arena_bytes": self.arena_bytes, "no_reuse_bytes": self.no_reuse_bytes,
                "persistent_bytes": self.persistent_bytes}

    def __repr__(self) -> str:
        return (f"Plan({self.graph.name!r}, arena {self.arena_bytes} B vs "
                f"{self.no_reuse_bytes} B without reuse)")
