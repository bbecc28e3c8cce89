"""Static graphs: forward building, backward appended to the same graph, evaluation.

    x = engine.param((4, 3), name="x")
    loss = ops.sum(ops.relu(x)).set_loss()
    g = Graph([loss])
    grads = g.build_backward(loss)      # appends gradient nodes to g
    x.set(np.random.rand(4, 3))
    g.compute()
    grads[x].numpy()

Forward and backward live in one graph because the backward pass reads forward
intermediates. Gradients are computed for param-flagged tensors only.

Broadcast gradients in 16 bits. The gradient of a broadcast operand is a sum of terms, one
per copy (sum_to in a binary op's, matmul's or softmax's rule; expand's, broadcast_to's and
repeat's rules sum their gradient itself). Made by 16-bit kernels, each term is rounded to
16 bits before the sum, and a sum of n terms that cancel errs by about sqrt(n) roundings of
the terms, far more than the one rounding of its result: a float16 softmax mask of one
element broadcast over 48 had a gradient 3.5e-4 off (truth 0) where torch's
float64-computed reference errs 6e-17, 124 times the precision bar (`gradcheck --op
softmax --random 200 --seed 1`), and reglu on one element expanded to 8 a gradient 10%
off (--seed 3). So such terms are made in float32 and summed before the one rounding to
16 bits (tests/engine/test_wide_gradients.py, whose bound is an ulp of the result plus
float32's rounding of the terms: 54 to 9,400 times it before, at most half of it now):

- a node "wants a wide gradient" when it is 16-bit and its rule adds up (an `adds_up` op:
  sum, repeat_back) terms made from its gradient, in 16 bits, for an input that needs a
  gradient (found by building the rule on a placeholder gradient), or when it only moves
  its gradient's values (a view, cont) to an input that wants one;
- the gradient a node wants is float32, made by its consumers' rules run wide: every 16-bit
  input widened (a cast, exact), the node's output recomputed in float32 from them (a rule
  that reads it, such as exp's y or div's a / b, reads it unrounded; one that does not
  leaves the recomputation unused, and no plan runs it), so that the rule's terms are
  float32; each other input of such a rule takes its 16-bit result as before (the rule is
  built twice; nothing unused is ever planned). The node's own rule then runs wide too,
  its sum adding float32 terms (in float64 accumulators, engine.backends.cpu.reduce), and
  its inputs' gradients are cast to their dtype once. (The recomputation costs a forward
  pass only where a rule reads its output: attention_fwd's, on an expanded 16-bit q, k or
  v, is an attention forward in float32.)

The sum is rounded twice, to float32 and then to 16 bits: the correctly rounded result but
within 2^-24 of a 16-bit tie. A 16-bit graph without broadcast gradients is built as
before, and float32 and float64 graphs always (softmax's mask alone goes wide in its own
rule there, engine.ops.softmax).
"""

from __future__ import annotations

import numpy as np

from engine.errors import EngineError, ShapeError, StalePlanError
from engine.planner import Plan
from engine.registry import OPS, make_node
from engine.tensor import Flag, Tensor, as_dtype, is_float, is_half

WIDE = "f32"      # the dtype of the gradients a 16-bit node wants wide (module doc)


def _topo(outputs, seen: set[int], order: list[Tensor]) -> None:
    """Append to `order`, in dependency order, every node reaching `outputs` not yet seen."""
    stack = [(t, False) for t in reversed(outputs)]
    while stack:
        t, expanded = stack.pop()
        if expanded:
            order.append(t)
            continue
        if t.id in seen:
            continue
        seen.add(t.id)
        stack.append((t, True))
        stack.extend((s, False) for s in reversed(t.srcs) if s.id not in seen)


