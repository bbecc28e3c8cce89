"""Plans: where each node of one graph runs, which buffer it writes, and the copies between
backends, as typed step records (engine.executor) that one executor runs.

A plan is made for one graph at one version. Asking it to run any other graph, or the same
graph after it grew (build_backward, expand) or after a flag changed, raises StalePlanError:
a stale plan never runs silently (ggml's scheduler once evaluated the training graph when
asked for the validation graph). `Plan.run` is the only way to run a plan, and it checks;
`Graph.compute` replans instead.

Persistent tensors (inputs, params, outputs, gradients of params, accumulators, optimizer
state) keep buffers of their own on the tensor and are never placed in the arena. An
intermediate gets an arena block when its op runs and frees it once its last reader (or the
last reader of any view of it) has run; blocks are placed first-fit.
"""

from __future__ import annotations

from engine.backends import get_backend
from engine.errors import StalePlanError
from engine.executor import (
    AccumulateStep,
    Copy,
    Executor,
    FromCopy,
    FromPersistent,
    FromStep,
    KernelStep,
    Step,
    ViewStep,
)
from engine.registry import OPS
from engine.tensor import LINE_BYTES, Flag, Tensor

ALIGN = LINE_BYTES   # offsets on a cache line, as the arenas' starts are


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


def _last_readers(nodes) -> dict[int, int]:
    """For every buffer owner, the position of its last reader (a view's readers, and the
    view itself, count for its base)."""
    last: dict[int, int] = {}
    for i, t in enumerate(nodes):
        for s in t.srcs:
            b = s.view_base()
            last[b.id] = max(last.get(b.id, -1), i)
        if t.view_of is not None:
            b = t.view_base()
            last[b.id] = max(last.get(b.id, -1), i)
    return last


def _dtypes(t: Tensor) -> tuple:
    """The dtypes a node's kernel meets: its output's and its sources'."""
    return (t.dtype, *(s.dtype for s in t.srcs))


