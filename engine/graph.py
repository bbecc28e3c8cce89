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

Broadcast gradients below float64. The gradient of a broadcast operand is a sum of terms,
one per copy (sum_to in a binary op's, matmul's or softmax's rule; expand's, broadcast_to's
and repeat's rules sum their gradient itself). Made by kernels of the operand's dtype, each
term is rounded to it before the sum, and a sum of n terms that cancel errs by about
sqrt(n) roundings of the terms, far more than the one rounding of its result: a float16
softmax mask of one element broadcast over 48 had a gradient 3.5e-4 off (truth 0) where
torch's float64-computed reference errs 6e-17, 124 times the precision bar (`gradcheck --op
softmax --random 200 --seed 1`), reglu on one element expanded to 8 a gradient 10% off
(--seed 3), and a float32 mask of one element expanded to 2 (or 4) erred 3.4e-8, 23.6 (9.6)
times the bar, torch's own float32 erring as much (`gradcheck --repro` of softmax x=[2],
mask=[2]expand[0], scale 1; the --random 200 --seed 2 failure of issue 37). So such terms
are made in the next wider float (WIDER: float32 for float16 and bfloat16, float64 for
float32) and summed before the one rounding to the operand's dtype
(tests/engine/test_wide_gradients.py, whose bound is an ulp of the result plus the wider
float's rounding of the terms: 16-bit terms erred 54 to 9,400 times it before, float32
ones 58 to 892 times; both at most half of it now):

- a node "wants a wide gradient" when it is below float64 and its rule adds up (an
  `adds_up` op: sum, repeat_back) terms made from its gradient, in its dtype, for an input
  that needs a gradient (found by building the rule on a placeholder gradient), or when it
  only moves its gradient's values (a view, cont) to an input that wants one;
- the gradient a node wants is of the next wider float, made by its consumers' rules run
  wide: every narrower float input widened (a cast, exact), the node's output recomputed
  in the wider float from them (a rule that reads it, such as exp's y or div's a / b,
  reads it unrounded; one that does not leaves the recomputation unused, and no plan runs
  it), so that the rule's terms are wide; each other input of such a rule takes its
  result in its own dtype as before (the rule is built twice; nothing unused is ever
  planned). The node's own rule then runs wide too, its sum adding wide terms (in float64
  accumulators, engine.backends.cpu.reduce), and its inputs' gradients are cast to their
  dtype once. (The recomputation costs a forward pass only where a rule reads its output:
  attention_fwd's, on an expanded q, k or v, is an attention forward in the wider float.)

A 16-bit sum is rounded twice, to float32 and then to 16 bits: the correctly rounded result
but within 2^-24 of a 16-bit tie. A graph without broadcast gradients is built as before,
and float64 graphs always (softmax's mask goes wide in its own rule, engine.ops.softmax,
in float64 for every dtype).

Float32 widens only its explicit broadcasts, the ops that do nothing but copy their input
(F32_WIDENS: expand, broadcast_to, repeat): the failures above came from them, and there
the cost is the consumer's rule run in float64 once. Widening every float32 sum over
broadcast axes (first tried) made a bias's gradient, a batch-broadcast matmul's weight
gradient and so every convolution's weight gradient go through float64: a bias added to a
(2048, 4096) batch went from 0.41 to 0.98 of torch's forward + backward
(bench/bench_wide_gradients.py, one thread, a loaded machine), and a convolution's
columns' gradient, read through a cast, lost its transposed product
(engine.ops.shape.transposed_product) and was copied
(tests/engine/backends/cpu/test_im2col_pool.py). Those float32 sums add terms that are
made in float32 as torch makes them, and a float32 BLAS product accumulates in float32
anyway; their cancellation is what the precision verdict measures against torch's float32.
"""

from __future__ import annotations

import numpy as np

from engine.errors import EngineError, ShapeError, StalePlanError
from engine.planner import Plan
from engine.registry import OPS, make_node
from engine.tensor import FLOAT_NAMES, Flag, Tensor, as_dtype, dtype_name, is_float

# the next wider float of each float dtype that has one: the dtype of the gradient a node of
# that dtype wants wide (module doc)
WIDER = {as_dtype("f16"): as_dtype("f32"), as_dtype("bf16"): as_dtype("f32"),
         as_dtype("f32"): as_dtype("f64")}
# the ops whose float32 nodes widen: the explicit broadcasts (module doc)
F32_WIDENS = frozenset({"expand", "broadcast_to", "repeat"})


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
            ran_wide = node.id in wide or any(s.id in wide for s in node.srcs)
            for src, sg in zip(node.srcs, src_grads, strict=True):
                if sg is None or not needs.get(src.id):
                    continue
                dtype = wide.get(src.id, src.dtype)
                if sg.dtype != dtype and ran_wide and _narrower(dtype, sg.dtype):
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


def _widens(t: Tensor) -> bool:
    """Whether t's dtype has a wider float (WIDER): every float but float64."""
    return t.dtype in WIDER


def _rank(dtype) -> int:
    """A float dtype's place in FLOAT_NAMES' order by width (both 16-bit ones first)."""
    return max(1, FLOAT_NAMES.index(dtype_name(dtype)))


def _narrower(dtype, than) -> bool:
    """Whether float `dtype` is narrower than float `than` (a 16-bit one than float32 or
    float64, float32 than float64); False for any other dtype."""
    return is_float(dtype) and is_float(than) and _rank(dtype) < _rank(than)


def _wants_wide(nodes, needs) -> dict[int, np.dtype]:
    """Which nodes want a wide gradient (module doc), and its dtype (WIDER's, of theirs), in
    the graph's order: a 16-bit node (a float32 one of F32_WIDENS) whose rule adds up terms
    made from its gradient, or that only moves its gradient's values to an input that wants
    one."""
    wide: dict[int, np.dtype] = {}
    for t in nodes:
        if t.is_leaf or not needs.get(t.id) or not _widens(t):
            continue
        op = OPS[t.op]
        if op.backward is None:
            continue
        if (op.kind == "view" or t.op == "cont") and wide.get(t.srcs[0].id):
            wide[t.id] = WIDER[t.dtype]
        elif ((t.dtype != np.float32 or t.op in F32_WIDENS)
              and _adds_up_its_gradient(op, t, needs)):
            wide[t.id] = WIDER[t.dtype]
    return wide


def _adds_up_its_gradient(op, node: Tensor, needs) -> bool:
    """Whether node's rule, built on a placeholder gradient (and then dropped), adds up
    terms made from that gradient below float64, over more than one element each, for an
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
            if (OPS[t.op].adds_up and _widens(t) and t.srcs[0].size > t.size
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
        grads = _wide_rule(op, g, node, wide[node.id])
    else:
        grads = op.backward(g, node, *node.srcs, **node.params)
        wanted = [wide[s.id] for s in node.srcs if s.id in wide]
        if len(grads) == len(node.srcs) and wanted:
            dtype = max(wanted, key=_rank)
            grads = tuple(w if wide.get(s.id) else sg for s, sg, w in zip(
                node.srcs, grads, _wide_rule(op, g, node, dtype), strict=True))
    if len(grads) != len(node.srcs):
        raise EngineError(f"backward of {node.op} returned {len(grads)} "
                          f"gradients for {len(node.srcs)} inputs")
    return grads


def _widened(t: Tensor, dtype) -> Tensor:
    """t cast (exactly) to float `dtype` where it is a narrower float, else t itself."""
    return OPS["cast"].build(t, dtype) if _narrower(t.dtype, dtype) else t


def _wide_rule(op, g: Tensor, node: Tensor, dtype) -> tuple:
    """node's rule on its gradient and inputs widened to `dtype` and its output recomputed
    from them in `dtype` (a cast of the stored one where the op's output has a dtype of its
    own whatever its inputs', as a cast's)."""
    srcs = tuple(_widened(s, dtype) for s in node.srcs)
    out = _widened(node, dtype)
    if _narrower(node.dtype, dtype) and any(
            s is not w for s, w in zip(node.srcs, srcs, strict=True)):
        again = make_node(node.op, srcs, **node.params)
        out = again if again.dtype == dtype else out
    return op.backward(_widened(g, dtype), out, *srcs, **node.params)


def compute(*tensors: Tensor, backend="cpu") -> list[np.ndarray]:
    """Evaluate `tensors` in a throwaway graph and return their values (convenience)."""
    g = Graph(tensors, name="eval")
    g.compute(backend)
    return [t.numpy() for t in tensors]


def _transposed_product(g: Tensor) -> Tensor | None:
    """For a gradient that is the transpose of a matrix product, (a @ b)^T, the product
    b^T @ a^T (engine.ops.shape.transposed_product): the same terms, written in g's
    layout, where copying the transposed view would be a pass of its own (a weight W used
    as W^T in `x @ W^T`, as in ggml's layout, gets its gradient this way). None for any
    other gradient, and for batched products."""
    from engine.ops.shape import transposed_product
    return transposed_product(g) if g.ndim == 2 else None