class Graph:
    """A topologically ordered, deduplicated set of nodes reaching its outputs."""

    def __init__(self, outputs=(), name: str = "graph"):
        self.name = name
        self.nodes: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self._seen: set[int] = set()
        self.version = 0
        self.grads: dict[Tensor, Tensor] = {}       # param -> gradient node in this graph
        self.grad_accs: dict[Tensor, Tensor] = {}   # param -> persistent accumulator
        self.loss_grad: Tensor | None = None        # the seed of backprop (reset sets 1)
        # None, or wrap(label, call) -> call: every call of this graph's plans runs through
        # it (engine.executor; bench/profile_mnist.py times nodes with one)
        self.call_wrapper = None
        self._plan: Plan | None = None
        self.expand(*outputs)

    # --- building -------------------------------------------------------------------------
    def expand(self, *tensors: Tensor) -> Graph:
        """Add `tensors` and everything they depend on (as ggml's build_forward_expand)."""
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"graph outputs must be Tensors, got {type(t).__name__}")
            t.set_flag(Flag.OUTPUT)
            if t not in self.outputs:
                self.outputs.append(t)
        _topo(list(tensors), self._seen, self.nodes)
        self.version += 1
        return self

    def copy(self, name: str | None = None) -> Graph:
        """A new graph with the same nodes (e.g. to extend a forward graph with backward)."""
        g = Graph(name=name or f"{self.name}_copy")
        g.expand(*self.outputs)
        return g

    def build_backward(self, loss: Tensor | None = None, accumulate: bool = False):
        """Append the gradient of `loss` w.r.t. every param in the graph; return them.

        With `accumulate`, each param also gets a persistent accumulator to which every
        evaluation adds its gradient, and the returned dict maps params to accumulators.
        The loss gradient is a persistent tensor seeded with 1; `reset` re-seeds it and
        zeroes the accumulators (done once here). A param's gradient is a tensor of its own,
        never a view: one that would be the transpose of a matrix product is built as the
        transposed product (`_transposed_product`), any other view copied (`cont`).
        """
        if self.loss_grad is not None:
            raise EngineError(f"graph {self.name!r} already has a backward pass")
        if loss is None:
            losses = [t for t in self.nodes if t.flags & Flag.LOSS]
            if len(losses) != 1:
                raise EngineError("build_backward: pass the loss, or flag exactly one tensor "
                                  f"with set_loss (found {len(losses)})")
            loss = losses[0]
        if loss.id not in self._seen:
            self.expand(loss)
        if not is_float(loss.dtype):
            raise EngineError(f"build_backward: loss {loss.name!r} must be float, "
                              f"not {loss.dtype}")
        loss.set_flag(Flag.LOSS | Flag.OUTPUT)
        params = [t for t in self.nodes if t.is_param]
        if not params:
            raise EngineError("build_backward: the graph has no param-flagged tensor")

        needs = _needs_grad(self.nodes)
        wide = _wants_wide(self.nodes, needs)
        seed = Tensor(loss.shape, loss.dtype, name=f"{loss.name}.grad_seed", flags=Flag.INPUT)
        grads: dict[int, Tensor] = {loss.id: seed}
        for node in reversed(self.nodes):
            g = grads.get(node.id)
            if g is None or node.is_leaf:
                continue
            op = OPS[node.op]
            if op.backward is None:
                if any(needs.get(s.id) for s in node.srcs):
                    raise EngineError(f"op {node.op} has no backward ({op.no_grad}), but "
                                      f"{node.name!r} lies between a param and the loss")
                continue
            src_grads = _rule_gradients(op, g, node, needs, wide)
            for src, sg in zip(node.srcs, src_grads, strict=True):
                if sg is None or not needs.get(src.id):
                    continue
                dtype = as_dtype(WIDE) if wide.get(src.id) else src.dtype
                if sg.dtype != dtype and _half(src) and {sg.dtype, dtype} == {
                        as_dtype(WIDE), src.dtype}:
                    sg = OPS["cast"].build(sg, dtype)   # a wide result rounded once
                if sg.shape != src.shape or sg.dtype != dtype:
                    raise ShapeError(f"backward of {node.op} gave a {sg.dtype} gradient of "
                                     f"shape {list(sg.shape)} for an input of shape "
                                     f"{list(src.shape)} ({src.dtype})")
                prev = grads.get(src.id)
                grads[src.id] = sg if prev is None else OPS["add"].build(prev, sg)

        self.loss_grad = seed
        for p in params:
            g = grads.get(p.id)
            if g is None:
                continue  # the loss does not depend on p; its gradient is zero
            if g.is_leaf or g.view_of is not None:
                # a gradient of its own, never an alias
                g = _transposed_product(g) or OPS["cont"].build(g)
            g.name = f"{p.name}.grad"
            self.grads[p] = g
            self.expand(g)
        if accumulate:
            for p in params:
                self.grad_accs[p] = Tensor(p.shape, p.dtype, name=f"{p.name}.grad_acc",
                                           flags=Flag.GRAD_ACC)
        self.version += 1
        self.reset()
        return dict(self.grad_accs) if accumulate else dict(self.grads)

    def grad(self, p: Tensor) -> Tensor:
        """The tensor holding p's gradient after compute (its accumulator when accumulating)."""
        if p in self.grad_accs:
            return self.grad_accs[p]
        if p in self.grads:
            return self.grads[p]
        raise EngineError(f"{p.name!r} has no gradient in graph {self.name!r}")

    def reset(self) -> None:
        """Seed the loss gradient with 1 and zero the gradient accumulators."""
        if self.loss_grad is None:
            raise EngineError(f"graph {self.name!r} has no backward pass to reset")
        self.loss_grad.fill(1)
        for acc in self.grad_accs.values():
            acc.fill(0)     # where it lives: no host round trip for device accumulators

    # --- evaluation -------------------------------------------------------------------------
    def compute(self, backend="cpu"):
        """Evaluate every node, replanning when the graph changed since the last plan."""
        plan = self._plan
        if plan is not None and plan.backend.name == backend:
            try:
                plan.run(self)               # checks that the plan is this graph's as it is
                return self
            except StalePlanError:
                pass
        self._plan = Plan(self, backend)
        self._plan.run(self)
        return self

    @property
    def plan(self) -> Plan | None:
        return self._plan

    def params(self) -> list[Tensor]:
        return [t for t in self.nodes if t.is_param]

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes, version {self.version})"