class Plan:
    """Buffers, kernels and backend placement for one graph, at one version.

    Each node runs on the plan's backend when that backend has a kernel for its op, else on
    the CPU (`fallbacks` lists those ops); a view runs where its source lives. Each backend
    has its own arena. A tensor computed on one backend and read on another is copied into a
    buffer of the reader's backend right after it is computed; persistent tensors instead
    keep one copy per backend, synchronised on demand (Tensor.device, Tensor.host_view).

    `steps` holds one record per node that computes (KernelStep, ViewStep), then one
    AccumulateStep per accumulated gradient; `run` hands them to the executor.
    """

    def __init__(self, graph, backend="cpu"):
        self.graph = graph
        self.version = graph.version
        self.n_nodes = len(graph.nodes)
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        nodes = graph.nodes
        self._place(nodes)
        self.kernels = {t.id: self.placement[t.id].kernel(OPS[t.op], _dtypes(t))
                        for t in nodes if not t.is_leaf and OPS[t.op].kind != "view"}
        self._lay_out_arenas(nodes)
        self.persistent_bytes = sum(t.nbytes for t in nodes if t.persistent)
        backends = self._backends()
        self._arenas = {name: be.alloc(self._tops.get(name, 0))
                        for name, be in backends.items()}
        # flags decide where buffers live: a flag changed after planning makes it stale
        self.flags = self._flags(graph)
        self.steps: tuple[Step, ...] = (*self._node_steps(nodes), *self._accumulate_steps())
        persistent = [t for t in nodes if t.persistent] + list(graph.grad_accs.values())
        owners = list({id(o): o for o in (t.owner() for t in persistent)}.values())
        self.executor = Executor(self.steps, self.n_nodes, tuple(backends.values()), owners,
                                 graph.name)

    # --- placement and arenas -------------------------------------------------------------
    def _place(self, nodes) -> None:
        cpu = get_backend("cpu")
        self.placement = {}
        self.fallbacks: list[str] = []
        for t in nodes:
            if t.is_leaf:
                continue
            op = OPS[t.op]
            if op.kind == "view":      # where its source is; a leaf's: the plan's backend
                home = self.backend if self.backend.stores(t.dtype) else cpu
                self.placement[t.id] = self.placement.get(t.srcs[0].id, home)
            elif self.backend.has_kernel(op, _dtypes(t)):
                self.placement[t.id] = self.backend
            else:
                self.placement[t.id] = cpu
                self.fallbacks.append(op.name)

    def _lay_out_arenas(self, nodes) -> None:
        """Arena offsets of the intermediates, one first-fit heap per backend: a block is
        free once its last reader ran (never before this node's output is placed, so an
        output never overlaps its own inputs)."""
        last = _last_readers(nodes)
        self.offsets: dict[int, int] = {}
        frees_after: dict[int, list[tuple[str, int, int]]] = {}
        heaps: dict[str, _FreeList] = {}
        no_reuse = 0
        for i, t in enumerate(nodes):
            if not (t.is_leaf or t.persistent or t.view_of is not None):
                name = self.placement[t.id].name
                size = _aligned(t.nbytes)
                no_reuse += size
                off = heaps.setdefault(name, _FreeList()).alloc(size)
                self.offsets[t.id] = off
                frees_after.setdefault(max(last.get(t.id, i), i), []).append((name, off, size))
            for name, off, size in frees_after.pop(i, ()):
                heaps[name].release(off, size)
        self._tops = {name: h.top for name, h in heaps.items()}
        self.arena_bytes = sum(self._tops.values())
        self.no_reuse_bytes = no_reuse

    def _backends(self) -> dict:
        out = {self.backend.name: self.backend}
        for be in self.placement.values():
            out.setdefault(be.name, be)
        return out

    @property
    def arena(self):
        return self._arenas[self.backend.name]

    # --- steps ----------------------------------------------------------------------------
    def _node_steps(self, nodes) -> list[Step]:
        """One step per node that computes, everything a run needs resolved now: where each
        operand comes from, the output buffer, the copies to other backends after it."""
        position = {t.id: i for i, t in enumerate(nodes)}
        readers: dict[int, set] = {}
        for t in nodes:
            for s in t.srcs:
                if not s.persistent and not t.is_leaf:
                    readers.setdefault(s.id, set()).add(self.placement[t.id].name)
        backends = self._backends()
        copied: dict[tuple[int, str], object] = {}   # (tensor id, backend) -> its copy there
        steps: list[Step] = []
        for t in nodes:
            if t.is_leaf:
                continue
            be = self.placement[t.id]
            op = OPS[t.op]
            operands = []
            for s in t.srcs:
                if s.persistent:
                    writes = op.kind == "update" and bool(s.flags & (Flag.PARAM | Flag.STATE))
                    operands.append(FromPersistent(s, writes))
                elif self.placement[s.id] is be:
                    operands.append(FromStep(position[s.id]))
                else:
                    operands.append(FromCopy(copied[(s.id, be.name)]))
            copies = []
            if not t.persistent:
                for name in sorted(readers.get(t.id, ()) - {be.name}):
                    dst = backends[name]
                    buf = dst.view(dst.alloc(_aligned(t.nbytes)), 0, t.shape, t.dtype)
                    copied[(t.id, name)] = buf
                    copies.append(Copy(be, dst, buf))
            slot = position[t.id]
            if op.kind == "view":
                steps.append(ViewStep(t, slot, be, op, tuple(operands), t.params,
                                      tuple(copies)))
            else:
                out = (None if t.persistent else
                       be.view(self._arenas[be.name], self.offsets[t.id], t.shape, t.dtype))
                steps.append(KernelStep(t, slot, be, self.kernels[t.id], tuple(operands),
                                        t.params, out, tuple(copies)))
        return steps

    def _accumulate_steps(self) -> list[AccumulateStep]:
        """Gradient accumulation after every node: each param's accumulator += its gradient
        (on the plan's backend)."""
        graph = self.graph
        return [AccumulateStep(acc, graph.grads[p], self.backend)
                for p, acc in graph.grad_accs.items() if graph.grads.get(p) is not None]

    # --- running --------------------------------------------------------------------------
    @staticmethod
    def _flags(graph) -> tuple[int, ...]:
        return tuple(t.flags._value_ for t in graph.nodes)   # _value_: no enum lookup

    def matches(self, graph) -> bool:
        """Whether this plan was made for `graph` as it is now (same graph, version, nodes
        and flags)."""
        return (graph is self.graph and graph.version == self.version
                and len(graph.nodes) == self.n_nodes
                and self._flags(graph) == self.flags)

    def run(self, graph) -> None:
        """Evaluate `graph`, which must be the graph this plan was made for, as it was then:
        StalePlanError otherwise. Each call passes through graph.call_wrapper when set."""
        if not self.matches(graph):
            raise StalePlanError(
                f"plan made for graph {self.graph.name!r} (version {self.version}, "
                f"{self.n_nodes} nodes) was asked to run graph {graph.name!r} "
                f"(version {graph.version}, {len(graph.nodes)} nodes, flags as now); make a "
                "new Plan or use Graph.compute, which replans")
        self.executor.run(graph.call_wrapper)

    def summary(self) -> dict:
        return {"graph": self.graph.name, "nodes": self.n_nodes, "backend": self.backend.name,
                "arena_bytes": self.arena_bytes, "no_reuse_bytes": self.no_reuse_bytes,
                "persistent_bytes": self.persistent_bytes,
                "fallbacks": sorted(set(self.fallbacks))}

    def __repr__(self) -> str:
        fb = f", CPU fallback for {sorted(set(self.fallbacks))}" if self.fallbacks else ""
        return (f"Plan({self.graph.name!r} on {self.backend.name}, arena {self.arena_bytes} B "
                f"vs {self.no_reuse_bytes} B without reuse{fb})")
