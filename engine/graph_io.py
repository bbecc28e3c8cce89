"""Graph files: a graph's nodes, flags, persistent data and backward bookkeeping, as GGUF.

    save_graph("train.gguf", trainer.training,
               roles={"images": images, "logits": logits, "labels": labels, "loss": loss})
    loaded = load_graph("train.gguf")      # LoadedGraph: graph, roles, params, metadata, loss
    opt = make_optimizer("adamw", loaded.graph, lr=1e-3)    # the imported graph trains

The layout (a table of nodes, flags, sources, op params as JSON, leaf data as GGUF tensors,
the backward bookkeeping) is engine.graph_format's. Loading rebuilds each node with the
registry's make_node, so the op's own shape/dtype inference and its declared parameters'
checks run (a parameter missing, unknown, out of its range or breaking a rule between them
is refused; so is one given twice in the file); the result must match the stored shape and
dtype. Nothing in a file is ever run.
"""

from __future__ import annotations

import dataclasses
import json
import math
from itertools import accumulate
from typing import Any

import numpy as np

from engine.gguf_io import MAX_DIMS, GGUFFile, load_gguf, save_gguf
from engine.graph import Graph
from engine.graph_format import (
    ARCH,
    FORMAT_VERSION,
    MAX_GRAPH_ELEMENTS,
    MAX_RANK,
    PREFIX,
    GraphFileError,
    decode_params,
    encode_params,
    flags_text,
    parse_flags,
)
from engine.registry import all_ops, make_node
from engine.tensor import DTYPES, Flag, Tensor, dtype_name, is_float

__all__ = ["GraphFileError", "LoadedGraph", "graph_from_gguf", "load_graph", "save_graph"]


@dataclasses.dataclass
class LoadedGraph:
    """An imported graph. roles: the caller's names -> tensors; params: the graph's params in
    node order; metadata: the caller's metadata; loss: the node backprop starts from (None
    without a backward pass or when the graph had several LOSS-flagged nodes)."""

    graph: Graph
    roles: dict[str, Tensor]
    params: list[Tensor]
    metadata: dict[str, Any]
    loss: Tensor | None = None


# --- writing ---------------------------------------------------------------------------------

def save_graph(path, graph: Graph, roles: dict[str, Tensor] | None = None,
               metadata: dict[str, Any] | None = None) -> None:
    """Write `graph` (forward and, if built, backward nodes), its flags, the data of its
    persistent leaves and its gradient bookkeeping to the GGUF file `path`, atomically.

    roles: names for tensors a caller wants back from load_graph (each must be an entry).
    metadata: extra key/values (engine.gguf_io's types; keys must not start with "graph.").
    Raises GraphFileError naming the node or key that cannot be stored, and
    engine.files.WriteError naming `path` when it cannot be written (save_gguf writes it
    through the one atomic writer: the previous file is kept on any failure).
    """
    if not isinstance(graph, Graph) or not graph.nodes:
        raise GraphFileError(f"save_graph: expected a Graph with nodes, got {graph!r}")
    entries = list(graph.nodes)
    index = {t.id: i for i, t in enumerate(entries)}
    seed = [] if graph.loss_grad is None else [graph.loss_grad]
    for t in [*graph.grad_accs.values(), *seed]:
        if index.setdefault(t.id, len(entries)) == len(entries):
            entries.append(t)
    _check_sizes([t.shape for t in entries], [t.name for t in entries], "save_graph")
    tensors, params = {}, []
    for i, t in enumerate(entries):
        at = f"save_graph: node {i} ({t.name!r}, op {t.op})"
        if t.is_leaf and (t.shares is not None or not t.persistent):
            raise GraphFileError(f"{at}: a leaf must hold its own data (an input, param, ...); "
                                 + (f"this one reads the buffer of {t.shares.name!r} in "
                                    "another graph" if t.shares is not None else "no flags"))
        params.append(encode_params(t.params, at))
        if t.is_leaf:
            data = t.host_view()
            tensors[f"node.{i}"] = data if 1 <= t.ndim <= MAX_DIMS else data.reshape(-1)
    keys: dict[str, Any] = {
        "format_version": FORMAT_VERSION, "name": graph.name, "node_count": len(graph.nodes),
        "node.name": [t.name for t in entries], "node.op": [t.op or "" for t in entries],
        "node.dtype": [dtype_name(t.dtype) for t in entries],
        "node.flags": [flags_text(t.flags) for t in entries],
        "node.ndim": [t.ndim for t in entries], "node.dims": [d for t in entries for d in t.shape],
        "node.nsrcs": [len(t.srcs) for t in entries], "node.params": params,
        "node.srcs": [index[s.id] for t in entries for s in t.srcs],
        "outputs": [index[t.id] for t in graph.outputs], "backward": bool(seed)}
    if seed:
        losses = [t for t in graph.nodes if t.flags & Flag.LOSS]
        keys.update({
            "backward.accumulate": bool(graph.grad_accs), "backward.loss_grad": index[seed[0].id],
            "backward.loss": index[losses[0].id] if len(losses) == 1 else -1,
            "backward.grad_params": [index[p.id] for p in graph.grads],
            "backward.grads": [index[g.id] for g in graph.grads.values()],
            "backward.acc_params": [index[p.id] for p in graph.grad_accs],
            "backward.accs": [index[a.id] for a in graph.grad_accs.values()]})
    roles = dict(roles or {})
    for name, t in roles.items():
        if not isinstance(name, str) or not isinstance(t, Tensor) or t.id not in index:
            raise GraphFileError(f"save_graph: role {name!r} names {t!r}, which is not a "
                                 f"tensor of graph {graph.name!r}")
    keys.update({"role.names": list(roles), "role.nodes": [index[t.id] for t in roles.values()]})
    meta = dict(metadata or {})
    reserved = [k for k in meta if not isinstance(k, str) or k.startswith(PREFIX)]
    if reserved:
        raise GraphFileError(f"save_graph: metadata keys {reserved} are reserved for the graph "
                             f"(keys starting with {PREFIX!r})")
    meta.update({PREFIX + k: v for k, v in keys.items() if v != []})   # GGUF: no empty arrays
    save_gguf(path, tensors, ARCH, meta)