def _needs_grad(nodes) -> dict[int, bool]:
    """Which nodes depend on a float param (only those get gradients)."""
    needs: dict[int, bool] = {}
    for t in nodes:
        if t.is_leaf:
            needs[t.id] = t.is_param and is_float(t.dtype)
        else:
            needs[t.id] = is_float(t.dtype) and any(needs.get(s.id) for s in t.srcs)
    return needs


def _half(t: Tensor) -> bool:
    return is_float(t.dtype) and is_half(t.dtype)


def _wants_wide(nodes, needs) -> dict[int, bool]:
    """Which nodes want a float32 gradient (module doc), in the graph's order: a 16-bit
    node whose rule adds up terms made from its gradient, or that only moves its
    gradient's values to an input that wants one."""
    wide: dict[int, bool] = {}
    for t in nodes:
        if t.is_leaf or not needs.get(t.id) or not _half(t):
            continue
        op = OPS[t.op]
        if op.backward is None:
            continue
        if (op.kind == "view" or t.op == "cont") and wide.get(t.srcs[0].id):
            wide[t.id] = True
        elif _adds_up_its_gradient(op, t, needs):
            wide[t.id] = True
    return wide


def _adds_up_its_gradient(op, node: Tensor, needs) -> bool:
    """Whether node's rule, built on a placeholder gradient (and then dropped), adds up
    terms made from that gradient in 16 bits, over more than one element each, for an
    input that needs a gradient. Every node the rule makes is newer than the placeholder."""
    probe = Tensor(node.shape, node.dtype, name=f"{node.name}.grad_probe")
    made = lambda t: t.id > probe.id and not t.is_leaf   # noqa: E731
    grads = op.backward(probe, node, *node.srcs, **node.params)
    for src, sg in zip(node.srcs, grads, strict=False):
        if sg is None or not needs.get(src.id):
            continue
        stack, seen = [sg], set()
        while stack:
            t = stack.pop()
            if not made(t) or t.id in seen:
                continue
            seen.add(t.id)
            if (OPS[t.op].adds_up and _half(t) and t.srcs[0].size > t.size
                    and _reaches(t.srcs[0], probe, made)):
                return True
            stack.extend(t.srcs)
    return False


def _reaches(t: Tensor, target: Tensor, made) -> bool:
    """Whether `target` is t or a source of t through nodes that `made` accepts."""
    stack, seen = [t], set()
    while stack:
        t = stack.pop()
        if t is target:
            return True
        if made(t) and t.id not in seen:
            seen.add(t.id)
            stack.extend(t.srcs)
    return False


def _rule_gradients(op, g: Tensor, node: Tensor, needs, wide) -> tuple:
    """The gradients of node's inputs from its rule: run as it is, or wide (module doc)
    for a node that wants a wide gradient, and for the inputs that want one."""
    if wide.get(node.id):
        grads = _wide_rule(op, g, node)
    else:
        grads = op.backward(g, node, *node.srcs, **node.params)
        if len(grads) == len(node.srcs) and any(wide.get(s.id) for s in node.srcs):
            grads = tuple(w if wide.get(s.id) else sg for s, sg, w in zip(
                node.srcs, grads, _wide_rule(op, g, node), strict=True))
    if len(grads) != len(node.srcs):
        raise EngineError(f"backward of {node.op} returned {len(grads)} "
                          f"gradients for {len(node.srcs)} inputs")
    return grads


def _widened(t: Tensor) -> Tensor:
    return OPS["cast"].build(t, WIDE) if _half(t) else t


def _wide_rule(op, g: Tensor, node: Tensor) -> tuple:
    """node's rule on its gradient and inputs widened to float32 and its output recomputed
    from them in float32 (a cast of the stored one where the op's output is 16-bit
    whatever its inputs, as a cast's)."""
    srcs = tuple(_widened(s) for s in node.srcs)
    out = _widened(node)
    if _half(node) and any(s is not w for s, w in zip(node.srcs, srcs, strict=True)):
        again = make_node(node.op, srcs, **node.params)
        out = out if _half(again) else again
    return op.backward(_widened(g), out, *srcs, **node.params)


def compute(*tensors: Tensor, backend="cpu") -> list[np.ndarray]:
    """Evaluate `tensors` in a throwaway graph and return their values (convenience)."""
    g = Graph(tensors, name="eval")
    g.compute(backend)
    return [t.numpy() for t in tensors]


def _is_matrix_transpose(t: Tensor) -> bool:
    return t.op == "permute" and t.params.get("axes") == (1, 0)


def _transposed_product(g: Tensor) -> Tensor | None:
    """For a gradient that is the transpose of a matrix product, (a @ b)^T, the product
    b^T @ a^T: the same terms, written in g's layout, where copying the transposed view
    would be a pass of its own (a weight W used as W^T in `x @ W^T`, as in ggml's layout,
    gets its gradient this way). None for any other gradient."""
    if not _is_matrix_transpose(g) or g.srcs[0].op != "matmul":
        return None
    a, b = g.srcs[0].srcs
    if a.ndim != 2 or b.ndim != 2:
        return None

    def t(x):
        return x.srcs[0] if _is_matrix_transpose(x) else OPS["permute"].build(x, axes=(1, 0))
    return OPS["matmul"].build(t(b), t(a))