# --- reading ---------------------------------------------------------------------------------

def load_graph(path) -> LoadedGraph:
    """Rebuild the graph saved at `path` by save_graph, checking everything on the way.

    Raises GGUFFormatError (from engine.gguf_io) for a file that is not readable GGUF
    (missing, truncated, corrupt), and GraphFileError, naming the node or key, for a GGUF
    file that is not a valid graph file.
    """
    return graph_from_gguf(load_gguf(path))


def graph_from_gguf(gf: GGUFFile) -> LoadedGraph:
    """load_graph for a GGUF file already read (engine.gguf_io.load_gguf): a caller that
    reads a file to see what it holds parses it once. GraphFileError as load_graph."""
    where = gf.path
    if gf.arch != ARCH:
        hint = (f"this is an MNIST model file ({gf.arch}), not a graph file; load it with "
                "mnist_target.models.Model.load" if gf.arch.startswith("mnist-") else
                "not a graph file")
        raise GraphFileError(f"{where}: architecture is {gf.arch!r}, expected {ARCH!r}: {hint}")
    keys = _Keys(gf.metadata, where)
    version = keys.one("format_version", int)
    if version != FORMAT_VERSION:
        raise GraphFileError(f"{where}: unsupported graph format version {version} (this "
                             f"engine reads version {FORMAT_VERSION})")
    names, n = keys.many("node.name", str), keys.one("node_count", int)
    count = len(names)
    if not 1 <= n <= count:
        raise GraphFileError(f"{where}: node_count {n} outside [1, {count}] ({count} entries "
                             "in graph.node.name)")
    ops_, dtypes, flags, params = (keys.many("node." + k, str, count)
                                   for k in ("op", "dtype", "flags", "params"))
    shapes = _split(keys, "node.ndim", "node.dims", count)
    _check_sizes(shapes, names, where)
    srcs = _split(keys, "node.nsrcs", "node.srcs", count)
    registry = all_ops()
    entries: list[Tensor] = []
    for i in range(count):
        at = f"{where}: node {i} ({names[i]!r}, {f'op {ops_[i]!r}' if ops_[i] else 'a leaf'})"
        if dtypes[i] not in DTYPES:
            raise GraphFileError(f"{at}: unknown dtype {dtypes[i]!r}; known: {sorted(DTYPES)}")
        flag = parse_flags(flags[i], at)
        kwargs = decode_params(params[i], at)
        _no_name_twice(params[i], at)
        bad = [s for s in srcs[i] if not 0 <= s < i]
        if bad:
            raise GraphFileError(f"{at}: source index {bad[0]} is out of range or not "
                                 f"earlier than the node (sources {list(srcs[i])})")
        if not ops_[i]:
            if srcs[i] or kwargs or not flag.persistent:
                raise GraphFileError(f"{at}: a leaf must be persistent (input, param, ...), "
                                     f"with no sources or params; flags {flags[i]!r}")
            t = Tensor(shapes[i], dtypes[i], name=names[i], flags=flag)
        else:
            t = _rebuild(registry, ops_[i], [entries[s] for s in srcs[i]], kwargs, i >= n, at)
            if t.shape != shapes[i] or dtype_name(t.dtype) != dtypes[i]:
                raise GraphFileError(f"{at}: stored as {list(shapes[i])} {dtypes[i]}, but the "
                                     f"op infers {list(t.shape)} {dtype_name(t.dtype)} from "
                                     "its sources")
            if flag & (Flag.PARAM | Flag.GRAD_ACC):
                raise GraphFileError(f"{at}: only leaves may be flagged {flags[i]}")
            t.name, t.flags = names[i], flag
        entries.append(t)
    _restore_data(gf.tensors, entries, where)

    graph = Graph(name=keys.one("name", str))
    graph.expand(*(entries[i] for i in keys.indices("outputs", n)))
    if [t.id for t in graph.nodes] != [t.id for t in entries[:n]]:
        raise GraphFileError(f"{where}: the stored nodes are not the graph of the stored "
                             "outputs in its topological order (a node is unreachable, or "
                             "out of order)")
    loss = _restore_backward(graph, keys, entries, n) if keys.one("backward", bool) else None
    role_names, role_nodes = keys.many("role.names", str), keys.indices("role.nodes", count)
    if len(role_names) != len(role_nodes) or len(set(role_names)) != len(role_names):
        raise GraphFileError(f"{where}: role.names {role_names} and role.nodes {role_nodes} "
                             "must pair up, names unique")
    roles = {name: entries[i] for name, i in zip(role_names, role_nodes, strict=True)}
    user = {k: v for k, v in gf.metadata.items() if not k.startswith(PREFIX)}
    return LoadedGraph(graph, roles, graph.params(), user, loss)


def _no_name_twice(text: str, at: str) -> None:
    """Refuse params JSON (already read by decode_params) whose objects give a name twice:
    json.loads would keep the last one silently ({"scale": 2.0, "scale": 3.0})."""
    def pairs(items):
        names = [k for k, _ in items]
        twice = next((k for i, k in enumerate(names) if k in names[:i]), None)
        if twice is not None:
            raise GraphFileError(f"{at}: param {twice!r} is given twice in {text[:200]!r}")
        return dict(items)
    json.loads(text, object_pairs_hook=pairs)


def _rebuild(registry, op, srcs, kwargs, detached, at) -> Tensor:
    if detached:
        raise GraphFileError(f"{at}: entries after node_count must be leaves")
    opdef = registry.get(op)
    if opdef is None:
        raise GraphFileError(f"{at}: unknown op {op!r} (not in the registry)")
    if opdef.kind == "composite":
        raise GraphFileError(f"{at}: {op} is a composite op; graphs hold the ops it is made of")
    try:
        return make_node(op, srcs, **kwargs)
    except Exception as exc:   # whatever the op's infer raises, the file is what is wrong
        raise GraphFileError(f"{at}: the op rejects its sources or params "
                             f"{encode_params(kwargs)[:200]}: {exc}") from exc


def _restore_data(tensors: dict[str, np.ndarray], entries: list[Tensor], where: str) -> None:
    """Set every leaf from its tensor `node.<i>`; refuse missing and unexpected tensors."""
    expected = {f"node.{i}": t for i, t in enumerate(entries) if t.is_leaf}
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise GraphFileError(f"{where}: tensors {extra[:5]} belong to no persistent leaf")
    for key, t in expected.items():
        at = f"{where}: node {key.split('.')[1]} ({t.name!r}, flags {flags_text(t.flags)})"
        data = tensors.get(key)
        if data is None:
            raise GraphFileError(f"{at}: no data (tensor {key!r}) for this persistent leaf")
        stored = t.shape if 1 <= t.ndim <= MAX_DIMS else (t.size,)
        if data.shape != stored or data.dtype != t.dtype:
            raise GraphFileError(f"{at}: data is {list(data.shape)} {data.dtype}, the node is "
                                 f"{list(stored)} {t.dtype}")
        t.set(data.reshape(t.shape))


def _restore_backward(graph: Graph, keys: _Keys, entries: list[Tensor], n: int):
    """Set the graph's loss_grad, grads and grad_accs; return its loss (None if unknown)."""
    seed = entries[keys.index("backward.loss_grad", len(entries))]
    if not (seed.is_leaf and seed.persistent and is_float(seed.dtype)):
        raise GraphFileError(f"{keys.where}: backward.loss_grad {seed.name!r} must be a "
                             "persistent float leaf")
    pairs = {}
    for kind, flag in (("grad", Flag.NONE), ("acc", Flag.GRAD_ACC)):
        ps = [entries[i] for i in keys.indices(f"backward.{kind}_params", n)]
        of = [entries[i] for i in keys.indices(f"backward.{kind}s", len(entries))]
        if len(ps) != len(of):
            raise GraphFileError(f"{keys.where}: backward.{kind}_params and backward.{kind}s "
                                 "differ in length")
        for p, g in zip(ps, of, strict=True):
            if not (p.is_leaf and p.is_param) or (g.shape, g.dtype) != (p.shape, p.dtype) or \
                    (flag and not (g.is_leaf and g.flags & flag)):
                raise GraphFileError(f"{keys.where}: {kind} {g.name!r} cannot belong to "
                                     f"{p.name!r} (a param leaf of its shape and dtype"
                                     + (", flagged GRAD_ACC)" if flag else ")"))
        pairs[kind] = dict(zip(ps, of, strict=True))
    if keys.one("backward.accumulate", bool) != bool(pairs["acc"]):
        raise GraphFileError(f"{keys.where}: backward.accumulate disagrees with backward.accs")
    graph.grads, graph.grad_accs, graph.loss_grad = pairs["grad"], pairs["acc"], seed
    return None if keys.one("backward.loss", int) == -1 else \
        entries[keys.index("backward.loss", n)]


def _split(keys: _Keys, counts_key: str, flat_key: str, count: int) -> list[tuple[int, ...]]:
    """Per-entry tuples from a counts array and the concatenated values."""
    counts, flat = keys.many(counts_key, int, count), keys.many(flat_key, int)
    if any(c < 0 for c in counts) or sum(counts) != len(flat):
        raise GraphFileError(f"{keys.where}: {PREFIX}{counts_key} (sum {sum(counts)}) and "
                             f"{PREFIX}{flat_key} ({len(flat)} values) disagree")
    out = [tuple(flat[e - c:e]) for c, e in zip(counts, accumulate(counts), strict=True)]
    bad = [i for i, values in enumerate(out) if min(values, default=0) < 0]
    if bad:
        raise GraphFileError(f"{keys.where}: node {bad[0]}: {PREFIX}{flat_key} gives it "
                             f"{list(out[bad[0]])}; indices and dimensions are >= 0")
    return out


def _check_sizes(shapes: list[tuple[int, ...]], names: list[str], where: str) -> None:
    """Refuse an entry of more than MAX_RANK axes, and shapes that together exceed
    MAX_GRAPH_ELEMENTS elements (a small leaf broadcast to 2^40 elements is a valid node,
    but computing it would exhaust memory)."""
    total = 0
    for i, shape in enumerate(shapes):
        if len(shape) > MAX_RANK:
            raise GraphFileError(f"{where}: node {i} ({names[i]!r}) has {len(shape)} axes; "
                                 f"at most {MAX_RANK}")
        total += math.prod(shape)
        if total > MAX_GRAPH_ELEMENTS:
            raise GraphFileError(f"{where}: node {i} ({names[i]!r}) of shape {list(shape)} "
                                 f"brings the graph past {MAX_GRAPH_ELEMENTS} elements")


class _Keys:
    """Typed reads of the graph's keys; every failure is a GraphFileError naming the key."""

    def __init__(self, metadata: dict, where: str):
        self.metadata, self.where = metadata, where

    def _fail(self, key, problem):
        return GraphFileError(f"{self.where}: {PREFIX + key} {problem}")

    def one(self, key, kind):
        """The value of a required scalar key of type `kind` (int, bool or str)."""
        v = self.metadata.get(PREFIX + key)   # a GGUF value is never None
        if type(v) is not kind:
            raise self._fail(key, "is missing" if v is None else
                             f"must be of type {kind.__name__}, got {v!r:.100}")
        return v

    def many(self, key, kind, count=None):
        """An array of `kind`; absent means empty unless `count` (the length) is positive."""
        v = self.metadata.get(PREFIX + key)
        if v is None and count:
            raise self._fail(key, "is missing")
        v = [] if v is None else v
        if not isinstance(v, list) or any(type(x) is not kind for x in v):
            raise self._fail(key, f"must be an array of {kind.__name__}, got {v!r:.100}")
        if count is not None and len(v) != count:
            raise self._fail(key, f"has {len(v)} values for {count} entries")
        return v

    def index(self, key, hi) -> int:
        return self.indices(key, hi, [self.one(key, int)])[0]

    def indices(self, key, hi, values=None) -> list[int]:
        values = self.many(key, int) if values is None else values
        bad = [i for i in values if not 0 <= i < hi]
        if bad:
            raise self._fail(key, f"holds {bad[0]}, not an entry index in [0, {hi})")
        return values
